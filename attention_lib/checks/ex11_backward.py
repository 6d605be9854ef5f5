"""Notebook 11's exercises: the softmax's backward as a kernel (warm-up), and the fused dK/dV tile (main).

``11_score_grad`` (warm-up): a kernel with ``backward.score_grad_kernel``'s signature ``(p, dp,
d_rows, scale, d_raw)``: p, dp (BH, T_q, T_k) float32, the weights and their gradient; d_rows
(BH, T_q), the row sums D_i = rowsum(dO o O)_i; scale 1/sqrt(d_k); it writes d_raw (BH, T_q,
T_k) = scale * P o (dP - D), one thread per entry, on the scores' grid (x over keys j, y over
queries i, z over heads h). The inputs are those of a real head (causal cases have P = 0 above
the diagonal). Limit: a warp's loads of p and dp touch at most 2 segments of 128 bytes on average
(``uncoalesced``: threads along x walking down a column). Besides the engine's diagnoses, a wrong
answer is compared with the usual slips:

- ``gradient_to_masked_keys``: an entry where P = 0 (a key the query cannot see) got a nonzero
  gradient: the row-sum term was not multiplied by P (P o dP - D);
- ``missing_row_sum``: scale * P o dP, the softmax's Jacobian reduced to its diagonal;
- ``transposed_p``: P read at [j, i] instead of [i, j] (the cases with T_q = T_k);
- ``missing_scale``: P o (dP - D), the 1/sqrt(d_k) forgotten;
- ``scale_applied_twice``: scale^2 * P o (dP - D);
- ``scale_inverted``: P o (dP - D) / scale, multiplied by sqrt(d_k) instead of divided;
- ``scale_on_one_term``: P o (scale dP - D) or P o (dP - scale D), the scale inside the bracket.

``11_dkdv_tile`` (main): a ``@cuda.jit(device=True)`` function with ``backward.dkdv_tile``'s
contract, ``(q_tile, do_tile, stats, rows_from, rows_to, k_row, v_row, dk_acc, dv_acc, scale,
d_k, d_v)``: for the queries in rows rows_from .. rows_to - 1 of the shared tiles, recompute
S_ij, then P_ij = exp(S_ij - lse_i) from the forward's log-sum-exp (stats[0]) and dS_ij = P_ij
(dP_ij - D_i) (stats[1]), and add P_ij dO_i to dv_acc and dS_ij Q_i to dk_acc. The check
compiles the library's dK/dV kernel around it (``backward.dkdv_kernel_with``), launches it on
real heads (causal, a sliding window, shared K/V heads, rows that see no key) and compares dK
and dV (concatenated on the last axis) with the NumPy backward. Besides the engine's diagnoses:
``lse_not_subtracted``, ``scores_not_scaled``, ``lse_and_d_swapped``, ``missing_row_sum``,
``row_sum_not_weighted``, ``dv_weighted_by_ds``, ``dk_weighted_by_p``, ``p_and_ds_swapped``,
``dk_scaled_twice``, ``mask_ignored`` (the loop started at row 0, not rows_from).
"""

import math
import warnings
from typing import NamedTuple

import numpy as np

from attention_lib import reference
from attention_lib.checks import shapes
from attention_lib.checks.engine import Diagnosed, Exercise, host_output, register, traced_launch
from attention_lib.checks.limits import Coalesced, MostLoads, RefilledTiles
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
    title="score_grad_kernel(p, dp, d_rows, scale, d_raw): dS of the softmax's backward, one thread per entry",
    kind="kernel",
    run=_run,
    # One query and one key first (P = 1, dS = 0: a check of indexing and the guard); then square
    # causal heads (a transposed P has the right shape there, so it is named), a partial 16 x 16
    # block each way; then T_q != T_k, not causal, two heads.
    cases=[Case(1, 1, 1, 3, True), Case(1, 7, 7, 4, True), Case(2, 19, 19, 8, True), Case(2, 5, 23, 16, False)],
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
    limits=(Coalesced("p", 2), Coalesced("dp", 2)),
    solution=backward.score_grad_kernel,
    forbidden=(backward.attention_backward, backward.launch_naive_backward),
))


# --- 11_dkdv_tile (main): the fused dK/dV pass's tile ------------------------------------------

class TileCase(NamedTuple):
    """One launch of the dK/dV kernel around the answer: BH query heads on BH_kv key/value heads,
    T_q queries against T_k keys, widths d_k and d_v, causal or not, a sliding window (0: none),
    and scores of ordinary size or of about a thousand (large)."""

    BH: int
    BH_kv: int
    T_q: int
    T_k: int
    d_k: int
    d_v: int
    causal: bool
    window: int = 0
    large: bool = False

    def __str__(self):
        heads = f"BH {self.BH}" if self.BH == self.BH_kv else f"BH {self.BH} on BH_kv {self.BH_kv}"
        return (f"({heads}, T_q {self.T_q}, T_k {self.T_k}, d_k {self.d_k}, d_v {self.d_v}, "
                f"{'causal' if self.causal else 'not causal'}{f', window {self.window}' if self.window else ''}"
                f"{', scores up to 1200' if self.large else ''})")


def tile_cases(configuration):
    """The cases at a configuration's tiles (BLOCK_Q = BLOCK_K = t: 16 on the simulator, 32 on a GPU):
    one pair (P = 1, dS = 0); queries the last t + 3 of t + 7 positions (the first query tile partly
    visible, partial tiles both ways, d_k < d_v); three query tiles under a window of 5 (d_k > d_v);
    two query heads on one K/V head, not causal; t + 7 queries on 9 keys (t - 2 see none: lse -inf);
    scores up to 1200, where exp of a raw score overflows."""
    t = backward.SHAPE_CONSTANTS["BLOCK_Q"][0 if configuration == shapes.SIMULATOR else 1]
    return [TileCase(1, 1, 1, 1, 1, 1, True), TileCase(2, 2, t + 3, t + 7, 5, 7, True),
            TileCase(1, 1, 2 * t + 1, 2 * t + 1, 7, 4, True, 5), TileCase(2, 1, t + 1, t + 1, 5, 3, False),
            TileCase(1, 1, t + 7, 9, 3, 3, True), TileCase(1, 1, 9, 11, 4, 3, True, large=True)]


def _inputs(case, rng):
    """q, k, v, d_out (float64). Large: integer q and k (with d_k 4 the scale is 1/2, so every score
    is exact in float32) and the last query's score with the last key 1200: exp(S) overflows
    float32 (and the simulator's math.exp), exp(S - lse) never does."""
    q = rng.standard_normal((case.BH, case.T_q, case.d_k))
    k = rng.standard_normal((case.BH_kv, case.T_k, case.d_k))
    if case.large:
        q, k = np.round(q), np.round(100 * k)                  # scores of several hundred
        q[:, -1], k[:, -1] = 2.0, 300.0                        # 2 * 300 * d_k * scale = 1200
    v = rng.standard_normal((case.BH_kv, case.T_k, case.d_v))
    d_out = rng.standard_normal((case.BH, case.T_q, case.d_v))
    return q, k, v, d_out


UNSTABLE = ("exp of a raw score: on a GPU exp of a float32 past 88.7 is inf (and below -104 it is 0), so "
            "exp(S) / exp(lse) is inf / inf or 0 / 0, NaN; here the simulator's math.exp raised {error} at a "
            "score near 1200. Take the exponential of the difference, S - lse, which is never above 0")


def _run_tile(tile, case, rng, _launch):
    q, k, v, d_out = _inputs(case, rng)
    window = case.window or None
    out = reference.attention(q, k, v, case.causal, window)                  # (BH, T_q, d_v)
    lse = backward.log_sum_exp(q, k, case.causal, window)                    # (BH, T_q), -inf: no key
    d_rows = np.sum(d_out * out, axis=-1)                                    # (BH, T_q)
    dk, dv = host_output(k.shape), host_output(v.shape)                      # written in place
    grid, block = backward.fused_grids(case.BH, case.T_q, case.T_k, case.BH_kv)["dkdv"]
    f32 = [a.astype(np.float32) for a in (q, k, v, d_out, lse, d_rows)]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)     # a wrong answer's overflows: said once
            traced_launch(backward.dkdv_kernel_with(tile), grid, block, *f32, scores.scale_factor(case.d_k),
                          case.causal, np.int32(case.window), dk, dv)
    except (OverflowError, ZeroDivisionError) as error:     # the simulator's math.exp; a GPU gives inf, NaN
        raise Diagnosed("unstable_softmax", UNSTABLE.format(error=type(error).__name__)) from None
    _, want_dk, want_dv = backward.backward(q, k, v, d_out, case.causal, window)
    return (np.concatenate([dk, dv], axis=-1), np.concatenate([want_dk, want_dv], axis=-1),
            q, k, v, d_out, case.causal, window)


def _folded_from_row_zero(t_q, t_k, causal, window):
    """(T_q, T_k) bool: the pairs a tile loop from row 0 (not rows_from) folds: every query of the
    tiles its key's block walks, up to the last query that sees the key."""
    folded = np.zeros((t_q, t_k), bool)
    for j in range(t_k):
        j0 = j - j % backward.BLOCK_K
        first = backward._queries_seeing(j0, t_q, t_k, causal, window)[0]
        end = backward._queries_seeing(j, t_q, t_k, causal, window)[1]
        folded[first - first % backward.BLOCK_Q:end, j] = True
    return folded


def _variant(q, k, v, d_out, causal, window, mistake=None):
    """dK and dV (concatenated on the last axis) of the dK/dV pass with one of the usual mistakes
    (None: right), float64; pairs folded per `visible` (the mask, or what a loop from row 0 folds).
    None where the mistake makes no difference of its own (dP over d_k columns when d_k >= d_v: the
    tile's padding, never written, is read, which the engine names)."""
    k_all, v_all = reference.share_kv_heads(k, q), reference.share_kv_heads(v, q)   # (BH, T_k, d)
    (t_q, d_k), (t_k, d_v) = q.shape[1:], v.shape[1:]
    if mistake == "dp_over_d_k" and d_k >= d_v:
        return None
    scale = 1.0 / math.sqrt(d_k)
    visible = reference.causal_mask(t_q, t_k, window) if causal else np.ones((t_q, t_k), bool)
    if mistake == "mask_ignored":
        visible = _folded_from_row_zero(t_q, t_k, causal, window)
    raw = q @ np.swapaxes(k_all, -1, -2)                                   # (BH, T_q, T_k), unscaled
    lse = backward.log_sum_exp(q, k, causal, window)[..., None]            # (BH, T_q, 1)
    d_i = np.sum(d_out * reference.attention(q, k, v, causal, window), axis=-1, keepdims=True)
    width = d_k if mistake == "dp_over_d_k" else d_v
    dp = d_out[..., :width] @ np.swapaxes(v_all[..., :width], -1, -2)      # (BH, T_q, T_k)
    s = raw if mistake == "scores_not_scaled" else raw * scale
    shift, minus = {"lse_not_subtracted": (0.0, d_i), "lse_and_d_swapped": (d_i, lse)}.get(mistake, (lse, d_i))
    with np.errstate(invalid="ignore", over="ignore"):
        p = np.where(visible, np.exp(s - shift), 0.0)
        ds = np.where(visible, {"missing_row_sum": p * dp,
                                "row_sum_not_weighted": p * dp - d_i}.get(mistake, p * (dp - minus)), 0.0)
    dv_weights = ds if mistake in ("dv_weighted_by_ds", "p_and_ds_swapped") else p
    dk_weights = p if mistake in ("dk_weighted_by_p", "p_and_ds_swapped") else ds
    dk = np.swapaxes(dk_weights, -1, -2) @ q * scale * (scale if mistake == "dk_scaled_twice" else 1.0)
    dv = np.swapaxes(dv_weights, -1, -2) @ d_out
    return np.concatenate([backward.fold_kv_heads(dk, k.shape), backward.fold_kv_heads(dv, v.shape)], axis=-1)


TILE_MISTAKES = {
    "lse_not_subtracted": "P_ij is exp(S_ij) without the log-sum-exp: the weights are not normalised; "
                          "subtract the query's lse (stats[0]) from the score before the exponential",
    "scores_not_scaled": "the recomputed score was not multiplied by scale: the forward's lse is the "
                         "log-sum-exp of the scaled scores, q . k / sqrt(d_k)",
    "lse_and_d_swapped": "the two rows of stats were read the other way round: stats[0] holds the lse, "
                         "stats[1] the row sum D",
    "missing_row_sum": "dS_ij is P_ij dP_ij: the row sum D (stats[1]) was not subtracted, so dK misses "
                       "the softmax's off-diagonal part",
    "row_sum_not_weighted": "dS_ij came out as P_ij dP_ij - D_i: the row sum belongs inside the factor P, "
                            "P_ij (dP_ij - D_i)",
    "dp_over_d_k": "dP_ij = v_j . dO_i was summed over the first d_k columns: v and dO rows are d_v wide "
                   "(here d_k < d_v, so the last columns were left out)",
    "dv_weighted_by_ds": "dV took dS_ij dO_i: the output is P V, so dV_j sums P_ij dO_i",
    "dk_weighted_by_p": "dK took P_ij Q_i: the scores' gradient is dS, so dK_j sums dS_ij Q_i",
    "p_and_ds_swapped": "P and dS swapped places: dV_j sums P_ij dO_i and dK_j sums dS_ij Q_i",
    "dk_scaled_twice": "dK came out scaled twice: the kernel multiplies the sum by scale once, at the end",
    "mask_ignored": "queries that cannot see key j were folded in: loop over the rows from rows_from, "
                    "the first query of the tile that sees the key, not from row 0",
}


def _diagnose_tile(got, expected, q, k, v, d_out, causal, window):
    for code, message in TILE_MISTAKES.items():
        wrong = _variant(q, k, v, d_out, causal, window, code)
        if wrong is None:
            continue
        seen = np.isfinite(wrong)
        if (seen.any() and not np.allclose(wrong[seen], expected[seen], rtol=1e-4, atol=1e-5)
                and np.allclose(got[seen], wrong[seen], rtol=1e-3, atol=1e-4)):
            return code, message
    if not np.isfinite(got).all():
        where = tuple(int(i) for i in np.argwhere(~np.isfinite(got))[0])
        return "wrong_values", (f"dK or dV is {got[where]} at (K/V head, key, column) {where}, where NumPy's is "
                                f"{expected[where]:.4g}: a computed inf or NaN (an exponential that overflowed, or "
                                "a query with lse -inf folded in)")
    return None


register(Exercise(
    exercise_id="11_dkdv_tile",
    title="dkdv_tile: recompute P_ij from the log-sum-exp and fold a tile of queries into key j's dK and dV",
    kind="device function",
    run=_run_tile,
    cases=tile_cases,
    hint=("key j's sums run over the queries that see it, so each row of the tile adds one term to each; the "
          "forward kept neither the score, nor the weight, nor the weight's gradient, but each follows from the "
          "row's q and dO, key j's k and v, the scale and the row's two statistics, with no pass over the row "
          "(the weight from the score and the row's log-sum-exp)"),
    more_hints=("the plan: one loop over the rows rows_from to rows_to, each row once. For a row, first its "
                "score: the dot product of key j's k with the row's q over d_k columns, times the scale (the "
                "forward's lse is of scaled scores). Then its weight: the exponential of the score minus the "
                "row's lse, stats row 0, never the exponential of the score alone (it overflows past 88.7). "
                "Then the weight's gradient dP: the dot product of key j's v with the row's dO over d_v "
                "columns. Then the score's gradient: the weight times (dP minus D, stats row 1), D inside the "
                "bracket. Last, add the weight times each of the row's d_v dO values to dv_acc, and the "
                "score's gradient times each of its d_k q values to dk_acc; the kernel scales dK once at the "
                "end",),
    # float32 scores, exp and sums of up to 65 terms against float64: errors around 1e-6.
    rtol=1e-4,
    atol=5e-5,
    diagnose=_diagnose_tile,
    diagnoses=tuple(TILE_MISTAKES) + ("unstable_softmax",),
    both_shapes=True,
    limits=(RefilledTiles(),),
    solution=backward.dkdv_tile,
    forbidden=(backward.dq_tile, backward.flash_backward_dkdv_kernel, backward.launch_fused_backward,
               backward.flash_attention_backward),
))


# --- 11x_group_sum (the deep dive's): a shared K/V head's gradient sums its group --------------

class GroupCase(NamedTuple):
    """BH query heads' gradients summed into BH_kv key/value heads' of (T, d)."""

    BH: int
    BH_kv: int
    T: int
    d: int

    def __str__(self):
        return f"({self.BH} query heads on {self.BH_kv} K/V heads, T {self.T}, d {self.d})"


def _run_group_sum(kernel, case, rng, launch):
    per_head = rng.standard_normal((case.BH, case.T, case.d)).astype(np.float32)
    shared = host_output((case.BH_kv, case.T, case.d))                 # written in place
    launch(kernel, *backward.group_sum_grid(case.BH_kv, case.T, case.d), per_head, shared)
    expected = backward.fold_kv_heads(per_head.astype(np.float64), shared.shape)
    return shared, expected, per_head


def _diagnose_group_sum(got, expected, per_head):
    """Name a wrong grouping of the query heads; None otherwise."""
    bh, bh_kv = per_head.shape[0], got.shape[0]
    group, p = bh // bh_kv, per_head.astype(np.float64)
    wrong = [("group_interleaved", p.reshape(group, bh_kv, *p.shape[1:]).sum(axis=0),
              "K/V head g summed query heads g, g + BH_kv, g + 2 BH_kv, ...: query head h reads K/V head h // group, "
              "so K/V head g's group is the consecutive heads g * group to (g + 1) * group - 1"),
             ("group_not_summed", p[::group], "K/V head g got only the first query head of its group: every query "
                                              "head of the group read it, and each adds its gradient")]
    for code, candidate, message in wrong:
        if not np.allclose(candidate, expected, rtol=1e-5, atol=1e-5) and np.allclose(got, candidate, rtol=1e-5,
                                                                                      atol=1e-5):
            return code, message
    return None


register(Exercise(
    exercise_id="11x_group_sum",
    title="group_sum_kernel(per_head, shared): each K/V head's gradient, the sum over its group of query heads",
    kind="kernel",
    run=_run_group_sum,
    # No group (1 on 1); a group of 3 (6 on 2) whose T x d entries fill one block and a part (T 9, d 4:
    # 36 entries in blocks of 32); multi-query (4 on 1); a group of 2 over several blocks.
    cases=[GroupCase(1, 1, 1, 1), GroupCase(6, 2, 9, 4), GroupCase(4, 1, 5, 7), GroupCase(4, 2, 17, 3)],
    hint=("each element of a K/V head's gradient is the sum of group numbers, one from each query head that "
          "reads that K/V head, all at the same position and column; one thread can own that sum, and "
          "neighbouring threads can own neighbouring elements"),
    more_hints=("the plan: the block's second grid index is the K/V head g; the thread's flat index along the "
                "first axis splits into a position (the quotient by d) and a column (the remainder), so that "
                "neighbouring threads touch neighbouring addresses; the last block hangs past T times d entries "
                "and its extra threads write nothing. Query head h reads K/V head h // group, so g's group is the "
                "group consecutive query heads starting at g times group, not every BH_kv-th head. Start the "
                "sum from a float32 zero, add the group's values at the thread's position and column, and "
                "store it once",),
    # Sums of at most 4 float32 standard normals against float64.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_group_sum,
    diagnoses=("group_interleaved", "group_not_summed"),
    limits=(MostLoads("per_head", 1, why="each query head's element is added into exactly one sum"),
            Coalesced("per_head", 2)),
    solution=backward.group_sum_kernel,
    forbidden=(backward.fold_kv_heads, backward.launch_grouped_naive_backward),
))
