"""Grid arithmetic, CUDA's grid limits, kernel versions and the simulator's time budget, shared by every launcher."""

import numbers
import os

from attention_lib.runtime import ON_SIMULATOR

# The simulator runs about 6,000 CUDA threads a second on one core (scripts/simulator_speed.py);
# a launch estimated above this many seconds is refused rather than left to run for an hour.
SIMULATOR_THREADS_PER_SECOND = 6000
SIMULATOR_MAX_SECONDS = 120
ALLOW_SLOW_VARIABLE = "ATTENTION_LIB_ALLOW_SLOW"
# Barriers cost the simulator far more than the thread count says: at each `syncthreads` round
# every thread of the block is parked and woken. Measured on a 2-core machine (numba-cuda
# 0.30.4): a round took 1.9 ms in a block of 8 threads, 3.3 ms in one of 32, 12.5 ms in one of
# 256, so the softmax kernel v2 (14 rounds in blocks of 32) ran 10 times longer than its threads
# alone predict. A round is counted as a fixed part plus a part per thread of the block.
BARRIER_SECONDS_PER_BLOCK = 1.5e-3
BARRIER_SECONDS_PER_THREAD = 4.5e-5
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


def barrier_seconds(blocks, block_threads, rounds):
    """Simulator seconds spent at barriers: `rounds` rounds in each of `blocks` blocks of
    `block_threads` threads."""
    return blocks * rounds * (BARRIER_SECONDS_PER_BLOCK + BARRIER_SECONDS_PER_THREAD * block_threads)


def check_simulator_budget(what, threads, barrier_s=0.0):
    """Refuse a launch of `threads` CUDA threads that the simulator would take minutes on.

    barrier_s: the launch's time at barriers on the simulator (``barrier_seconds``), added to
    the threads' own time. Does nothing on a GPU, or when ATTENTION_LIB_ALLOW_SLOW=1 is set.
    """
    if not ON_SIMULATOR or os.environ.get(ALLOW_SLOW_VARIABLE) == "1":
        return
    seconds = threads / SIMULATOR_THREADS_PER_SECOND + barrier_s
    if seconds > SIMULATOR_MAX_SECONDS:
        raise ValueError(
            f"{what}: {threads:,} CUDA threads would take about {seconds / 60:.0f} min on the simulator; "
            f"use smaller sizes (attention_lib.SIZES) or set {ALLOW_SLOW_VARIABLE}=1 to run it anyway")
