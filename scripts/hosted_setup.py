"""Install the course into a hosted notebook's Python (Colab, Kaggle, ...), with the CUDA toolkit
that matches the GPU's driver, and say whether the notebook's kernel must be restarted.

The toolkit is the course's extra for that driver (``gpu``: CUDA 13, ``gpu-cu12``: CUDA 12): numba-cuda's
compiler and runtime, and the kernel report's ptxas and nvdisasm, pinned to the NVVM they read.

In a notebook cell, with the course's folder (cloned or uploaded) beside the notebook:

    %run attention-course/scripts/hosted_setup.py attention-course

In a terminal: ``python scripts/hosted_setup.py . [--dry-run]`` (``--dry-run`` prints the pip
command and installs nothing). The folder is copied first, so a read-only upload installs too.
"""

import importlib
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# Packages the install may upgrade: if one was imported already, the old version stays loaded.
WATCHED = {"numpy": "numpy", "numba": "numba", "llvmlite": "llvmlite", "matplotlib": "matplotlib",
           "numba-cuda": "numba_cuda", "cuda-bindings": "cuda.bindings", "attention-lib": "attention_lib"}


def driver_cuda_major():
    """The CUDA major version the GPU's driver runs (nvidia-smi's "CUDA Version"), or None."""
    try:
        shown = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r"CUDA Version:\s*(\d+)\.", shown)
    return int(found.group(1)) if found else None


def toolkit_extra(major):
    """The course's extra for a driver of CUDA `major`: gpu-cu12, gpu (CUDA 13 on), or None (no GPU,
    or a driver too old for any toolkit: the simulator then)."""
    if major is None or major < 12:
        return None
    return "gpu-cu12" if major == 12 else "gpu"


def installed_versions():
    """{distribution: version or None} of the watched packages."""
    versions = {}
    for name in WATCHED:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def restart_reasons(before, after, imported):
    """Why the notebook's kernel must restart: the packages that changed while loaded."""
    return [f"{name} {before[name]} -> {after[name]}" for name in WATCHED
            if before[name] != after[name] and WATCHED[name] in imported]


def main(argv):
    folder = Path(argv[0] if argv else ".").resolve()
    if not (folder / "pyproject.toml").is_file():
        raise SystemExit(f"{folder} is not the course's folder (no pyproject.toml): clone or upload it first")
    major = driver_cuda_major()
    extra = toolkit_extra(major)
    copy = Path(tempfile.mkdtemp(prefix="attention-course-")) / "course"
    target = f"{copy}[{extra}]" if extra else str(copy)
    command = [sys.executable, "-m", "pip", "install", "--quiet", target]
    where = f"driver for CUDA {major}, extra {extra}" if extra else "no usable GPU driver: the simulator"
    print(f"Installing the course ({where}): {' '.join(command)}")
    if "--dry-run" in argv:
        return
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns(".git", ".venv", "release", "build", "*.egg-info"))
    before = installed_versions()
    subprocess.run(command, check=True)
    importlib.invalidate_caches()
    reasons = restart_reasons(before, installed_versions(), set(sys.modules))
    if "numba.cuda" in sys.modules:
        reasons.append("numba.cuda is loaded, so attention_lib could not choose the backend")
    if reasons:
        print(f"Restart the kernel now (Colab: Runtime > Restart session), then run from the top: {'; '.join(reasons)}.")
    else:
        print("Installed; no restart needed: run the next cell.")


if __name__ == "__main__":
    main(sys.argv[1:])
