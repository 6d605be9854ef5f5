"""``08_row_reduce`` (notebook 08, warm-up 2): a row's max or sum over its 8-lane row group, every
lane ending with it (the contract of ``flash.v3_row_reduce``), in warp shuffles only. Its cases, its
limit of warp rounds (``WarpRounds``) and named mistakes are declared in the ``Exercise`` below.
"""

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.measure import sanitizer
from attention_lib.platform.rebuild import rebuilt
from attention_lib.stages import flash
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import host_output
from attention_lib.checks.limits import NoLocalMemory
from attention_lib.checks.ex08_kernel3 import (attention_v3, kernel3, quiet_launch, rebound,
                                               refuse_library_names, traced_for)

@dataclass
class WarpRounds:
    """At most `most` warp collectives (shuffles, votes, syncwarps) joined by any thread, and no
    barrier or shared memory: a reduction among the lanes of a warp in log2(lanes) rounds.
    `most(case)` None: not measured on that case."""

    most: Callable
    code: str = "too_many_rounds"

    def broken(self, traces, case, compiled):
        limit = self.most(case)
        if limit is None:
            return None
        for traced in traces:
            shared = traced.arrays(sanitizer.SHARED)
            if traced.barriers or shared:
                used = f"shared memory ({', '.join(shared)})" if shared else f"{traced.barriers} barrier(s)"
                return (f"the values are right, but the reduction used {used}: the 8 lanes of a row group sit in "
                        "one warp and can hand each other registers, with no shared memory and no barrier")
            if traced.launch.warp_collectives > limit:
                return (f"the values are right, but a thread joined {traced.launch.warp_collectives} warp "
                        f"collectives for its {limit // 3} rows, where the limit is {limit}: 3 rounds a row "
                        "(8 lanes, halved each round), with every lane combining in each round")
        return None



class ReduceCase(NamedTuple):
    """One probe of the answer: head width d_k (its MICRO_M rows a thread), the max or the sum; or
    (kernel) flash v3 itself with the answer as its row reduction, T queries and keys."""

    d_k: int
    take_max: bool
    kernel: bool = False
    T: int = 0

    def __str__(self):
        if self.kernel:
            return f"(kernel 3, T {self.T}, d_k {self.d_k}, causal)"
        rows = flash.v3_sizes(self.d_k)["MICRO_M"]
        return f"(d_k {self.d_k}: {rows} rows a thread, {'max' if self.take_max else 'sum'})"


def _reduce_probe_source(x_in, x_out, take_max):
    """One block of kernel 3's threads: each loads its MICRO_M values, reduces them across its row
    group with `reduce` (the answer), writes them back. Compiled by _reduce_probe with flash's names."""
    t = cuda.threadIdx.x
    x = cuda.local.array(MICRO_M, np.float32)       # noqa: F821  (flash's sizes, bound by _reduce_probe)
    for a in range(MICRO_M):                        # noqa: F821
        x[a] = x_in[t, a]
    reduce(x, take_max)                             # noqa: F821
    for a in range(MICRO_M):                        # noqa: F821
        x_out[t, a] = x[a]


def _reduce_probe(answer, d_k):
    """The probe kernel at head width d_k, the answer as its `reduce`."""
    return rebuilt(_reduce_probe_source, {**flash.v3_sizes(d_k), "reduce": rebound(answer, d_k)}, base=vars(flash),
                   name="row_reduce_probe")


def _lanes_expected(x, take_max, width=8):
    """(128, MICRO_M): every lane holds its row group's (`width` lanes) max or sum, in float64."""
    groups = x.astype(np.float64).reshape(-1, width, x.shape[1])
    combined = groups.max(axis=1, keepdims=True) if take_max else groups.sum(axis=1, keepdims=True)
    return np.broadcast_to(combined, groups.shape).reshape(x.shape)


def _run_reduce(answer, case, rng, launch):
    refuse_library_names(answer, ("v3_row_reduce", "v3_tile_max"))
    if case.kernel:
        q, k, v = (rng.standard_normal((1, case.T, case.d_k)).astype(np.float32) for _ in range(3))
        got = attention_v3(kernel3(answer, "v3_row_reduce", case.d_k), quiet_launch, q, k, v, True, None)
        return got, reference.attention(q, k, v), None, case
    rows = flash.v3_sizes(case.d_k)["MICRO_M"]
    x = rng.standard_normal((flash.THREADS_V3, rows)).astype(np.float32)
    if case.take_max:                                # masked scores: some -inf, a whole row of them
        x[rng.random(x.shape) < 0.3] = -np.inf
        x[8:16, 0] = -np.inf
    out = host_output(x.shape)
    traced_for(case.d_k)(_reduce_probe(answer, case.d_k), 1, flash.THREADS_V3, x, out, case.take_max)
    return out, _lanes_expected(x, case.take_max), x, case


def _diagnose_reduce(got, expected, x, case):
    if case.kernel:
        return None
    close = dict(rtol=1e-5, atol=1e-5)

    def same(want):
        finite = np.isfinite(want)
        return np.array_equal(np.isneginf(got), np.isneginf(want)) and np.allclose(got[finite], want[finite], **close)

    if same(_lanes_expected(x, not case.take_max)):
        return "max_and_sum_swapped", (f"every lane holds the row's {'sum' if case.take_max else 'max'}, not its "
                                       f"{'max' if case.take_max else 'sum'}: take_max says which to combine")
    for width in (4, 2):
        if same(_lanes_expected(x, case.take_max, width)):
            return "butterfly_missing_step", (f"each lane combined only {width} of its row group's 8 lanes: the "
                                              "butterfly takes three steps, partners 1, 2 and 4 lanes away")
    for width in (16, 32):
        if same(_lanes_expected(x, case.take_max, width)):
            return "reduced_across_rows", (f"{width} lanes were combined, not 8: partners 8 and 16 lanes away "
                                           "belong to other row groups of the warp, which hold other rows")
    first = np.arange(x.shape[0]) % 8 == 0
    if same(np.where(first[:, None], expected, got)) and not same(expected):
        return "not_in_every_lane", ("only the first lane of each row group holds the row's value: every lane "
                                     "needs it (each rescales its own sums by it); with xor partners, lanes "
                                     "swap values and all 8 end with the total")
    return None


register(Exercise(
    exercise_id="08_row_reduce",
    kind="device function",
    run=_run_reduce,
    # The max with -inf entries (a row all -inf in one row group), the sum, at 4 rows a thread
    # (d_k 1 and 64: one probe kernel) and 2 (d_k 127 and 100: another); then kernel 3 built
    # around it at d_k 9, T 70 (two blocks of queries, rows in every micro-row; three key tiles).
    cases=[ReduceCase(1, True), ReduceCase(64, False), ReduceCase(127, True), ReduceCase(100, False),
           ReduceCase(9, True, kernel=True, T=70)],
    hint=("the 8 lanes of a row group sit side by side in one warp; in each of three rounds every lane swaps "
          "its value with the partner whose lane number differs in one bit (1, 2, then 4 lanes away) and "
          "combines the two, so after the third round all 8 hold the row's result"),
    more_hints=("the plan, per row a: take the row's value from x into a register; three rounds, with partners 1, "
                "2 and 4 lanes away, each a shuffle by exclusive-or whose mask names all 32 lanes of the warp (all "
                "of them call it), then the max of the two or their sum, as take_max says; store the result back "
                "in x. The partners never leave the row group: lane exclusive-or 1, 2 or 4 stays among the same 8 "
                "aligned lanes. Where answers go wrong: a mask that leaves out lanes that call the shuffle, a "
                "shuffle only some lanes reach (under a branch), two rounds or five, and a one-way tree that "
                "leaves the result in the first lane only",),
    # float32 sums of 8 values against float64: errors near 1e-7.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_reduce,
    diagnoses=("too_many_rounds", "butterfly_missing_step", "reduced_across_rows", "not_in_every_lane",
               "max_and_sum_swapped"),
    solution=flash.v3_row_reduce,
    forbidden=(flash.v3_tile_max, flash.flash_attention_kernel_v3),
    limits=(WarpRounds(lambda case: None if case.kernel else 3 * flash.v3_sizes(case.d_k)["MICRO_M"]),
            NoLocalMemory()),
))
