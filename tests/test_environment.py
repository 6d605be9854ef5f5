"""environment.yml (conda, Binder) and pyproject.toml (pip) ask for the same packages and ranges."""

import tomllib
from pathlib import Path

import yaml
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parent.parent
# What environment.yml installs: the core dependencies plus the lab and test extras.
EXTRAS_IN_ENVIRONMENT = ("lab", "test")


def _normalise(spec):
    requirement = Requirement(spec)
    return requirement.name.lower().replace("_", "-"), requirement.specifier


def pyproject_requirements():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in EXTRAS_IN_ENVIRONMENT:
        specs += project["optional-dependencies"][extra]
    return dict(_normalise(s) for s in specs), project["requires-python"]


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
    return dict(_normalise(s) for s in specs), python


def test_same_packages_with_same_ranges():
    wanted, _ = pyproject_requirements()
    listed, _ = environment_requirements()
    assert sorted(listed) == sorted(wanted), "packages differ between environment.yml and pyproject.toml"
    for name, specifier in wanted.items():
        assert listed[name] == specifier, f"{name}: environment.yml has {listed[name]}, pyproject.toml {specifier}"


def test_same_python_range():
    _, wanted = pyproject_requirements()
    _, listed = environment_requirements()
    assert listed.replace(" ", "") == wanted.replace(" ", "")


def test_environment_installs_the_course_itself():
    entries = yaml.safe_load((ROOT / "environment.yml").read_text())["dependencies"]
    pip_entries = next(e["pip"] for e in entries if isinstance(e, dict))
    assert "-e ." in pip_entries
