"""Notebook 05's exercises: A . V with one thread per output, then tiled for causal weights.

``05_weighted_sum`` (warm-up): a kernel with weighted_sum_kernel_v1's signature ``(a, v, out)``:
a (BH, T_q, T_k) weights, v (BH, T_k, d_v) values, out (BH, T_q, d_v), all float32, launched on
weighted_sum_grid (x over out's columns, y over the queries, z over the heads; blocks of TILE x
TILE). Besides the engine's diagnoses:

- ``grid_axes_swapped``: the query was taken from the grid's x (and the column from y), so
  the outputs the grid does not reach that way were never written;
- ``weights_transposed``: query i read column i of the weights, a[h, j, i], for its row
  (seen on a square case, T_q = T_k).

``05_causal_av`` (main): a kernel with weighted_sum_causal_kernel's signature, on the same grid,
for causal weights (zero for every key j > i + T_k - T_q: the queries are the last positions):
the tile loop written out, with its loads, its two barriers and a stopping point along the keys
that is the same for the whole block, so that no key tile wholly above the diagonal is loaded.
Race-checked, its loads of a counted by the sanitizer, on every case. Besides the engine's
diagnoses (``race``, ``divergent_barrier`` for a stopping point that differs between the threads
of a block, ``out_of_bounds``):

- ``no_tiles_skipped``: right values, but weights were loaded from key tiles that lie wholly
  above the diagonal of the block's queries (a stop rounded up to the end of the diagonal tile
  loads no such tile, and passes);
- ``diagonal_tile_skipped``: the tile on the diagonal was skipped too: it holds weights that
  are not zero;
- ``mask_ignores_offset``: with T_q != T_k the stop ignored that the queries are the last
  positions (query i sees keys up to i + T_k - T_q).
"""

from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import projection, weighted_sum
from attention_lib.stages.projection import TILE
from attention_lib.checks.engine import (Diagnosed, Exercise, host_output, output_array, read_output, register,
                                         traced_launch, unwritten)

# The library code an answer to either exercise may not call: the kernels, their launchers, the
# tiled matmul of notebook 01 that would do the tile loop, and the references.
_STAGE = (weighted_sum.weighted_sum_kernel_v1, weighted_sum.weighted_sum_kernel_v2,
          weighted_sum.weighted_sum_causal_kernel, weighted_sum.launch_weighted_sum, weighted_sum.weighted_sum,
          projection.projection_kernel_v1, projection.projection_kernel_v2, projection.tile_matmul,
          reference.weighted_sum)


class Case(NamedTuple):
    """One size tried: BH heads of weights (T_q, T_k) times values (T_k, d_v)."""

    BH: int
    T_q: int
    T_k: int
    d_v: int

    def __str__(self):
        return f"(BH {self.BH}, T_q {self.T_q}, T_k {self.T_k}, d_v {self.d_v})"


def _weights(case, rng, causal):
    """Attention weights (BH, T_q, T_k) float32, rows >= 0 summing to 1 (or all 0 where a causal
    query sees no key), and values (BH, T_k, d_v) float32."""
    s = rng.standard_normal((case.BH, case.T_q, case.T_k))
    a = reference.softmax(reference.apply_causal_mask(s) if causal else s).astype(np.float32)
    v = rng.standard_normal((case.BH, case.T_k, case.d_v)).astype(np.float32)
    return a, v


# --- The warm-up: one thread per output element, all heads in one launch ------------------------

def _swapped_reach(case):
    """(T_q, d_v) bool: the outputs a kernel reaches when it takes the query from the grid's x and
    the column from its y (the grid being weighted_sum_grid's)."""
    (across, down, _), _ = weighted_sum.weighted_sum_grid(case.BH, case.T_q, case.d_v)
    return (np.arange(case.T_q)[:, None] < across * TILE) & (np.arange(case.d_v)[None, :] < down * TILE)


def _run_weighted_sum(kernel, case, rng, launch):
    a, v = _weights(case, rng, causal=False)
    full, out = output_array((case.BH, case.T_q, case.d_v), guard=TILE * TILE)
    grid, block = weighted_sum.weighted_sum_grid(case.BH, case.T_q, case.d_v)
    launch(kernel, grid, block, cuda.to_device(a), cuda.to_device(v), out)
    got = read_output(full, out)
    written = ~unwritten(got)
    reach = _swapped_reach(case)
    if not written.all() and not reach.all() and (written == reach[None]).all():
        raise Diagnosed("grid_axes_swapped", (
            "the outputs past the first blocks of the grid's x axis were never written: the query was taken "
            "from the grid's x and the column from y; the grid's x runs along the output's columns (d_v), "
            "its y along the queries, its z over the heads"))
    return got, a.astype(np.float64) @ v, a, v


def _diagnose_weighted_sum(got, expected, a, v):
    if a.shape[1] == a.shape[2] and np.allclose(got, np.swapaxes(a, 1, 2).astype(np.float64) @ v,
                                                rtol=1e-5, atol=1e-5):
        return "weights_transposed", ("query i read column i of the weights: its weights are row i of a[h], "
                                      "a[h, i, j] for every key j")
    return None


register(Exercise(
    exercise_id="05_weighted_sum",
    title="out[h, i, c] = sum_j a[h, i, j] v[h, j, c], one thread per output element, all heads in one launch",
    kind="kernel",
    run=_run_weighted_sum,
    # One weight; two square heads (T_q = T_k: transposed weights keep the shape; two block rows
    # and one block across, so swapped axes leave outputs unwritten); d_v 24 (two blocks across,
    # the second partly used); 33 queries of 20 keys (three block rows); three heads of 5 queries.
    cases=[Case(1, 1, 1, 1), Case(2, 19, 19, 3), Case(2, 7, 5, 24), Case(1, 33, 20, 5), Case(3, 5, 9, 17)],
    describe_case=str,
    hint=("one thread per output element: the grid's x picks the value's feature, y the query, z the "
          "head; the thread walks the keys, adding each weight of its query's row times that key's "
          "value in its feature"),
    more_hints=("where answers go wrong: the grid's x is the column, not the query; the weights of a "
                "query are a row of the head's weights, not a column; and threads of the edge blocks "
                "that have no output must do nothing",),
    # float32 sums of at most 20 products of order 1 against float64: errors around 1e-7.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_weighted_sum,
    diagnoses=("grid_axes_swapped", "weights_transposed"),
    solution=weighted_sum.weighted_sum_kernel_v1,
    forbidden=_STAGE,
))


# --- The main exercise: the causal tiled kernel ------------------------------------------------

def _visible_keys(block_row, t_q, t_k):
    """Keys the queries of block row `block_row` may see: up to its last query + T_k - T_q (0 or
    less: none)."""
    last_query = min((block_row + 1) * TILE, t_q) - 1
    return max(0, min(t_k, last_query + t_k - t_q + 1))


def _run_causal_av(kernel, case, rng, _launch):          # traced: races and loads on every case
    a, v = _weights(case, rng, causal=True)
    out = host_output((case.BH, case.T_q, case.d_v))
    grid, block = weighted_sum.weighted_sum_grid(case.BH, case.T_q, case.d_v)
    traced = traced_launch(kernel, grid, block, a, v, out)
    expected = a.astype(np.float64) @ v
    if np.allclose(out, expected, rtol=1e-5, atol=1e-5):             # right: were the zero tiles read?
        loads = traced.loads("a")
        for block_row in range(ceil_div(case.T_q, TILE)):
            # the key tiles after the one that holds the block's last visible key are all zero
            first_zero_tile = ceil_div(_visible_keys(block_row, case.T_q, case.T_k), TILE) * TILE
            wasted = int(loads[:, block_row * TILE:(block_row + 1) * TILE, first_zero_tile:].sum())
            if wasted:
                raise Diagnosed("no_tiles_skipped", (
                    f"the values are right, but {wasted} loads of weights lie in key tiles wholly above the "
                    f"diagonal of query block {block_row} (keys {first_zero_tile} and on, all zero): stop the "
                    "block's walk along the keys after the tile that holds its last query's last visible key"))
    return out, expected, a, v


def _diagnose_causal_av(got, expected, a, v):
    close = dict(rtol=1e-5, atol=1e-5)
    bh, t_q, t_k = a.shape

    def up_to(bound):                     # A . V over the first bound(r) keys of each block row r
        result = np.zeros_like(expected)
        for r in range(ceil_div(t_q, TILE)):
            rows, k_end = slice(r * TILE, (r + 1) * TILE), max(0, min(t_k, bound(r)))
            result[:, rows] = a[:, rows, :k_end].astype(np.float64) @ v[:, :k_end]
        return result

    if np.allclose(got, up_to(lambda r: r * TILE + t_k - t_q), **close):
        return "diagonal_tile_skipped", ("the key tile on the diagonal was skipped too: it holds the weights of "
                                        "each query's nearest keys, itself included, which are not zero")
    if t_q != t_k and np.allclose(got, up_to(lambda r: (r + 1) * TILE), **close):
        return "mask_ignores_offset", (f"with T_q = {t_q} and T_k = {t_k} the queries are the last positions: "
                                       f"query i sees keys up to i + {t_k - t_q}, and the block's walk along "
                                       "the keys must stop there")
    return None


register(Exercise(
    exercise_id="05_causal_av",
    title="A . V for causal weights, tiled, never loading a key tile wholly above the diagonal",
    kind="kernel",
    run=_run_causal_av,
    # One weight first; then heads of 7 (one tile); 33 queries (three block rows, the last
    # partly used: tiles above the diagonal exist); 17 queries against 40 keys, an offset that
    # is no multiple of the tile; 40 queries against 20 keys (the first block row sees no key at
    # all, the stop is below 0); d_v not a multiple of the tile either.
    cases=[Case(1, 1, 1, 1), Case(2, 7, 7, 5), Case(1, 33, 33, 18), Case(1, 17, 40, 7), Case(1, 40, 20, 3)],
    describe_case=str,
    hint=("the queries of one block share one stopping point along the keys: the last key the block's "
          "last query may see; every key tile after it is all zeros, for every query of the block, so "
          "the block's walk through the tiles ends there"),
    more_hints=("where answers go wrong: a stopping point worked out from each thread's own query (the "
                "threads of a block then take different numbers of steps, and every step waits at "
                "barriers); stopping before the tile on the diagonal, which is not all zeros; forgetting "
                "that with fewer queries than keys the queries are the last positions",),
    # float32 sums of at most 40 products of order 1 against float64: errors around 1e-7.
    rtol=1e-5,
    atol=1e-5,
    diagnose=_diagnose_causal_av,
    diagnoses=("no_tiles_skipped", "diagonal_tile_skipped", "mask_ignores_offset"),
    solution=weighted_sum.weighted_sum_causal_kernel,
    forbidden=_STAGE,
))
