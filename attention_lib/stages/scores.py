"""Scaled attention scores (notebook 02): S = Q K^T / sqrt(d_k), every query against every key.

Entry S[i, j] says how well query i matches key j. For one head that is a (T_q, T_k) matrix:
1024 x 1024 = 1,048,576 scores per head per pass at ANDREA-120M.

- NumPy reference: ``attention_lib.reference.scores`` (not repeated here).
- ``scores_kernel_v1``: one thread per score, reading q and k straight from global memory.
- ``scores_kt_kernel``: the tiled kernel when K arrives transposed, kt (BH, d_k, T_k), as some
  KV caches store it: a block of TILE x TILE threads computes a TILE x TILE tile of S, staging
  TILE columns of its rows of q and of kt in shared memory at a time, so each element read from
  global memory serves TILE threads; kt's tile is copied as it lies, and the scale is folded
  into q's tile as it is loaded.
- ``scores_tiled_kernel``: the teaching version of the tiled kernel for K as the projection writes
  it, (BH, T_k, d_k), in one body: a thread copies q and k along d_k (coalesced), stores k's
  element transposed into a tile padded to KT_WIDTH (no bank conflicts on the store or the
  reads), and folds the scale into q's tile.
- ``tile_dot`` + ``scores_kernel_v2``: the same tiles for K as the projection writes it, (BH,
  T_k, d_k): its tile is stored transposed on the way in (``load_qk_tiles``, rows padded to
  KT_WIDTH against bank conflicts), then TILE multiply-adds (``dot_qk_tiles``).
- Launchers ``scores(q, k, scale=True, version=2, kernel=None)`` and ``scores_kt(q, kt, ...)``.

The scale is one multiplication per score by 1/sqrt(d_k), computed once on the host and passed
to the kernel as a float32 (1.0 for unscaled scores): a multiplication is cheaper than a
division, and no thread recomputes a square root.

Heads ride on the grid's z axis: q (..., T_q, d_k) is flattened to (BH, T_q, d_k), where BH is
the product of the leading axes (batch x heads), and block z handles head h = blockIdx.z.
``mask.py`` reuses ``tile_dot``, ``score_grid`` and ``flatten_qk`` for its fused kernel.
The tile is the same on a GPU and on the simulator, so ``score_grid`` at ANDREA-120M sizes gives
the GPU's grid on either backend.
"""

import math

import numpy as np
from numba import cuda

from attention_lib.platform.launch import ceil_div, check_grid, check_simulator_budget, check_version
from attention_lib.platform.validation import as_float32, attention_inputs, require

# Side of a square tile of S: a block of TILE x TILE threads computes TILE x TILE scores.
# 16 x 16 = 256 threads per block (8 warps) on a GPU; on the simulator T 32 is 2 x 2 tiles.
TILE = 16
# Row length of the transposed K tile in shared memory: TILE + 2 words. A warp is two rows ty of
# 16 threads, and thread (tx, ty) stores to word tx * KT_WIDTH + ty. With rows of 16 words those
# 32 stores fall into 4 banks (an 8-way conflict: 8 rounds instead of 1); with 17, 31 banks (tx 15,
# ty 1 meets tx 0, ty 0); with 18, 2 * (9 tx mod 16) + ty takes each of the 32 banks once.
# The reads kt_tile[cc, tx] stay conflict-free: 16 neighbouring words, the same for both rows.
KT_WIDTH = TILE + 2


# --- Kernels -----------------------------------------------------------------------------

@cuda.jit
def scores_kernel_v1(q, k, inv_sqrt_dk, s):
    """Naive scores: s[h, i, j] = (q[h, i] . k[h, j]) * inv_sqrt_dk, one thread per score.

    q: (BH, T_q, d_k) float32; k: (BH, T_k, d_k) float32; inv_sqrt_dk: float32, 1/sqrt(d_k)
    (1.0 for unscaled scores); s: (BH, T_q, T_k) float32, written.
    Grid: x runs over keys j (columns of s), y over queries i (rows), z over heads h.
    """
    j, i = cuda.grid(2)                    # (x, y): x is the column j, y the row i
    h = cuda.blockIdx.z                    # one head per grid layer
    if i < s.shape[1] and j < s.shape[2]:  # the edge blocks hang past T_q and T_k
        acc = np.float32(0.0)              # float32, as on the GPU: no double-precision maths
        for c in range(q.shape[2]):
            # Row j of K is column j of K^T: the transpose is in the indexing, never stored.
            acc += q[h, i, c] * k[h, j, c]
        s[h, i, j] = acc * inv_sqrt_dk     # the scale: one multiplication, no division


@cuda.jit
def scores_kt_kernel(q, kt, inv_sqrt_dk, s):
    """Tiled scores from K given transposed: s[h, i, j] = (q[h, i] . kt[h, :, j]) * inv_sqrt_dk.

    q: (BH, T_q, d_k), kt: (BH, d_k, T_k), s: (BH, T_q, T_k) float32; inv_sqrt_dk: float32.
    Grid and block as scores_kernel_v2. The block copies TILE columns of its q rows and TILE rows
    of its kt columns per step, each element once, as they lie in memory; the scale is folded
    into the q tile as it is loaded, so the sum is the score.
    """
    q_tile = cuda.shared.array((TILE, TILE), np.float32)     # [query in the tile, column c of the step]
    kt_tile = cuda.shared.array((TILE, TILE), np.float32)    # [column c of the step, key in the tile]
    j, i = cuda.grid(2)
    h, tx, ty, acc = cuda.blockIdx.z, cuda.threadIdx.x, cuda.threadIdx.y, np.float32(0.0)
    for c0 in range(0, q.shape[2], TILE):                    # one step along d_k
        inside = i < q.shape[1] and c0 + tx < q.shape[2]     # tx walks along d_k, q's last axis
        q_tile[ty, tx] = q[h, i, c0 + tx] * inv_sqrt_dk if inside else np.float32(0.0)   # scale folded in
        inside = c0 + ty < kt.shape[1] and j < kt.shape[2]   # tx walks along T_k, kt's last axis
        kt_tile[ty, tx] = kt[h, c0 + ty, j] if inside else np.float32(0.0)            # 0 past an edge
        cuda.syncthreads()                                   # wait: both tiles are complete
        for c in range(TILE):
            acc += q_tile[ty, c] * kt_tile[c, tx]
        cuda.syncthreads()                                   # wait: every thread has read them
    if i < q.shape[1] and j < kt.shape[2]:
        s[h, i, j] = acc                                     # the scale is already in the sum


@cuda.jit
def scores_tiled_kernel(q, k, inv_sqrt_dk, s):
    """Tiled scores, K in its own layout: s[h, i, j] = (q[h, i] . k[h, j]) * inv_sqrt_dk.

    q: (BH, T_q, d_k), k: (BH, T_k, d_k), s: (BH, T_q, T_k) float32; inv_sqrt_dk: float32.
    Grid and block: score_grid (blocks of TILE x TILE, x over keys, y over queries, z over heads).
    Thread (tx, ty) scores query i against key j. Per step of TILE columns along d_k it copies column
    c0 + tx of query i and of key `key`, row ty of its block's keys: neighbouring threads read
    neighbouring addresses of both arrays. The key's element goes into kt_tile transposed, so that
    the sum reads a row of kt_tile (rows padded to KT_WIDTH: no bank conflict on the store); the
    query's goes in times the scale, so that the sum is the score.
    """
    q_tile = cuda.shared.array((TILE, TILE), np.float32)      # [query in the block, column of the step]
    kt_tile = cuda.shared.array((TILE, KT_WIDTH), np.float32)  # [column of the step, key in the block]
    tx, ty, h, acc = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockIdx.z, np.float32(0.0)
    i, j, key = cuda.blockIdx.y * TILE + ty, cuda.blockIdx.x * TILE + tx, cuda.blockIdx.x * TILE + ty
    for c0 in range(0, q.shape[2], TILE):                     # one step of TILE columns along d_k
        inside = i < q.shape[1] and c0 + tx < q.shape[2]      # tx runs along d_k in both copies
        q_tile[ty, tx] = q[h, i, c0 + tx] * inv_sqrt_dk if inside else np.float32(0.0)   # the scale folded in
        inside = key < k.shape[1] and c0 + tx < k.shape[2]
        kt_tile[tx, ty] = k[h, key, c0 + tx] if inside else np.float32(0.0)             # stored transposed
        cuda.syncthreads()                                    # wait: both tiles are complete
        for cc in range(TILE):
            acc += q_tile[ty, cc] * kt_tile[cc, tx]
        cuda.syncthreads()                                    # wait: every thread has read them
    if i < q.shape[1] and j < k.shape[1]:                     # a score only where both exist
        s[h, i, j] = acc                                      # the scale is already in the sum


@cuda.jit(device=True)
def load_qk_tiles(q, k, h, i, key, c0, q_tile, kt_tile):
    """Thread (tx, ty) copies q[h, i, c0 + tx] into q_tile and k[h, key, c0 + tx] into kt_tile, transposed.

    q_tile: (TILE, TILE), kt_tile: (TILE, KT_WIDTH) float32 shared arrays. Past an edge the
    thread stores 0, which adds nothing to the sums. kt_tile's rows are padded to KT_WIDTH words
    so that the transposing stores are free of bank conflicts.
    """
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    c = c0 + tx                            # neighbouring threads read neighbouring columns
    if i < q.shape[1] and c < q.shape[2]:
        q_tile[ty, tx] = q[h, i, c]
    else:
        q_tile[ty, tx] = 0.0
    if key < k.shape[1] and c < q.shape[2]:    # q and k share d_k
        kt_tile[tx, ty] = k[h, key, c]     # stored transposed: dot_qk_tiles reads kt_tile[cc, tx]
    else:
        kt_tile[tx, ty] = 0.0


@cuda.jit(device=True)
def dot_qk_tiles(q_tile, kt_tile, acc):
    """acc + q_tile[ty, :] . kt_tile[:, tx]: TILE multiply-adds from shared memory, returned."""
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    for cc in range(TILE):
        acc += q_tile[ty, cc] * kt_tile[cc, tx]
    return acc


@cuda.jit(device=True)
def tile_dot(q, k, h, i, j):
    """q[h, i] . k[h, j] for thread (i, j) of a TILE x TILE block, computed with the whole block.

    Every thread of the block must call it (it waits at barriers), also threads whose (i, j)
    lies past the edge of s: they help load and get a meaningless 0.
    """
    q_tile = cuda.shared.array((TILE, TILE), np.float32)   # [query row in tile, column c]
    kt_tile = cuda.shared.array((TILE, KT_WIDTH), np.float32)  # [column c, key in tile]: K^T, padded
    key = cuda.blockIdx.x * TILE + cuda.threadIdx.y        # the key row this thread copies, not j
    acc = np.float32(0.0)
    for c0 in range(0, q.shape[2], TILE):  # walk along d_k, TILE columns of q and k at a time
        load_qk_tiles(q, k, h, i, key, c0, q_tile, kt_tile)
        cuda.syncthreads()                 # wait: both tiles are complete before anyone reads them
        acc = dot_qk_tiles(q_tile, kt_tile, acc)
        cuda.syncthreads()                 # wait: everyone has read them before the next copy
    return acc


@cuda.jit
def scores_kernel_v2(q, k, inv_sqrt_dk, s):
    """Tiled scores: the block computes a TILE x TILE tile of s for head blockIdx.z.

    Same arguments and grid as scores_kernel_v1; block (TILE, TILE). Each element of q and
    k is read from global memory once per tile of s that needs it, instead of once per score.
    """
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    acc = tile_dot(q, k, h, i, j)          # called by every thread: it contains barriers
    if i < s.shape[1] and j < s.shape[2]:
        s[h, i, j] = acc * inv_sqrt_dk


# --- Launchers ---------------------------------------------------------------------------

KERNELS = {1: scores_kernel_v1, 2: scores_kernel_v2}


def scale_factor(d_k, scale=True):
    """The float32 every score is multiplied by: 1/sqrt(d_k), or 1.0 when not `scale`."""
    return np.float32(1.0 / math.sqrt(d_k)) if scale else np.float32(1.0)


def score_grid(bh, t_q, t_k):
    """(grid, block) for a (bh, t_q, t_k) scores matrix: TILE x TILE blocks, one layer per head."""
    return (ceil_div(t_k, TILE), ceil_div(t_q, TILE), bh), (TILE, TILE)


def launch_scores(kernel, q, k, scale, s):
    """One scores launch on device arrays: q (BH, T_q, d_k) and k (BH, T_k, d_k) float32, scale
    the float32 factor -> s (BH, T_q, T_k) float32, written. `kernel`: any with scores_kernel_v1's
    signature (mask.causal_scores_kernel too), launched on score_grid."""
    grid, block = score_grid(*s.shape)
    kernel[grid, block](q, k, scale, s)


def check_score_launch(what, bh, t_q, t_k, d_k):
    """The grid and simulator-budget checks of a (bh, t_q, t_k) scores launch."""
    grid, block = score_grid(bh, t_q, t_k)
    check_grid(what, grid, x="k's T_k in tiles of 16", y="q's T_q in tiles of 16", z="q's batch x heads")
    check_simulator_budget(what, math.prod(grid) * math.prod(block), bh * t_q * t_k * d_k)


def flatten_qk(q, k, what):
    """Validate q and k and flatten their leading axes; returns (q3, k3, leading shape).

    q: (..., T_q, d_k); k: (..., T_k, d_k), same leading axes and d_k -> q3 (BH, T_q, d_k),
    k3 (BH, T_k, d_k) float32. These kernels read one head of k per head of q: grouped-query
    shapes (fewer heads in k) are refused here; ``attention.attention`` takes them. `what`
    names the caller in the simulator-budget message.
    """
    q3, k3, _, lead, group = attention_inputs(q, k)
    require(group == 1, f"k must have the leading axes of q {lead}; got shape {np.shape(k)}")
    check_score_launch(what, *q3.shape[:2], k3.shape[1], q3.shape[2])
    return q3, k3, lead                                                # (BH, T, d_k) each


def scores(q, k, scale=True, version=2, kernel=None):
    """Attention scores q @ k^T, times 1/sqrt(d_k) when `scale`, on the device.

    q: (..., T_q, d_k) float; k: (..., T_k, d_k) float, same leading axes -> (..., T_q, T_k)
    float32. version: 1 (naive) or 2 (tiled); kernel: any kernel with scores_kernel_v1's
    signature, launched on the same grid (overrides version).
    """
    check_version(version, KERNELS)
    q3, k3, lead = flatten_qk(q, k, "scores")
    if kernel is None:
        kernel = KERNELS[version]
    (bh, t_q, d_k), t_k = q3.shape, k3.shape[1]
    d_s = cuda.device_array((bh, t_q, t_k), np.float32)
    launch_scores(kernel, cuda.to_device(q3), cuda.to_device(k3), scale_factor(d_k, scale), d_s)
    return d_s.copy_to_host().reshape(*lead, t_q, t_k)                # (..., T_q, T_k)


def scores_kt(q, kt, scale=True, kernel=None):
    """Attention scores from K given transposed: q @ kt, times 1/sqrt(d_k) when `scale`, on the device.

    q: (..., T_q, d_k) float; kt: (..., d_k, T_k) float, the leading axes of q -> (..., T_q, T_k)
    float32. kernel: any kernel with scores_kt_kernel's signature (default scores_kt_kernel),
    launched on score_grid.
    """
    q = as_float32("q", q, "(..., T_q, d_k)", min_ndim=2)
    kt = as_float32("kt", kt, "(..., d_k, T_k)", min_ndim=2)
    (t_q, d_k), t_k = q.shape[-2:], kt.shape[-1]
    require(kt.shape[:-1] == q.shape[:-2] + (d_k,),
            f"kt must have shape {q.shape[:-2] + (d_k,)} + (T_k,) (the leading axes and d_k of q {q.shape}); "
            f"got shape {kt.shape}")
    q3, kt3 = q.reshape(-1, t_q, d_k), kt.reshape(-1, d_k, t_k)      # (BH, T_q, d_k), (BH, d_k, T_k)
    check_score_launch("scores_kt", q3.shape[0], t_q, t_k, d_k)
    d_s = cuda.device_array((q3.shape[0], t_q, t_k), np.float32)
    launch_scores(scores_kt_kernel if kernel is None else kernel,
                  cuda.to_device(q3), cuda.to_device(kt3), scale_factor(d_k, scale), d_s)
    return d_s.copy_to_host().reshape(*q.shape[:-2], t_q, t_k)       # (..., T_q, T_k)
