"""The GPU configuration, tested without a GPU: tests/gpu_configuration/run.py starts a process
configured exactly as on a GPU machine but for the device (simulator off where attention_lib is
imported, GPU block sizes and kernel versions, the sanitizer simulating beside a GPU, stand-ins
for device memory, launches and events: tests/gpu_configuration/fake_device.py), and runs there
the sanitizer on every kernel, the bench on a fake clock and the notebooks' GPU branches."""

import os
import subprocess
import sys
from pathlib import Path

RUN = Path(__file__).resolve().parent / "gpu_configuration" / "run.py"


def test_the_gpu_configuration_runs_every_check():
    env = {k: v for k, v in os.environ.items() if k not in ("ATTENTION_LIB_BACKEND", "NUMBA_ENABLE_CUDASIM",
                                                            "ATTENTION_LIB_SHAPES")}
    done = subprocess.run([sys.executable, str(RUN)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-2000:]


def test_the_runner_fails_when_a_check_fails(tmp_path):
    failing = tmp_path / "check_planted.py"
    failing.write_text("import attention_lib\n\ndef test_planted():\n    assert attention_lib.ON_SIMULATOR\n")
    done = subprocess.run([sys.executable, str(RUN), str(failing)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "1 failed" in done.stdout, done.stdout[-2000:]


# What the GPU machine's image lacks (it has numba-cuda, numpy, matplotlib, pytest and PyTorch).
NOT_ON_THE_GPU_IMAGE = ("greenlet", "nbval", "nbformat", "nbconvert", "nbclient", "ipykernel",
                        "jupyter_client", "jupyterlab", "nbgrader")
IMPORT_EVERYTHING = f"""
import sys
for name in {NOT_ON_THE_GPU_IMAGE!r}:
    sys.modules[name] = None                 # import name -> ImportError, as on the image
from numba import cuda                       # the simulator off: a GPU process
import importlib, pkgutil
import attention_lib
assert attention_lib.BACKEND == "gpu"
imported = [importlib.import_module(info.name).__name__
            for info in pkgutil.walk_packages(attention_lib.__path__, "attention_lib.")
            if info.name != "attention_lib.platform.simulator"]   # greenlets: what the bundle brings
from attention_lib.measure import kernel_cases
print(len(imported), len(kernel_cases.library_kernels()))
try:
    importlib.import_module("attention_lib.platform.simulator")
except ImportError as error:
    print("simulator:", error)
"""


def test_the_package_imports_without_what_the_gpu_image_lacks():
    """Only the simulator needs greenlet (the sanitizer and the checks import it when they
    simulate); nothing imports the notebook tools."""
    env = {k: v for k, v in os.environ.items() if k not in ("ATTENTION_LIB_BACKEND", "ATTENTION_LIB_SHAPES")}
    env["NUMBA_ENABLE_CUDASIM"] = "0"
    done = subprocess.run([sys.executable, "-c", IMPORT_EVERYTHING], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    modules, kernels = (int(n) for n in done.stdout.split()[:2])
    assert modules > 40 and kernels > 25, done.stdout
    assert "simulator: import of greenlet halted" in done.stdout, done.stdout
