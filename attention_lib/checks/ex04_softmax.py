"""Notebook 04's exercise: the one-thread-per-row softmax kernel, with its typical mistakes named.

The answer has softmax_kernel_v1's signature ``(s, out)``, s and out (rows, T_k) float32, and
is launched on v1's grid (one thread per row, ROWS_PER_BLOCK rows to a block). Besides the
engine's diagnoses:

- ``unstable_softmax``: right on small scores, but overflow on scores around +1000 (the
  simulator's math.exp raises OverflowError, a GPU returns inf and then NaN) or 0 / 0 on
  scores around -1000: the row maximum was not subtracted before exp;
- ``softmax_wrong_axis``: the weights sum to 1 down each column instead of along each row;
- ``fully_masked_row``: a row whose every score is -inf came out NaN instead of all zeros.

A NaN the answer computed must not pass for an entry it never wrote (the engine's NaN
marker), so the output is prefilled with -1, a value no softmax produces: -1 left over
becomes NaN (never written), and a computed NaN reaches the engine as +inf, the original
handed to the diagnosis.
"""

import warnings

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.stages import softmax
from attention_lib.checks.engine import Exercise, assert_guard_intact, launch, register

UNWRITTEN = -1.0         # prefill of the output: never a softmax weight
LARGE = 1000.0           # scores of the large case: exp(1000) overflows float32 (max about 88.7)


def _scores(rows, t_k, kind, rng):
    """Scores of one case, (rows, T_k) float32."""
    s = rng.standard_normal((rows, t_k))
    if kind == "large":                  # alternating rows around +1000 and -1000
        s = 3.0 * s + np.where(np.arange(rows)[:, None] % 2 == 0, LARGE, -LARGE)
    elif kind == "masked":               # causal mask, and one row with every score masked
        s = reference.apply_causal_mask(s)
        s[min(3, rows - 1)] = -np.inf
    return s.astype(np.float32)


def _run_softmax(kernel, case, rng):
    rows, t_k, kind = case
    s = _scores(rows, t_k, kind, rng)
    guard = softmax.ROWS_PER_BLOCK * t_k             # the rows of a whole extra block
    # Inputs and output followed by guard zones, so reads and writes past the last row stay
    # inside the allocation on a GPU, and writes there are caught.
    d_s_full = cuda.to_device(np.concatenate([s.ravel(), np.zeros(guard, np.float32)]))
    full = cuda.to_device(np.concatenate([np.full(s.size, UNWRITTEN, np.float32),
                                          np.full(guard, np.nan, np.float32)]))
    d_s = d_s_full[:s.size].reshape(rows, t_k)       # (rows, T_k) views
    d_out = full[:s.size].reshape(rows, t_k)
    grid, block = softmax.softmax_grid(rows, version=1)
    error = None
    try:
        with warnings.catch_warnings():
            # An unstable answer's NumPy scalars warn of overflow in every thread (the
            # simulator's); the diagnosis says it once.
            warnings.simplefilter("ignore", RuntimeWarning)
            launch(kernel, grid, block, d_s, d_out)
    except (OverflowError, ZeroDivisionError, FloatingPointError) as caught:
        if kind != "large":
            raise                        # not the overflow this case tests: the engine reports it
        error = caught
    expected = reference.softmax(s)
    if error is not None:                # nothing usable came out: every entry counts as wrong
        return np.full(s.shape, np.inf), expected, s, None, error
    assert_guard_intact(full, s.size)
    raw = d_out.copy_to_host()
    got = np.where(raw == UNWRITTEN, np.nan, np.where(np.isnan(raw), np.inf, raw))
    return got, expected, s, raw, None


def _diagnose(got, expected, s, raw, error):
    """Name the mistake; None when it is none of the known ones (the engine shows where)."""
    if np.abs(s[np.isfinite(s)]).max() > 100:       # the large case
        if error is not None:
            why = ("exp(-1000) underflows to 0, so a row's sum is 0 and 0 / 0 is undefined"
                   if isinstance(error, ZeroDivisionError) else
                   "exp(1000) overflows (a GPU returns inf, then inf / inf = NaN)")
            return "unstable_softmax", (
                f"scores around +-{LARGE:.0f} made the kernel raise {type(error).__name__}: {why}. "
                "Subtract the row maximum first: exp(s - max) <= 1 and the largest term is exactly 1")
        if not np.isfinite(raw).all():
            return "unstable_softmax", (
                f"scores around +-{LARGE:.0f} gave {int((~np.isfinite(raw)).sum())} NaN or inf weights: "
                "exp(1000) overflows float32 and exp(-1000) underflows to 0 (0 / 0). "
                "Subtract the row maximum first: exp(s - max) <= 1 and the largest term is 1")
    masked_rows = np.isneginf(s).all(axis=-1)
    if masked_rows.any() and np.isnan(raw[masked_rows]).any():
        row = int(np.flatnonzero(masked_rows & np.isnan(raw).any(axis=-1))[0])
        return "fully_masked_row", (
            f"row {row} has every score -inf (fully masked) and its weights came out NaN "
            "(-inf - (-inf) = NaN, or 0 / 0): when the row max is -inf, write zeros, the row attends to nothing")
    if np.allclose(raw, reference.softmax(s, axis=0), rtol=1e-5, atol=1e-6):
        return "softmax_wrong_axis", (
            "each column sums to 1, not each row: thread `row` must take the max and the sum "
            "over s[row, j] for every key j, along the row")
    if np.isnan(raw).any():
        where = tuple(int(i) for i in np.argwhere(np.isnan(raw))[0])
        return "wrong_values", f"the kernel computed NaN at {where}, where the weight is {expected[where]:.6g}"
    return None


register(Exercise(
    exercise_id="04_row_softmax",
    title="out[row] = softmax(s[row]), one thread per row",
    kind="kernel",
    run=_run_softmax,
    # (rows, T_k, kind): one score; 7 rows of 5 (fewer rows than a block; every column gets a
    # thread too, so a column softmax stays in bounds and is recognised); scores around +-1000
    # (overflow without the max), 33 rows (a partly used second block); causal -inf with one
    # fully masked row.
    cases=[(1, 1, "normal"), (7, 5, "normal"), (7, 33, "large"), (33, 33, "masked")],
    describe_case=lambda c: f"rows = {c[0]}, T_k = {c[1]} ({c[2]} scores)",
    hint=("row = cuda.grid(1); if row < s.shape[0]: m = max of s[row, j] over j; if m is -inf write "
          "zeros; else total = sum of math.exp(s[row, j] - m); out[row, j] = math.exp(s[row, j] - m) / total"),
    # float32 exp and sums of up to 33 terms against float64: relative errors around 1e-7 per weight.
    rtol=1e-5,
    atol=1e-6,
    diagnose=_diagnose,
    diagnoses=('unstable_softmax', 'softmax_wrong_axis', 'fully_masked_row'),
))
