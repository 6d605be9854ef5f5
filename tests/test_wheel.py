"""The course as a real package: a wheel built from the checkout's tracked files, installed
non-editable into a fresh virtual environment, runs an exercise check and notebook 00.

Cheap by design: nothing is downloaded when the test environment can build wheels itself
(setuptools >= 70.1, the `test` extra). The new environment gets its dependencies (numba-cuda,
NumPy, nbval, ...) by putting this environment's site-packages after its own, and copies every
start-up file (.pth) of this environment except the editable install's: the checkout can then
not shadow the wheel, and the test proves that each module comes from the new site-packages.
"""

import importlib.metadata
import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOK = "00_gpu_basics.ipynb"
# Modules whose origin is checked inside the new environment: the package, each subpackage, data.
PROBE = """
import importlib, json, pkgutil, sys
import attention_lib, attention_lib.checks, attention_lib.stages
from attention_lib.checks import check
names = ["attention_lib"] + [m.name for m in pkgutil.walk_packages(attention_lib.__path__, "attention_lib.")]
files = {name: importlib.import_module(name).__file__ for name in names}
from numba import cuda

@cuda.jit
def answer(alpha, x, y, out):                     # a student's scale_add (the library's own is refused)
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = alpha * x[i] + y[i]

result = check("00_scale_add", answer, verbose=False)
print(json.dumps({"files": files, "passed": bool(result.passed), "backend": attention_lib.BACKEND}))
"""


def _can_build_without_isolation():
    """True when this environment's setuptools builds wheels by itself (no download needed)."""
    try:
        setuptools = Version(importlib.metadata.version("setuptools"))
    except importlib.metadata.PackageNotFoundError:
        return False
    try:
        importlib.metadata.version("wheel")
        has_wheel = True
    except importlib.metadata.PackageNotFoundError:
        has_wheel = False
    return setuptools >= Version("70.1") or (setuptools >= Version("68") and has_wheel)


def _tracked_copy(destination):
    """The checkout's git-tracked files (as they are in the working tree) under `destination`."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():                     # a tracked file deleted in the working tree is skipped
            (destination / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, destination / name)


def _fresh_venv(path):
    """A new virtual environment whose imports fall back on this one's packages, not its checkout."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    python = path / "bin" / "python"
    own = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                              capture_output=True, text=True, check=True).stdout.strip())
    base = [Path(p) for p in site.getsitepackages()]
    # "00" sorts before every other start-up file, so the base paths are there when those run.
    (own / "00_base_environment.pth").write_text("".join(f"{p}\n" for p in base))
    for directory in base:
        for pth in directory.glob("*.pth"):
            text = pth.read_text()
            if "attention_lib" in pth.name or "attention_lib" in text or str(ROOT) in text:
                continue                         # the editable install of the checkout: left out
            shutil.copy2(pth, own / pth.name)
        if (directory / "nvidia").is_dir() and not (own / "nvidia").exists():
            # NVIDIA's compiler wheels: CUDA's library finder looks in the environment's own
            # site-packages only (site.getsitepackages), so the GPU compile check needs them there.
            (own / "nvidia").symlink_to(directory / "nvidia")
    return python, own


def _clean_env():
    """This process's environment without anything that points imports at the checkout."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "ATTENTION_LIB_BACKEND", "NUMBA_ENABLE_CUDASIM", "PYTHONSTARTUP")}
    env["PYTHONNOUSERSITE"] = "1"
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python, site-packages, wheel) of a fresh environment holding the course's wheel."""
    work = tmp_path_factory.mktemp("wheel")
    source, dist = work / "source", work / "dist"
    _tracked_copy(source)
    # Without a wheel-building setuptools here, pip fetches one into an isolated build environment.
    no_isolation = ["--no-build-isolation"] if _can_build_without_isolation() else []
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", *no_isolation,
                            "--wheel-dir", str(dist), str(source)], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr[-3000:]
    wheel, = dist.glob("attention_lib-*.whl")
    python, own = _fresh_venv(work / "venv")
    done = subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                           "--no-deps", "--no-index", str(wheel)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return python, own, wheel


def test_the_wheel_holds_every_subpackage_and_data_file(installed):
    _, _, wheel = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    tracked = subprocess.run(["git", "ls-files", "attention_lib"], cwd=ROOT, capture_output=True,
                             text=True, check=True).stdout.split()
    wanted = {n for n in tracked if n.endswith((".py", ".npz"))}
    assert wanted, "git lists no package files"
    assert not wanted - names, f"missing from the wheel: {sorted(wanted - names)}"
    assert {"attention_lib/checks/__init__.py", "attention_lib/stages/__init__.py"} <= names
    assert not any(n.startswith(("tests/", "notebooks/", "scripts/")) for n in names)


def test_installed_non_editable_and_imported_from_the_new_environment(installed, tmp_path):
    python, own, _ = installed
    done = subprocess.run([str(python), "-c", PROBE], cwd=tmp_path, env=_clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert {"attention_lib.checks", "attention_lib.stages.flash", "attention_lib.checks.ex00_scale_add"} <= set(found["files"])
    outside = {name: f for name, f in found["files"].items() if not Path(f).is_relative_to(own)}
    assert not outside, f"imported from outside the new environment: {outside}"
    assert found["passed"], "the library's own kernel failed exercise 00's check"
    direct_url = next(own.glob("attention_lib-*.dist-info")) / "direct_url.json"
    assert not json.loads(direct_url.read_text()).get("dir_info", {}).get("editable", False)


def test_notebook_00_runs_from_the_installed_wheel(installed, tmp_path):
    python, own, _ = installed
    shutil.copy2(ROOT / "notebooks" / NOTEBOOK, tmp_path / NOTEBOOK)
    env = _clean_env() | {"ATTENTION_LIB_BACKEND": "simulator"}
    done = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval-lax",
                           "--nbval-current-env", NOTEBOOK], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:]
    assert " passed" in done.stdout and "failed" not in done.stdout
