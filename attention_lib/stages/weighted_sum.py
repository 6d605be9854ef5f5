"""Weighted values (notebook 05): out = A @ V per head, A (BH, T_q, T_k), V (BH, T_k, d_v). The file:

- ``weighted_sum_kernel_v1``: one thread per output element, the head on the grid's z axis (all
  heads in one launch); each thread reads its row of A and its column of V from main memory.
- ``weighted_sum_kernel_v2``: the same grid, each block running ``projection.tile_matmul``
  (A @ V is notebook 01's matrix product with A as x and V as w: one tiled matmul in the library).
- ``weighted_sum_causal_kernel``: version 2 for causal weights, written out: each block walks the
  keys in (TILE, TILE) tiles only up to its last query's last visible key, so no tile wholly
  above the diagonal is loaded (``causal_tile_counts``); the pipeline (attention.py) uses it.
- ``weighted_sum_grid``, ``flatten_av`` (validation), ``launch_weighted_sum`` on device arrays,
  and the launcher ``weighted_sum(a, v, version=2, kernel=None, causal=False)``.
- Costs are projection's: ``projection.flops(T_q, T_k, d_v)`` and ``projection.global_reads``.
"""

import math

import numpy as np
from numba import cuda, float32

from attention_lib import reference
from attention_lib.platform.launch import ceil_div, check_grid, check_simulator_budget, check_version
from attention_lib.stages import mask
from attention_lib.stages.projection import BLOCK, TILE, tile_matmul
from attention_lib.platform.validation import as_float32, kv_group, require

# --- Kernels -----------------------------------------------------------------------------

@cuda.jit
def weighted_sum_kernel_v1(a, v, out):
    """out[h, i, c] = sum_j a[h, i, j] * v[h, j, c]: one thread per output element, all heads in one launch.

    a: (BH, T_q, T_k) float32 weights; v: (BH, T_k, d_v) float32 values; out: (BH, T_q, d_v)
    float32, written. Grid: x over the output's columns c, y over queries i, z over heads h;
    block (TILE, TILE). Each weight is read d_v times, each value T_q times, from main memory.
    """
    col, row = cuda.grid(2)                    # col: a feature of the values, row: a query
    h = cuda.blockIdx.z                        # one head per grid layer
    if row < a.shape[1] and col < v.shape[2]:  # the edge blocks hang past T_q and d_v
        acc = float32(0.0)                     # float32: a bare 0.0 would make acc float64
        for j in range(a.shape[2]):            # every key: its weight times its value's feature
            acc += a[h, row, j] * v[h, j, col]
        out[h, row, col] = acc


@cuda.jit
def weighted_sum_kernel_v2(a, v, out):
    """out[h, i, c] = sum_j a[h, i, j] * v[h, j, c], tiled, all heads in one launch.

    a: (BH, T_q, T_k) float32 weights; v: (BH, T_k, d_v) float32 values; out: (BH, T_q, d_v)
    float32, written. Grid: x over the output's columns c, y over queries i, z over heads h;
    block (TILE, TILE). a[h] and v[h] are 2-D views of head h: no copy, the same memory.
    """
    col, row = cuda.grid(2)                    # col: a feature of the values, row: a query
    h = cuda.blockIdx.z                        # one head per grid layer
    acc = tile_matmul(a[h], v[h], row, col)    # called by every thread: it contains barriers
    if row < out.shape[1] and col < out.shape[2]:
        out[h, row, col] = acc


@cuda.jit
def weighted_sum_causal_kernel(a, v, out):
    """weighted_sum_kernel_v2 for causal weights, never loading a tile of a above the diagonal.

    Same arguments, grid and block as weighted_sum_kernel_v2; a must be 0 wherever the causal
    mask hides a key: a[h, i, j] = 0 for j > i + (T_k - T_q) (the queries are the last T_q
    positions). The block's last query, (blockIdx.y + 1) * TILE - 1, sees keys 0 .. k_end - 1 at
    most, so the block walks the keys TILE at a time up to k_end only: the tiles after it, all 0,
    are neither loaded nor multiplied (as causal_scores_kernel skips its tiles). Every thread of
    the block takes the same steps, as each step waits at two barriers. Loads are guarded at
    k_end, not T_k: past it every weight of the block is 0, so nothing there is loaded.
    """
    a_tile = cuda.shared.array((TILE, TILE), float32)     # [query in the block, key in this step]
    v_tile = cuda.shared.array((TILE, TILE), float32)     # [key in this step, column in the block]
    col, row = cuda.grid(2)                    # col: a feature of the values, row: a query
    tx, ty, h = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockIdx.z
    (t_q, t_k), d_v, acc = a.shape[1:], v.shape[2], float32(0.0)   # acc: this thread's out[h, row, col]
    k_end = min(t_k, (cuda.blockIdx.y + 1) * TILE + t_k - t_q)   # the block's last query's: one stop for all
    for start in range(0, k_end, TILE):        # no step when k_end <= 0: the block sees no key
        a_tile[ty, tx] = a[h, row, start + tx] if row < t_q and start + tx < k_end else float32(0.0)
        v_tile[ty, tx] = v[h, start + ty, col] if start + ty < k_end and col < d_v else float32(0.0)
        cuda.syncthreads()                     # wait until both tiles are loaded
        for j in range(TILE):                  # past k_end or an edge the tiles hold 0: adds nothing
            acc += a_tile[ty, j] * v_tile[j, tx]
        cuda.syncthreads()                     # wait until all have read them: the next step overwrites
    if row < t_q and col < d_v:
        out[h, row, col] = acc


KERNELS = {1: weighted_sum_kernel_v1, 2: weighted_sum_kernel_v2}


# --- Launchers ---------------------------------------------------------------------------

def weighted_sum_grid(bh, t_q, d_v):
    """(grid, block) of every weighted-sum kernel for an output of (bh, t_q, d_v): one thread per
    output element in (TILE, TILE) blocks, one grid layer per head."""
    return (ceil_div(d_v, TILE), ceil_div(t_q, TILE), bh), BLOCK


def launch_weighted_sum(a, v, out, version=2, kernel=None, causal=False):
    """a @ v into out, on device arrays: a (BH, T_q, T_k), v (BH, T_k, d_v), out (BH, T_q, d_v),
    float32. No checks: ``weighted_sum`` makes them. causal (version 2): a is 0 above the causal
    diagonal, and weighted_sum_causal_kernel skips those tiles. `kernel` replaces that version's
    library kernel and is launched on the same grid."""
    if kernel is None:
        kernel = weighted_sum_causal_kernel if causal else KERNELS[version]
    grid, block = weighted_sum_grid(*out.shape)
    kernel[grid, block](a, v, out)


def causal_tile_counts(bh, t_q, t_k, d_v):
    """(loaded, skipped) (TILE, TILE) tiles of a, counted once per block that needs them, by
    weighted_sum_causal_kernel on (bh, t_q, t_k) weights and d_v columns of values.

    A block of query rows stops at its last visible key, so the tiles skipped in each row of
    blocks are the tiles of S that causal_scores_kernel skips: mask.causal_tile_counts, once per
    head and per block across d_v. For T_q = T_k = n TILE that is n (n - 1) / 2 of n^2.
    """
    computed, skipped = mask.causal_tile_counts(t_q, t_k, TILE)
    blocks_across = bh * ceil_div(d_v, TILE)
    return computed * blocks_across, skipped * blocks_across


def flatten_av(a, v, what):
    """Validate a and v and flatten their leading axes; returns (a3, v3, leading shape).

    a: (..., T_q, T_k); v: (..., T_k, d_v), the same leading axes -> a3 (BH, T_q, T_k),
    v3 (BH, T_k, d_v) float32. `what` names the caller in the simulator-budget message.
    """
    a = as_float32("a", a, "(..., T_q, T_k)", min_ndim=2)
    v = as_float32("v", v, "(..., T_k, d_v)", min_ndim=2)
    require(v.shape[-2] == a.shape[-1],
            f"v must have T_k = {a.shape[-1]} rows (the last axis of a {a.shape}); got shape {v.shape}")
    # One head of v per head of a: grouped-query shapes are refused (attention.attention takes them).
    require(kv_group("v", v, "a", a) == 1, f"v must have the leading axes of a {a.shape[:-2]}; got shape {v.shape}")
    lead = a.shape[:-2]
    (t_q, t_k), d_v = a.shape[-2:], v.shape[-1]
    grid, block = weighted_sum_grid(math.prod(lead), t_q, d_v)
    check_grid(what, grid, x="v's d_v in tiles of 16", y="a's T_q in tiles of 16", z="a's batch x heads")
    check_simulator_budget(what, math.prod(grid) * math.prod(block), math.prod(lead) * t_q * t_k * d_v)
    return a.reshape(-1, t_q, t_k), v.reshape(-1, t_k, d_v), lead     # (BH, T, ...)


def _require_causal(a3):
    """Refuse weights said to be causal that are not 0 where the mask hides a key: a3 (BH, T_q, T_k)."""
    hidden = ~reference.causal_mask(*a3.shape[1:])              # (T_q, T_k), True above the diagonal
    bad = np.argwhere((a3 != 0) & hidden)
    if bad.size:
        h, i, j = (int(n) for n in bad[0])
        raise ValueError(f"a must be 0 where j > i + (T_k - T_q) when causal=True; got {a3[h, i, j]} "
                         f"at (head {h}, i {i}, j {j})")


def weighted_sum(a, v, version=2, kernel=None, causal=False):
    """Each output row a mix of the value rows: a @ v, on the device.

    a: (..., T_q, T_k) float weights; v: (..., T_k, d_v) float values, the same leading axes
    -> (..., T_q, d_v) float32. version 1: weighted_sum_kernel_v1, version 2:
    weighted_sum_kernel_v2, each one launch for all heads. causal (version 2): the weights are
    causal, 0 for j > i + (T_k - T_q), which is checked; weighted_sum_causal_kernel skips the
    tiles above the diagonal. kernel: replaces that kernel (any with its signature) and is
    launched on the same grid.
    """
    check_version(version, KERNELS)
    require(isinstance(causal, (bool, np.bool_)), f"causal must be True or False, got {causal!r}")
    require(not (causal and version == 1), "causal=True needs version 2 (version 1 has no tile to skip)")
    a3, v3, lead = flatten_av(a, v, "weighted_sum")
    if causal:
        _require_causal(a3)
    (bh, t_q, _), d_v = a3.shape, v3.shape[2]
    d_out = cuda.device_array((bh, t_q, d_v), np.float32)
    launch_weighted_sum(cuda.to_device(a3), cuda.to_device(v3), d_out, version, kernel, causal)
    return d_out.copy_to_host().reshape(*lead, t_q, d_v)              # (..., T_q, d_v)
