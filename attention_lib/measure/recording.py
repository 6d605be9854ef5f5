"""Recording the kernel launches a launcher makes, and replaying them.

The bench times exactly what the library runs: it calls a stage's own launcher once inside
``recording_launches`` (every ``kernel[griddim, blockdim](*args)`` noted: kernel, grid, block,
device arrays), then ``replay`` runs only those launches again, with no host copies and no
input checks. The traffic counts run the same recorded launches under the sanitizer.
"""

import math
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
from numba import cuda

from attention_lib.measure import sanitizer


@dataclass
class Launch:
    """One kernel launch as a launcher made it: kernel[griddim, blockdim](*args)."""

    kernel: object
    griddim: tuple
    blockdim: tuple
    args: tuple
    report: object = None          # sanitizer.MemoryReport when it ran under count_memory

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
    """Record every `kernel[griddim, blockdim](*args)` made inside the block; yields the list.

    Each launch still runs (under sanitizer.count_memory when `count`, its report in
    Launch.report). It replaces the kernel class's ``__getitem__`` (the ``[griddim, blockdim]``
    of a launch) for the length of the block; the sanitizer's own launch passes straight through.
    """
    from attention_lib.stages.basics import add_kernel
    cls = type(add_kernel)                     # CUDADispatcher, or the simulator's FakeCUDAKernel
    original, launches, inside_sanitizer = cls.__getitem__, [], []

    def configure(kernel, config):
        configured = original(kernel, config)
        if inside_sanitizer:
            return configured

        def launch(*args):
            record = Launch(kernel, config[0], config[1], args)
            if count:
                inside_sanitizer.append(True)
                try:
                    record.report = sanitizer.count_memory(
                        kernel, config[0], config[1], *args, sharedmem=config[3] if len(config) == 4 else 0)
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
    """A function that runs the recorded launches again, in order, on the same device arrays."""
    ready = []
    for launch in launches:
        # A host array given to a kernel would be copied both ways at every launch: copy it once.
        args = tuple(cuda.to_device(a) if isinstance(a, np.ndarray) and a.ndim > 0 else a
                     for a in launch.args)
        ready.append((launch.kernel[launch.griddim, launch.blockdim], args))

    def work():
        for configured, args in ready:
            configured(*args)
    return work
