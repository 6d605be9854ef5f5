"""Recording the kernel launches a launcher makes, and replaying them.

The bench times exactly what the library runs: it calls a stage's own launcher once inside
``recording_launches`` (every ``kernel[griddim, blockdim, stream, sharedmem](*args)`` noted:
kernel, grid, block, stream, bytes of dynamic shared memory, device arrays), then ``replay``
runs only those launches again, with the same configuration, no host copies and no input
checks. The traffic counts run the same recorded launches under the sanitizer.
"""

import math
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from numba import cuda

from attention_lib.measure import sanitizer


@dataclass
class Launch:
    """One kernel launch as a launcher made it: kernel[griddim, blockdim, stream, sharedmem](*args).

    stream and sharedmem (bytes of dynamic shared memory) are 0 where the launch left them out,
    as CUDA's defaults are; flash v3's grouped kernel asks for about 70 KB, and a replay without
    them would give it none."""

    kernel: object
    griddim: tuple
    blockdim: tuple
    args: tuple
    report: object = None          # sanitizer.MemoryReport when it ran under count_memory
    stream: object = 0
    sharedmem: int = 0

    @classmethod
    def of(cls, kernel, config, args):
        """The launch kernel[config](*args), config being what the launch's [...] held (2 to 4 items)."""
        config = tuple(config) + (0, 0)[len(config) - 2:]
        return cls(kernel, config[0], config[1], args, stream=config[2], sharedmem=int(config[3]))

    @property
    def config(self):
        """The launch's whole configuration, as kernel[...] takes it."""
        return self.griddim, self.blockdim, self.stream, self.sharedmem

    @property
    def name(self):
        return self.kernel.py_func.__name__

    @property
    def blocks(self):
        return math.prod(dim3(self.griddim))

    @property
    def threads(self):
        return self.blocks * math.prod(dim3(self.blockdim))


def dim3(dims):
    """A grid or block shape as a tuple of ints (an int is a 1-D shape)."""
    return (int(dims),) if isinstance(dims, (int, np.integer)) else tuple(int(d) for d in dims)


@contextmanager
def recording_launches(count=False):
    """Record every `kernel[griddim, blockdim(, stream, sharedmem)](*args)` made inside the block;
    yields the list.

    Each launch still runs (under sanitizer.count_memory when `count`, its report in
    Launch.report). It replaces the kernel class's ``__getitem__`` (the ``[...]`` of a launch)
    for the length of the block; the sanitizer's own launch passes straight through.
    """
    from attention_lib.stages.basics import add_kernel
    cls = type(add_kernel)                     # CUDADispatcher, or the simulator's FakeCUDAKernel
    original, launches, inside_sanitizer = cls.__getitem__, [], []

    def configure(kernel, config):
        configured = original(kernel, config)
        if inside_sanitizer:
            return configured

        def launch(*args):
            record = Launch.of(kernel, config, args)
            if count:
                inside_sanitizer.append(True)
                try:
                    record.report = sanitizer.count_memory(
                        kernel, record.griddim, record.blockdim, *args, sharedmem=record.sharedmem)
                finally:
                    inside_sanitizer.pop()
            else:
                configured(*args)
            launches.append(record)
        return launch

    cls.__getitem__ = configure
    try:
        yield launches
    finally:
        cls.__getitem__ = original


def replay(launches):
    """A function that runs the recorded launches again, in order, on the same device arrays,
    each with its own grid, block, stream and dynamic shared memory."""
    ready = []
    for launch in launches:
        # A host array given to a kernel would be copied both ways at every launch: copy it once.
        args = tuple(cuda.to_device(a) if isinstance(a, np.ndarray) and a.ndim > 0 else a
                     for a in launch.args)
        configured = launch.kernel[launch.config]
        # A GPU kernel's [...] returns a new launch configuration, made once here so that the timed
        # loop spends no Python on it. The simulator's kernel sets the configuration on itself and
        # returns itself, so two launches of one kernel would share the last one: configure it at
        # each call there.
        ready.append((None if configured is launch.kernel else configured, launch, args))

    def work():
        for configured, launch, args in ready:
            (launch.kernel[launch.config] if configured is None else configured)(*args)
    return work
