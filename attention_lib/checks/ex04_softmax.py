"""Notebook 04's exercises, the row softmax with a thread and a block per row, and the deep dive
04x's, the row softmax with a warp per row and the warps an SM holds.

``04_row_softmax`` (warm-up): a kernel with softmax_kernel_v1's signature ``(s, out)``, s and out
(rows, T_k) float32, launched on v1's grid (one thread per row, ROWS_PER_BLOCK rows to a block).

``04_block_reduction`` (warm-up): ``block_reduce(partial, value, take_max)``, a device function: the
max (take_max) or the sum of one value per thread over the block, by a tree in the shared array
``partial``, returned to every thread. The check runs softmax_kernel_v2 with the answer in the
library's place (``softmax_around``), under the race finder on every case, at the simulator's
THREADS_PER_ROW (32) and a GPU's (128), and compares what every thread got from both reductions
with the row's max and sum of exp(s - max). Limit: no thread reads shared memory more than
2 log2(THREADS_PER_ROW) + 2 times a reduction (``serial_reduction``: a loop over the slots in one
thread reads THREADS_PER_ROW of them).

``04_block_softmax`` (main): a kernel with softmax_kernel_v2's signature ``(s, out)``, launched on
v2's grid (one block of THREADS_PER_ROW threads per row, row = blockIdx.x), designed by the student
around the warm-up's block_reduce: which thread reads which columns, what each thread brings to each
reduction, the fully masked row's guard, the write pass (softmax.block_softmax_kernel). Run at the
simulator's 32 threads a row and a GPU's 128. Limits, counted per launch: each score read at most 3
times (kernel 2's count; ``no_reuse`` names the line that read the most-read score most, from the
traced launch's record of each access's line); no warp making more than twice its share of its block's loads of s or
stores of out (``serial_copy``: one thread, or one lane a warp, walking the row); at most 2 segments
a warp load of s and store of out; no thread reading shared memory more than two trees'
2 (2 log2(THREADS_PER_ROW) + 2) times or passing more than two trees' 2 (2 + log2(THREADS_PER_ROW))
barriers; no shared slot read before its block wrote it.

``04x_warp_softmax`` (deep dive 04x): a kernel with softmax_kernel_v3's signature, launched on v3's grid
(one warp per row): each lane folds its columns into one (m, l) pair with ``merge_stats``, the
warp merges the pairs with shuffles, each lane writes its columns. Limits: every score read at most
twice from global memory (``stats_not_in_one_pass``); a warp's load of s touches at most 2
segments of 128 bytes on average (``uncoalesced``: lanes that each take a contiguous chunk of the
row).

The cases come from the constants (the block exercises' cases are a function of the
configuration): rows around a block of ROWS_PER_BLOCK, rows of THREADS_PER_ROW - 1, THREADS_PER_ROW,
THREADS_PER_ROW + 1, + 3, + 5, + 7 and 2 THREADS_PER_ROW + 5 scores at either launch, more than 4
warps of columns; and from magnitudes: rows whose max stands PEAK above the rest in the first column,
the last or the first past a block, rows whose every score lies below -90, rows around +-1000, rows spanning about 1000, rows whose every
score but the last 5 is -inf (the first block of columns, or the first 32 lanes' columns, wholly
masked: a sliding window's band or left padding), causal rows with one fully masked.

Besides the engine's diagnoses (``race``, ``divergent_barrier`` for a barrier or a shuffle that
not every thread reaches, ``out_of_bounds``, ``float64_arithmetic``):

- ``unstable_softmax``: right on small scores, but overflow on scores around +1000 (the
  simulator's math.exp raises OverflowError, a GPU returns inf and then NaN) or 0 / 0 on
  scores around -1000: the row maximum was not subtracted before exp; or a shift by some other
  score of the row (its first, say), caught by rows whose scores span about 1000;
- ``softmax_wrong_axis``: the weights sum to 1 down each column instead of along each row;
- ``fully_masked_row``: a row whose every score is -inf came out NaN instead of all zeros;
- ``tree_stops_early``: the tree left out its last rounds: slot 0 holds only every 2nd (4th,
  ...) thread's value;
- ``tree_starts_narrow``: the first stride was less than half the block (a number that fits the
  simulator's 32 threads, where a GPU's block has 128): slot 0 holds only the first threads' values;
- ``result_not_broadcast``: only thread (lane) 0 got the row's result, the others kept a part;
- ``wrong_neutral_value``: a lane started its pair from m = 0, not -inf (or, in the block kernel, a
  shift above the row's max on negative rows: a thread's max started from 0, a thread with no column
  bringing 0 to the max's reduction, or the reduced max clamped at 0; they give the same weights, so
  the message names all three): rows around -1000, or below -90, underflow while rows around +1000
  come out right;
- ``online_softmax_no_rescale``: the lanes' sums l were added without rescaling each to the
  common maximum;
- ``stats_not_in_one_pass``: right weights, but a score read three times (counted by the
  sanitizer): the max and the sum were not folded into one pass of (m, l) pairs;
- ``sum_not_reduced`` (the block kernel): each thread divided its columns by its own partial sum,
  not by the row's;
- ``max_misses_a_column`` (the block kernel): a row's max, alone PEAK above the rest in its first
  column, its last, or the first past the block, was left out of the max (a walk's start, end or
  step off by one), and the shifted exponentials overflowed.

Outputs are prefilled by the engine's output_array: an entry left UNWRITTEN was never written,
and a NaN the kernel computed (a fully masked row's 0 / 0) stays a NaN, which the diagnosis names.

``04x_warps_per_sm`` (deep dive 04x): ``warps_per_sm(registers, shared_bytes, threads_per_block, sm)``, a plain
function, the resident warps per SM of blocks of ``threads_per_block`` threads that use
``registers`` registers a thread and ``shared_bytes`` of shared memory a block, on the SM whose
limits ``sm`` holds (``kernel_report.SMLimits``: an H200's and a T4's). The check holds it, exactly,
to the kernel report's own function (``kernel_report.warps_per_sm``) on cases where each limit
binds in turn and each rounding matters (the softmax kernels' own rows among them), then on
random kernels, on both SMs: numbers typed for an H200 fail on the T4.

Its named mistakes, each found by recomputing the case with one rule left out:
``registers_not_rounded``, ``sub_partitions_ignored``, ``reserved_shared_missing``,
``warp_slots_ignored``, ``block_slots_ignored``, ``partial_warp_dropped``, ``blocks_not_warps``,
``sm_ignored`` (an H200's limits typed in, caught on the T4).
"""

import math
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.stages import softmax
from attention_lib.stages.softmax import (THREADS_PER_ROW, WARP_SIZE, strided_max, strided_sum_exp,
                                          strided_write, strided_zeros)
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import output_array, race_finding_launch, read_output
from attention_lib.checks.limits import (Coalesced, MostBarriers, MostLoads, NoSerialCopy, NoUnwrittenReads,
                                         SharedLoadsPerThread)
from attention_lib.measure import kernel_report, sanitizer
from attention_lib.measure.kernel_report import H200, T4
from attention_lib.platform import where

LARGE = 1000.0           # scores of the large case: exp(1000) overflows float32 (max about 88.7)
SPREAD = 500.0           # half the span of a "spread" row's scores
BAND = 5                 # a left-masked row's scores that are not -inf: its last BAND
PEAK = 200.0             # a "peaks" row's largest score: a shift that misses it leaves exp(~197) = inf

# The library code an answer to any of the three may not call: the kernels, their launchers,
# and the helpers that make the passes over a row.
_STAGE = (softmax.softmax_kernel_v1, softmax.softmax_kernel_v2, softmax.softmax_kernel_v3,
          softmax.launch_softmax, softmax.softmax, softmax.online_softmax, reference.softmax)


def _scores(rows, t_k, kind, rng):
    """Scores of one case, (rows, T_k) float32."""
    s = rng.standard_normal((rows, t_k))
    if kind == "large":                  # alternating rows around +1000 and -1000
        s = 3.0 * s + np.where(np.arange(rows)[:, None] % 2 == 0, LARGE, -LARGE)
    elif kind == "spread":               # each row spans about 2 * SPREAD: a shift by the row's first
        s = rng.uniform(-SPREAD, SPREAD, (rows, t_k))   # score leaves exponents above 88.7 in most rows
    elif kind == "negative":             # every score below 0: a max that starts at 0 stays there
        s = -np.abs(s) - 5.0
    elif kind == "deep":                 # every score below -90: exp(s - 0) is subnormal or 0
        s = -100.0 - 4.0 * np.abs(s)
    elif kind == "peaks":                # each row's max PEAK above the rest, in its first column, its
        columns = [0, t_k - 1, min(softmax.THREADS_PER_ROW, t_k - 1)]   # last, or the first past a block
        s[np.arange(rows), [columns[r % 3] for r in range(rows)]] = PEAK
    elif kind == "masked":               # causal mask, and one row with every score masked
        s = reference.apply_causal_mask(s)
        s[min(3, rows - 1)] = -np.inf
    elif kind == "left-masked":          # all but the last BAND scores -inf: the first block of
        s[:, :-BAND] = -np.inf           # columns (a thread's, a lane's first ones) wholly masked
    return s.astype(np.float32)


def _run_softmax(kernel, case, rng, launch, version):
    rows, t_k, kind = case
    s = _scores(rows, t_k, kind, rng)
    grid, block = softmax.softmax_grid(rows, version)
    guard = block * t_k                              # the rows of a whole extra block, at most
    # Inputs and output followed by guard zones, so reads and writes past the last row stay
    # inside the allocation on a GPU, and writes there are caught.
    d_s_full = cuda.to_device(np.concatenate([s.ravel(), np.zeros(guard, np.float32)]))
    full, d_out = output_array((rows, t_k), guard)
    d_s = d_s_full[:s.size].reshape(rows, t_k)       # (rows, T_k) view
    error = None
    try:
        launch(kernel, grid, block, d_s, d_out)
    except (OverflowError, ZeroDivisionError, FloatingPointError) as caught:
        if kind not in ("large", "spread"):
            raise                        # not the overflow this case tests: the engine reports it
        error = caught
    expected = reference.softmax(s)
    if error is not None:                # nothing usable came out: every entry counts as wrong
        return np.full(s.shape, np.inf), expected, s, error
    return read_output(full, d_out), expected, s, error


def _run_row_softmax(kernel, case, rng, launch):
    return _run_softmax(kernel, case, rng, launch, version=1)


def _run_warp_softmax(kernel, case, rng, launch):
    return _run_softmax(kernel, case, rng, launch, version=3)


def _unstable(got, s, error):
    """The diagnosis of an answer that raised or gave inf/NaN on the large or spread case, or None."""
    if np.abs(s[np.isfinite(s)]).max() <= 100:
        return None
    if error is not None:
        why = ("exp(-1000) underflows to 0, so a row's sum is 0 and 0 / 0 is undefined"
               if isinstance(error, ZeroDivisionError) else
               "exp(1000) overflows (a GPU returns inf, then inf / inf = NaN)")
        return "unstable_softmax", (
            f"large scores made the kernel raise {type(error).__name__}: {why}. "
            "Subtract the row maximum first (no other score of the row will do): exp(s - max) <= 1 "
            "and the largest term is exactly 1")
    if not np.isfinite(got).all():
        return "unstable_softmax", (
            f"large scores gave {int((~np.isfinite(got)).sum())} NaN or inf weights: "
            "exp(1000) overflows float32 and exp(-1000) underflows to 0 (0 / 0). "
            "Subtract the row maximum first (no other score of the row will do): exp(s - max) <= 1 "
            "and the largest term is 1")
    return None


def _fully_masked(got, s):
    """fully_masked_row, or None."""
    masked_rows = np.isneginf(s).all(axis=-1)
    if masked_rows.any() and np.isnan(got[masked_rows]).any():
        row = int(np.flatnonzero(masked_rows & np.isnan(got).any(axis=-1))[0])
        return "fully_masked_row", (
            f"row {row} has every score -inf (fully masked) and its weights came out NaN "
            "(-inf - (-inf) = NaN, or 0 / 0): when the row max is -inf, write zeros, the row attends to nothing")
    return None


def _computed_nan(got, expected):
    """wrong_values naming the first NaN the kernel computed, or None."""
    if np.isnan(got).any():
        where = tuple(int(i) for i in np.argwhere(np.isnan(got))[0])
        return "wrong_values", f"the kernel computed NaN at {where}, where the weight is {expected[where]:.6g}"
    return None


def _diagnose(got, expected, s, error):
    """Name the warm-up's mistake; None when it is none of the known ones (the engine shows where)."""
    named = _unstable(got, s, error) or _fully_masked(got, s)
    if named:
        return named
    if np.allclose(got, reference.softmax(s, axis=0), rtol=1e-5, atol=1e-6):
        return "softmax_wrong_axis", (
            "each column sums to 1, not each row: thread `row` must take the max and the sum "
            "over s[row, j] for every key j, along the row")
    return _computed_nan(got, expected)


register(Exercise(
    exercise_id="04_row_softmax",
    kind="kernel",
    run=_run_row_softmax,
    # (rows, T_k, kind): one score; 7 rows of 5 (fewer rows than a block; every column gets a
    # thread too, so a column softmax stays in bounds and is recognised); scores around +-1000
    # (overflow without the max), rows spanning about 1000 (a shift by the row's first score
    # overflows in most of them), a block and one row (a partly used second block) of causal
    # -inf with one fully masked row; a block less one row, all but the last BAND scores -inf.
    cases=[(1, 1, "normal"), (7, 5, "normal"), (7, 33, "large"), (5, 19, "spread"),
           (softmax.ROWS_PER_BLOCK + 1, 33, "masked"), (softmax.ROWS_PER_BLOCK - 1, 40, "left-masked")],
    describe_case=lambda c: f"rows = {c[0]}, T_k = {c[1]} ({c[2]} scores)",
    hint=("one thread owns one whole row; the shift that keeps every exponential at most 1 is the row's "
          "largest score, which the thread knows only after a first walk along the row"),
    more_hints=("where each step goes: threads past the last row do nothing; a first walk finds the maximum, "
                "starting from minus infinity as a float32; a row whose maximum is minus infinity gets zeros "
                "and its thread is done; a second walk adds up the shifted exponentials in a float32 total; a "
                "third writes each shifted exponential divided by that total",
                "where answers go wrong: shifting by a score that is not the row's maximum (the first one, "
                "say); a row whose every score is -inf, where the maximum itself is -inf; a total or a maximum "
                "started from a plain Python number, which makes the arithmetic float64 on a GPU"),
    # float32 exp and sums of up to 33 terms against float64: relative errors around 1e-7 per weight.
    rtol=1e-5,
    atol=1e-6,
    diagnose=_diagnose,
    diagnoses=('unstable_softmax', 'softmax_wrong_axis', 'fully_masked_row'),
    solution=softmax.softmax_kernel_v1,
    forbidden=_STAGE + (strided_max, strided_sum_exp, strided_write, strided_zeros),
))


# --- The main exercise: the tree reduction of kernel 2 ------------------------------------------

_AROUND = {}


def softmax_around(block_reduce):
    """softmax_kernel_v2's passes with `block_reduce` in the library's place, one kernel per device
    function.

    Arguments (s, out, seen): s and out (rows, T_k) float32 as the library kernel's; seen
    (rows, THREADS_PER_ROW, 2) float32, written: what each thread got from the two reductions
    (the row's max, then its sum of exp(s - max); 0 for a fully masked row). Unlike kernel 2,
    every thread joins both reductions, also on a fully masked row: a wrong max that differs
    from thread to thread cannot send them to different barriers. Grid: one block of
    THREADS_PER_ROW threads per row.
    """
    if block_reduce not in _AROUND:
        @cuda.jit
        def kernel(s, out, seen):
            partial = cuda.shared.array(THREADS_PER_ROW, np.float32)
            row, tid = cuda.blockIdx.x, cuda.threadIdx.x
            row_max = block_reduce(partial, strided_max(s, row, tid, THREADS_PER_ROW), True)
            masked = row_max == -math.inf          # every score -inf: nothing to add
            mine = np.float32(0.0) if masked else strided_sum_exp(s, row, tid, THREADS_PER_ROW, row_max)
            total = block_reduce(partial, mine, False)
            seen[row, tid, 0] = row_max
            seen[row, tid, 1] = total
            if masked:
                strided_zeros(out, row, tid, THREADS_PER_ROW)
            else:
                strided_write(s, out, row, tid, THREADS_PER_ROW, row_max, np.float32(1.0) / total)
        _AROUND[block_reduce] = kernel
    return _AROUND[block_reduce]


def _thread_stats(s):
    """(rows, THREADS_PER_ROW) float64 each: the max of each thread's columns tid, tid + threads, ..."""
    threads = softmax.THREADS_PER_ROW
    padded = np.full((s.shape[0], -(-s.shape[1] // threads) * threads), -np.inf)
    padded[:, :s.shape[1]] = s
    return padded.reshape(s.shape[0], -1, threads).transpose(0, 2, 1)   # (rows, threads, columns each)


def _tree_result(s, every, width=None):
    """(rows, 2): the max, and the sum of exp(s - that max), over the columns of the threads tid with
    tid % every == 0 only (what slot 0 holds when the tree stops log2(every) rounds early), and
    tid < width (what it holds when the first stride was width / 2)."""
    per = _thread_stats(s.astype(np.float64))[:, :width:every]     # (rows, threads / every, columns each)
    m = per.max(axis=(1, 2))
    shift = np.where(np.isneginf(m), 0.0, m)
    return np.stack([m, np.where(np.isneginf(m), 0.0, np.exp(per - shift[:, None, None]).sum(axis=(1, 2)))], -1)


def _row_stats(s):
    """(rows, 2) float64: each row's maximum and sum of exp(s - max); (-inf, 0) if fully masked."""
    return _tree_result(s, 1)


def _run_block_reduction(block_reduce, case, rng, _launch):   # race-checked on every case
    rows, t_k, kind = case
    threads = softmax.THREADS_PER_ROW                  # the configuration's: 32, or a GPU's 128
    s = _scores(rows, t_k, kind, rng)
    out = cuda.device_array((rows, t_k), np.float32)
    full, seen = output_array((rows, threads, 2), guard=2 * threads)
    try:
        race_finding_launch(softmax_around(block_reduce), rows, threads,
                            cuda.to_device(s), out, seen)
    except (OverflowError, ZeroDivisionError, FloatingPointError):
        if kind != "large":
            raise                        # not the overflow this case tests: the engine reports it
        got = np.full((rows, threads, 2), np.inf)                    # nothing usable came out
    else:
        got = read_output(full, seen)
    expected = np.repeat(_row_stats(s)[:, None], threads, axis=1)   # (rows, threads, 2)
    return got, expected, s


def _reads_per_reduction():
    """The shared-memory reads one thread may make in one reduction: 2 a round (its slot and the
    one a stride above), log2(THREADS_PER_ROW) rounds, the result, and one to spare."""
    return 2 * int(math.log2(softmax.THREADS_PER_ROW)) + 2


def _diagnose_block_reduction(got, expected, s):
    close = dict(rtol=1e-5, atol=1e-6)
    first = got[:, 0]                                              # thread 0's view, (rows, 2)
    if np.allclose(first, expected[:, 0], **close):
        return "result_not_broadcast", (
            "thread 0 got the row's result but other threads did not: every thread must read the "
            "result from slot 0 once the last round is over, not from its own slot")
    every, threads = 2, softmax.THREADS_PER_ROW
    while every <= threads:
        if np.allclose(first, _tree_result(s, every), **close):
            rounds = int(np.log2(every))
            return "tree_stops_early", (
                f"slot 0 holds the result of only every {every}{'nd' if every == 2 else 'th'} thread: the tree "
                f"stopped {rounds} "
                f"round{'s' if rounds > 1 else ''} early; it halves the stride down to 1, log2(THREADS_PER_ROW) "
                f"= {int(np.log2(threads))} rounds")
        every *= 2
    width = threads // 2
    while width >= 2:
        if np.allclose(first, _tree_result(s, 1, width), **close):
            return "tree_starts_narrow", (
                f"slot 0 holds the result of threads 0-{width - 1} only, out of {threads}: the first round's "
                f"stride was {width // 2}, where it must be half the block, {threads // 2} at this launch (a "
                "stride written as a number fits one block size: 32 threads a row on the simulator, 128 on a GPU)")
        width //= 2
    return None


register(Exercise(
    exercise_id="04_block_reduction",
    kind="device function",
    run=_run_block_reduction,
    # (rows, T_k, kind), at THREADS_PER_ROW 32 and a GPU's 128: one score (every other thread holds
    # only the neutral value); rows of 7 negative scores; rows of 2 * THREADS_PER_ROW + 5 around
    # +-1000 (each thread has two or three columns); THREADS_PER_ROW + 5 columns, all but the last
    # 5 -inf (every thread's first column masked, 5 threads with a score); causal rows with one
    # fully masked (every thread leaves after the max).
    cases=lambda configuration: [(1, 1, "normal"), (3, 7, "negative"), (2, 2 * softmax.THREADS_PER_ROW + 5, "large"),
                                 (2, softmax.THREADS_PER_ROW + BAND, "left-masked"), (5, 33, "masked")],
    both_shapes=True,
    limits=(SharedLoadsPerThread(lambda case: 2 * _reads_per_reduction(), why=(
        "the check's kernel runs two reductions (the max, then the sum), each allowed 2 log2(THREADS_PER_ROW) "
        "+ 2 reads a thread: a tree shares the work round after round; a loop over the slots in one thread "
        "reads all THREADS_PER_ROW of them")),),
    describe_case=lambda c: f"rows = {c[0]}, T_k = {c[1]} ({c[2]} scores)",
    hint=("each thread puts its value in its own slot; then, round after round, the lower half of the "
          "slots still in play takes in the upper half, until slot 0 holds the whole block's result, "
          "which every thread reads"),
    more_hints=("where each step goes: every thread writes its value to its slot, then waits for the others; "
                "each round, the threads below the stride combine their slot with the one a stride above, and "
                "the whole block waits before the stride halves; from half the block down to 1, "
                "log2(THREADS_PER_ROW) rounds; every thread reads slot 0, and the block waits once more "
                "before the slots can be reused; so the block waits once after the writes, once after each "
                "round and once after the read, two more barriers than rounds",
                "where answers go wrong: a barrier placed inside the test that picks the threads of a "
                "round (every thread of the block must reach every barrier); a barrier missing after "
                "the values are written, after a round, or after the result is read (the next "
                "reduction reuses the slots); the first stride written as a number (32 threads here, 128 "
                "on a GPU)"),
    # float32 exp and sums of up to 69 terms against float64: relative errors around 1e-6.
    rtol=1e-5,
    atol=1e-6,
    diagnose=_diagnose_block_reduction,
    diagnoses=("result_not_broadcast", "tree_stops_early", "tree_starts_narrow"),
    solution=softmax.block_reduce,
    forbidden=_STAGE + (softmax.block_max, softmax.block_sum),
))


# --- The main exercise: one block per row, the whole kernel --------------------------------------

def _run_block_softmax(kernel, case, rng, launch):
    return _run_softmax(kernel, case, rng, launch, version=2)


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
    (a walk that misses a column misses it); two blocks and 5 around +-1000; one short of a block, every score below -90 (a thread with no column
    must bring -inf to the max); n + 7 spread over -500 .. 500 (more than 88 within a thread's
    columns); all but the last 5 scores -inf (every thread's first column masked); causal rows with
    one fully masked; one row of one score (every thread but one without a column)."""
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
    return np.exp(_thread_stats(s) - shift[:, None, None]).sum(axis=-1)


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
    named = _unstable(got, s, error) or _fully_masked(got, s)
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
    return _computed_nan(got, expected)


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
                "so that a warp's load spreads over many segments; the block size written as 32"),
    # float32 exp and sums of up to 261 terms against float64: relative errors around 1e-6.
    rtol=1e-5,
    atol=1e-6,
    limits=(MostLoadsNamingTheLine("s", 3, why=(
                "kernel 2 reads each score three times, in the max's walk, the sum's and the weights': a "
                "thread gathers its part of the row as it walks, and the block shares the parts")),
            NoSerialCopy("s"), NoSerialCopy("out", access="store"),
            Coalesced("out", 2, access="store"), Coalesced("s", 2),
            SharedLoadsPerThread(lambda case: 2 * _reads_per_reduction(), why=(
                "two trees (the max, then the sum) read at most 2 log2(THREADS_PER_ROW) + 2 slots a thread "
                "each; a loop over the slots in one thread reads all THREADS_PER_ROW of them")),
            MostBarriers(lambda case: 2 * _barriers_per_reduction(), why=(
                "two trees need 2 + log2(THREADS_PER_ROW) barriers each, and the walks none")),
            NoUnwrittenReads(why="every slot a reduction reads must be written first, -inf or 0 by a "
                                 "thread with no column")),
    diagnose=_diagnose_block_softmax,
    diagnoses=("max_misses_a_column", "wrong_neutral_value", "unstable_softmax", "fully_masked_row",
               "sum_not_reduced"),
    solution=softmax.block_softmax_kernel,
    forbidden=_STAGE + (strided_max, strided_sum_exp, strided_write, strided_zeros, softmax.block_max,
                        softmax.block_sum),
))


# --- 04x_warp_softmax (deep dive 04x): one warp per row, its (m, l) pairs merged by shuffles --------

def _lane_pairs(s):
    """(rows, 32) m and l of each lane's columns lane, lane + 32, ..., float64."""
    padded = np.full((s.shape[0], -(-s.shape[1] // WARP_SIZE) * WARP_SIZE), -np.inf)
    padded[:, :s.shape[1]] = s
    per = padded.reshape(s.shape[0], -1, WARP_SIZE).transpose(0, 2, 1)     # (rows, lanes, columns each)
    m = per.max(axis=-1)
    shift = np.where(np.isneginf(m), 0.0, m)
    return m, np.exp(per - shift[..., None]).sum(axis=-1)


def _diagnose_warp(got, expected, s, error):
    named = _unstable(got, s, error)
    large = np.abs(s[np.isfinite(s)]).max() > 100
    if named and error is None and large:
        high = s.max(axis=-1) > 0                                          # the rows around +1000
        if np.allclose(got[high], expected[high], rtol=1e-5, atol=1e-6) and np.isnan(got[~high]).all():
            return "wrong_neutral_value", (
                "rows around +1000 are right but rows around -1000 came out NaN: a lane's pair started "
                "from m = 0, which stays the max of negative scores, so exp(s - 0) underflows to 0; "
                "start from the pair that changes nothing, (-inf, 0)")
    named = named or _fully_masked(got, s)
    if named:
        return named
    m_lane, l_lane = _lane_pairs(s.astype(np.float64))
    m = m_lane.max(axis=-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        unscaled = np.exp(s - m) / l_lane.sum(axis=-1, keepdims=True)    # the l's added as they are
    seen = ~np.isneginf(m[:, 0])
    if np.allclose(got[seen], unscaled[seen], rtol=1e-5, atol=1e-6):
        return "online_softmax_no_rescale", (
            "the lanes' sums were added as they are: each lane's l counts against its own maximum and "
            "must be rescaled by exp(m_lane - m) before it joins another; merge_stats does it")
    lane_0 = np.arange(s.shape[1]) % WARP_SIZE == 0
    right = np.isclose(got, expected, rtol=1e-5, atol=1e-6)
    if s.shape[1] > 1 and right[:, lane_0].all() and not right[:, ~lane_0].all():
        return "result_not_broadcast", (
            "lane 0's columns are right but other lanes' are not: the reduction left the row's pair in "
            "lane 0 alone (as shfl_down_sync does); a butterfly, where lane i trades with lane i ^ step, "
            "leaves it in every lane")
    return _computed_nan(got, expected)


register(Exercise(
    exercise_id="04x_warp_softmax",
    kind="kernel",
    run=_run_warp_softmax,
    # (rows, T_k, kind): one score (lanes 1-31 hold nothing, three warps of the block have no
    # row); 3 rows of 7 negative scores; 6 rows of 4 warps + 7 columns (two blocks, the second
    # with two warps, each lane four or five columns: a lane that takes a chunk of the row reads
    # 5 or more segments a warp load); rows around +-1000; rows spanning about 1000; 33 causal rows
    # with one fully masked; rows whose first 32 columns are -inf (every lane's first pair masked).
    cases=[(1, 1, "normal"), (3, 7, "negative"), (6, 4 * WARP_SIZE + 7, "normal"), (6, 37, "large"),
           (5, 19, "spread"), (33, 33, "masked"), (5, WARP_SIZE + BAND, "left-masked")],
    limits=(MostLoads("s", 2, code="stats_not_in_one_pass", why=(
                "fold each score into the lane's (m, l) pair in one pass, then read it once more to write its "
                "weight (2 reads, where kernels 1 and 2 take 3)")),
            Coalesced("s", 2)),
    describe_case=lambda c: f"rows = {c[0]}, T_k = {c[1]} ({c[2]} scores)",
    hint=("each lane folds its own columns into one (m, l) pair as it reads them; then five exchanges "
          "with the lane whose number differs in one bit give every lane the pair of the whole row"),
    more_hints=("where each step goes: the warp's number in the block and the block's number give the row, "
                "the thread's number modulo 32 the lane; a warp past the last row leaves whole; each lane "
                "starts from the pair that has seen nothing and walks the columns that start at its lane, "
                "32 apart (the 32 lanes read 32 neighbouring scores at each step), merging each score in; "
                "five exchanges (a butterfly), steps 16 down to 1, each merging the pair received; a fully masked "
                "row gets zeros, any other its weights, each lane its own columns",
                "where answers go wrong: a lane with no column that leaves before the exchanges (every "
                "lane the mask names must make every shuffle call); adding two sums without bringing "
                "them to the common maximum; an exchange that leaves the result in lane 0 alone; a lane "
                "that takes a contiguous chunk of the row, so a warp's load spreads over many segments"),
    # float32 exp and sums of up to 135 terms against float64: relative errors around 1e-6.
    rtol=1e-5,
    atol=1e-6,
    diagnose=_diagnose_warp,
    diagnoses=("unstable_softmax", "fully_masked_row", "wrong_neutral_value", "online_softmax_no_rescale",
               "result_not_broadcast", "stats_not_in_one_pass"),
    solution=softmax.softmax_kernel_v3,
    forbidden=_STAGE + (strided_max, strided_sum_exp, softmax.block_reduce, softmax.block_max, softmax.block_sum),
))


# --- 04x_warps_per_sm (deep dive 04x): the warps an SM holds ---------------------------------------

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
