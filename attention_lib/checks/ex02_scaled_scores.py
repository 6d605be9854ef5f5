"""``02_scaled_scores`` (notebook 02's warm-up): a kernel ``(q, k, inv_sqrt_dk, s)`` computing the scores
q k^T times inv_sqrt_dk, one thread per score on the library's grid (``scores.scores_kernel_v1``). Its
cases, limits and named mistakes are declared in the Exercise below.
"""

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.stages import scores
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import output_array, read_output, unwritten
from attention_lib.checks.result import Diagnosed


def _run_scores(kernel, case, rng, launch):
    bh, t_q, t_k, d_k = case[:4]
    scale = _warm_up_scale(case)
    q = rng.standard_normal((bh, t_q, d_k)).astype(np.float32)
    k = rng.standard_normal((bh, t_k, d_k)).astype(np.float32)
    full, s = output_array((bh, t_q, t_k), guard=scores.TILE * scores.TILE)
    grid, block = scores.score_grid(bh, t_q, t_k)
    launch(kernel, grid, block, cuda.to_device(q), cuda.to_device(k), np.float32(scale), s)
    got, expected = read_output(full, s), reference.scores(q, k, scale=False) * np.float32(scale)
    _check_grid_axes(got, expected, grid)
    return got, expected, q, k, np.float32(scale)


def _check_grid_axes(got, expected, grid):
    """grid_axes_swapped when exactly the scores a kernel with i from the grid's x and j from its y
    cannot reach were left unwritten, and the rest are right."""
    t_q, t_k = got.shape[-2:]
    i, j = np.arange(t_q)[:, None], np.arange(t_k)[None, :]
    reached = (i < grid[0] * scores.TILE) & (j < grid[1] * scores.TILE)      # i from x, j from y
    never = unwritten(got)
    if reached.all() or not np.array_equal(never, np.broadcast_to(~reached, got.shape)):
        return
    if np.allclose(got[~never], expected[~never], rtol=1e-4, atol=1e-4):
        raise Diagnosed("grid_axes_swapped", (
            f"{int(never.sum())} scores were never written, exactly those whose row lies beyond the grid's x "
            "extent: the row i was taken from the grid's x axis. The grid's x runs over keys (the columns j), "
            "y over queries (the rows i); on a GPU such threads would also write addresses a row apart"))


def _warm_up_cases(configuration):
    """(BH, T_q, T_k, d_k), and a scale where it is not 1/sqrt(d_k): all ones first; then T_q = T_k = d_k = 7, where both transposes stay
    in bounds; T_q != T_k next; then a tile + 1 keys and two tiles + 1 queries in 3 heads: partly used
    blocks, and rows beyond the grid's x extent (two tiles + 1 rows, keys in two tiles), after a few scores
    at the model's head width, 64. The scale is
    1/sqrt(d_k), as the launcher passes it, except in the last case: a kernel that computes it itself
    instead of multiplying by its argument is wrong there."""
    tile = scores.TILE
    # d_k 64, the model's head width, in a few scores (a loop bounded by a typed 16 or 24 shows there).
    return [(1, 1, 1, 1), (2, 7, 7, 7), (2, 7, 5, 5), (1, 3, 5, 64), (3, 2 * tile + 1, tile + 1, 24, 0.3)]


def _warm_up_scale(case):
    """The float32 a warm-up case passes as inv_sqrt_dk: its fifth entry, else 1/sqrt(d_k)."""
    return np.float32(case[4]) if len(case) > 4 else scores.scale_factor(case[3])


def scale_ignored(raw, scale, d_k):
    """("scale_ignored", scores, message) when `scale` is not 1/sqrt(d_k), else nothing: a kernel that
    computes 1/sqrt(d_k) itself instead of using its argument."""
    if np.isclose(scale, 1 / np.sqrt(d_k), rtol=1e-3):
        return []
    return [("scale_ignored", raw / np.sqrt(d_k),
             f"the scores came out divided by sqrt(d_k) = {np.sqrt(d_k):.3g}, but this case passes inv_sqrt_dk = "
             f"{scale:.3g}: the kernel computed the scale itself. Multiply by the argument it is given (a caller "
             "may want another scale, or 1.0 for unscaled scores)")]


def _diagnose(got, expected, q, k, scale):
    """Name the mistake when `got` equals a known wrong formula; None otherwise."""
    d_k = q.shape[-1]
    raw = reference.scores(q, k, scale=False)
    wrong = [("missing_scale", raw, f"the scores are q.k without the scale: multiply by inv_sqrt_dk "
                                    f"(= {scale:.3g} here)")] if scale != 1 else []
    wrong += scale_ignored(raw, scale, d_k)
    wrong.append(("scaled_by_d_k", raw / d_k, (
        f"the scores came out divided by d_k = {d_k}, not by sqrt(d_k) = {np.sqrt(d_k):.3g}: either the scale "
        "was applied twice, or d_k was used in place of its square root; multiply by inv_sqrt_dk exactly once")))
    if scale_ignored(raw, scale, d_k) and scale != 1:
        wrong.append(("scaled_by_d_k", raw * scale * scale, (
            f"the scores came out multiplied by inv_sqrt_dk = {scale:.3g} twice: multiply by it exactly once")))
    if k.shape[-2] == d_k:  # only then does k[h, c, j] stay in bounds
        wrong.append(("transposed", (q.astype(np.float64) @ k) * scale,
                      "the scores are Q K, not Q K^T: score (i, j) is the dot product of row i "
                      "of q with row j of k, both read along d_k"))
    if q.shape[-2] == k.shape[-2]:  # only then do swapped q and k stay in bounds
        wrong.append(("transposed", np.swapaxes(expected, -1, -2),
                      "the scores are transposed, S^T: q and k are swapped. Row i of s belongs to query "
                      "i (the grid's y), column j to key j (the grid's x)"))
    for code, candidate, message in wrong:
        if np.allclose(got, candidate, rtol=1e-4, atol=1e-4):
            return code, message
    return None


register(Exercise(
    exercise_id="02_scaled_scores",
    kind="kernel",
    run=_run_scores,
    cases=_warm_up_cases,
    describe_case=lambda c: f"BH = {c[0]}, T_q = {c[1]}, T_k = {c[2]}, d_k = {c[3]}, inv_sqrt_dk = {_warm_up_scale(c):.3g}",
    hint=("one thread per score, one grid layer per head: the thread of row i and column j "
          "computes one dot product of length d_k and scales it"),
    more_hints=(
        "the plan: take the key (the column) from the grid's x, the query (the row) from its y and the head "
        "from the block's z; a thread whose score lies past an edge of s does nothing; the others sum the "
        "products of row i of q and row j of k along d_k (row j of K is column j of K^T, so both are read "
        "along their last axis), from a float32 zero, multiply the sum by the scale once and store it",
        "where answers go wrong: the grid's x axis is the column of s, the key; a sum begun from a plain "
        "Python 0.0 is float64 on a GPU; the scale is passed in, so no thread computes a square root"),
    # float32 sums of up to 24 products of standard normals, against float64: errors ~1e-6.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose,
    diagnoses=("missing_scale", "scaled_by_d_k", "scale_ignored", "transposed", "grid_axes_swapped"),
    solution=scores.scores_kernel_v1,
    forbidden=(scores.scores, scores.launch_scores, scores.tile_dot, scores.dot_qk_tiles),
))
