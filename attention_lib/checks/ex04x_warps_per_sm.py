"""``04x_warps_per_sm`` (deep dive 04x): ``warps_per_sm(registers, shared_bytes, threads_per_block, sm)``,
a plain function, the resident warps per SM of blocks of ``threads_per_block`` threads that use
``registers`` registers a thread and ``shared_bytes`` of shared memory a block, on the SM whose limits
``sm`` holds (``kernel_report.SMLimits``: an H200's and a T4's), held exactly to its solution
``kernel_report.warps_per_sm``. Its cases and named mistakes (each found by recomputing the case with
one rule left out, ``occupancy_without``) are declared in the ``Exercise`` below.
"""

from typing import NamedTuple

import numpy as np

from attention_lib.checks.engine import Exercise, register
from attention_lib.measure import kernel_report
from attention_lib.measure.kernel_report import H200, T4


class OccupancyCase(NamedTuple):
    """One kernel's resources, on one SM."""

    registers: int
    shared_bytes: int
    threads_per_block: int
    sm: kernel_report.SMLimits

    def __str__(self):
        return (f"{self.registers} registers, {self.shared_bytes:,} B shared, {self.threads_per_block} threads "
                f"({self.sm.name})")


# Each limit binds in turn, and each rounding changes the answer (comments: what binds on the SM).
OCCUPANCY_CASES = [
    OccupancyCase(36, 0, 128, H200),        # softmax kernel 2's row: registers, 36 allocated as 40
    OccupancyCase(40, 0, 64, H200),         # registers, by sub-partition: 12 warps a quarter, not 51 in all
    OccupancyCase(16, 32768, 64, H200),     # shared memory, 1 KB reserved a block: 6 blocks, not 7
    OccupancyCase(16, 0, 256, H200),        # warp slots: 8 blocks of 8 warps
    OccupancyCase(16, 0, 32, H200),         # block slots: 32 blocks of one warp
    OccupancyCase(32, 0, 48, H200),         # a partial warp takes a whole warp's slot: 2 warps a block
    OccupancyCase(36, 4096, 128, T4),       # a T4's 32 warp slots
    OccupancyCase(16, 0, 32, T4),           # a T4's 16 block slots; no shared memory, no limit from it
    OccupancyCase(255, 100, 1000, T4),      # registers: one block of 32 warps needs more than a T4 has
]


def _random_occupancy_cases(seed=7, count=8):
    """Kernels of the sizes compiled kernels have: 8 to 128 registers a thread, up to 512 threads a
    block, no shared memory or up to 48 KB, on each SM in turn."""
    rng = np.random.default_rng(seed)
    return [OccupancyCase(int(rng.integers(8, 129)), int(rng.choice([0, int(rng.integers(1, 48 * 1024))])),
                   int(rng.integers(1, 513)), (H200, T4)[i % 2]) for i in range(count)]


def occupancy_without(rule, k):
    """The resident warps of kernel `k` computed with `rule` left out (a usual mistake), or None
    where that computation fails."""
    sm = H200 if rule == "sm_ignored" else k.sm
    warps_per_block = k.threads_per_block // 32 if rule == "partial_warp_dropped" else -(-k.threads_per_block // 32)
    per_warp = max(k.registers, 1) * 32                            # registers_not_rounded: as they come
    if rule != "registers_not_rounded":                            # a thread's to the step, a warp's to the unit
        per_thread = -(-max(k.registers, 1) // sm.thread_register_step) * sm.thread_register_step
        per_warp = -(-per_thread * 32 // sm.register_unit) * sm.register_unit
    parts = 1 if rule == "sub_partitions_ignored" else sm.sub_partitions
    shared = k.shared_bytes + (0 if rule == "reserved_shared_missing" else sm.reserved_shared_per_block)
    if warps_per_block == 0:
        return None
    blocks = [sm.registers // parts // per_warp * parts // warps_per_block]
    blocks += [sm.shared_bytes // shared] if shared else []
    blocks += [] if rule == "warp_slots_ignored" else [sm.warps // warps_per_block]
    blocks += [] if rule == "block_slots_ignored" else [sm.blocks]
    return min(blocks) if rule == "blocks_not_warps" else min(blocks) * warps_per_block


# Tried in this order: an H200's numbers on a T4 can look like a T4 limit left out, which an H200
# case would have caught first.
OCCUPANCY_MISTAKES = {
    "sm_ignored": "that is the count on an H200; every limit comes from sm, and a {name}'s differ",
    "registers_not_rounded": "a thread's registers are allocated in steps of {step} (36 become 40), and a warp's "
                             "take 32 times that",
    "sub_partitions_ignored": "the register file is split into {parts} sub-partitions of {part:,} registers, a "
                              "warp's registers all in one: count the warps that fit in one part, times {parts}",
    "reserved_shared_missing": "each block also takes {reserved:,} bytes of shared memory the CUDA runtime "
                               "reserves, beside its own",
    "warp_slots_ignored": "an SM holds at most {warps} warps, whatever else is left",
    "block_slots_ignored": "an SM holds at most {blocks} blocks, however small",
    "partial_warp_dropped": "a block of {threads} threads runs as {whole} warps: the last, partial warp takes a "
                            "whole warp's slot and registers",
    "blocks_not_warps": "that is the number of resident blocks; the function returns warps, blocks times the "
                        "warps of a block",
}


def _run_occupancy(answer, k, rng, _launch):
    got = answer(k.registers, k.shared_bytes, k.threads_per_block, k.sm)
    return np.array(float(got)), np.array(float(kernel_report.warps_per_sm(*k))), k


def _diagnose_occupancy(got, expected, k):
    """Name the rule the answer left out: the one whose omission gives its number on this kernel."""
    sm = k.sm
    for rule, message in OCCUPANCY_MISTAKES.items():
        if occupancy_without(rule, k) == got:
            return rule, (f"got {got:g} warps for {k}, expected {expected:g}: " + message.format(
                step=sm.thread_register_step, parts=sm.sub_partitions, part=sm.registers // sm.sub_partitions,
                reserved=sm.reserved_shared_per_block, warps=sm.warps, blocks=sm.blocks,
                threads=k.threads_per_block, whole=-(-k.threads_per_block // 32), name=sm.name))
    return None


register(Exercise(
    exercise_id="04x_warps_per_sm",
    kind="function",
    gpu_code=False,
    run=_run_occupancy,
    cases=OCCUPANCY_CASES + _random_occupancy_cases(),
    hint=("list the four things an SM runs out of (registers, shared memory, warp slots, block slots); for "
          "each, how many blocks of this kernel it allows; the SM holds the fewest"),
    more_hints=("where each step goes: a block's warps (a partial warp counts whole); a thread's registers "
                "rounded up to the allocation step, a warp's 32 times that, rounded to the allocation unit; "
                "the warps one sub-partition's registers hold, times the sub-partitions, in whole blocks; the "
                "blocks shared memory holds, the runtime's reserve included (no limit when a block takes none "
                "at all); the blocks the warp slots hold; the block slots; the fewest blocks, times a block's "
                "warps",
                "where answers go wrong: registers not rounded to the step, the register file taken as one "
                "pool instead of its sub-partitions, the runtime's reserved shared memory forgotten, a limit "
                "left out (warp slots, block slots), the partial warp dropped, blocks returned for warps, an "
                "H200's numbers typed in instead of read from sm"),
    rtol=0.0,
    atol=0.0,
    diagnose=_diagnose_occupancy,
    diagnoses=tuple(OCCUPANCY_MISTAKES),
    solution=kernel_report.warps_per_sm,
))
