"""``11_score_grad`` (notebook 11, warm-up): the softmax's backward as a kernel with
``backward.score_grad_kernel``'s signature ``(p, dp, d_rows, scale, d_raw)``, one thread per entry on
the scores' grid: d_raw = scale * P o (dP - D), from a real head's weights P, their gradient dP and the
row sums D = rowsum(dO o O). Its solution is ``backward.score_grad_kernel``; its cases, limits and named
mistakes are declared in the ``Exercise`` below.
"""

from typing import NamedTuple

import numpy as np

from attention_lib import reference
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import host_output
from attention_lib.checks.limits import Coalesced, MostAccessesPerThread
from attention_lib.stages import backward, scores


class Case(NamedTuple):
    """One size tried: BH heads of T_q queries against T_k keys, width d_k, causal or not."""

    BH: int
    T_q: int
    T_k: int
    d_k: int
    causal: bool

    def __str__(self):
        return (f"(BH {self.BH}, T_q {self.T_q}, T_k {self.T_k}, d_k {self.d_k}, "
                f"{'causal' if self.causal else 'not causal'})")


def _run(kernel, case, rng, launch):
    q, k, v, d_out = (rng.standard_normal((case.BH, t, d)) for t, d in
                      ((case.T_q, case.d_k), (case.T_k, case.d_k), (case.T_k, 4), (case.T_q, 4)))
    p = reference.attention_weights(q, k, case.causal)          # (BH, T_q, T_k) float64
    dp = d_out @ np.swapaxes(v, -1, -2)                         # (BH, T_q, T_k)
    d_rows = np.sum(d_out * (p @ v), axis=-1)                   # (BH, T_q)
    scale = scores.scale_factor(case.d_k)
    p32, dp32, d_rows32 = (a.astype(np.float32) for a in (p, dp, d_rows))
    d_raw = host_output(p.shape)                                # copied back by the launch
    launch(kernel, *scores.score_grid(case.BH, case.T_q, case.T_k), p32, dp32, d_rows32, scale, d_raw)
    expected = float(scale) * p * (dp - d_rows[..., None])
    return d_raw, expected, p, dp, d_rows, float(scale)


def _diagnose(got, expected, p, dp, d_rows, scale):
    """Name the slip when `got` equals a known wrong formula; None otherwise."""
    d = d_rows[..., None]
    wrong = [("missing_row_sum", scale * p * dp,
              "the row sum D was not subtracted: the softmax's Jacobian has an off-diagonal part, "
              "because raising one score lowers every other weight of the row")]
    if p.shape[-1] == p.shape[-2]:
        wrong.append(("transposed_p", scale * np.swapaxes(p, -1, -2) * (dp - d),
                      "P was read transposed: entry (i, j) needs the weight of query i on key j"))
    wrong += [("missing_scale", p * (dp - d),
               f"the result was not multiplied by scale = 1/sqrt(d_k) = {scale:.4g}"),
              ("scale_applied_twice", scale * scale * p * (dp - d),
               f"the scale 1/sqrt(d_k) = {scale:.4g} was applied twice"),
              ("scale_inverted", p * (dp - d) / scale,
               f"the result was divided by scale = {scale:.4g} (multiplied by sqrt(d_k)): the scores were "
               "multiplied by 1/sqrt(d_k), so their gradient is multiplied by it too"),
              ("scale_on_one_term", p * (scale * dp - d),
               "the scale multiplies dP but not D: it belongs outside the bracket, on the whole P (dP - D)"),
              ("scale_on_one_term", p * (dp - scale * d),
               "the scale multiplies D but not dP: it belongs outside the bracket, on the whole P (dP - D)")]
    for code, candidate, message in wrong:
        if not np.allclose(candidate, expected, rtol=1e-4, atol=1e-5) and np.allclose(got, candidate, rtol=1e-4,
                                                                                      atol=1e-5):
            return code, message
    masked = p == 0
    if np.any(np.abs(got[masked]) > 1e-6):
        where = tuple(int(i) for i in np.argwhere(masked & (np.abs(got) > 1e-6))[0])
        return ("gradient_to_masked_keys",
                f"entry {where} has P = 0 (a key that query cannot see) but got gradient {got[where]:.4g}: "
                "every term of dS must carry the factor P, the row-sum term too")
    return None


register(Exercise(
    exercise_id="11_score_grad",
    kind="kernel",
    run=_run,
    # One query and one key first (P = 1, dS = 0: a check of indexing and the guard); then square
    # causal heads (a transposed P has the right shape there, so it is named), a partial 16 x 16
    # block each way; then T_q != T_k, not causal, two heads.
    cases=[Case(1, 1, 1, 3, True), Case(1, 7, 7, 4, True), Case(2, 19, 19, 8, True), Case(2, 5, 23, 16, False),
           Case(1, 5, 6, 64, True)],                                # the model's head width
    hint=("each thread owns one entry (i, j) of one head; the softmax's Jacobian turns dP into dS by "
          "subtracting the row's weighted mean of dP (the row sum D), everything weighted by P; and the "
          "scores were scaled"),
    more_hints=("where answers go wrong: subtracting D without the factor P (then keys the query cannot see "
                "get a gradient), putting the scale inside the bracket on one term only, and the threads of "
                "the edge blocks that fall outside the matrix",),
    # One float32 multiply and subtraction against float64: errors around 1e-7.
    rtol=1e-5,
    atol=1e-6,
    diagnose=_diagnose,
    diagnoses=("gradient_to_masked_keys", "missing_row_sum", "transposed_p", "missing_scale",
               "scale_applied_twice", "scale_inverted", "scale_on_one_term"),
    # x along the keys: a warp's 32 threads read two rows of 16 neighbouring floats.
    limits=(MostAccessesPerThread("d_raw", 1, access="store", why="one thread per entry writes its own entry"),
            Coalesced("p", 2), Coalesced("dp", 2)),
    solution=backward.score_grad_kernel,
    forbidden=(backward.attention_backward, backward.launch_naive_backward),
))
