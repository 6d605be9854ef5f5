"""Running the course where it is not installed yet: each notebook's first cell says what to do,
and the hosted-notebook setup (scripts/hosted_setup.py) picks the toolkit matching the driver."""

import contextlib
import importlib.util
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

import attention_lib

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
SCRIPT = ROOT / "scripts" / "hosted_setup.py"
SETUP_CELL = re.compile(r"```python\n(COURSE = .*?hosted_setup\.py.*?)\n```", re.S)


def _first_code_cell(path):
    return next(c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")


def _setup_module():
    spec = importlib.util.spec_from_file_location("hosted_setup", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_first_cell_says_in_one_line_what_to_do_without_the_course(path, monkeypatch):
    monkeypatch.setitem(sys.modules, "attention_lib", None)       # `import attention_lib` now fails
    with pytest.raises(ModuleNotFoundError) as missing:
        exec(_first_code_cell(path).source, {})
    message = str(missing.value)
    assert "\n" not in message
    assert message.startswith("attention_lib is missing: run `make lab` in the course folder")
    assert "setup cell at the top of 00_gpu_basics.ipynb" in message
    assert missing.value.__cause__ is None and missing.value.__suppress_context__


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_first_cell_prints_the_banner_when_the_course_is_there(path):
    cell = _first_code_cell(path)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(cell.source, {})
    assert printed.getvalue() == attention_lib.banner() + "\n"
    committed = "".join(o.get("text", "") for o in cell.outputs)
    assert committed.startswith("Kernels run on ") and committed.count("\n") == 1


def test_readme_and_notebook_00_show_the_same_setup_cell():
    notebook = "\n".join(c.source for c in nbformat.read(NOTEBOOKS[0], as_version=4).cells
                         if c.cell_type == "markdown")
    in_notebook, in_readme = SETUP_CELL.findall(notebook), SETUP_CELL.findall((ROOT / "README.md").read_text())
    assert len(in_notebook) == 1 and in_readme == in_notebook
    assert f"scripts/{SCRIPT.name}" in in_notebook[0]


@pytest.mark.parametrize("major, extra", [(None, None), (11, None), (12, "gpu-cu12"), (13, "gpu"), (14, "gpu")])
def test_the_extra_follows_the_drivers_cuda_version(major, extra):
    assert _setup_module().toolkit_extra(major) == extra


@pytest.mark.parametrize("major", [12, 13])
def test_the_extra_installed_brings_the_kernel_reports_tools(major):
    import tomllib
    from packaging.requirements import Requirement
    extra = _setup_module().toolkit_extra(major)
    specs = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"][extra]
    names = {Requirement(s).name for s in specs}
    assert "numba-cuda" in names and "nvidia-cuda-nvdisasm" in names
    assert ("nvidia-cuda-nvcc-cu12" if major == 12 else "nvidia-cuda-nvcc") in names      # ptxas


def test_restart_only_for_a_package_changed_while_loaded():
    setup = _setup_module()
    before = dict.fromkeys(setup.WATCHED, None) | {"numpy": "2.0.2", "numba": "0.60.0"}
    after = before | {"numpy": "2.4.1", "numba": "0.62.0", "numba-cuda": "0.30.4"}
    assert setup.restart_reasons(before, after, {"numpy"}) == ["numpy 2.0.2 -> 2.4.1"]
    assert setup.restart_reasons(before, after, {"sys", "os"}) == []
    assert setup.restart_reasons(before, before, {"numpy", "numba"}) == []


@pytest.mark.parametrize("smi, expected", [
    ("| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 |", "driver for CUDA 12, extra gpu-cu12"),
    ("| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06   CUDA Version: 13.0 |", "driver for CUDA 13, extra gpu"),
    (None, "no usable GPU driver: the simulator"),
])
def test_dry_run_against_a_simulated_nvidia_smi(smi, expected, tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if smi is not None:
        fake = bin_dir / "nvidia-smi"
        fake.write_text(f"#!/bin/sh\necho '{smi}'\n")
        fake.chmod(0o755)
    env = dict(os.environ, PATH=str(bin_dir))
    done = subprocess.run([sys.executable, str(SCRIPT), str(ROOT), "--dry-run"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    line, = done.stdout.strip().splitlines()
    assert line.startswith(f"Installing the course ({expected}): {sys.executable} -m pip install --quiet ")
    extra = re.search(r"extra (\S+)\)", line)
    assert line.endswith(f"course[{extra.group(1)}]" if extra else "course")


def test_a_folder_that_is_not_the_course_is_refused(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path), "--dry-run"], capture_output=True, text=True)
    assert done.returncode != 0
    assert "is not the course's folder (no pyproject.toml)" in done.stderr
