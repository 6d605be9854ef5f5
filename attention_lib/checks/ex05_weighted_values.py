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
from numba import cuda, float32

from attention_lib import reference
from attention_lib.measure import sanitizer
from attention_lib.checks.engine import Diagnosed, Exercise, output_array, read_output, register
from attention_lib.stages.projection import TILE


class Case(NamedTuple):
    """One size tried: x (T, d_model), w_q, w_k, w_v (d_model, d_k), causal or not."""

    T: int
    d_model: int
    d_k: int
    causal: bool

    def __str__(self):
        return f"(T {self.T}, d_model {self.d_model}, d_k {self.d_k}, {'causal' if self.causal else 'not causal'})"


def _run_single_head(answer, case, rng, _launch):       # NumPy: no kernel to launch
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


# --- The main exercise: A . V that skips the zero tiles above the diagonal ----------------------
# The answer has weighted_sum_kernel_v2's signature ``(a, v, out)``: a (BH, T_q, T_k) causal
# weights (zero for every key j > i + T_k - T_q: the queries are the last positions), v (BH, T_k,
# d_v), out (BH, T_q, d_v), launched on weighted_sum_grid. It calls tile_matmul_until (given)
# with the number of keys its block must visit: every key tile wholly above the diagonal of
# the block's TILE queries is skipped, never loaded. Besides the engine's diagnoses:
#
# - ``no_tiles_skipped``: right values, but weights above the diagonal tiles were loaded
#   (counted by the sanitizer);
# - ``diagonal_tile_skipped``: the tile on the diagonal was skipped too: it holds weights that
#   are not zero;
# - ``mask_ignores_offset``: with T_q < T_k the bound ignored that the queries are the last
#   positions (query i sees keys up to i + T_k - T_q).

@cuda.jit(device=True)
def load_tile_pair_until(x_tile, w_tile, x, w, row, col, start, k_end):
    """Thread (ty, tx) loads x[row, start + tx] and w[start + ty, col] into the shared tiles.

    An entry past the edge of x or w, or at key k_end or later, becomes 0: it adds nothing.
    """
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    inside = row < x.shape[0] and start + tx < k_end
    x_tile[ty, tx] = x[row, start + tx] if inside else float32(0.0)
    inside = start + ty < k_end and col < w.shape[1]
    w_tile[ty, tx] = w[start + ty, col] if inside else float32(0.0)


@cuda.jit(device=True)
def tile_matmul_until(x, w, row, col, k_end):
    """x[row, :k_end] . w[:k_end, col] for thread (row, col), the whole block walking TILE-wide tiles.

    As projection.tile_matmul, but stops after key k_end - 1: later tiles are never loaded.
    Every thread of the block must call it with the same k_end (it waits at barriers).
    """
    x_tile = cuda.shared.array((TILE, TILE), float32)
    w_tile = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    acc = float32(0.0)
    for start in range(0, k_end, TILE):
        load_tile_pair_until(x_tile, w_tile, x, w, row, col, start, k_end)
        cuda.syncthreads()                      # wait until the whole tile pair is loaded
        for j in range(TILE):
            acc += x_tile[ty, j] * w_tile[j, tx]
        cuda.syncthreads()                      # wait until everyone is done before the next load
    return acc


class CausalCase(NamedTuple):
    """One size tried: BH heads of causal weights (T_q, T_k) times values (T_k, d_v)."""

    BH: int
    T_q: int
    T_k: int
    d_v: int

    def __str__(self):
        return f"(BH {self.BH}, T_q {self.T_q}, T_k {self.T_k}, d_v {self.d_v})"


def _visible_keys(block_row, t_q, t_k):
    """Keys the queries of block row `block_row` may see: up to its last query + T_k - T_q."""
    return min(t_k, (block_row + 1) * TILE + t_k - t_q)


def _run_causal_av(kernel, case, rng, launch):
    from attention_lib.stages import weighted_sum
    bh, t_q, t_k, d_v = case
    s = reference.apply_causal_mask(rng.standard_normal((bh, t_q, t_k)))
    a = reference.softmax(s).astype(np.float32)                      # zero above the diagonal
    v = rng.standard_normal((bh, t_k, d_v)).astype(np.float32)
    full, out = output_array((bh, t_q, d_v), guard=TILE * (d_v + 1))
    grid, block = weighted_sum.weighted_sum_grid(bh, t_q, d_v)
    launch(kernel, grid, block, cuda.to_device(a), cuda.to_device(v), out)
    got, expected = read_output(full, out), a.astype(np.float64) @ v
    if np.allclose(got, expected, rtol=1e-5, atol=1e-5):            # right: were the zero tiles read?
        loads = sanitizer.count_memory(kernel, grid, block, a, v, np.zeros((bh, t_q, d_v), np.float32)).loads("a")
        for block_row in range(-(-t_q // TILE)):
            rows = slice(block_row * TILE, (block_row + 1) * TILE)
            wasted = int(loads[:, rows, _visible_keys(block_row, t_q, t_k):].sum())
            if wasted:
                raise Diagnosed("no_tiles_skipped", (
                    f"the values are right, but {wasted} loads of weights lie in key tiles wholly above the "
                    f"diagonal of query block {block_row} (all zero): stop the block's walk along the keys "
                    "after the tile that holds its last query's last visible key"))
    return got, expected, a, v


def _diagnose_causal_av(got, expected, a, v):
    close = dict(rtol=1e-5, atol=1e-5)
    bh, t_q, t_k = a.shape
    def up_to(bound):                                               # A . V over the first bound(r) keys of each block row
        result = np.zeros_like(expected)
        for r in range(-(-t_q // TILE)):
            rows, k_end = slice(r * TILE, (r + 1) * TILE), max(0, min(t_k, bound(r)))
            result[:, rows] = a[:, rows, :k_end].astype(np.float64) @ v[:, :k_end]
        return result
    if np.allclose(got, up_to(lambda r: r * TILE + t_k - t_q), **close):
        return "diagonal_tile_skipped", ("the key tile on the diagonal was skipped too: it holds the weights of "
                                        "each query's nearest keys, itself included, which are not zero")
    if t_q != t_k and np.allclose(got, up_to(lambda r: (r + 1) * TILE), **close):
        return "mask_ignores_offset", (f"with T_q = {t_q} < T_k = {t_k} the queries are the last positions: "
                                       f"query i sees keys up to i + {t_k - t_q}, so the block's walk goes "
                                       f"{t_k - t_q} keys further")
    return None


register(Exercise(
    exercise_id="05_causal_av",
    title="A . V for causal weights, skipping the key tiles wholly above the diagonal",
    kind="kernel",
    run=_run_causal_av,
    # One weight first; then heads of 7 (one tile); 33 queries (three block rows, the last
    # partly used: tiles above the diagonal exist); T_q < T_k with an offset that is no multiple
    # of the tile; d_v not a multiple of it either.
    cases=[CausalCase(1, 1, 1, 1), CausalCase(2, 7, 7, 5), CausalCase(1, 33, 33, 18), CausalCase(1, 17, 40, 7)],
    describe_case=str,
    hint=("the queries of one block share one stopping point along the keys: the last key the block's "
          "last query may see; every tile after it is all zeros, for every query of the block"),
    more_hints=("where answers go wrong: stopping before the tile on the diagonal (it is not all zeros), "
                "forgetting that with fewer queries than keys the queries are the last positions, and "
                "computing the stopping point per thread: every thread of a block must take as many steps, "
                "since each step waits at barriers",),
    # float32 sums of at most 40 products of order 1 against float64: errors around 1e-7.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_causal_av,
    diagnoses=("no_tiles_skipped", "diagonal_tile_skipped", "mask_ignores_offset"),
))
