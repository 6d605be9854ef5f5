"""Choosing the GPU: the driver and the toolkit must agree and a one-thread kernel must run.

Two levels, no GPU needed:
- ``gpu_verdict`` on the probe's answers written by hand, one case per decision;
- the whole choice in a fresh interpreter against a fake CUDA driver (a small C library built
  here with the system's C compiler, answering cuInit, cuDriverGetVersion, ... from environment
  variables, and logging each call with the calling process's id).
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
from attention_lib.platform import runtime

FAKE_DRIVER = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
static int answer(const char *call, const char *variable, int fallback) {
    const char *log = getenv("FAKE_CUDA_LOG");
    if (log) { FILE *f = fopen(log, "a"); if (f) { fprintf(f, "%d %s\n", (int)getpid(), call); fclose(f); } }
    const char *value = getenv(variable);
    return value ? atoi(value) : fallback;
}
int cuInit(unsigned int flags) { return answer("cuInit", "FAKE_CUDA_INIT", 0); }
int cuDriverGetVersion(int *v) { *v = answer("cuDriverGetVersion", "FAKE_CUDA_VERSION", 13000); return 0; }
int cuDeviceGetCount(int *n) { *n = answer("cuDeviceGetCount", "FAKE_CUDA_DEVICES", 1); return 0; }
int cuDeviceGet(int *d, int i) { *d = i; return 0; }
int cuDeviceGetName(char *name, int len, int d) { strncpy(name, "Tesla T4", len); return 0; }
int cuDeviceGetAttribute(int *v, int attribute, int d) { *v = attribute == 75 ? 7 : 5; return 0; }
"""

T4 = {"driver": "libcuda.so.1", "driver_version": 12040, "devices": 1, "name": "Tesla T4", "cc": [7, 5]}


@pytest.mark.parametrize("probe, usable, expected", [
    ({"driver": None}, False, "no CUDA driver (libcuda) is installed"),
    ({"driver": "libcuda.so.1", "error": "the GPU check did not finish in 120 s"}, False, "did not finish in 120 s"),
    ({"driver": "libcuda.so.1", "init": "cuInit returned error 100"}, False,
     "the CUDA driver (libcuda.so.1) did not initialise (cuInit returned error 100)"),
    ({"driver": "libcuda.so.1", "driver_version": 12040, "devices": 0}, False, "the CUDA driver reports no GPU"),
    (T4 | {"driver_version": 11080}, False, "driver for CUDA 11.8), older than the CUDA 12 the course's toolkits "
                                            "need: update the NVIDIA driver"),
    (T4 | {"toolkit": None}, False, "toolkit is missing: pip install -e \".[gpu-cu12]\""),
    (T4 | {"driver_version": 13000, "toolkit": None}, False, "toolkit is missing: pip install -e \".[gpu]\""),
    (T4 | {"toolkit": "13.5.0"}, False,
     "the installed toolkit is CUDA 13.5.0, newer than the driver runs: pip install -e \".[gpu-cu12]\""),
    (T4 | {"toolkit": "12.9.1", "launch": "CudaAPIError: [222] CUDA_ERROR_UNSUPPORTED_PTX_VERSION"}, False,
     "test kernel failed (CudaAPIError: [222] CUDA_ERROR_UNSUPPORTED_PTX_VERSION): update the NVIDIA driver "
     "to one for CUDA 12.9 or newer"),
    (T4 | {"driver_version": 13000, "toolkit": "12.9.1", "launch": "RuntimeError: no kernel image"}, False,
     "test kernel failed (RuntimeError: no kernel image): pip install -e \".[gpu]\""),
    (T4 | {"toolkit": "12.9.1", "launch": None}, True,
     "found Tesla T4 (sm_75, driver for CUDA 12.4), toolkit CUDA 12.9.1; a test kernel ran"),
])
def test_each_decision_in_one_line(probe, usable, expected):
    got_usable, why = runtime.gpu_verdict(probe)
    assert got_usable is usable
    assert expected in why
    assert "\n" not in why


def test_the_install_command_follows_the_drivers_cuda_major_version():
    assert runtime.install_command(12020).startswith('pip install -e ".[gpu-cu12]"')
    assert runtime.install_command(13000).startswith('pip install -e ".[gpu]"')
    assert runtime.cuda_version(12040) == "12.4" and runtime.cuda_version(13010) == "13.1"


def test_a_probe_that_hangs_or_crashes_is_a_reason_not_a_crash(monkeypatch):
    def hang(*args, **kwargs):
        raise subprocess.TimeoutExpired(args[0], runtime.PROBE_TIMEOUT_S)
    monkeypatch.setattr(subprocess, "run", hang)
    assert runtime.gpu_verdict(runtime._probe_gpu("libcuda.so.1")) == (
        False, f"the GPU check did not finish in {runtime.PROBE_TIMEOUT_S} s")

    def crash(*args, **kwargs):
        return subprocess.CompletedProcess(args[0], -11, stdout="", stderr="Fatal Python error: Segmentation fault\n")
    monkeypatch.setattr(subprocess, "run", crash)
    assert runtime.gpu_verdict(runtime._probe_gpu("libcuda.so.1")) == (
        False, "the GPU check failed (Fatal Python error: Segmentation fault)")


@pytest.fixture(scope="module")
def fake_driver(tmp_path_factory):
    """A directory holding a fake libcuda.so.1, for LD_LIBRARY_PATH."""
    directory = tmp_path_factory.mktemp("fake_cuda")
    (directory / "fake.c").write_text(FAKE_DRIVER)
    subprocess.run(["cc", "-shared", "-fPIC", "-o", str(directory / "libcuda.so.1"), str(directory / "fake.c")],
                   check=True)
    return directory


def _with_driver(fake_driver, code, **answers):
    """Run `code` in a fresh interpreter that finds the fake driver; `answers` set its replies."""
    env = {k: v for k, v in os.environ.items() if k not in ("ATTENTION_LIB_BACKEND", "NUMBA_ENABLE_CUDASIM")}
    env["LD_LIBRARY_PATH"] = str(fake_driver)
    env.update(answers)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)


CHOICE = "import os, attention_lib; print(os.getpid()); print(attention_lib.BACKEND); print(attention_lib.platform.runtime.REASON)"


def test_cuda_12_driver_with_the_cuda_13_toolkit_falls_back_naming_the_fix(fake_driver, tmp_path):
    log = tmp_path / "calls.log"
    done = _with_driver(fake_driver, CHOICE, FAKE_CUDA_VERSION="12040", FAKE_CUDA_LOG=str(log))
    assert done.returncode == 0, done.stderr
    pid, backend, reason = done.stdout.strip().splitlines()[-3:]
    assert backend == "simulator"
    assert reason.startswith("found Tesla T4 (sm_75, driver for CUDA 12.4)")
    assert 'pip install -e ".[gpu-cu12]"' in reason, reason      # toolkit too new, or missing
    # The driver was asked, but never by this process: it can still fork CUDA-using children.
    calls = [line.split() for line in log.read_text().splitlines()]
    assert ["cuInit"] in [c[1:] for c in calls]
    assert all(c[0] != pid for c in calls), "the importing process initialised CUDA itself"


def test_forcing_the_gpu_on_a_mismatch_refuses_in_one_line(fake_driver):
    done = _with_driver(fake_driver, "import attention_lib", ATTENTION_LIB_BACKEND="gpu", FAKE_CUDA_VERSION="12040")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: ATTENTION_LIB_BACKEND=gpu but found Tesla T4 (sm_75, driver for CUDA 12.4)")
    assert last.endswith("; unset it to use the simulator")


def test_a_failed_test_launch_falls_back(fake_driver):
    """A CUDA 13 driver passes the version test; the fake has no real driver API behind it, so
    the one-thread kernel fails, as it does on a broken driver installation."""
    done = _with_driver(fake_driver, CHOICE, FAKE_CUDA_VERSION="13090")
    assert done.returncode == 0, done.stderr
    _, backend, reason = done.stdout.strip().splitlines()[-3:]
    assert backend == "simulator"
    assert "a one-thread test kernel failed (" in reason or "toolkit is missing" in reason, reason


@pytest.mark.parametrize("answers, expected", [
    ({"FAKE_CUDA_DEVICES": "0"}, "the CUDA driver reports no GPU"),
    ({"FAKE_CUDA_INIT": "100"}, "the CUDA driver (libcuda.so.1) did not initialise (cuInit returned error 100)"),
])
def test_a_driver_without_a_usable_gpu_falls_back(fake_driver, answers, expected):
    done = _with_driver(fake_driver, CHOICE, **answers)
    assert done.returncode == 0, done.stderr
    _, backend, reason = done.stdout.strip().splitlines()[-3:]
    assert (backend, reason) == ("simulator", expected)


def test_the_probe_script_imports_nothing_of_the_course():
    source = Path(runtime.PROBE_SCRIPT).read_text()
    assert "attention_lib" not in source.split('"""', 2)[2]
