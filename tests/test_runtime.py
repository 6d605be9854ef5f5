"""The backend choice (GPU or simulator), its one-line explanation, and the course sizes."""

import os
import subprocess
import sys

import attention_lib
from attention_lib.platform import runtime


def _python(code, **env_changes):
    """Run `code` in a fresh interpreter (the choice is made once per process)."""
    env = {k: v for k, v in os.environ.items() if k not in ("ATTENTION_LIB_BACKEND", "NUMBA_ENABLE_CUDASIM")}
    env.update(env_changes)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def test_banner_is_one_line_naming_backend_reason_and_switch():
    banner = attention_lib.banner()
    assert "\n" not in banner
    assert runtime.REASON in banner
    assert runtime.BACKEND_VARIABLE in banner
    assert ("simulator" in banner) == runtime.ON_SIMULATOR


def test_numba_follows_the_choice():
    import numba
    assert bool(numba.config.ENABLE_CUDASIM) == runtime.ON_SIMULATOR


def test_sizes_follow_backend_and_share_the_shape():
    expected = runtime.ANDREA_SIMULATOR if runtime.ON_SIMULATOR else runtime.ANDREA_120M
    assert attention_lib.SIZES == expected
    big = runtime.ANDREA_120M
    assert (big.d_model, big.n_head, big.d_k, big.T, big.n_layer) == (768, 12, 64, 1024, 12)
    for sizes in (runtime.ANDREA_120M, runtime.ANDREA_SIMULATOR):
        assert sizes.d_k * sizes.n_head == sizes.d_model
        assert sizes.n_head > 1 and sizes.batch > 1


def test_forcing_the_simulator():
    done = _python("import attention_lib, numba; print(attention_lib.BACKEND, numba.config.ENABLE_CUDASIM)",
                   ATTENTION_LIB_BACKEND="simulator")
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["simulator", "1"]


def test_numba_variable_selects_the_simulator():
    done = _python("import attention_lib; print(attention_lib.platform.runtime.REASON)", NUMBA_ENABLE_CUDASIM="1")
    assert done.returncode == 0, done.stderr
    assert "NUMBA_ENABLE_CUDASIM" in done.stdout


def test_unknown_backend_value_is_a_one_line_error():
    done = _python("import attention_lib", ATTENTION_LIB_BACKEND="tpu")
    assert done.returncode != 0
    assert "ValueError: ATTENTION_LIB_BACKEND must be 'auto', 'gpu' or 'simulator', got 'tpu'" in done.stderr


def test_forcing_the_gpu_uses_it_or_says_in_one_line_why_not():
    driver = runtime._find_driver()
    usable, _ = runtime.gpu_verdict(runtime._probe_gpu(driver) if driver else {"driver": None})
    done = _python("import attention_lib; print(attention_lib.BACKEND)", ATTENTION_LIB_BACKEND="gpu")
    if usable:
        assert done.returncode == 0 and done.stdout.strip() == "gpu", done.stderr
        return
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("RuntimeError: ATTENTION_LIB_BACKEND=gpu but ")


def test_numba_loaded_but_not_its_cuda_module_still_follows_the_choice():
    done = _python("import numba; import attention_lib; from numba import cuda; print(numba.config.ENABLE_CUDASIM)",
                   ATTENTION_LIB_BACKEND="simulator")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"
