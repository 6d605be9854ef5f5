"""Grid arithmetic and the simulator's time budget, shared by every launcher."""

import os

from attention_lib.runtime import ON_SIMULATOR

# The simulator runs about 6,000 CUDA threads a second on one core (scripts/simulator_speed.py);
# a launch estimated above this many seconds is refused rather than left to run for an hour.
SIMULATOR_THREADS_PER_SECOND = 6000
SIMULATOR_MAX_SECONDS = 120
ALLOW_SLOW_VARIABLE = "ATTENTION_LIB_ALLOW_SLOW"


def ceil_div(n, d):
    """Blocks of d needed to cover n items: the last block may be only partly used."""
    return (n + d - 1) // d


def check_simulator_budget(what, threads):
    """Refuse a launch of `threads` CUDA threads that the simulator would take minutes on.

    Does nothing on a GPU, or when ATTENTION_LIB_ALLOW_SLOW=1 is set.
    """
    if not ON_SIMULATOR or os.environ.get(ALLOW_SLOW_VARIABLE) == "1":
        return
    seconds = threads / SIMULATOR_THREADS_PER_SECOND
    if seconds > SIMULATOR_MAX_SECONDS:
        raise ValueError(
            f"{what}: {threads:,} CUDA threads would take about {seconds / 60:.0f} min on the simulator; "
            f"use smaller sizes (attention_lib.SIZES) or set {ALLOW_SLOW_VARIABLE}=1 to run it anyway")
