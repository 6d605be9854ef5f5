"""Every numba-cuda internal the library replaces or reads, with the version it was checked against.

Checked against numba-cuda ``CHECKED_WITH``; ``missing_internals()`` names each one that is gone
(tests/test_numba_patches.py fails on it, and the GPU check prints it as one line per patch: the
first thing to look at after an upgrade).

- ``compile_for(cc)``: compile for a chosen GPU where none is present (the compile check, the
  kernel report). Replaces ``numba.cuda.dispatcher.get_current_device``.
- ``simulator.install()`` (attention_lib/platform/simulator.py): the simulator's CUDA threads as
  greenlets, warp primitives, barrier checking, GPU-only options. Replaces the internals in
  ``PATCHED`` below for the life of the process.

``ELSEWHERE`` lists the internals that other modules patch or read in place (the sanitizer's
recording, the bench's launch recorder, the launch that raises a kernel's shared memory).
This module imports neither Numba nor greenlet: a GPU process imports it without either loaded.
"""

import importlib
from types import SimpleNamespace

CHECKED_WITH = "0.30.4"

# (module, attribute) of every internal replaced; `dispatcher` is the GPU target's module and
# is checked in a process with the simulator off.
PATCHED = {
    "compile_for": ("numba.cuda.dispatcher", "get_current_device"),
    "simulated threads: blocks run on greenlets": ("numba.cuda.simulator.kernel", "BlockManager.run"),
    "simulated current thread": ("numba.cuda.simulator.kernelapi", "threading"),
    "shared arrays by the caller's frame": ("numba.cuda.simulator.kernelapi", "FakeCUDAShared.array"),
    "launches checked, globals simulated": ("numba.cuda.simulator.kernel", "FakeCUDAKernel.__call__"),
    "device calls counted without locks": ("numba.cuda.simulator.kernelapi", "_swap_refcount"),
    "device calls: the modules swapped back": ("numba.cuda.simulator.kernelapi", "_swap_orig"),
    "simulated element access": ("numba.cuda.simulator.cudadrv.devicearray",
                                 "FakeWithinKernelCUDAArray.__getitem__"),
    "warp primitives on the simulator's cuda": ("numba.cuda.simulator.kernelapi", "FakeCUDAModule"),
    "jit takes the GPU's options": ("numba.cuda.simulator.api", "jit"),
}

# Internals patched (for the length of one launch) or read where they are used, left there
# because they are part of that code's logic; listed so an upgrade is checked in one place.
ELSEWHERE = {
    "sanitizer: atomics recorded": ("numba.cuda.simulator.kernelapi", "FakeCUDAAtomic.add"),
    "sanitizer: a kernel simulated beside a GPU": ("numba.cuda.simulator.kernel", "FakeCUDAKernel"),
    "sanitizer: device arrays unwrapped": ("numba.cuda.simulator.cudadrv.devicearray", "FakeCUDAArray"),
    "bench: launches recorded": ("numba.cuda.simulator.kernel", "FakeCUDAKernel.__getitem__"),
    "kernel_cases: kernels told from device functions": ("numba.cuda.simulator.kernel", "FakeCUDAKernel"),
}


def missing_internals(which=("PATCHED", "ELSEWHERE"), gpu_target=False):
    """One line per internal above that this numba-cuda no longer has, naming the patch it
    breaks: [] when all are there. gpu_target: also check ``compile_for``'s, which only exists
    in a process whose numba.cuda is the GPU target (the simulator off)."""
    lines = []
    for table in which:
        for what, (module_name, attribute) in globals()[table].items():
            if module_name == "numba.cuda.dispatcher" and not gpu_target:
                continue
            try:
                owner = importlib.import_module(module_name)
                for part in attribute.split("."):
                    owner = getattr(owner, part)
            except (ImportError, AttributeError) as error:
                lines.append(f"numba-cuda patch '{what}' is off: {module_name}.{attribute} is gone "
                             f"({type(error).__name__}; checked with numba-cuda {CHECKED_WITH})")
    return lines


def compile_for(cc):
    """Compile for compute capability `cc` (a pair such as (9, 0)) even where no GPU is present.

    numba-cuda compiles a device function called by a kernel for the *current* device's compute
    capability (``dispatcher`` asks the driver through ``get_current_device``), which fails
    without a GPU; this tells it the architecture being compiled for instead. Only for a process
    that compiles and never launches.
    """
    from numba.cuda import dispatcher
    dispatcher.get_current_device = lambda: SimpleNamespace(compute_capability=tuple(cc))
