"""Wheels of what the GPU check needs and the GPU machine's image lacks, for its Python, in one folder.

    python scripts/gpu_bundle.py [FOLDER]            # or: make gpu-bundle (FOLDER: gpu-bundle)

The machine that runs scripts/gpu_check.sh reaches no package registry, so what its image lacks
travels with the course as wheels: the simulator's greenlet (the sanitizer runs kernels on it
beside a GPU) and what executing a notebook needs (nbformat, nbclient, ipykernel and theirs).
pip resolves the whole closure for the image's interpreter (TARGET_PYTHON, x86_64 manylinux);
the packages the image already holds (IMAGE_HAS) are dropped together with what only they need,
and the rest is downloaded into FOLDER/wheels, pinned in FOLDER/requirements.txt, which
gpu_check.sh installs offline with ``pip install --no-index --no-deps --target``.
Needs pip and a package registry; run it where both are (not on the GPU machine).
"""

import argparse
import json
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_FOLDER = ROOT / "gpu-bundle"
# The GPU machine's own python3 (the image's PyTorch venv): CPython 3.12 on x86_64 Linux, glibc new
# enough for every manylinux tag below (pip matches each tag exactly, so each is named).
TARGET_PYTHON = "3.12"
PLATFORMS = ("manylinux2014_x86_64", "manylinux_2_17_x86_64", "manylinux_2_24_x86_64",
             "manylinux_2_26_x86_64", "manylinux_2_27_x86_64", "manylinux_2_28_x86_64")
# What the check imports that the image may lack, named by the course's own requirement (its range).
WANTED = ("greenlet", "nbformat", "nbclient", "ipykernel")
# The travelling working tree is limited to 64 MiB in all; the course itself is about 5 MB.
LIMIT_MB = 48
# The Python packages the GPU machine's image holds (its package list, read on that machine on
# 2026-11-17). gpu_check.sh's preflight imports everything it uses, so a package that has since
# left the image is named there in one line.
IMAGE_HAS = frozenset(canonicalize_name(n) for n in """
absl-py accelerate aiofiles aiohappyeyeballs aiohttp aiosignal annotated-doc anyio attrs botorch build
certifi charset-normalizer chex click cloudpickle cmake colorama contourpy coverage cuda-bindings
cuda-core cuda-pathfinder cuda-toolkit cupy-cuda13x cycler cython diffrax e3nn einops equinox etils
execnet filelock flatbuffers flax fonttools formulaic frozenlist fsspec gpytorch grpcio h11 h5py hf-xet
httpcore httpx huggingface-hub humanize hypothesis idna imageio iniconfig interface-meta jax
jax-cuda13-pjrt jax-cuda13-plugin jaxlib jaxtyping jinja2 joblib kiwisolver lazy-loader lightning
lightning-utilities linear-operator lineax llvmlite lxml markdown markdown-it-py markupsafe matplotlib
mdurl meson ml-dtypes mpi4py mpmath msgpack multidict multipledispatch mypy-extensions nanobind narwhals
networkx ninja numba numba-cuda numpy numpyro nvidia-cublas nvidia-cuda-cupti nvidia-cuda-nvrtc
nvidia-cuda-runtime nvidia-cudnn-cu13 nvidia-cufft nvidia-cufile nvidia-curand nvidia-cusolver
nvidia-cusparse nvidia-cusparselt-cu13 nvidia-ml-py nvidia-nccl-cu13 nvidia-nvjitlink
nvidia-nvshmem-cu13 nvidia-nvtx onnx onnx-ir onnxruntime onnxscript opencv-python-headless optax
opt-einsum opt-einsum-fx optimistix orbax-checkpoint packaging pandas pathspec patsy peft pillow pip
pluggy portalocker prometheus-client propcache protobuf psutil pyarrow pybind11 py-cpuinfo pygments
pyparsing pyproject-hooks pyre-extensions pytest pytest-benchmark pytest-cov pytest-mock pytest-timeout
pytest-xdist python-dateutil pytorch-lightning pyyaml regex requests rich sacrebleu safetensors
scikit-build-core scikit-image scikit-learn scipy seaborn sentencepiece sentence-transformers setuptools
shellingham simplejson six sortedcontainers statsmodels sympy tabulate tensorboard
tensorboard-data-server tensorstore threadpoolctl tifffile tiktoken timm tokenizers toolz torch
torchaudio torchdiffeq torch-geometric torchmetrics torchvision tqdm transformers treescope triton typer
typing-extensions typing-inspect urllib3 uvloop wadler-lindig werkzeug wheel wrapt xarray xxhash yarl
zipp""".split())


def course_requirements(names=WANTED):
    """The course's own requirement (with its range) for each name, from pyproject.toml."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in project["optional-dependencies"].values():
        specs += extra
    found = {canonicalize_name(Requirement(s).name): s for s in specs}
    missing = [n for n in names if canonicalize_name(n) not in found]
    if missing:
        raise SystemExit(f"pyproject.toml names no range for {', '.join(missing)}")
    return [found[canonicalize_name(n)] for n in names]


def target_environment(python_version):
    """The marker environment of the GPU machine's interpreter (markers are evaluated for it, not here)."""
    full = python_version if python_version.count(".") == 2 else f"{python_version}.0"
    return {**default_environment(), "python_version": ".".join(full.split(".")[:2]), "python_full_version": full,
            "sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64", "os_name": "posix",
            "implementation_name": "cpython", "platform_python_implementation": "CPython"}


def pip_target_options(python_version):
    return ["--only-binary=:all:", "--python-version", python_version, "--implementation", "cp",
            *[part for platform in PLATFORMS for part in ("--platform", platform)]]


def resolve(requirements, python_version):
    """{name: (version, [requirement strings])} of pip's resolution of `requirements` for the target."""
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
                        "--report", str(report), "--target", str(Path(scratch) / "unused"),
                        *pip_target_options(python_version), *requirements], check=True)
        installs = json.loads(report.read_text())["install"]
    return {canonicalize_name(i["metadata"]["name"]): (i["metadata"]["version"], i["metadata"].get("requires_dist", []))
            for i in installs}


def closure(requirements, resolved, environment, image=IMAGE_HAS):
    """The packages reachable from `requirements` without passing through one the image holds:
    {name: version}, in the order reached. A package the image holds is not followed, since the
    image brings what it needs."""
    wanted, queue = {}, [(Requirement(r), ()) for r in requirements]
    while queue:
        requirement, extras = queue.pop(0)
        name = canonicalize_name(requirement.name)
        if name in image or name in wanted:
            continue
        version, requires = resolved[name]
        wanted[name] = version
        for spec in requires:
            dependency = Requirement(spec)
            asked = requirement.extras or {""}
            if dependency.marker is None or any(dependency.marker.evaluate({**environment, "extra": e}) for e in asked):
                queue.append((dependency, ()))
    return wanted


def download(pins, folder, python_version):
    wheels = folder / "wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(wheels),
                    *pip_target_options(python_version), *[f"{n}=={v}" for n, v in pins.items()]], check=True)
    keep = {canonicalize_name(n) for n in pins}
    for wheel in wheels.glob("*.whl"):           # a wheel left by an earlier bundle of other pins
        name, version = wheel.name.split("-")[:2]
        if canonicalize_name(name) not in keep or pins[canonicalize_name(name)] != version:
            wheel.unlink()
    return sorted(wheels.glob("*.whl"))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", nargs="?", default=str(DEFAULT_FOLDER), help="where the bundle goes")
    parser.add_argument("--python-version", default=TARGET_PYTHON,
                        help="the interpreter it is for (default %(default)s, the GPU machine's)")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    requirements = course_requirements()
    resolved = resolve(requirements, args.python_version)
    pins = closure(requirements, resolved, target_environment(args.python_version))
    wheels = download(pins, folder, args.python_version)
    size_mb = sum(w.stat().st_size for w in wheels) / 2**20
    dropped = sorted(set(resolved) - set(pins))
    lines = ["# gpu_check.sh installs these offline: pip install --no-index --find-links wheels --no-deps --target DIR",
             f"# for CPython {args.python_version}, x86_64 manylinux; {len(pins)} wheels, {size_mb:.1f} MB",
             f"# asked for: {', '.join(requirements)}",
             f"# left out, the image holds them (or only they need them): {', '.join(dropped) or 'none'}",
             *[f"{name}=={version}" for name, version in sorted(pins.items())]]
    (folder / "requirements.txt").write_text("\n".join(lines) + "\n")
    print(f"{folder}: {len(pins)} wheels, {size_mb:.1f} MB for Python {args.python_version}: "
          + ", ".join(f"{n} {v}" for n, v in sorted(pins.items())))
    if size_mb > LIMIT_MB:
        raise SystemExit(f"the bundle is {size_mb:.1f} MB, over the {LIMIT_MB} MB that may travel beside the course")


if __name__ == "__main__":
    main()
