"""The numba-cuda internals that attention_lib/numba_patches.py replaces are still there, and
still the ones numba-cuda uses: after an upgrade this file fails first, naming the attribute."""

import importlib
import os
import subprocess
import sys

from attention_lib import numba_patches

UPGRADE = f"(checked with numba-cuda {numba_patches.CHECKED_WITH}; see attention_lib/numba_patches.py)"


def _resolve(module_name, attribute):
    owner = importlib.import_module(module_name)
    for part in attribute.split("."):
        assert hasattr(owner, part), f"{module_name}.{attribute} is gone {UPGRADE}"
        owner = getattr(owner, part)
    return owner


def test_simulator_shared_array_patch_still_applies():
    module_name, attribute = numba_patches.PATCHED["lock_simulator_shared_arrays"]
    _resolve(module_name, attribute)
    from numba.cuda.simulator import kernelapi
    # The locked lookup reads and fills the same per-block table the simulator's own uses.
    assert "_allocations" in kernelapi.FakeCUDAShared.__init__.__code__.co_names, \
        f"FakeCUDAShared no longer keeps its arrays in _allocations {UPGRADE}"


def test_compile_target_patch_still_applies():
    """In a process with the simulator off, as the compile check and the kernel report run."""
    module_name, attribute = numba_patches.PATCHED["compile_for"]
    program = (
        "import os; os.environ['NUMBA_ENABLE_CUDASIM'] = '0'\n"
        "from numba import cuda\n"
        "from numba.cuda import dispatcher\n"
        f"assert hasattr(dispatcher, {attribute!r}), 'gone'\n"
        "uses = [f for f in vars(dispatcher.CUDADispatcher).values()\n"
        f"        if {attribute!r} in getattr(getattr(f, '__code__', None), 'co_names', ())]\n"
        "assert uses, 'unused'\n"
        "from attention_lib.numba_patches import compile_for\n"
        "compile_for((8, 0))\n"
        f"assert dispatcher.{attribute}().compute_capability == (8, 0), 'not replaced'\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "ATTENTION_LIB_BACKEND"}
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, (f"{module_name}.{attribute}: {done.stderr.strip().splitlines()[-1]} "
                                  f"{UPGRADE}")


def test_internals_patched_elsewhere_still_exist():
    from numba.cuda.simulator import kernel
    from numba.cuda.simulator.cudadrv import devicearray
    for what, (module_name, attribute) in numba_patches.ELSEWHERE.items():
        assert _resolve(module_name, attribute) is not None, what
    # What the sanitizer and kernel_cases read on the simulator's objects.
    assert "_ary" in devicearray.FakeCUDAArray.__init__.__code__.co_names, f"FakeCUDAArray._ary {UPGRADE}"
    assert "_device" in kernel.FakeCUDAKernel.__init__.__code__.co_names, f"FakeCUDAKernel._device {UPGRADE}"
