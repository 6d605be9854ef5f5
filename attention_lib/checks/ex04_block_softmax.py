"""``04_block_softmax`` (notebook 04's main exercise): a kernel with softmax_kernel_v2's signature
``(s, out)``, one block of THREADS_PER_ROW threads a row on v2's grid, built around the warm-up's
block_reduce; its solution is ``softmax.block_softmax_kernel``. Its cases, limits and named mistakes are
declared in the ``Exercise`` below; its limit on reuse, ``MostLoadsNamingTheLine``, also names the line
that read a score most.
"""

import math
from dataclasses import dataclass

import numpy as np

from attention_lib.stages import softmax
from attention_lib.stages.softmax import strided_max, strided_sum_exp, strided_write, strided_zeros
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.limits import (Coalesced, MostBarriers, MostLoads, NoSerialCopy, NoUnwrittenReads,
                                         NoSharedAtomics, SharedLoadsPerThread, StoredOnce)
from attention_lib.checks.ex04_row_softmax import (BAND, STAGE, computed_nan, fully_masked, run_softmax,
                                                   unstable)
from attention_lib.checks.ex04_block_reduction import atomics_why, reads_per_reduction, thread_columns
from attention_lib.measure import sanitizer
from attention_lib.platform import where


def _run_block_softmax(kernel, case, rng, launch):
    return run_softmax(kernel, case, rng, launch, version=2)


def _barriers_per_reduction():
    """The barriers one tree makes every thread pass: after the writes, after each of its
    log2(THREADS_PER_ROW) rounds, after the result is read."""
    return 2 + int(math.log2(softmax.THREADS_PER_ROW))


@dataclass
class MostLoadsNamingTheLine(MostLoads):
    """MostLoads whose verdict also names the source line that read the most-read element most often,
    from the same traced launch (each access is recorded with its line): a walk that loads a score
    twice in one step (a max written `if s[row, j] > m: m = s[row, j]`) shows there."""

    def broken(self, traces, case, compiled):
        message = super().broken(traces, case, compiled)
        if message is None:
            return None
        traced = max(_traces_with_array(traces, self.array), key=lambda t: int(t.loads(self.array).max()))
        target = traced.launch.targets[self.array]
        element = int(np.argmax(traced.loads(self.array)))
        by_line = {}
        for index, kind, _who, _interval, site, *_ in target.trace:
            if kind == sanitizer.LOAD and index == element:
                by_line[site] = by_line.get(site, 0) + 1
        site, reads = max(by_line.items(), key=lambda item: (item[1], -item[0][1]))
        name = f"{self.array}[{', '.join(str(int(i)) for i in np.unravel_index(element, target.shape))}]"
        return (f"{message}. The line that read {name} most, {reads} of its {sum(by_line.values())} reads, "
                f"is {where.describe_with_code(*site)}")


def _traces_with_array(traces, name):
    return [t for t in traces if name in t.arrays()]


def _block_softmax_cases(configuration):
    """(rows, T_k, kind), from the block's THREADS_PER_ROW n (32 on the simulator, 128 on a GPU): a row
    one short of the block (the last thread has no column; 3 rows, so a row taken from anything but
    blockIdx shows), exactly a block of negative scores, one past (thread 0 takes two columns); two
    rows of n + 3 whose max stands alone in the first column, the last, or the first past the block
    (a walk that misses a column misses it); two blocks and 5 around +-1000; one short of a block,
    every score below -90 (a thread with no column must bring -inf to the max); n + 7 spread over
    -500 .. 500 (more than 88 within a thread's columns); all but the last 5 scores -inf (every
    thread's first column masked); causal rows with one fully masked; one row of one score (every
    thread but one without a column)."""
    n = softmax.THREADS_PER_ROW
    return [(3, n - 1, "normal"), (2, n, "negative"), (2, n + 1, "normal"), (3, n + 3, "peaks"),
            (2, 2 * n + 5, "large"),
            (2, n - 1, "deep"), (2, n + 7, "spread"), (2, n + BAND, "left-masked"), (5, 33, "masked"),
            (1, 1, "normal")]


def _thread_sums(s):
    """(rows, THREADS_PER_ROW) float64: each thread's sum of exp(s - row max) over its columns tid,
    tid + threads, ... (0 in a fully masked row)."""
    m = s.max(axis=-1)
    shift = np.where(np.isneginf(m), 0.0, m)
    return np.exp(thread_columns(s) - shift[:, None, None]).sum(axis=-1)


def _diagnose_block_softmax(got, expected, s, error):
    """Name the block kernel's mistake; None when it is none of the known ones."""
    finite = s[np.isfinite(s)]
    # Rows whose max stands more than 88 above the rest: some right and some wrong, so the answer does
    # subtract a max, but misses some columns (an answer that subtracts none gets every such row wrong).
    top = np.sort(s, axis=-1)[:, -2:] if s.shape[1] > 1 else None
    with np.errstate(invalid="ignore"):                # -inf - (-inf) in a masked row: NaN, not alone
        alone = top is not None and top[:, 1] - top[:, 0] > 88
    right = np.isclose(got, expected, rtol=1e-5, atol=1e-6).all(axis=-1)
    if np.any(alone & right) and np.any(alone & ~right):
        row = int(np.flatnonzero(alone & ~right)[0])
        column = int(np.argmax(s[row]))
        return "max_misses_a_column", (
            f"row {row}'s largest score, in column {column}, was left out of its max, and exp of the scores "
            "shifted by a smaller one overflowed: the threads' walks must cover every column of the row, "
            "from column 0 to the last")
    # A max started from 0, 0 brought by a thread with no column and a max clamped at 0 give the same
    # weights, so wrong_neutral_value's message names all three.
    if finite.size and finite.max() < -90:
        return "wrong_neutral_value", (
            "every score of these rows lies below -90 and the weights came out wrong, as they do when "
            "exp(s - m) underflows because m lies above the row's max. The shift must be the row's max "
            "whatever its sign: a max started from 0, 0 brought by a thread with no column, or a max "
            "clamped at 0 after the reduction all give this")
    if error is None and np.abs(finite).max() > 100:
        high = s.max(axis=-1) > 0                                          # the rows around +1000
        if np.allclose(got[high], expected[high], rtol=1e-5, atol=1e-6) and \
                not np.allclose(got[~high], expected[~high], rtol=1e-5, atol=1e-6):
            low = got[~high]
            seen = "all 0 or NaN" if np.all((low == 0) | np.isnan(low)) else "wrong"
            return "wrong_neutral_value", (
                f"rows around +1000 are right but rows around -1000 came out {seen}, as when exp(s - m) "
                "underflows because m lies far above the row's max (0, say). The shift must be the row's max "
                "whatever its sign: a max started from 0, 0 brought by a thread with no column, or a max "
                "clamped at 0 after the reduction all give this")
    named = unstable(got, s, error) or fully_masked(got, s)
    if named:
        return named
    s64 = s.astype(np.float64)
    m = s64.max(axis=-1, keepdims=True)
    seen = ~np.isneginf(m[:, 0])
    with np.errstate(invalid="ignore", divide="ignore"):
        own = np.exp(s64 - np.where(seen[:, None], m, 0.0))
        own = own / _thread_sums(s64)[:, np.arange(s.shape[1]) % softmax.THREADS_PER_ROW]
    defined = seen[:, None] & np.isfinite(own)
    if defined.any() and np.allclose(got[defined], own[defined], rtol=1e-5, atol=1e-6):
        return "sum_not_reduced", (
            "each thread divided its columns by its own partial sum, not by the row's: reduce the threads' "
            "sums over the block, so that every thread divides by the same total")
    return computed_nan(got, expected)


register(Exercise(
    exercise_id="04_block_softmax",
    kind="kernel",
    run=_run_block_softmax,
    cases=_block_softmax_cases,
    both_shapes=True,
    describe_case=lambda c: f"rows = {c[0]}, T_k = {c[1]} ({c[2]} scores)",
    hint=("the block shares its row: each thread first gathers what it can of the row alone, then "
          "block_reduce gives every thread the whole row's figure, once for the max and once for the sum. "
          "A warp's load takes one segment when its 32 threads read 32 neighbouring scores, so let the "
          "whole block step along the row together, a block's width at a time, each thread at its own offset"),
    more_hints=("the plan: thread number t takes columns t, t plus the block size, t plus twice the block "
                "size, and so on to the row's end, in each of three walks; the first walk keeps the "
                "largest score (a thread with no column keeps minus infinity), and block_reduce makes it "
                "the row's max in every thread; the second adds up the exponentials shifted by that max, "
                "and block_reduce makes it the row's sum; the third writes each weight. A fully masked "
                "row's max is minus infinity: either shift by 0 there, so that every exponential, the sum "
                "and every weight are 0, or let the whole block leave together right after the first "
                "reduction",
                "where answers go wrong: a thread that leaves early (it has no column, or its own columns "
                "are all masked) while the others wait for it at a barrier inside block_reduce; a max "
                "started from 0, wrong on rows whose every score lies far below 0; each thread dividing "
                "by its own sum instead of the row's; a thread that takes a contiguous chunk of the row, "
                "so that a warp's load spreads over many segments; exponentials written to out and divided "
                "there afterwards, so that each weight is stored twice; the block size written as 32"),
    # float32 exp and sums of up to 261 terms against float64: relative errors around 1e-6.
    rtol=1e-5,
    atol=1e-6,
    limits=(MostLoadsNamingTheLine("s", 3, why=(
                "kernel 2 reads each score three times, in the max's walk, the sum's and the weights': a "
                "thread gathers its part of the row as it walks, and the block shares the parts")),
            NoSerialCopy("s"), NoSerialCopy("out", access="store"),
            Coalesced("out", 2, access="store"), Coalesced("s", 2),
            # The contract gives each weight one writer and one value: a thread that stores exp(s - m) and
            # then divides out in place stores each of its weights twice (and reads them back).
            StoredOnce("out", why=("store each weight once, when its value is final: an exponential stored in "
                                   "out and divided there later is stored twice")),
            SharedLoadsPerThread(lambda case: 2 * reads_per_reduction(), why=(
                "two trees (the max, then the sum) read at most 2 log2(THREADS_PER_ROW) + 2 slots a thread "
                "each; a loop over the slots in one thread reads all THREADS_PER_ROW of them")),
            NoSharedAtomics(why=atomics_why),
            MostBarriers(lambda case: 2 * _barriers_per_reduction(), why=(
                "two trees need 2 + log2(THREADS_PER_ROW) barriers each, and the walks none")),
            NoUnwrittenReads(why="every slot a reduction reads must be written first, -inf or 0 by a "
                                 "thread with no column")),
    diagnose=_diagnose_block_softmax,
    diagnoses=("max_misses_a_column", "wrong_neutral_value", "unstable_softmax", "fully_masked_row",
               "sum_not_reduced", "output_rewritten"),
    solution=softmax.block_softmax_kernel,
    forbidden=STAGE + (strided_max, strided_sum_exp, strided_write, strided_zeros, softmax.block_max,
                        softmax.block_sum),
))
