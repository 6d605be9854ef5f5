"""Grid arithmetic, CUDA's grid limits, kernel versions and the simulator's time budget, shared by every launcher."""

import numbers
import os

from attention_lib.platform.runtime import ON_SIMULATOR

# The simulator's time budget, one estimate for every launcher: its threads plus the
# multiply-adds they run in Python. Measured on a 2-core machine with scripts/simulator_speed.py
# (numba-cuda 0.30.4, threads as greenlets): 34,000 to 61,000 threads a second (a copy, an
# empty body), 0.4 to 1.3 million multiply-adds a second in the kernels' inner loops, and 2 to
# 3 us per thread per barrier, too little to count. A launch estimated above
# SIMULATOR_MAX_SECONDS is refused rather than left to run for an hour.
SIMULATOR_THREADS_PER_SECOND = 40_000
SIMULATOR_MADDS_PER_SECOND = 500_000
SIMULATOR_MAX_SECONDS = 120
ALLOW_SLOW_VARIABLE = "ATTENTION_LIB_ALLOW_SLOW"
# CUDA's limits on the blocks of one grid, per axis (the same for every compute capability
# from 3.0 on): a launch past them fails on a GPU with an error that names nothing.
MAX_GRID = {"x": 2**31 - 1, "y": 65535, "z": 65535}


def ceil_div(n, d):
    """Blocks of d needed to cover n items: the last block may be only partly used."""
    return (n + d - 1) // d


def check_version(version, kernels):
    """Refuse a version that is not a key of a stage's KERNELS, in the same words everywhere:
    "version must be 1, 2 or 3, got 4"."""
    known = [str(v) for v in sorted(kernels)]
    words = known[0] if len(known) == 1 else ", ".join(known[:-1]) + " or " + known[-1]
    if isinstance(version, bool) or not isinstance(version, numbers.Integral) or version not in kernels:
        raise ValueError(f"version must be {words}, got {version!r}")


def check_grid(what, grid, **counts):
    """Refuse a grid that CUDA cannot launch, in one line naming what the axis counts.

    what: the launcher's name; grid: int or tuple of blocks per axis (x, y, z); counts: for an
    axis, what its blocks stand for, naming the argument it comes from, e.g. y="q's batch x heads".
    Runs on the simulator too, before anything is allocated, so that the error is the same there.
    """
    for axis, blocks in zip("xyz", grid if isinstance(grid, tuple) else (grid,)):
        if blocks > MAX_GRID[axis]:
            raise ValueError(
                f"{what}: {counts.get(axis, 'the blocks')} needs {blocks:,} blocks on the grid's {axis} axis, "
                f"more than CUDA's limit of {MAX_GRID[axis]:,}; split the call into smaller ones")


def check_simulator_budget(what, threads, madds=0):
    """Refuse a launch that the simulator would take minutes on: `threads` CUDA threads (all
    its launches together) running `madds` multiply-adds (or steps of like cost) between them.
    Does nothing on a GPU, or when ATTENTION_LIB_ALLOW_SLOW=1 is set.
    """
    if not ON_SIMULATOR or os.environ.get(ALLOW_SLOW_VARIABLE) == "1":
        return
    seconds = threads / SIMULATOR_THREADS_PER_SECOND + madds / SIMULATOR_MADDS_PER_SECOND
    if seconds > SIMULATOR_MAX_SECONDS:
        raise ValueError(
            f"{what}: {threads:,} CUDA threads would take about {seconds / 60:.0f} min on the simulator; "
            f"use smaller sizes (attention_lib.SIZES) or set {ALLOW_SLOW_VARIABLE}=1 to run it anyway")
