"""``04_row_softmax`` (notebook 04, warm-up): a kernel with softmax_kernel_v1's signature ``(s, out)``, one
thread a row on v1's grid, whose solution is ``softmax.softmax_kernel_v1``. Its cases and named mistakes
are declared in the ``Exercise`` below. Here too is what the softmax kernels of notebook 04 and deep dive
04x share: their cases' scores (``case_scores``), one launch on a version's grid (``run_softmax``), and
the diagnoses of an unstable softmax, a fully masked row and a NaN the kernel computed.
"""

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.stages import softmax
from attention_lib.stages.softmax import strided_max, strided_sum_exp, strided_write, strided_zeros
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import output_array, read_output

LARGE = 1000.0           # scores of the large case: exp(1000) overflows float32 (max about 88.7)
SPREAD = 500.0           # half the span of a "spread" row's scores
BAND = 5                 # a left-masked row's scores that are not -inf: its last BAND
PEAK = 200.0             # a "peaks" row's largest score: a shift that misses it leaves exp(~197) = inf

# The library code an answer to any of the softmax exercises may not call: the kernels, their
# launchers, and the helpers that make the passes over a row.
STAGE = (softmax.softmax_kernel_v1, softmax.softmax_kernel_v2, softmax.softmax_kernel_v3,
         softmax.launch_softmax, softmax.softmax, softmax.online_softmax, reference.softmax)


def case_scores(rows, t_k, kind, rng):
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
        s[:, :-BAND] = -np.inf           # columns (a thread's, a lane's first ones) wholly masked,
                                         # as a sliding window's band or left padding leaves them
    return s.astype(np.float32)


def run_softmax(kernel, case, rng, launch, version):
    """(got, expected, s, error) of one launch of `kernel` on softmax `version`'s grid."""
    rows, t_k, kind = case
    s = case_scores(rows, t_k, kind, rng)
    grid, block = softmax.softmax_grid(rows, version)
    guard = block * t_k                              # the rows of a whole extra block, at most
    # Inputs and output followed by guard zones, so reads and writes past the last row stay
    # inside the allocation on a GPU, and writes there are caught.
    d_s_full = cuda.to_device(np.concatenate([s.ravel(), np.zeros(guard, np.float32)]))
    # Prefilled: an entry left UNWRITTEN was never written, and a NaN the kernel computed (a fully
    # masked row's 0 / 0) stays a NaN, which the diagnosis names.
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
    return run_softmax(kernel, case, rng, launch, version=1)


def unstable(got, s, error):
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


def fully_masked(got, s):
    """fully_masked_row, or None."""
    masked_rows = np.isneginf(s).all(axis=-1)
    if masked_rows.any() and np.isnan(got[masked_rows]).any():
        row = int(np.flatnonzero(masked_rows & np.isnan(got).any(axis=-1))[0])
        return "fully_masked_row", (
            f"row {row} has every score -inf (fully masked) and its weights came out NaN "
            "(-inf - (-inf) = NaN, or 0 / 0): when the row max is -inf, write zeros, the row attends to nothing")
    return None


def computed_nan(got, expected):
    """wrong_values naming the first NaN the kernel computed, or None."""
    if np.isnan(got).any():
        where = tuple(int(i) for i in np.argwhere(np.isnan(got))[0])
        return "wrong_values", f"the kernel computed NaN at {where}, where the weight is {expected[where]:.6g}"
    return None


def _diagnose(got, expected, s, error):
    """Name the warm-up's mistake; None when it is none of the known ones (the engine shows where)."""
    named = unstable(got, s, error) or fully_masked(got, s)
    if named:
        return named
    if np.allclose(got, reference.softmax(s, axis=0), rtol=1e-5, atol=1e-6):
        return "softmax_wrong_axis", (
            "each column sums to 1, not each row: thread `row` must take the max and the sum "
            "over s[row, j] for every key j, along the row")
    return computed_nan(got, expected)


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
    forbidden=STAGE + (strided_max, strided_sum_exp, strided_write, strided_zeros),
))
