"""environment.yml (conda, Binder) and pyproject.toml (pip) ask for the same packages and ranges,
and the Makefile installs the CUDA toolkit that matches the machine's driver."""

import os
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
# What environment.yml installs: the core dependencies plus the lab and test extras.
EXTRAS_IN_ENVIRONMENT = ("lab", "test", "compile")


def _normalise(specs):
    """name -> (specifier, extras); a package listed twice (numba-cuda, numba-cuda[cu13]) must
    have one range, and its extras are pooled."""
    wanted = {}
    for spec in specs:
        requirement = Requirement(spec)
        name = requirement.name.lower().replace("_", "-")
        specifier, extras = wanted.get(name, (requirement.specifier, set()))
        assert specifier == requirement.specifier, f"{name} has two ranges: {specifier} and {requirement.specifier}"
        wanted[name] = (specifier, extras | set(requirement.extras))
    return wanted


def pyproject_requirements():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in EXTRAS_IN_ENVIRONMENT:
        specs += project["optional-dependencies"][extra]
    return _normalise(specs), project["requires-python"]


def environment_requirements():
    entries = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    specs, python = [], None
    for entry in entries:
        if isinstance(entry, dict):
            specs += [s for s in entry["pip"] if not s.startswith("-e")]
        elif entry.startswith("python"):
            python = entry[len("python"):]
        elif entry != "pip":
            specs.append(entry)
    return _normalise(specs), python


def test_same_packages_with_same_ranges():
    wanted, _ = pyproject_requirements()
    listed, _ = environment_requirements()
    assert sorted(listed) == sorted(wanted), "packages differ between environment.yml and pyproject.toml"
    for name, (specifier, extras) in wanted.items():
        assert listed[name][0] == specifier, f"{name}: environment.yml has {listed[name][0]}, pyproject.toml {specifier}"
        assert listed[name][1] == extras, f"{name}: environment.yml has extras {listed[name][1]}, pyproject.toml {extras}"


def test_same_python_range():
    _, wanted = pyproject_requirements()
    _, listed = environment_requirements()
    assert listed.replace(" ", "") == wanted.replace(" ", "")


def test_environment_installs_the_course_itself():
    entries = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    pip_entries = next(e["pip"] for e in entries if isinstance(e, dict))
    assert "-e ." in pip_entries


def _make_dry_run(tmp_path, target, smi=None, **variables):
    """`make -n target` with a simulated nvidia-smi (printing `smi`) or none on the PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    fake = bin_dir / "nvidia-smi"
    if smi is not None:
        fake.write_text(f"#!/bin/sh\necho '{smi}'\n")
        fake.chmod(0o755)
    elif fake.exists():
        fake.unlink()
    env = dict(os.environ, PATH=f"{bin_dir}:/usr/bin:/bin")
    args = [f"{k}={v}" for k, v in variables.items()]
    done = subprocess.run(["make", "-n", "-C", str(ROOT), target, f"VENV={tmp_path / 'venv'}", *args],
                          env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize("smi, extras", [
    ("| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 |", "lab,test,gpu-cu12"),
    ("| NVIDIA-SMI 580.65.06   Driver Version: 580.65.06   CUDA Version: 13.0 |", "lab,test,compile"),
    (None, "lab,test,compile"),
])
def test_make_installs_the_toolkit_matching_the_driver(tmp_path, smi, extras):
    planned = _make_dry_run(tmp_path, "install", smi)
    assert f'pip install --quiet --editable ".[{extras}]"' in planned
    assert f".installed-{extras.replace(',', '-')}" in planned       # other extras: another stamp


def test_make_notebook_reexecutes_one_notebook_on_the_simulator(tmp_path):
    planned = _make_dry_run(tmp_path, "notebook", NB="03")
    assert "ATTENTION_LIB_BACKEND=simulator" in planned
    assert "nbconvert --to notebook --execute --inplace 03_causal_mask.ipynb" in planned


def test_make_unit_runs_only_existing_test_files(tmp_path):
    planned = next(line for line in _make_dry_run(tmp_path, "unit").splitlines() if " -m pytest " in line)
    files = [word for word in planned.split() if word.startswith("tests/")]
    assert files and all((ROOT / f).is_file() for f in files)
    assert not any(word.startswith("notebooks") or word.endswith(".ipynb") for word in planned.split())
    assert not any(name in planned for name in ("--nbval", "test_student_copies", "test_wheel"))


def _extra(name):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return {Requirement(s).name.lower(): Requirement(s) for s in project["optional-dependencies"][name]}


def _pin(requirement):
    """The version of an == pin, or None."""
    specs = list(requirement.specifier)
    return specs[0].version if len(specs) == 1 and specs[0].operator == "==" else None


@pytest.mark.parametrize("extra, ptxas", [("compile", "nvidia-cuda-nvcc"), ("gpu", "nvidia-cuda-nvcc"),
                                          ("gpu-cu12", "nvidia-cuda-nvcc-cu12")])
def test_every_toolkit_extra_brings_the_kernel_reports_tools_pinned(extra, ptxas):
    wanted = _extra(extra)
    assert _pin(wanted[ptxas]) and _pin(wanted["nvidia-cuda-nvdisasm"]), f"{extra} must pin ptxas and nvdisasm"
    if extra == "gpu-cu12":                      # NVVM comes inside the cu12 nvcc wheel, with its ptxas
        assert _pin(wanted[ptxas]).startswith("12.") and "cu12" in wanted["numba-cuda"].extras
    else:                                        # NVVM is a wheel of its own: the same release as ptxas
        assert _pin(wanted["nvidia-nvvm"]) == _pin(wanted[ptxas]) and "cu13" in wanted["numba-cuda"].extras


def test_gpu_pins_the_tools_as_compile_does_and_environment_yml_names_the_cu12_pins():
    compile_, gpu, cu12 = _extra("compile"), _extra("gpu"), _extra("gpu-cu12")
    for name in ("nvidia-nvvm", "nvidia-cuda-nvcc", "nvidia-cuda-nvdisasm"):
        assert gpu[name].specifier == compile_[name].specifier, name
    text = (ROOT / "environment.yml").read_text()
    for name in ("nvidia-cuda-nvcc-cu12", "nvidia-cuda-nvdisasm"):
        assert f"{name}=={_pin(cu12[name])}" in text, f"environment.yml's CUDA 12 note must name {name}'s pin"
