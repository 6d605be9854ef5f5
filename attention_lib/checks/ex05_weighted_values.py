"""Notebook 05's exercise: one attention head assembled from the library's stage functions.

The answer is a NumPy-in, NumPy-out function ``single_head_attention(x, w_q, w_k, w_v, causal)``:
x (T, d_model), w_q, w_k, w_v (d_model, d_k) float32 -> (T, d_k), equal to
``reference.attention(x @ w_q, x @ w_k, x @ w_v, causal)``. Besides the engine's diagnoses, a
wrong answer is compared with the usual wrong pipelines (each computed in float64 from the
same inputs):

- ``missing_scale``: softmax(mask(Q K^T)) V, the scores never divided by sqrt(d_k);
- ``scaled_by_d_k``: the scores divided by d_k instead of sqrt(d_k);
- ``mask_not_applied``: a causal case answered without the mask;
- ``transposed``: the scores K Q^T (q and k swapped), or Q K without the transpose (that one
  only has the right shape when T = d_k, which is why such a case comes early);
- ``softmax_wrong_axis``: weights that sum to 1 down each column instead of along each row.
"""

from typing import NamedTuple

import numpy as np

from attention_lib import reference
from attention_lib.checks.engine import Exercise, register


class Case(NamedTuple):
    """One size tried: x (T, d_model), w_q, w_k, w_v (d_model, d_k), causal or not."""

    T: int
    d_model: int
    d_k: int
    causal: bool

    def __str__(self):
        return f"(T {self.T}, d_model {self.d_model}, d_k {self.d_k}, {'causal' if self.causal else 'not causal'})"


def _run_single_head(answer, case, rng):
    x = rng.standard_normal((case.T, case.d_model)).astype(np.float32)
    # Weights scaled by 1/sqrt(d_model), as at initialisation, so that q, k, v have entries of
    # order 1 and the scaled scores too: the softmax is neither uniform nor one-hot, and every
    # mistake below changes the result visibly.
    scale = np.float32(1.0 / np.sqrt(case.d_model))
    w_q, w_k, w_v = (rng.standard_normal((case.d_model, case.d_k)).astype(np.float32) * scale for _ in range(3))
    got = answer(x.copy(), w_q.copy(), w_k.copy(), w_v.copy(), case.causal)  # copies: the answer may write
    q, k, v = (reference.project(x, w) for w in (w_q, w_k, w_v))              # (T, d_k) float64
    return np.asarray(got), reference.attention(q, k, v, case.causal), q, k, v, case.causal


def _pipeline(s, v, causal, axis=-1):
    """softmax(mask(s)) @ v in float64, with the softmax along `axis`."""
    return reference.softmax(reference.apply_causal_mask(s) if causal else s, axis=axis) @ v


def _diagnose(got, expected, q, k, v, causal):
    """Name the mistake when `got` equals a known wrong pipeline; None otherwise."""
    T, d_k = q.shape
    raw = q @ k.T                                                  # unscaled scores (T, T)
    wrong = [
        ("missing_scale", _pipeline(raw, v, causal),
         f"the scores were not divided by sqrt(d_k) = {np.sqrt(d_k):.3g}: scores.scores(q, k) and "
         "mask.causal_scores(q, k) scale them unless told scale=False"),
        ("scaled_by_d_k", _pipeline(raw / d_k, v, causal),
         f"the scores were divided by d_k = {d_k}, not by sqrt(d_k) = {np.sqrt(d_k):.3g}"),
    ]
    if causal:
        wrong.append(("mask_not_applied", _pipeline(raw / np.sqrt(d_k), v, False),
                      "position i saw later positions: with causal=True mask the scores before the softmax "
                      "(mask.causal_scores(q, k), or mask.apply_causal_mask(s))"))
    wrong.append(("transposed", _pipeline(raw.T / np.sqrt(d_k), v, causal),
                  "the scores are K Q^T, q and k swapped: scores.scores(q, k) wants the queries first, "
                  "so that row i of the scores belongs to query i"))
    if T == d_k:  # only then does q @ k (no transpose) have the shape of the scores
        wrong.append(("transposed", _pipeline(q @ k / np.sqrt(d_k), v, causal),
                      "the scores are Q K, not Q K^T: score (i, j) is the dot product of query i with key j"))
    wrong.append(("softmax_wrong_axis", _pipeline(raw / np.sqrt(d_k), v, causal, axis=-2),
                  "each column of the weights sums to 1 instead of each row: the softmax goes along the "
                  "last axis of the (T_q, T_k) scores, over the keys of one query"))
    for code, candidate, message in wrong:
        if np.allclose(got, candidate, rtol=1e-4, atol=1e-4):
            return code, message
    return None


register(Exercise(
    exercise_id="05_single_head",
    title="single_head_attention(x, w_q, w_k, w_v, causal) from the stage functions",
    kind="function",
    run=_run_single_head,
    # One position first (its only weight is 1, so the output is its value row: mostly a check
    # of shapes; d_k 1 so that even Q K without the transpose runs); then T = d_k = 5, causal
    # (Q K has the right shape, so that mistake is named); widths that are not multiples of the
    # 16-wide tiles, not causal; then two tiles of positions and of d_k, causal. Small, because
    # every stage of the answer is a launch on the simulator: the whole check takes seconds.
    cases=[Case(1, 3, 1, True), Case(5, 8, 5, True), Case(7, 24, 5, False), Case(17, 12, 18, True)],
    hint=("follow the formula stage by stage, one library function per stage: the three projections, "
          "the scaled scores (masked when causal), the row softmax, the weighted sum of the values"),
    more_hints=("where answers go wrong: the scores of notebook 02 take the queries first and the keys "
                "second, the causal flag must choose between the masked and the plain scores, and each "
                "library function already applies its own scale",),
    # Four float32 stages, each a sum of at most 24 terms of order 1, against float64: errors
    # around 1e-6 (measured up to 4e-7); 1e-4 leaves room and still tells every mistake apart.
    rtol=1e-4,
    atol=1e-4,
    diagnose=_diagnose,
    diagnoses=("missing_scale", "scaled_by_d_k", "mask_not_applied", "transposed", "softmax_wrong_axis"),
))
