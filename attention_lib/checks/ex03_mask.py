"""Notebook 03's exercise: the in-place causal mask kernel, with its typical mistakes named.

The answer has mask_kernel_v1's signature ``(s)`` and is launched on the library's grid over
random finite scores. A wrong answer is compared with the usual wrong masks, by which entries
it changed: ``mask_not_applied`` (none), ``mask_includes_diagonal`` (j >= i: a position may
not even see itself), ``mask_wrong_side`` (the past masked instead of the future),
``mask_ignores_offset`` (j > i when T_k > T_q: the queries are the last T_q positions), and
``mask_value_not_neg_inf`` (the right entries, but set to something else than -inf, such as
-1e9 or 0).
"""

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.stages import scores
from attention_lib.checks.engine import Exercise, assert_guard_intact, launch, register


def _run_mask(kernel, case, rng):
    bh, t_q, t_k = case
    s = rng.standard_normal((bh, t_q, t_k)).astype(np.float32)
    n = s.size
    guard = scores.TILE * scores.TILE
    # The scores, then a guard zone of NaN that catches writes past the end on a real GPU.
    full = cuda.to_device(np.concatenate([s.ravel(), np.full(guard, np.nan, np.float32)]))
    d_s = full[:n].reshape(bh, t_q, t_k)                 # (BH, T_q, T_k) view, masked in place
    grid, block = scores.score_grid(bh, t_q, t_k)
    launch(kernel, grid, block, d_s)
    assert_guard_intact(full, n)
    return d_s.copy_to_host(), reference.apply_causal_mask(s), s


def _diagnose(got, expected, s):
    """Name the mistake from the set of entries the answer changed; None when it is none of them."""
    t_q, t_k = s.shape[-2:]
    offset = t_k - t_q
    i, j = np.arange(t_q)[:, None], np.arange(t_k)[None, :]
    changed = got != s                                  # (BH, T_q, T_k)
    if not changed.any():
        return "mask_not_applied", "no score was changed: write -inf where j > i + (T_k - T_q)"
    if not (changed == changed[0]).all():
        return None                                     # heads differ: the engine shows where
    changed = changed[0]                                # (T_q, T_k), the same in every head
    if np.array_equal(changed, j > i + offset) and not np.isneginf(got[..., j > i + offset]).all():
        value = got[..., j > i + offset][~np.isneginf(got[..., j > i + offset])][0]
        return "mask_value_not_neg_inf", (f"the right scores were masked, but with {value:.6g}; use -math.inf, "
                                          "which softmax turns into exactly 0")
    if np.array_equal(changed, j >= i + offset):
        return "mask_includes_diagonal", ("the diagonal is masked too (j >= i): a position may see itself; "
                                          "mask only j > i + (T_k - T_q)")
    if np.array_equal(changed, j < i + offset) or np.array_equal(changed, j <= i + offset):
        return "mask_wrong_side", ("the past is masked instead of the future: key j is hidden from "
                                   "query i when j > i + (T_k - T_q)")
    if offset and np.array_equal(changed, j > i):
        return "mask_ignores_offset", (f"T_k = {t_k} keys but T_q = {t_q} queries: the queries are the "
                                       f"last {t_q} positions, so query i sits at i + {offset}; mask j > i + (T_k - T_q)")
    return None


register(Exercise(
    exercise_id="03_causal_mask",
    title="s[h, i, j] = -inf where j > i + (T_k - T_q), in place, one thread per score",
    kind="kernel",
    run=_run_mask,
    # (BH, T_q, T_k): one score; 7 x 7 (less than a block); 33 x 33 (a partly used last block,
    # several heads); then 5 queries against 9 keys, as when decoding with a cache.
    cases=[(1, 1, 1), (2, 7, 7), (3, 33, 33), (2, 5, 9)],
    describe_case=lambda c: f"BH = {c[0]}, T_q = {c[1]}, T_k = {c[2]}",
    hint=("j, i = cuda.grid(2); h = cuda.blockIdx.z; inside the bounds of s, "
          "if j > i + (s.shape[2] - s.shape[1]): s[h, i, j] = -math.inf"),
    rtol=0.0,   # a mask moves no value: every score is either kept exactly or -inf
    atol=0.0,
    diagnose=_diagnose,
    diagnoses=('mask_includes_diagonal', 'mask_wrong_side', 'mask_not_applied', 'mask_ignores_offset',
               'mask_value_not_neg_inf'),
))
