"""Notebook 02's exercises: the scaled scores, one thread per score, then tiled with K^T given.

``02_scaled_scores`` (warm-up): scores_kernel_v1's signature ``(q, k, inv_sqrt_dk, s)``,
launched on the library's grid. A wrong answer is compared with the usual wrong formulas:
``missing_scale`` (q k^T), ``scaled_by_d_k`` (q k^T / d_k: the scale applied twice, or d_k in
place of its root) and ``transposed``: either Q K instead of Q K^T (q[i] . k[:, j]), or q and k
swapped (S^T). Both stay in bounds only on a square case with T_q = T_k = d_k, which is why one
comes second, after the all-ones case. ``grid_axes_swapped``: the row taken from the grid's x,
so rows past the x extent of the grid are never written (and on a GPU neighbouring threads
would write a row apart).

``02_scores_kt`` (main): K arrives already transposed, kt (BH, d_k, T_k), as some KV caches
store it. The student writes the loop body of scores_kt_kernel: a guarded q tile (the scale
folded in) and kt tile, two barriers, TILE multiply-adds. Every case is traced on the
simulator: races, and ``edge_not_zeroed`` (a thread read a slot of a tile that the latest fill
did not write: past an edge it keeps an earlier step's value). On the values: ``missing_scale``,
``scale_applied_twice``; with right values, ``scale_not_folded`` (q_tile does not hold q times
the scale, read from the shared array after a one-block case), then on the last case
``no_reuse`` (reads per element counted) and ``uncoalesced`` (segments per warp load of kt).
"""

from collections import defaultdict

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.measure import sanitizer
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import scores
from attention_lib.checks.engine import (Diagnosed, Exercise, host_output, output_array, read_output, register,
                                         traced_launch, unwritten)


def _run_scores(kernel, case, rng, launch):
    bh, t_q, t_k, d_k = case
    q = rng.standard_normal((bh, t_q, d_k)).astype(np.float32)
    k = rng.standard_normal((bh, t_k, d_k)).astype(np.float32)
    full, s = output_array((bh, t_q, t_k), guard=scores.TILE * scores.TILE)
    grid, block = scores.score_grid(bh, t_q, t_k)
    launch(kernel, grid, block, cuda.to_device(q), cuda.to_device(k), scores.scale_factor(d_k), s)
    got, expected = read_output(full, s), reference.scores(q, k)
    _check_grid_axes(got, expected, grid)
    return got, expected, q, k


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


def _diagnose(got, expected, q, k):
    """Name the mistake when `got` equals a known wrong formula; None otherwise."""
    d_k = q.shape[-1]
    raw = reference.scores(q, k, scale=False)
    wrong = [("missing_scale", raw, f"the scores are q.k without the scale: multiply by inv_sqrt_dk "
                                    f"(= 1/sqrt({d_k}) here)")]
    wrong.append(("scaled_by_d_k", raw / d_k, (
        f"the scores came out divided by d_k = {d_k}, not by sqrt(d_k) = {np.sqrt(d_k):.3g}: either the scale "
        "was applied twice, or d_k was used in place of its square root; multiply by inv_sqrt_dk exactly once")))
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
    # in bounds; T_q != T_k next; then sizes that leave partly used blocks, several heads, and
    # rows beyond the grid's x extent (33 > 2 blocks of 16 keys).
    cases=[(1, 1, 1, 1), (2, 7, 7, 7), (2, 7, 5, 5), (3, 33, 17, 24)],
    describe_case=lambda c: f"BH = {c[0]}, T_q = {c[1]}, T_k = {c[2]}, d_k = {c[3]}",
    hint=("one thread per score, one grid layer per head: the thread of row i and column j "
          "computes one dot product of length d_k and scales it"),
    more_hints=("where answers go wrong: the grid's x axis is the column of s, the key; row j of K is "
                "column j of K^T, so both q and k are read along their last axis; multiply by the "
                "scale passed in, once, rather than computing a square root in every thread",),
    # float32 sums of up to 24 products of standard normals, against float64: errors ~1e-6.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose,
    diagnoses=("missing_scale", "scaled_by_d_k", "transposed", "grid_axes_swapped"),
    solution=scores.scores_kernel_v1,
    forbidden=(scores.scores, scores.launch_scores, scores.tile_dot, scores.dot_qk_tiles),
))


# --- The main exercise: K^T given ----------------------------------------------------------

def _run_scores_kt(kernel, case, rng, launch):
    """Every case is traced (the cases are small): races, stale tile slots, the q tile's contents,
    and on the last case reads per element and segments per warp load."""
    bh, t_q, t_k, d_k = case
    q = rng.standard_normal((bh, t_q, d_k)).astype(np.float32)
    k = rng.standard_normal((bh, t_k, d_k)).astype(np.float32)
    kt = np.ascontiguousarray(np.swapaxes(k, 1, 2))                  # (BH, d_k, T_k)
    grid, block = scores.score_grid(bh, t_q, t_k)
    inv_sqrt_dk = scores.scale_factor(d_k)
    expected = reference.scores(q, k)
    got = host_output((bh, t_q, t_k))
    traced = traced_launch(kernel, grid, block, q, kt, inv_sqrt_dk, got)
    for name in ("q_tile", "kt_tile"):
        _check_fills(traced, name, t_q, t_k)
    if np.allclose(got, expected, rtol=1e-5, atol=1e-5):
        if case == FOLD_CASE:
            _check_fold(traced, q, inv_sqrt_dk)
        if case == KT_CASES[-1]:
            _check_reuse(traced, t_q, t_k)
            _check_coalescing(traced)
    return got, expected, q, k


def _check_fills(traced, name, t_q, t_k):
    """edge_not_zeroed when a thread that owns a score read a slot of shared array `name` that the
    block's latest fill before the read did not write: the slot holds an earlier step's value, or
    was never written (on a GPU, whatever the memory held: even a NaN). A thread past the edge of
    s may read anything: its sum is never written."""
    target = traced.launch.targets.get(name)
    if target is None:
        return
    fills = defaultdict(lambda: defaultdict(set))         # block -> barrier interval -> slots stored
    for element, kind, (blk, _), interval, _, _ in target.trace:
        if kind == sanitizer.STORE:
            fills[blk][interval].add(element)
    tile = scores.TILE
    for element, kind, (blk, thread), interval, _, _ in target.trace:
        owns_a_score = blk[1] * tile + thread[1] < t_q and blk[0] * tile + thread[0] < t_k
        if kind != sanitizer.LOAD or not owns_a_score:
            continue
        latest = max((n for n in fills[blk] if n <= interval), default=None)
        if latest is None or element not in fills[blk][latest]:
            slot = ", ".join(str(int(v)) for v in np.unravel_index(element, target.shape))
            raise Diagnosed("edge_not_zeroed", (
                f"thread {thread} of block {blk} read {name}[{slot}], a slot the latest fill of the tile did not "
                "write: it still holds an earlier step's value, or nothing at all. Past an edge of q, kt or d_k "
                "every slot must still be written, with a value that adds nothing to the sum"))


def _shared_contents(traced, name):
    """What shared array `name` holds after a traced launch (the last block's last fill), or None.

    The sanitizer keeps one array per declaration for the whole launch (its _Launch._shared)."""
    for view in traced.launch._shared.values():
        if view._target.name == name:
            return np.array(view._ary)
    return None


def _check_fold(traced, q, inv_sqrt_dk):
    """scale_not_folded when, after a case of one block per head and one step along d_k, q_tile
    does not hold a head's q elements times the scale (in any arrangement)."""
    tile = _shared_contents(traced, "q_tile")
    if tile is None:
        return
    held = np.sort(tile[tile != 0])
    heads = [np.sort((q[h] * inv_sqrt_dk).ravel()) for h in range(len(q))]
    if not any(held.shape == want.shape and np.allclose(held, want, rtol=1e-6, atol=0) for want in heads):
        plain = any(held.shape == np.sort(q[h].ravel()).shape and np.allclose(held, np.sort(q[h].ravel()))
                    for h in range(len(q)))
        raise Diagnosed("scale_not_folded", (
            "the values are right, but q_tile " + ("holds q's elements unscaled" if plain else
                                                    "does not hold q's elements times the scale") +
            ": the scale was applied elsewhere (to kt's tile, in the multiply-adds, or to the sum). Multiply "
            "each element of q by inv_sqrt_dk as it is copied into q_tile, so the sum is already the score"))


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


def _diagnose_kt(got, expected, q, k):
    """missing_scale (q.k) and scale_applied_twice (q.k / d_k); None for any other wrong value."""
    d_k = q.shape[-1]
    raw = reference.scores(q, k, scale=False)
    if np.allclose(got, raw, rtol=1e-4, atol=1e-4):
        return "missing_scale", ("the scores are q.k without the scale: multiply each element of q by "
                                 "inv_sqrt_dk as it is copied into q_tile")
    if d_k > 1 and np.allclose(got, raw / d_k, rtol=1e-4, atol=1e-4):
        return "scale_applied_twice", (
            f"the scores came out divided by d_k = {d_k}: inv_sqrt_dk was applied twice (to both tiles, or on "
            "the load and again in the sum); fold it into q_tile only")
    return None


# (BH, T_q, T_k, d_k): one score; T_q != T_k, both under a tile, d_k odd: one block per head and one
# step, so q_tile ends holding a head's whole q (the fold is read there); then two blocks down and
# two across, partly used, two steps along d_k (the second partial), for the counts.
KT_CASES = [(1, 1, 1, 1), (2, 7, 9, 5), (1, 17, 31, 20)]
FOLD_CASE = KT_CASES[1]

register(Exercise(
    exercise_id="02_scores_kt",
    title="tiled scores with K given transposed, kt (BH, d_k, T_k): the loop body",
    kind="kernel",
    run=_run_scores_kt,
    cases=KT_CASES,
    describe_case=lambda c: f"BH = {c[0]}, T_q = {c[1]}, T_k = {c[2]}, d_k = {c[3]}",
    hint=("the same march along d_k as a tiled matmul, but K^T is already in memory: think about "
          "which index of kt neighbouring threads should vary so that their reads sit side by side, "
          "and put the scale where each element of q passes once per tile"),
    more_hints=(
        "where answers go wrong: the kt tile is laid out like kt itself, column c first and key second, so "
        "it needs no transposing on the way in; transposing it anyway gives wrong values or a slow load",
        "and the edges: a slot whose element lies past T_q, T_k or d_k must still be written, with a value "
        "that adds nothing, and both barriers are needed, one before reading the tiles and one before "
        "refilling them"),
    rtol=1e-5,     # float32 sums of up to 20 products of standard normals, against float64
    atol=1e-5,
    diagnose=_diagnose_kt,
    diagnoses=("edge_not_zeroed", "missing_scale", "scale_applied_twice", "scale_not_folded", "no_reuse",
               "uncoalesced"),
    solution=scores.scores_kt_kernel,
    forbidden=(scores.scores_kt, scores.launch_scores, scores.tile_dot, scores.dot_qk_tiles),
))
