"""Notebook 02's exercises: the scaled scores, one thread per score, then tiled with K^T given.

``02_scaled_scores`` (warm-up): scores_kernel_v1's signature ``(q, k, inv_sqrt_dk, s)``,
launched on the library's grid. A wrong answer is compared with the usual wrong formulas:
``missing_scale`` (q k^T), ``scaled_by_d_k`` (q k^T / d_k) and ``transposed``: either Q K
instead of Q K^T (q[i] . k[:, j]), or q and k swapped (S^T). Both stay in bounds only on a
square case with T_q = T_k = d_k, which is why one comes second, after the all-ones case.

``02_scores_kt`` (main): K arrives already transposed, kt (BH, d_k, T_k), as some KV caches
store it. The student writes the loop body of a tiled kernel: a guarded q tile and kt tile,
two barriers, TILE multiply-adds. Every case runs under the race finder; the last also
under a read-count ceiling (``no_reuse``) and a coalescing count (``uncoalesced``: a warp's
load of kt should touch a few 128-byte segments, not one per thread).
"""

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import scores
from attention_lib.checks.engine import (Diagnosed, Exercise, host_output, output_array, read_output, register,
                                         traced_launch)


def _run_scores(kernel, case, rng, launch):
    bh, t_q, t_k, d_k = case
    q = rng.standard_normal((bh, t_q, d_k)).astype(np.float32)
    k = rng.standard_normal((bh, t_k, d_k)).astype(np.float32)
    full, s = output_array((bh, t_q, t_k), guard=scores.TILE * scores.TILE)
    grid, block = scores.score_grid(bh, t_q, t_k)
    launch(kernel, grid, block, cuda.to_device(q), cuda.to_device(k), scores.scale_factor(d_k), s)
    return read_output(full, s), reference.scores(q, k), q, k


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
    title="s[h, i, j] = (q[h, i] . k[h, j]) * inv_sqrt_dk, one thread per score",
    kind="kernel",
    run=_run_scores,
    # (BH, T_q, T_k, d_k): all ones first; then T_q = T_k = d_k = 7, where both transposes stay
    # in bounds; T_q != T_k next; then sizes that leave partly used blocks, several heads.
    cases=[(1, 1, 1, 1), (2, 7, 7, 7), (2, 7, 5, 5), (3, 33, 17, 24)],
    describe_case=lambda c: f"BH = {c[0]}, T_q = {c[1]}, T_k = {c[2]}, d_k = {c[3]}",
    hint=("one thread per score, one grid layer per head: the thread of row i and column j "
          "computes one dot product of length d_k and scales it"),
    more_hints=("where it goes wrong: the grid's x axis is the column of s, the key; row j of K is "
                "column j of K^T, so both q and k are read along their last axis; multiply by the "
                "scale passed in rather than computing a square root in every thread",),
    # float32 sums of up to 24 products of standard normals, against float64: errors ~1e-6.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose,
    diagnoses=('missing_scale', 'scaled_by_d_k', 'transposed'),
))


# --- The main exercise: K^T given ----------------------------------------------------------

def _run_scores_kt(kernel, case, rng, launch):
    bh, t_q, t_k, d_k = case
    q = rng.standard_normal((bh, t_q, d_k)).astype(np.float32)
    k = rng.standard_normal((bh, t_k, d_k)).astype(np.float32)
    kt = np.ascontiguousarray(np.swapaxes(k, 1, 2))                  # (BH, d_k, T_k)
    grid, block = scores.score_grid(bh, t_q, t_k)
    inv_sqrt_dk = scores.scale_factor(d_k)
    expected = reference.scores(q, k)
    if case == KT_CASES[-1]:
        # One traced run on the simulator: races, reads per element, segments per warp load.
        got = host_output((bh, t_q, t_k))
        traced = traced_launch(kernel, grid, block, q, kt, inv_sqrt_dk, got)
        if np.allclose(got, expected, rtol=1e-5, atol=1e-5):
            _check_reuse(traced, t_q, t_k)
            _check_coalescing(traced)
        return got, expected, q, k
    full, s = output_array((bh, t_q, t_k), guard=scores.TILE * scores.TILE)
    launch(kernel, grid, block, cuda.to_device(q), cuda.to_device(kt), inv_sqrt_dk, s)
    return read_output(full, s), expected, q, k


def _check_reuse(traced, t_q, t_k):
    """no_reuse when an element of q or kt is read more often than a tiled kernel reads it."""
    q_ceiling, kt_ceiling = ceil_div(t_k, scores.TILE), ceil_div(t_q, scores.TILE)
    q_reads, kt_reads = int(traced.loads("q").max()), int(traced.loads("kt").max())
    if q_reads > q_ceiling or kt_reads > kt_ceiling:
        raise Diagnosed("no_reuse", (
            f"the values are right, but an element of q was read up to {q_reads} times (tiled: {q_ceiling}) "
            f"and one of kt up to {kt_reads} times (tiled: {kt_ceiling}); copy each tile into shared "
            "memory once and let the block read it from there"))


# A warp of a 16 x 16 block spans two rows of a tile: a coalesced kt load touches 2 to 4
# segments; one that walks down kt's columns touches one per thread, 16 or more.
COALESCED_SEGMENTS = 4


def _check_coalescing(traced):
    """uncoalesced when a warp's load of kt touches many segments: neighbouring threads, far addresses."""
    segments = traced.warp_segments("kt")
    if segments > COALESCED_SEGMENTS:
        raise Diagnosed("uncoalesced", (
            f"the values are right, but each warp's load of kt touched {segments:.1f} segments of 128 bytes "
            f"on average (a coalesced load: at most {COALESCED_SEGMENTS}); let neighbouring threads (threadIdx.x) "
            "read neighbouring elements of kt's last axis"))


KT_CASES = [(1, 1, 1, 1), (2, 7, 9, 5), (1, 17, 31, 20)]

register(Exercise(
    exercise_id="02_scores_kt",
    title="tiled scores with K given transposed, kt (BH, d_k, T_k): the loop body",
    kind="kernel",
    run=_run_scores_kt,
    # (BH, T_q, T_k, d_k): one score; T_q != T_k, both under a tile, d_k odd; then two blocks
    # down and two across, partly used, two steps along d_k, traced once for
    # races, reads per element and segments per warp load.
    cases=KT_CASES,
    describe_case=lambda c: f"BH = {c[0]}, T_q = {c[1]}, T_k = {c[2]}, d_k = {c[3]}",
    hint=("the same march along d_k as the tiled kernel, but K^T is already in memory: think about "
          "which index of kt neighbouring threads should vary so that their reads sit side by side"),
    more_hints=(
        "where it goes wrong: the kt tile is laid out like kt itself, column c first and key second, so "
        "it needs no transposing on the way in; transposing it anyway gives wrong values or a slow load",
        "and the edges: a slot whose element lies past T_q, T_k or d_k must hold a value that adds "
        "nothing, and both barriers are needed, one before reading the tiles and one before refilling them"),
    rtol=1e-5,     # float32 sums of up to 20 products of standard normals, against float64
    atol=1e-5,
    diagnose=_diagnose,
    diagnoses=("no_reuse", "uncoalesced", "missing_scale"),
))
