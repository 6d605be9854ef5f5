"""Every change the library makes to numba-cuda's internals that lives outside the code using it.

Checked against numba-cuda ``CHECKED_WITH``; tests/test_numba_patches.py fails, naming the
attribute, when one of them is gone (the first thing to look at after an upgrade).

- ``compile_for(cc)``: compile for a chosen GPU where none is present (the compile check, the
  kernel report). Replaces ``numba.cuda.dispatcher.get_current_device``.
- ``lock_simulator_shared_arrays()``: the simulator's shared-array race (below). Replaces
  ``numba.cuda.simulator.kernelapi.FakeCUDAShared.array`` for the life of the process.

``ELSEWHERE`` lists the internals that other modules patch or read in place (the sanitizer's
recording, the bench's launch recorder), checked by the same test. Nothing here imports Numba at module level: ``attention_lib.runtime`` imports this module
before Numba's CUDA target is chosen.
"""

import sys
import threading
from types import SimpleNamespace

import numpy as np

CHECKED_WITH = "0.30.4"

# (module, attribute) of every internal patched above; the test checks they still exist.
# `dispatcher` is the GPU target's module and is checked in a process with the simulator off.
PATCHED = {
    "compile_for": ("numba.cuda.dispatcher", "get_current_device"),
    "lock_simulator_shared_arrays": ("numba.cuda.simulator.kernelapi", "FakeCUDAShared.array"),
}

# Internals patched (for the length of one launch) or read where they are used, left there
# because they are part of that code's logic; listed so an upgrade is checked in one place.
ELSEWHERE = {
    "sanitizer: shared arrays recorded": ("numba.cuda.simulator.kernelapi", "FakeCUDAShared.array"),
    "sanitizer: barriers counted": ("numba.cuda.simulator.kernel", "BlockThread.syncthreads"),
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


def lock_simulator_shared_arrays():
    """Make the simulator create each shared array once per block, whatever the thread timing.

    The simulator's ``cuda.shared.array`` looks its array up by the declaring line and creates
    it on a miss, with no lock: when the interpreter switches threads between the lookup and
    the store, two threads of one block get two different "shared" arrays and the kernel
    silently computes garbage (seen about once in 300 launches of the fused attention kernel
    with a 1 us switch interval). This is the same lookup, under a lock.
    """
    from numba.cuda.simulator import kernelapi
    from numba.cuda import types
    from numba.cuda.np import numpy_support

    original = kernelapi.FakeCUDAShared.array
    lock = threading.Lock()

    def array(self, shape, dtype, alignment=None):
        if shape == 0 or alignment is not None:    # dynamic shared memory: one buffer, no lookup
            return original(self, shape, dtype, alignment)
        if isinstance(dtype, types.Type):
            dtype = numpy_support.as_dtype(dtype)
        caller = sys._getframe(1)                  # the kernel line that declares the array
        site = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            shared = self._allocations.get(site)
            if shared is None:
                shared = self._allocations[site] = np.empty(shape, dtype)
        return shared

    kernelapi.FakeCUDAShared.array = array
