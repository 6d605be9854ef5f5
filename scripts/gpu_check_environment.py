"""What scripts/gpu_check.sh records about the machine, and its preflight, as JSON.

    python scripts/gpu_check_environment.py                              # the record, on stdout
    python scripts/gpu_check_environment.py --preflight --out DIR [--mode simulate]
    python scripts/gpu_check_environment.py --summary DIR                # the run's summary.json, on stdout

The record: the interpreter, GPU name, driver, memory and compute capability (nvidia-smi; not
run with --mode simulate, and the record says so), every version that matters, the date.
--preflight also imports every package a later step of the check imports, and prints one line
per one that is missing, naming it and what needs it; names the numba-cuda internals the
library patches that this numba-cuda lacks (attention_lib.platform.numba_patches, checked in a
process with the simulator off); finds ptxas and nvdisasm as the kernel report does; writes it
all to DIR/environment.json. Exit status 1 when a required package or tool is missing or the
interpreter is not Python 3.11 to 3.13 (a missing numba-cuda internal is printed and recorded;
the GPU steps run and show what it breaks).
Uses only the standard library itself; asks no registry.
"""

import argparse
import datetime
import importlib
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PATCHES = ROOT / "attention_lib" / "platform" / "numba_patches.py"
SUPPORTED = ((3, 11), (3, 12), (3, 13))

# Every module a later step imports (the library, pytest and the tests it runs, the notebook
# runner and its kernel, the bench), the distribution it comes in, and what needs it.
REQUIRED = (
    ("numpy", "numpy", "everything"),
    ("numba", "numba", "every kernel"),
    ("numba.cuda", "numba-cuda", "every kernel"),
    ("greenlet", "greenlet", "the simulator, which the sanitizer uses beside a GPU"),
    ("matplotlib", "matplotlib", "plots in the notebooks and the bench's roofline"),
    ("pytest", "pytest", "the unit tests"),
    ("xdist", "pytest-xdist", "the unit tests' workers"),
    ("yaml", "pyyaml", "tests/test_environment.py"),
    ("packaging", "packaging", "tests/test_environment.py"),
    ("nbformat", "nbformat", "the notebooks and tests/test_notebooks.py"),
    ("nbclient", "nbclient", "executing the notebooks"),
    ("jupyter_client", "jupyter-client", "executing the notebooks"),
    ("zmq", "pyzmq", "executing the notebooks"),
    ("ipykernel", "ipykernel", "the notebooks' kernel"),
    ("IPython", "ipython", "the notebooks' kernel"),
)
OPTIONAL = (
    ("torch", "torch", "the bench's PyTorch baselines"),
    ("cupy", "cupy-cuda13x", "the bench's CuPy baselines"),
)
OTHER_DISTRIBUTIONS = ("llvmlite", "cuda-bindings", "cuda-core", "cuda-pathfinder", "cuda-toolkit", "nvidia-nvvm",
                       "nvidia-cuda-nvcc", "nvidia-cuda-nvdisasm", "cupy-cuda12x", "nbval", "traitlets", "tornado")


def nvidia_smi(query):
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError) as error:
        return f"unknown ({type(error).__name__})"
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else "unknown"


def version_of(distribution):
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def one_line(error):
    text = [line for line in str(error).strip().splitlines() if line.strip()]
    return f"{type(error).__name__}: {text[0] if text else ''}"


def environment(mode="gpu"):
    """The record: interpreter, GPU (unless simulated), versions, date."""
    distributions = [d for _, d, _ in REQUIRED + OPTIONAL] + list(OTHER_DISTRIBUTIONS)
    versions = {"python": platform.python_version()}
    versions.update({d: v for d in distributions if (v := version_of(d)) is not None})
    if mode == "simulate":
        gpu = dict.fromkeys(("gpu", "driver", "memory", "compute_capability"),
                            "not asked: --simulate runs without a GPU driver (nvidia-smi not run)")
    else:
        gpu = {"gpu": nvidia_smi("name"), "driver": nvidia_smi("driver_version"),
               "memory": nvidia_smi("memory.total"), "compute_capability": nvidia_smi("compute_cap")}
    return {"mode": mode, "interpreter": sys.executable, **gpu, "versions": versions,
            "backend": os.environ.get("ATTENTION_LIB_BACKEND", "auto"),
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def missing_numba_internals():
    """numba_patches.missing_internals(gpu_target=True), from a process with the simulator off that
    loads numba_patches by its path (attention_lib's own import would choose a backend first)."""
    ask = ("import importlib.util, json, sys\n"
           f"spec = importlib.util.spec_from_file_location('numba_patches', {str(PATCHES)!r})\n"
           "patches = importlib.util.module_from_spec(spec); spec.loader.exec_module(patches)\n"
           "print(json.dumps({'checked_with': patches.CHECKED_WITH, "
           "'missing': patches.missing_internals(gpu_target=True)}))")
    done = subprocess.run([sys.executable, "-c", ask], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NUMBA_ENABLE_CUDASIM": "0"})
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return {"checked_with": None, "missing": [f"numba-cuda internals not checked: {last}"]}


def bundle_seen(bundle, problems):
    """{name: {"version", "location"}} of every package the bundle pins, as this interpreter finds
    it (the install step's folder, through PYTHONPATH); a pin not found, or found at another
    version, is a problem. {} without a bundle."""
    pins = Path(bundle or "", "requirements.txt")
    if not bundle or not pins.is_file():
        return {}
    seen = {}
    for line in pins.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, version = line.strip().split("==")
        try:
            found = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            problems.append(f"missing: {name}=={version} from the bundle is not seen by this interpreter")
            continue
        seen[name] = {"version": found.version, "location": str(found.locate_file(""))}
        if found.version != version:
            problems.append(f"bundle: {name} is {found.version} here, the bundle pins {version}")
    return seen


def preflight(mode):
    """(record, problems): the record with imports, tools and numba internals; problems are one line each."""
    record, problems = environment(mode), []
    if sys.version_info[:2] not in SUPPORTED:
        problems.append(f"interpreter {sys.executable} is Python {platform.python_version()}; the course needs 3.11 to 3.13")
    # attention_lib first: it chooses the backend (ATTENTION_LIB_BACKEND) before numba.cuda loads.
    try:
        import attention_lib
        record["banner"] = attention_lib.banner()
        print(record["banner"], flush=True)
    except Exception as error:  # a GPU that cannot run, or a missing package: name it and go on
        problems.append(f"attention_lib cannot be imported here: {one_line(error)}")
    record["imports"] = {}
    for module, distribution, needed_by in REQUIRED + OPTIONAL:
        try:
            importlib.import_module(module)
            record["imports"][module] = "ok"
        except Exception as error:  # ImportError, or a package that breaks on import
            record["imports"][module] = one_line(error)
            line = f"missing: {module} ({distribution}) for {needed_by}: {one_line(error)}"
            if (module, distribution, needed_by) in OPTIONAL:
                print(f"optional, {line}", flush=True)
            else:
                problems.append(line)
    record["tools"] = {}
    try:
        from attention_lib.measure.kernel_report import tool
        for name in ("ptxas", "nvdisasm"):
            try:
                record["tools"][name] = tool(name)
            except FileNotFoundError as error:
                record["tools"][name] = None
                problems.append(f"missing: {one_line(error)}")
    except Exception as error:  # attention_lib itself missing: already named above
        record["tools"]["error"] = one_line(error)
    for command in ("nvcc", "make", "nvidia-smi"):
        record["tools"][command] = shutil.which(command)
    if record["tools"]["make"] is None:
        problems.append("missing: the command make, which tests/test_environment.py runs (make -n)")
    record["bundle"] = bundle_seen(os.environ.get("BUNDLE"), problems)
    numba = missing_numba_internals()
    record["numba_patches"] = {**numba, "numba_cuda": version_of("numba-cuda")}
    for line in numba["missing"]:
        print(line, flush=True)
    record["problems"] = problems
    return record, problems


def summary(folder):
    """The run's summary: the environment record (as the environment step wrote it), every step and the files."""
    folder = Path(folder)
    steps = []
    for line in (folder / "steps.tsv").read_text().splitlines():
        name, status, seconds, budget = line.split("\t")
        steps.append({"step": name, "exit_status": int(status), "seconds": int(seconds), "budget_s": int(budget),
                      "ok": status == "0", "over_budget": status in ("124", "137")})
    recorded = folder / "environment.json"
    record = json.loads(recorded.read_text()) if recorded.is_file() else environment()
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    return {**record, "steps": steps, "all_ok": all(s["ok"] for s in steps),
            "total_budget_s": sum(s["budget_s"] for s in steps), "files": files}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--summary", metavar="DIR", help="print the summary of the run in DIR")
    parser.add_argument("--preflight", action="store_true", help="check imports and tools too, write DIR/environment.json")
    parser.add_argument("--out", metavar="DIR", help="where --preflight writes environment.json")
    parser.add_argument("--mode", choices=("gpu", "simulate"), default="gpu")
    args = parser.parse_args(argv)
    if args.summary:
        print(json.dumps(summary(args.summary), indent=1))
        return 0
    if not args.preflight:
        print(json.dumps(environment(args.mode), indent=1))
        return 0
    record, problems = preflight(args.mode)
    for line in problems:
        print(line, flush=True)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "environment.json").write_text(json.dumps(record, indent=1) + "\n")
        if args.mode == "gpu":                  # the whole table, clocks and processes included
            try:
                shown = subprocess.run(["nvidia-smi"], capture_output=True, text=True, timeout=30).stdout
            except (OSError, subprocess.SubprocessError) as error:
                shown = f"nvidia-smi did not run: {one_line(error)}\n"
            (out / "nvidia-smi.txt").write_text(shown)
    print(f"preflight: {len(problems)} problem(s), {len(record['numba_patches']['missing'])} numba-cuda internal(s) "
          f"missing (checked with numba-cuda {record['numba_patches']['checked_with']}, "
          f"here {record['numba_patches']['numba_cuda']})", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
