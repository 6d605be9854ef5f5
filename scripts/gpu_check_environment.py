"""What scripts/gpu_check.sh records about the machine, as JSON on stdout.

    python scripts/gpu_check_environment.py             # GPU name, driver, versions, date
    python scripts/gpu_check_environment.py --summary DIR   # that, the steps run and the files made

Needs nothing beyond the Python standard library and what is installed; asks no registry.
"""

import datetime
import importlib.metadata
import json
import platform
import subprocess
import sys
from pathlib import Path

PACKAGES = ("numpy", "numba", "numba-cuda", "torch", "cupy", "cupy-cuda12x", "cupy-cuda13x", "pytest", "nbval")


def nvidia_smi(query):
    try:
        done = subprocess.run(["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError) as error:
        return f"unknown ({type(error).__name__})"
    return done.stdout.strip().splitlines()[0] if done.stdout.strip() else "unknown"


def environment():
    versions = {"python": platform.python_version()}
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return {"gpu": nvidia_smi("name"), "driver": nvidia_smi("driver_version"),
            "memory": nvidia_smi("memory.total"), "compute_capability": nvidia_smi("compute_cap"),
            "versions": versions,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}


def summary(folder):
    folder = Path(folder)
    steps = []
    for line in (folder / "steps.tsv").read_text().splitlines():
        name, status, seconds, budget = line.split("\t")
        steps.append({"step": name, "exit_status": int(status), "seconds": int(seconds), "budget_s": int(budget),
                      "ok": status == "0", "over_budget": status in ("124", "137")})
    files = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    return {**environment(), "steps": steps, "files": files}


if __name__ == "__main__":
    result = summary(sys.argv[2]) if sys.argv[1:2] == ["--summary"] else environment()
    print(json.dumps(result, indent=1))
