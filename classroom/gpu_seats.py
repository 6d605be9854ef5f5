"""How many students one GPU holds, notebook by notebook, from the course's own estimate of device
memory (tests/test_gpu_memory_budget.py: the float32 arrays alive together at a notebook's largest
step at the GPU sizes, ANDREA-120M, plus 1 GiB counted for each process's CUDA context). An
estimate, not a measurement: each student's kernel is one process with its own context, and the
GPU's compute is shared by time-slicing, which nothing here measures.

    python classroom/gpu_seats.py [--gpu-gib 139]     (the memory the GPU leaves free, in GiB)

Prints one line per notebook: the GiB one student needs and how many students fit. Give the
least of the notebooks your sessions use as CLASSROOM_GPU_SEATS to the hub (classroom/README.md).
"""

import argparse
import importlib.util
import math
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GIB = 2 ** 30


def _estimate():
    spec = importlib.util.spec_from_file_location("gpu_memory_budget", ROOT / "tests" / "test_gpu_memory_budget.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def per_student():
    """{notebook: bytes of device memory one student's kernel needs}, by the course's estimate."""
    estimate = _estimate()
    return {name: estimate.device_bytes(shapes) for name, shapes in sorted(estimate.NOTEBOOKS.items())}


def seats(gpu_gib):
    """{notebook: (GiB per student, students that fit in gpu_gib)}."""
    return {name: (needed / GIB, math.floor(gpu_gib * GIB / needed)) for name, needed in per_student().items()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--gpu-gib", type=float, default=139.0,
                        help="GPU memory free for the class, GiB (an H200 leaves about 139)")
    options = parser.parse_args(argv)
    print(f"device memory per student (estimate) and students on a GPU with {options.gpu_gib:g} GiB free:")
    for name, (gib, fit) in seats(options.gpu_gib).items():
        print(f"  {name:24} {gib:5.2f} GiB  {fit:4d} students")


if __name__ == "__main__":
    main()
