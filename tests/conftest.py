"""Shared fixtures, and the order the files are collected in. attention_lib is imported before
numba: it chooses GPU or simulator before numba.cuda loads."""

from pathlib import Path

import attention_lib  # noqa: F401  (must precede any numba.cuda import)
import numpy as np
import pytest


# Run by tests/test_gpu_configuration.py in a process configured as on a GPU machine, not here.
collect_ignore = ["gpu_configuration"]


@pytest.fixture
def rng():
    """A fresh, seeded generator per test: random data, the same on every run."""
    return np.random.default_rng(12345)


# `make test`'s two workers take whole files (--dist loadfile) in collection order
# (--no-loadscope-reorder), so a slow file collected last keeps one worker busy while the other
# has finished. The slowest files (measured from the JUnit report of a make test, slowest first)
# are collected first, then the other notebooks (several seconds each), then the other test
# files; the tests inside every file keep their order.
SLOW_FILES_FIRST = ("tests/test_gpu_configuration.py", "tests/test_grading.py", "tests/test_student_copies.py",
                    "tests/test_kernel_report.py", "tests/test_gpu_check.py", "tests/test_jupyterhub.py",
                    "tests/test_browser.py", "tests/test_compile.py", "tests/test_projection.py",
                    "tests/test_gqa.py", "tests/test_exercises_10.py", "tests/test_race_free.py",
                    "tests/test_exercises_03.py", "notebooks/11_backward.ipynb", "tests/test_wheel.py",
                    "notebooks/09_kv_cache_decoding.ipynb", "notebooks/07_fused_attention.ipynb",
                    "tests/test_properties.py", "tests/test_flash.py", "tests/test_exercises_02.py")


def pytest_collection_modifyitems(session, config, items):
    rank = {path: n for n, path in enumerate(SLOW_FILES_FIRST)}
    root = Path(str(config.rootpath))

    def place(item):
        path = Path(str(item.fspath))
        name = path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)
        return rank.get(name, len(rank) + (path.suffix != ".ipynb"))
    items.sort(key=place)
