"""Notebook 04's exercise: the one-thread-per-row softmax kernel, with its typical mistakes named.

The answer has softmax_kernel_v1's signature ``(s, out)``, s and out (rows, T_k) float32, and
is launched on v1's grid (one thread per row, ROWS_PER_BLOCK rows to a block). Besides the
engine's diagnoses:

- ``unstable_softmax``: right on small scores, but overflow on scores around +1000 (the
  simulator's math.exp raises OverflowError, a GPU returns inf and then NaN) or 0 / 0 on
  scores around -1000: the row maximum was not subtracted before exp; or a shift by some other
  score of the row (its first, say), caught by rows whose scores span about 1000;
- ``softmax_wrong_axis``: the weights sum to 1 down each column instead of along each row;
- ``fully_masked_row``: a row whose every score is -inf came out NaN instead of all zeros.

The output is prefilled by the engine's output_array: an entry left UNWRITTEN was never
written, and a NaN the kernel computed (a fully masked row's 0 / 0) stays a NaN, which the
diagnosis names.
"""

import math
import warnings

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.stages import softmax
from attention_lib.checks.engine import Exercise, output_array, read_output, register

LARGE = 1000.0           # scores of the large case: exp(1000) overflows float32 (max about 88.7)
SPREAD = 500.0           # half the span of a "spread" row's scores


def _scores(rows, t_k, kind, rng):
    """Scores of one case, (rows, T_k) float32."""
    s = rng.standard_normal((rows, t_k))
    if kind == "large":                  # alternating rows around +1000 and -1000
        s = 3.0 * s + np.where(np.arange(rows)[:, None] % 2 == 0, LARGE, -LARGE)
    elif kind == "spread":               # each row spans about 2 * SPREAD: a shift by any score but
        s = rng.uniform(-SPREAD, SPREAD, (rows, t_k))   # the max leaves exponents far above 88.7
    elif kind == "negative":             # every score below 0: a max that starts at 0 stays there
        s = -np.abs(s) - 5.0
    elif kind == "masked":               # causal mask, and one row with every score masked
        s = reference.apply_causal_mask(s)
        s[min(3, rows - 1)] = -np.inf
    return s.astype(np.float32)


def _run_softmax(kernel, case, rng, launch):
    rows, t_k, kind = case
    s = _scores(rows, t_k, kind, rng)
    guard = softmax.ROWS_PER_BLOCK * t_k             # the rows of a whole extra block
    # Inputs and output followed by guard zones, so reads and writes past the last row stay
    # inside the allocation on a GPU, and writes there are caught.
    d_s_full = cuda.to_device(np.concatenate([s.ravel(), np.zeros(guard, np.float32)]))
    full, d_out = output_array((rows, t_k), guard)
    d_s = d_s_full[:s.size].reshape(rows, t_k)       # (rows, T_k) view
    grid, block = softmax.softmax_grid(rows, version=1)
    error = None
    try:
        with warnings.catch_warnings():
            # An unstable answer's NumPy scalars warn of overflow in every thread (the
            # simulator's); the diagnosis says it once.
            warnings.simplefilter("ignore", RuntimeWarning)
            launch(kernel, grid, block, d_s, d_out)
    except (OverflowError, ZeroDivisionError, FloatingPointError) as caught:
        if kind not in ("large", "spread"):
            raise                        # not the overflow this case tests: the engine reports it
        error = caught
    expected = reference.softmax(s)
    if error is not None:                # nothing usable came out: every entry counts as wrong
        return np.full(s.shape, np.inf), expected, s, error
    return read_output(full, d_out), expected, s, None


def _diagnose(got, expected, s, error):
    """Name the mistake; None when it is none of the known ones (the engine shows where)."""
    if np.abs(s[np.isfinite(s)]).max() > 100:       # the large and spread cases
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
    masked_rows = np.isneginf(s).all(axis=-1)
    if masked_rows.any() and np.isnan(got[masked_rows]).any():
        row = int(np.flatnonzero(masked_rows & np.isnan(got).any(axis=-1))[0])
        return "fully_masked_row", (
            f"row {row} has every score -inf (fully masked) and its weights came out NaN "
            "(-inf - (-inf) = NaN, or 0 / 0): when the row max is -inf, write zeros, the row attends to nothing")
    if np.allclose(got, reference.softmax(s, axis=0), rtol=1e-5, atol=1e-6):
        return "softmax_wrong_axis", (
            "each column sums to 1, not each row: thread `row` must take the max and the sum "
            "over s[row, j] for every key j, along the row")
    if np.isnan(got).any():
        where = tuple(int(i) for i in np.argwhere(np.isnan(got))[0])
        return "wrong_values", f"the kernel computed NaN at {where}, where the weight is {expected[where]:.6g}"
    return None


register(Exercise(
    exercise_id="04_row_softmax",
    title="out[row] = softmax(s[row]), one thread per row",
    kind="kernel",
    run=_run_softmax,
    # (rows, T_k, kind): one score; 7 rows of 5 (fewer rows than a block; every column gets a
    # thread too, so a column softmax stays in bounds and is recognised); scores around +-1000
    # (overflow without the max), rows spanning about 1000 (a shift by the row's first score, or
    # any score but the max, still overflows), 33 rows (a partly used second block); causal -inf
    # with one fully masked row.
    cases=[(1, 1, "normal"), (7, 5, "normal"), (7, 33, "large"), (5, 19, "spread"), (33, 33, "masked")],
    describe_case=lambda c: f"rows = {c[0]}, T_k = {c[1]} ({c[2]} scores)",
    hint=("one thread owns one whole row: it walks the row once for the maximum, once for the sum "
          "of the shifted exponentials, once for the weights"),
    more_hints=("where answers go wrong: shifting by a score that is not the row's maximum (the first one, "
                "say), and a row whose every score is -inf, where the maximum itself is -inf",),
    # float32 exp and sums of up to 33 terms against float64: relative errors around 1e-7 per weight.
    rtol=1e-5,
    atol=1e-6,
    diagnose=_diagnose,
    diagnoses=('unstable_softmax', 'softmax_wrong_axis', 'fully_masked_row'),
))


# --- The main exercise: the block reduction of a row's softmax statistics -----------------------
# The answer has the signature ``(s, stats)``: s (rows, T_k) float32, stats (rows, 2) float32,
# launched one block per row with softmax.THREADS_PER_ROW threads. It writes stats[row, 0] = m, the
# row's maximum, and stats[row, 1] = l, the sum of exp(s[row, j] - m); a fully masked row gets
# (-inf, 0). Each thread folds its columns into a pair (m, l) with merge_stats, then the block
# combines the pairs in a shared-memory tree, a barrier between rounds. Besides the engine's
# diagnoses (``race`` for a missing barrier, the answer being race-checked on every case):
#
# - ``row_not_strided``: right on short rows, wrong on rows longer than the block: a thread
#   took column tid only, not tid, tid + THREADS_PER_ROW, ...;
# - ``online_softmax_no_rescale``: the tree added the l's without rescaling each to the
#   common maximum (each thread's l counts against its own m);
# - ``wrong_neutral_value``: rows whose every score is negative got a maximum of 0: a thread
#   with no column must start from (-inf, 0), the pair that changes nothing;
# - ``unstable_softmax``: exp of a raw score overflowed on scores around +1000.

@cuda.jit(device=True)
def merge_stats(m_a, l_a, m_b, l_b):
    """Merge two softmax partials into one: (m, l) with m the larger maximum.

    Each partial is (m, l): m the largest score it has seen, l the sum of exp(s - m) over
    those scores, float32. Rescaling each l to the common maximum keeps every exponent <= 0.
    (-inf, 0), a partial that has seen nothing (or only masked scores), changes nothing.
    """
    m = max(m_a, m_b)
    if m == -math.inf:                     # both saw only masked scores: -inf - (-inf) is NaN
        return m, np.float32(0.0)
    return m, l_a * math.exp(m_a - m) + l_b * math.exp(m_b - m)


def _row_stats(s):
    """(rows, 2) float64: each row's maximum and sum of exp(s - max); (-inf, 0) if fully masked."""
    m = s.max(axis=-1)
    shift = np.where(np.isneginf(m), 0.0, m)
    return np.stack([m, np.exp(s - shift[:, None]).sum(axis=-1)], axis=-1)


def _run_block_reduction(kernel, case, rng, launch):
    rows, t_k, kind = case
    s = _scores(rows, t_k, kind, rng).astype(np.float32)
    full, d_stats = output_array((rows, 2), guard=2 * softmax.THREADS_PER_ROW)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)   # an unstable answer warns in every thread
            launch(kernel, rows, softmax.THREADS_PER_ROW, cuda.to_device(s), d_stats)
    except (OverflowError, ZeroDivisionError, FloatingPointError):
        if kind != "large":
            raise                        # not the overflow this case tests: the engine reports it
        return np.full((rows, 2), np.inf), _row_stats(s.astype(np.float64)), s   # nothing usable came out
    return read_output(full, d_stats), _row_stats(s.astype(np.float64)), s


def _per_thread_stats(s):
    """(rows, THREADS_PER_ROW, 2): the pair each thread holds before the tree, columns tid + k * threads."""
    threads = softmax.THREADS_PER_ROW
    padded = np.full((s.shape[0], -(-s.shape[1] // threads) * threads), -np.inf)
    padded[:, :s.shape[1]] = s
    per = padded.reshape(s.shape[0], -1, threads).transpose(0, 2, 1)   # (rows, threads, columns each)
    m = per.max(axis=-1)
    shift = np.where(np.isneginf(m), 0.0, m)
    return m, np.exp(per - shift[..., None]).sum(axis=-1)


def _diagnose_block_reduction(got, expected, s):
    close = dict(rtol=1e-5, atol=1e-6)
    if not np.isfinite(got).all() and np.abs(s[np.isfinite(s)]).max() > 100:
        return "unstable_softmax", ("a sum came out inf or NaN on scores around +-1000: exp of a raw score "
                                    "overflows; fold every score in with merge_stats, which subtracts the maximum")
    threads = softmax.THREADS_PER_ROW
    if s.shape[1] > threads and np.allclose(got, _row_stats(s[:, :threads].astype(np.float64)), **close):
        return "row_not_strided", (f"the result covers only the first {threads} columns of rows of "
                                   f"{s.shape[1]}: each thread must walk its columns tid, tid + {threads}, ... "
                                   "to the end of the row")
    m_t, l_t = _per_thread_stats(s.astype(np.float64))
    if np.allclose(got[:, 0], expected[:, 0], **close) and np.allclose(got[:, 1], l_t.sum(axis=-1), **close):
        return "online_softmax_no_rescale", ("the maxima are right but each sum adds the threads' l as they are: "
                                             "each l counts against its own thread's maximum and must be rescaled "
                                             "by exp(m_thread - m) before it is added")
    negative = expected[:, 0] < 0
    if negative.any() and np.all(got[negative, 0] == 0):
        return "wrong_neutral_value", ("rows whose every score is negative got a maximum of 0: a thread starts "
                                       "from the pair that changes nothing, (-inf, 0), not from 0")
    return None


register(Exercise(
    exercise_id="04_block_reduction",
    title="a row's max and sum of exp(s - max) by one block: a shared-memory tree of (m, l) pairs",
    kind="kernel",
    run=_run_block_reduction,
    # (rows, T_k, kind): one score; rows of 7 negative scores (most threads have no column);
    # rows of 2 * THREADS_PER_ROW + 5 around +-1000 (each thread has two or three columns, the
    # last ones partly used); causal rows with one fully masked.
    cases=[(1, 1, "normal"), (3, 7, "negative"), (2, 2 * softmax.THREADS_PER_ROW + 5, "large"),
           (5, 33, "masked")],
    describe_case=lambda c: f"rows = {c[0]}, T_k = {c[1]} ({c[2]} scores)",
    hint=("each thread folds its own columns into one (m, l) pair, then the block halves the number of "
          "pairs each round in shared memory, merging pair tid with pair tid + stride"),
    more_hints=("where answers go wrong: a missing barrier, after the pairs are written and after every "
                "round (the next round reads what this one wrote); and a thread that skips the tree: every "
                "thread of the block must reach every barrier",),
    # float32 exp and sums of up to 69 terms against float64: relative errors around 1e-6.
    rtol=1e-5,
    atol=1e-6,
    diagnose=_diagnose_block_reduction,
    diagnoses=("row_not_strided", "online_softmax_no_rescale", "wrong_neutral_value", "unstable_softmax"),
))

