"""Every change the library makes to numba-cuda's internals that lives outside the code using it.

Checked against numba-cuda ``CHECKED_WITH``; tests/test_numba_patches.py fails, naming the
attribute, when one of them is gone (the first thing to look at after an upgrade).

- ``compile_for(cc)``: compile for a chosen GPU where none is present (the compile check, the
  kernel report). Replaces ``numba.cuda.dispatcher.get_current_device``.
- ``simulate_threads_as_greenlets()``: the simulator's CUDA threads as greenlets instead of
  operating-system threads (below). Replaces ``numba.cuda.simulator.kernel.BlockManager.run``,
  the ``threading`` the simulator's kernel API reads its current thread from, element access
  of ``FakeWithinKernelCUDAArray``, ``FakeCUDAShared.array`` and ``FakeCUDAKernel.__call__``,
  for the life of the process.

``ELSEWHERE`` lists the internals that other modules patch or read in place (the sanitizer's
recording, the bench's launch recorder), checked by the same test.
"""

import sys
import threading
from collections import namedtuple
from contextlib import contextmanager
from types import SimpleNamespace

import greenlet
import numpy as np

CHECKED_WITH = "0.30.4"

# (module, attribute) of every internal patched above; the test checks they still exist.
# `dispatcher` is the GPU target's module and is checked in a process with the simulator off.
PATCHED = {
    "compile_for": ("numba.cuda.dispatcher", "get_current_device"),
    "simulate_threads_as_greenlets": ("numba.cuda.simulator.kernel", "BlockManager.run"),
    "simulated current thread": ("numba.cuda.simulator.kernelapi", "threading"),
    "shared arrays by the caller's frame": ("numba.cuda.simulator.kernelapi", "FakeCUDAShared.array"),
    "device calls counted without locks": ("numba.cuda.simulator.kernelapi", "_swap_refcount"),
    "device calls: the modules swapped back": ("numba.cuda.simulator.kernelapi", "_swap_orig"),
    "simulated element access": ("numba.cuda.simulator.cudadrv.devicearray",
                                 "FakeWithinKernelCUDAArray.__getitem__"),
}

# Internals patched (for the length of one launch) or read where they are used, left there
# because they are part of that code's logic; listed so an upgrade is checked in one place.
ELSEWHERE = {
    "sanitizer: shared arrays recorded": ("numba.cuda.simulator.kernelapi", "FakeCUDAShared.array"),
    "sanitizer: atomics recorded": ("numba.cuda.simulator.kernelapi", "FakeCUDAAtomic.add"),
    "sanitizer: a kernel simulated beside a GPU": ("numba.cuda.simulator.kernel", "FakeCUDAKernel"),
    "sanitizer: device arrays unwrapped": ("numba.cuda.simulator.cudadrv.devicearray", "FakeCUDAArray"),
    "bench: launches recorded": ("numba.cuda.simulator.kernel", "FakeCUDAKernel.__getitem__"),
    "kernel_cases: kernels told from device functions": ("numba.cuda.simulator.kernel", "FakeCUDAKernel"),
}


def compile_for(cc):
    """Compile for compute capability `cc` (a pair such as (9, 0)) even where no GPU is present.

    numba-cuda compiles a device function called by a kernel for the *current* device's compute
    capability (``dispatcher`` asks the driver through ``get_current_device``), which fails
    without a GPU; this tells it the architecture being compiled for instead. Only for a process
    that compiles and never launches.
    """
    from numba.cuda import dispatcher
    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=tuple(cc))


Dim3 = namedtuple("Dim3", "x y z")           # as the simulator's: .x .y .z, and a tuple


class SimulatedThread(greenlet.greenlet):
    """One CUDA thread of a simulated block, as a greenlet: it runs until it reaches a barrier
    or returns, and ``syncthreads`` hands control back to the block's scheduler.

    Carries what numba-cuda's ``BlockThread`` carries and the simulator reads (``blockIdx``,
    ``threadIdx``, ``thread_id``, ``syncthreads*``, ``exception``). Defined without importing
    Numba, which this module must not load before the backend is chosen.
    """

    def __init__(self, manager, block_index, thread_index, kernel, args):
        super().__init__()
        self._manager = manager                   # its block_state backs syncthreads_count/and/or
        self._kernel, self._args = kernel, args
        self.blockIdx = Dim3(*block_index)
        self.threadIdx = Dim3(*thread_index)
        x, y, _ = manager._block_dim
        self.thread_id = thread_index[0] + x * (thread_index[1] + y * thread_index[2])
        self.exception = None

    def run(self):
        try:
            if self._manager._debug:              # as numba-cuda's debug mode: 1/0 raises
                with np.errstate(divide="raise"):
                    self._kernel(*self._args)
            else:
                self._kernel(*self._args)
        except Exception as error:               # the message numba-cuda's threads give
            where = f"tid={list(self.threadIdx)} ctaid={list(self.blockIdx)}"
            self.exception = (type(error)(f"{where}: {error}" if str(error) else where),
                              sys.exc_info()[2])

    def syncthreads(self):
        self.parent.switch()                      # back to the scheduler until all arrive

    def _vote(self, value, combine):
        """Every thread posts a value, all wait, each reads the block's combined answer."""
        state = self._manager.block_state     # numba-cuda's array of block_dim, one per block
        state[tuple(self.threadIdx)] = value
        self.syncthreads()
        result = combine(state)
        self.syncthreads()                    # nobody posts the next vote before all have read
        return result

    def syncthreads_count(self, value):
        return int(self._vote(value, np.count_nonzero))

    def syncthreads_and(self, value):
        return int(self._vote(value, np.all))

    def syncthreads_or(self, value):
        return int(self._vote(value, np.any))


def run_block(manager, block_index, *args):
    """``BlockManager.run`` on greenlets: run every live thread of the block up to its next
    barrier (or its end), in thread order, then the next round, until all have returned. A
    thread that has returned no longer takes part in barriers, as in numba-cuda's own; the
    first error stops the block and is raised."""
    threads = [SimulatedThread(manager, block_index, thread_index, manager._f, args)
               for thread_index in np.ndindex(*manager._block_dim)]
    waiting = threads
    try:
        while waiting:
            arrived = []
            for thread in waiting:
                thread.switch()
                if thread.exception:
                    raise thread.exception[0].with_traceback(thread.exception[1])
                if not thread.dead:
                    arrived.append(thread)
            waiting = arrived
    finally:
        # After an error, unwind the threads still waiting at a barrier now (GreenletExit), so
        # the device functions they are inside of hand the modules back their real `cuda`.
        for thread in threads:
            if not thread.dead:
                thread.throw()


def current_thread():
    """The simulated CUDA thread running now, else the Python thread (outside a launch)."""
    running = greenlet.getcurrent()
    return running if isinstance(running, SimulatedThread) else threading.current_thread()


class _ThreadingWithSimulatedThreads:
    """The ``threading`` module as the simulator's kernel API sees it: ``current_thread()``
    is the simulated CUDA thread. The API asks it for threadIdx, blockIdx and barriers."""

    current_thread = staticmethod(current_thread)

    def __getattr__(self, name):
        return getattr(threading, name)


def _element(self, index):
    """``FakeWithinKernelCUDAArray.__getitem__`` without its two intermediate calls: the same
    result (a scalar, or a sub-array wrapped the same way)."""
    item = self.__dict__["_item"]                 # the FakeCUDAArray this one wraps
    value = item._ary[index]
    if type(value) is np.ndarray or type(value) is np.void:
        return type(self)(type(item)(value, stream=item.stream))
    return value


def _set_element(self, index, value):
    self.__dict__["_item"]._ary[index] = value


def _shared_array(self, shape, dtype, alignment=None):
    """``FakeCUDAShared.array`` keyed, as numba-cuda's, by the declaring line, but read from the
    caller's frame instead of a whole ``traceback.extract_stack`` (which checks every source
    file on the stack, at each declaration of each thread), and stored with ``setdefault``,
    atomic under the interpreter lock: numba-cuda's own threads, which can switch between the
    lookup and the store, then also get one array per block (numba-cuda's code gave two threads
    two arrays about once in 300 launches of the fused kernel at a 1 us switch interval)."""
    if shape == 0 or alignment is not None:      # dynamic shared memory, or numba-cuda's error
        return _numba_shared_array(self, shape, dtype, alignment)
    caller = sys._getframe(1)
    site = (caller.f_code.co_filename, caller.f_lineno)
    shared = self._allocations.get(site)
    if shared is None:
        from numba.cuda import types
        from numba.cuda.np import numpy_support
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        shared = self._allocations.setdefault(site, np.empty(shape, dtype))
    return shared


def _call(self, *args):
    """``FakeCUDAKernel.__call__``, with a shortcut for a device function called inside a launch
    whose module already sees the simulator's ``cuda``: count the use, as numba-cuda's
    ``swapped_cuda_module`` does, without its two locks and context manager (threads are
    greenlets: nothing runs between the test and the count); whoever leaves last, numba-cuda's
    context or this, gives the module its real ``cuda`` back."""
    from numba.cuda.simulator import kernel, kernelapi
    if not (self._device or kernel._kernel_context):
        return _numba_call(self, *args)                     # a launch
    users, key = kernelapi._swap_refcount, id(self.fn.__globals__)
    if not users.get(key):
        return _numba_call(self, *args)                     # first use: numba-cuda swaps the module
    users[key] += 1
    try:
        return self.fn(*args)
    finally:
        users[key] -= 1
        if not users[key]:                                  # the last one out restores, as numba-cuda's
            self.fn.__globals__.update(kernelapi._swap_orig.pop(key))
            del users[key]


def simulate_threads_as_greenlets():
    """Run the simulator's CUDA threads as greenlets, one block at a time (idempotent).

    numba-cuda's simulator starts one operating-system thread per CUDA thread and polls them
    at every barrier, so a launch spends most of its time handing the interpreter between
    threads; greenlets switch inside one thread. Measured with scripts/simulator_speed.py
    (README, "The simulator"). Threads now run in a fixed order between barriers: a missing
    barrier gives the same wrong answer every time, and the sanitizer's race finding, which
    never depended on the order, is unchanged. Element access of array arguments, the lookup
    of shared arrays and calls of device functions take shortcuts too (same results, fewer
    calls).
    """
    if _originals:
        return
    from numba.cuda.simulator import kernel, kernelapi
    from numba.cuda.simulator.cudadrv.devicearray import FakeWithinKernelCUDAArray
    global _numba_shared_array, _numba_call
    _numba_shared_array, _numba_call = kernelapi.FakeCUDAShared.array, kernel.FakeCUDAKernel.__call__
    # needs_greenlets: wrong under numba-cuda's own threads (numba_cuda_threads puts it back).
    replacements = [(kernel.BlockManager, "run", run_block, True),
                    (kernel.FakeCUDAKernel, "__call__", _call, True),
                    (kernelapi, "threading", _ThreadingWithSimulatedThreads(), True),
                    (kernelapi.FakeCUDAShared, "array", _shared_array, False),
                    (FakeWithinKernelCUDAArray, "__getitem__", _element, False),
                    (FakeWithinKernelCUDAArray, "__setitem__", _set_element, False)]
    for owner, name, replacement, needs_greenlets in replacements:
        _originals.append((owner, name, getattr(owner, name), replacement, needs_greenlets))
        setattr(owner, name, replacement)


_originals = []   # (owner, attribute, numba-cuda's, ours, needs_greenlets)
_numba_shared_array = _numba_call = None


@contextmanager
def numba_cuda_threads(keep_shortcuts=False):
    """numba-cuda's own simulator, as shipped, for the length of a `with` block (to compare the
    two: scripts/simulator_speed.py, tests/test_numba_patches.py). keep_shortcuts: put back only
    what needs greenlets, and keep the shortcuts that are right under both schedulers (the
    shared-array lookup among them, whose atomic store makes numba-cuda's threads race-free).
    Not for the sanitizer, which counts barriers on SimulatedThread."""
    restored = [patch for patch in _originals if patch[4] or not keep_shortcuts]
    for owner, name, theirs, _, _ in restored:
        setattr(owner, name, theirs)
    try:
        yield
    finally:
        for owner, name, _, ours, _ in restored:
            setattr(owner, name, ours)
