"""Notebook 02's exercise: the naive scaled-scores kernel, with its typical mistakes named.

The answer has scores_kernel_v1's signature ``(q, k, inv_sqrt_dk, s)`` and is launched on the
library's grid. Besides the engine's diagnoses, a wrong answer is compared with the usual
wrong formulas: ``missing_scale`` (q k^T), ``scaled_by_d_k`` (q k^T / d_k) and ``transposed``
(q[i] . k[:, j], i.e. Q K instead of Q K^T; it stays in bounds only when T_k = d_k, which is
why such a case comes before the others).
"""

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.stages import scores
from attention_lib.checks.engine import Exercise, assert_guard_intact, guarded_output, launch, register


def _run_scores(kernel, case, rng):
    bh, t_q, t_k, d_k = case
    q = rng.standard_normal((bh, t_q, d_k)).astype(np.float32)
    k = rng.standard_normal((bh, t_k, d_k)).astype(np.float32)
    n = bh * t_q * t_k
    full, flat = guarded_output(n, guard=scores.TILE * scores.TILE)   # NaN: never written
    s = flat.reshape(bh, t_q, t_k)                                     # (BH, T_q, T_k) view
    grid, block = scores.score_grid(bh, t_q, t_k)
    launch(kernel, grid, block, cuda.to_device(q), cuda.to_device(k), scores.scale_factor(d_k), s)
    assert_guard_intact(full, n)
    return s.copy_to_host(), reference.scores(q, k), q, k


def _diagnose(got, expected, q, k):
    """Name the mistake when `got` equals a known wrong formula; None otherwise."""
    d_k = q.shape[-1]
    raw = reference.scores(q, k, scale=False)
    wrong = [("missing_scale", raw, f"the scores are q.k without the scale: multiply by inv_sqrt_dk "
                                    f"(= 1/sqrt({d_k}) here)")]
    wrong.append(("scaled_by_d_k", raw / d_k, f"the scores are divided by d_k = {d_k}, not by "
                                              f"sqrt(d_k) = {np.sqrt(d_k):.3g}: multiply by inv_sqrt_dk"))
    if k.shape[-2] == d_k:  # only then does k[h, c, j] stay in bounds
        wrong.append(("transposed", (q.astype(np.float64) @ k) / np.sqrt(d_k),
                      "the scores are Q K, not Q K^T: score (i, j) is the dot product of row i "
                      "of q with row j of k, sum over c of q[h, i, c] * k[h, j, c]"))
    for code, candidate, message in wrong:
        if np.allclose(got, candidate, rtol=1e-4, atol=1e-4):
            return code, message
    return None


register(Exercise(
    exercise_id="02_scaled_scores",
    title="s[h, i, j] = (q[h, i] . k[h, j]) * inv_sqrt_dk, one thread per score",
    kind="kernel",
    run=_run_scores,
    # (BH, T_q, T_k, d_k): all ones first; T_k = d_k = 5 next (a transposed k stays in bounds),
    # T_q = 7 not a multiple of anything; then sizes that leave partly used blocks, several heads.
    cases=[(1, 1, 1, 1), (2, 7, 5, 5), (3, 33, 17, 24)],
    describe_case=lambda c: f"BH = {c[0]}, T_q = {c[1]}, T_k = {c[2]}, d_k = {c[3]}",
    hint=("j, i = cuda.grid(2); h = cuda.blockIdx.z; if i < s.shape[1] and j < s.shape[2]: "
          "add up q[h, i, c] * k[h, j, c] over c, then s[h, i, j] = total * inv_sqrt_dk"),
    # float32 sums of up to 24 products of standard normals, against float64: errors ~1e-6.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose,
    diagnoses=('missing_scale', 'scaled_by_d_k', 'transposed'),
))
