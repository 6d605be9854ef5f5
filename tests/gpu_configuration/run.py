"""The checks of a process configured as on a GPU machine (fake_device.py), as one pytest run.

    python tests/gpu_configuration/run.py [pytest arguments]

tests/test_gpu_configuration.py runs it inside `make test`. The files run in the order below.
"""

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]        # fake_device, and the tests' cell_slices

import fake_device  # noqa: E402  (first: it keeps the simulator off in this process)

fake_device.install()

import pytest  # noqa: E402

FILES = ["check_configuration.py", "check_sanitizer.py", "check_window.py", "check_bench.py", "check_notebook_cells.py"]

if __name__ == "__main__":
    arguments = sys.argv[1:] or [str(HERE / name) for name in FILES]
    sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "-o", "python_files=check_*.py",
                          "--confcutdir", str(HERE), "--rootdir", str(HERE), *arguments]))
