"""environment.yml (conda, Binder) and pyproject.toml (pip) ask for the same packages and ranges."""

import tomllib
from pathlib import Path

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
