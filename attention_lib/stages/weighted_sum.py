"""Weighted values (notebook 05): out = A @ V per head, A (BH, T_q, T_k), V (BH, T_k, d_v). A @ V is
notebook 01's matrix product with A as x and V as w, so the kernels reuse projection.py's (one
matmul in the library). The file:

- ``KERNELS``: version 1, ``weighted_sum_kernel_v1``, is ``projection.projection_kernel_v1``
  itself, launched once per head (``launch_per_head``); version 2, ``weighted_sum_kernel_v2``,
  runs all heads in one launch (z axis), each block running ``projection.tile_matmul``.
- ``weighted_sum_causal_kernel``: version 2 for causal weights, each block stopping at its last
  query's last visible key (``causal_tile_counts``); the pipeline (attention.py) uses it.
- ``weighted_sum_grid``, ``flatten_av`` (validation), ``launch_weighted_sum`` on device arrays,
  and the launcher ``weighted_sum(a, v, version=2, kernel=None, causal=False)``.
- Costs are projection's: ``projection.flops(T_q, T_k, d_v)`` and ``projection.global_reads``.
"""

import math

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.platform.launch import ceil_div, check_grid, check_simulator_budget, check_version
from attention_lib.stages import mask
from attention_lib.stages.projection import BLOCK, TILE, launch_projection, projection_kernel_v1, tile_matmul
from attention_lib.platform.validation import as_float32, kv_group, require

# --- Kernels -----------------------------------------------------------------------------

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
    """weighted_sum_kernel_v2 for causal weights, skipping the tiles of a above the diagonal.

    Same arguments, grid and block as weighted_sum_kernel_v2; a must be 0 wherever the causal
    mask hides a key: a[h, i, j] = 0 for j > i + (T_k - T_q) (the queries are the last T_q
    positions). The block's last query sees keys 0 .. k_end - 1 at most, so the block multiplies
    the slices a[h, :, :k_end] and v[h, :k_end] only: the steps of TILE keys past k_end, whose
    weights are all 0, are neither loaded nor multiplied (as causal_scores_kernel skips its tiles).
    """
    col, row = cuda.grid(2)
    h = cuda.blockIdx.z
    t_q, t_k = a.shape[1], a.shape[2]
    last_row = min((cuda.blockIdx.y + 1) * TILE, t_q) - 1    # the block's last real query
    k_end = max(0, min(t_k, last_row + (t_k - t_q) + 1))    # the same for the whole block
    acc = tile_matmul(a[h, :, :k_end], v[h, :k_end], row, col)   # every thread: barriers inside
    if row < out.shape[1] and col < out.shape[2]:
        out[h, row, col] = acc


# Version 1 is notebook 01's kernel itself, A in the role of x and V in that of w, once per head.
weighted_sum_kernel_v1 = projection_kernel_v1
KERNELS = {1: weighted_sum_kernel_v1, 2: weighted_sum_kernel_v2}


# --- Launchers ---------------------------------------------------------------------------

def weighted_sum_grid(bh, t_q, d_v):
    """(grid, block) of weighted_sum_kernel_v2 for an output of (bh, t_q, d_v): one thread per
    output element in (TILE, TILE) blocks, one grid layer per head."""
    return (ceil_div(d_v, TILE), ceil_div(t_q, TILE), bh), BLOCK


def launch_per_head(kernel, a, v, out):
    """Version 1's launch: `kernel`, with projection_kernel_v1's signature (x, w, b, out), once per
    head h on x = a[h], w = v[h], no bias, into out[h]. a, v, out: device arrays (BH, ...)."""
    no_bias = cuda.to_device(np.zeros(0, np.float32))    # b of shape (0,): "no bias"
    for h in range(a.shape[0]):
        launch_projection(kernel, a[h], v[h], no_bias, out[h])   # (T_q, T_k) @ (T_k, d_v)


def launch_weighted_sum(a, v, out, version=2, kernel=None, causal=False):
    """a @ v into out, on device arrays: a (BH, T_q, T_k), v (BH, T_k, d_v), out (BH, T_q, d_v),
    float32. No checks: ``weighted_sum`` makes them. version 1 launches per head, version 2 once;
    causal (version 2): a is 0 above the causal diagonal, and weighted_sum_causal_kernel skips
    those tiles. `kernel` replaces that version's library kernel and is launched the same way."""
    if version == 1:
        launch_per_head(weighted_sum_kernel_v1 if kernel is None else kernel, a, v, out)
    else:
        grid, block = weighted_sum_grid(*out.shape)
        if kernel is None:
            kernel = weighted_sum_causal_kernel if causal else weighted_sum_kernel_v2
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
    -> (..., T_q, d_v) float32. version 1: projection_kernel_v1 once per head; version 2:
    weighted_sum_kernel_v2 once for all heads. causal (version 2): the weights are causal, 0
    for j > i + (T_k - T_q), which is checked; weighted_sum_causal_kernel skips the tiles above
    the diagonal. kernel: replaces the version's kernel (for version 1 any kernel with
    projection_kernel_v1's signature, for version 2 any with weighted_sum_kernel_v2's) and is
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
