"""Fused attention (notebook 07): softmax(mask(Q K^T / sqrt(d_k))) V in one kernel, FlashAttention-style.

The stage-by-stage pipeline (scores, mask, softmax, weighted sum) writes the (T_q, T_k) scores
and weights to main memory and reads them back between kernels: at ANDREA-120M that is
1024 x 1024 float32 = 4 MiB per head, 48 MiB per layer of 12 heads, 384 MiB at batch 8. The
fused kernel never stores them. A block owns a tile of queries of one head and walks the keys
a tile at a time: it scores the tile, masks it, folds it into each query's running maximum m,
running sum l and output accumulator acc (the online softmax: when the maximum grows from
m_old to m_new, l and acc are multiplied by exp(m_old - m_new)), and divides by l at the end.
Milakov & Gimelshein 2018 (online softmax); Dao et al. 2022, FlashAttention (arXiv 2205.14135);
Dao 2023, FlashAttention-2 (arXiv 2307.08691), two of whose choices this kernel follows: a
block owns queries and loops over the keys (the outer loop over queries is the grid), and the
output stays unnormalised until a single division by l at the end.

- NumPy: ``online_update`` (fold one block of keys into (m, l, acc)) and ``online_attention``
  (attention computed block by block with it; the (T_q, T_k) matrix never exists). The plain
  reference is ``attention_lib.reference.attention``; the online softmax alone is
  ``attention_lib.stages.softmax.online_softmax`` (notebook 04).
- ``flash_attention_kernel_v1``: one thread per query, everything from global memory, key by key.
- ``flash_attention_kernel_v2``: a block of BLOCK_Q threads per tile of BLOCK_Q queries; Q, K
  and V tiles staged in shared memory; causal key tiles wholly after the block's last query
  are skipped.
- ``flash_tile_counts``, ``flash_traffic``, ``pipeline_traffic``: the work and the main-memory
  traffic, as formulas; ``count_fused`` and ``count_pipeline`` count the same traffic with
  ``sanitizer.count_memory`` (tests/test_flash.py checks that formulas and counts agree).
- Launcher ``flash_attention(q, k, v, causal=True, version=2, kernel=None)``.

The scale 1/sqrt(d_k) is folded into Q as it is loaded: (q / sqrt(d_k)) . k = (q . k) / sqrt(d_k),
and multiplying each of the d_k elements of a query once costs less than multiplying each of
its T_k scores (64 against 1024 at ANDREA-120M). Heads ride on the grid's y axis: q
(..., T_q, d_k) is flattened to (BH, T_q, d_k), and block y handles head h = blockIdx.y.
"""

import math

import numpy as np
from numba import cuda

from attention_lib import reference, sanitizer
from attention_lib.stages import mask, scores, softmax, weighted_sum
from attention_lib.launch import SIMULATOR_THREADS_PER_SECOND, ceil_div, check_simulator_budget
from attention_lib.runtime import SIMULATOR_SHAPES
from attention_lib.validation import as_float32, require, require_finite_result

# Largest head width the kernels accept: each thread keeps its query row and its output
# accumulator in local arrays of MAX_D float32, whose size must be known when compiling.
MAX_D = 128
# v1: queries (threads) per block.
ROWS_PER_BLOCK = 32
# v2: queries per block (one thread each) and keys per tile. Shared memory per block:
# (BLOCK_Q + 2 * BLOCK_K) * MAX_D * 4 bytes, 32 KiB on a GPU (static shared memory stops at
# 48 KiB). On a GPU a block is one warp; K and V are re-read from main memory once per block of
# queries, so a larger BLOCK_Q reads them less often. On the simulator 16 and 16: ANDREA-sim's
# T = 32 is 2 x 2 tiles per head, and every barrier round costs tens of milliseconds per block.
BLOCK_Q_GPU = 32
BLOCK_Q = 16 if SIMULATOR_SHAPES else BLOCK_Q_GPU
BLOCK_K = 16


# --- NumPy: attention computed one block of keys at a time ---------------------------------

def online_update(m, l, acc, s_block, v_block):
    """Fold one block of keys into a query's running state; returns (m_new, l_new, acc_new).

    m: (...) running max of the scores seen so far (-inf before any); l: (...) running sum of
    exp(s - m); acc: (..., d_v) running sum of exp(s - m) * v; s_block: (..., n) scores of the
    block's n keys (-inf for masked ones); v_block: (n, d_v) or (..., n, d_v) their values.
    The old terms were computed against m; against m_new each is exp(m - m_new) times smaller,
    so l and acc are rescaled by that factor before the block's own terms are added.
    """
    m_new = np.maximum(m, np.max(s_block, axis=-1))
    shift = np.where(np.isneginf(m_new), 0.0, m_new)   # only -inf so far: l and acc stay 0
    rescale = np.exp(m - shift)                        # 1 if the max stayed, 0 at the start
    p = np.exp(s_block - shift[..., None])             # (..., n) this block's terms
    return m_new, l * rescale + p.sum(axis=-1), acc * rescale[..., None] + p @ v_block


def online_attention(q, k, v, causal=True, block=BLOCK_K):
    """Attention computed `block` keys at a time with online_update; float64.

    q: (..., T_q, d_k); k: (..., T_k, d_k); v: (..., T_k, d_v) -> (..., T_q, d_v), equal to
    reference.attention(q, k, v, causal) up to rounding. Only a (..., T_q, block) slice of
    scores exists at any time. Rows that see no key (T_q > T_k, causal) get zeros.
    """
    q, k, v = (np.asarray(a, dtype=np.float64) for a in (q, k, v))
    (t_q, d_k), t_k = q.shape[-2:], k.shape[-2]
    visible = reference.causal_mask(t_q, t_k) if causal else np.ones((t_q, t_k), bool)
    m = np.full(q.shape[:-1], -np.inf)                      # (..., T_q)
    l = np.zeros(q.shape[:-1])                              # (..., T_q)
    acc = np.zeros(q.shape[:-1] + v.shape[-1:])             # (..., T_q, d_v)
    for start in range(0, t_k, block):
        keys = slice(start, start + block)
        s_block = q @ np.swapaxes(k[..., keys, :], -1, -2) / math.sqrt(d_k)  # (..., T_q, <= block)
        s_block = np.where(visible[:, keys], s_block, -np.inf)
        m, l, acc = online_update(m, l, acc, s_block, v[..., keys, :])
    seen = (l > 0)[..., None]
    return np.where(seen, acc / np.where(seen, l[..., None], 1.0), 0.0)


# --- Kernels ---------------------------------------------------------------------------------

@cuda.jit(device=True)
def visible_keys(i, t_q, t_k, causal):
    """How many keys query i sees: keys 0 .. i + (T_k - T_q) when causal (the queries are the
    last T_q positions, as in reference.causal_mask), all T_k otherwise; never below 0."""
    if not causal:
        return t_k
    return max(0, min(t_k, i + (t_k - t_q) + 1))


@cuda.jit
def flash_attention_kernel_v1(q, k, v, scale, causal, out):
    """Fused attention, one thread per query, reading K and V straight from global memory.

    q: (BH, T_q, d_k), k: (BH, T_k, d_k), v: (BH, T_k, d_v) float32, d_k and d_v <= MAX_D;
    scale: float32, 1/sqrt(d_k); causal: bool; out: (BH, T_q, d_v) float32, written.
    Grid: x over queries i (ROWS_PER_BLOCK to a block), y over heads h. Thread i walks its
    visible keys one by one: score, online-softmax update of (m, l, acc), next key. Nothing
    is shared between threads, so every thread reads all of K and V it needs by itself.
    """
    i, h = cuda.grid(2)                          # x: the query, y: the head (blocks 1 high)
    t_q, d_k = q.shape[1], q.shape[2]
    t_k, d_v = k.shape[1], v.shape[2]
    if i >= t_q:                                 # the last block may hang past T_q
        return
    q_row = cuda.local.array(MAX_D, np.float32)  # private to the thread: registers
    acc = cuda.local.array(MAX_D, np.float32)
    for c in range(d_k):
        q_row[c] = q[h, i, c] * scale            # the scale, folded into q once
    for c in range(d_v):
        acc[c] = 0.0
    m = np.float32(-math.inf)                    # running max; float32 throughout, as on a GPU
    l = np.float32(0.0)                          # running sum of exp(s - m)
    for j in range(visible_keys(i, t_q, t_k, causal)):   # masked keys are never scored
        s = np.float32(0.0)
        for c in range(d_k):
            s += q_row[c] * k[h, j, c]
        m_new = max(m, s)
        rescale = math.exp(m - m_new)            # 1 if the max stayed, 0 for the first key
        p = math.exp(s - m_new)
        l = l * rescale + p
        for c in range(d_v):
            acc[c] = acc[c] * rescale + p * v[h, j, c]
        m = m_new
    inv_l = np.float32(1.0) / l if l > 0 else np.float32(0.0)  # l = 0: no visible key
    for c in range(d_v):
        out[h, i, c] = acc[c] * inv_l


@cuda.jit
def flash_attention_kernel_v2(q, k, v, scale, causal, out):
    """Fused, tiled attention: a block of BLOCK_Q threads owns BLOCK_Q queries of head blockIdx.y.

    Same arguments as flash_attention_kernel_v1. Grid (ceil(T_q / BLOCK_Q), BH), block BLOCK_Q.
    Thread tid owns query i = blockIdx.x * BLOCK_Q + tid. The block stages its queries (scaled)
    in shared memory, then walks the keys BLOCK_K at a time: all threads copy a K and a V tile
    into shared memory (neighbouring threads, neighbouring addresses), then each thread scores
    its query against the tile, takes the tile's maximum, rescales l and acc once, and adds
    the tile's terms. Key tiles after the block's last visible key are never loaded: in causal
    attention almost half of them.
    """
    q_tile = cuda.shared.array((BLOCK_Q, MAX_D), np.float32)  # the block's queries, scaled
    k_tile = cuda.shared.array((BLOCK_K, MAX_D), np.float32)  # the current tile of keys
    v_tile = cuda.shared.array((BLOCK_K, MAX_D), np.float32)  # and of their values
    q_row = cuda.local.array(MAX_D, np.float32)               # this thread's query
    acc = cuda.local.array(MAX_D, np.float32)                 # this thread's output, unnormalised
    p_row = cuda.local.array(BLOCK_K, np.float32)             # its scores against one tile
    tid = cuda.threadIdx.x
    h = cuda.blockIdx.y
    q0 = cuda.blockIdx.x * BLOCK_Q                            # the block's first query
    t_q, d_k = q.shape[1], q.shape[2]
    t_k, d_v = k.shape[1], v.shape[2]
    n_rows = min(BLOCK_Q, t_q - q0)                           # the last block may have fewer
    i = q0 + tid
    # Stage the queries: element e of the tile is (row e // d_k, column e % d_k), so threads
    # side by side read addresses side by side.
    for e in range(tid, n_rows * d_k, BLOCK_Q):
        r = e // d_k
        q_tile[r, e - r * d_k] = q[h, q0 + r, e - r * d_k] * scale
    cuda.syncthreads()                           # wait: the whole Q tile is in shared memory
    if tid < n_rows:
        for c in range(d_k):
            q_row[c] = q_tile[tid, c]            # each thread keeps its own row in registers
    for c in range(d_v):
        acc[c] = 0.0
    m = np.float32(-math.inf)
    l = np.float32(0.0)
    my_keys = visible_keys(i, t_q, t_k, causal) if tid < n_rows else 0
    # The keys the whole block needs, up to its last query's last key: the same in every
    # thread, so every thread runs the loop (and reaches its barriers) the same number of times.
    block_keys = visible_keys(q0 + n_rows - 1, t_q, t_k, causal)
    for k0 in range(0, block_keys, BLOCK_K):
        n = min(BLOCK_K, block_keys - k0)        # keys in this tile
        for e in range(tid, n * d_k, BLOCK_Q):
            r = e // d_k
            k_tile[r, e - r * d_k] = k[h, k0 + r, e - r * d_k]
        for e in range(tid, n * d_v, BLOCK_Q):
            r = e // d_v
            v_tile[r, e - r * d_v] = v[h, k0 + r, e - r * d_v]
        cuda.syncthreads()                       # wait: the K and V tiles are complete
        mine = min(n, my_keys - k0)              # keys of this tile this query sees (causal)
        if mine > 0:
            tile_max = np.float32(-math.inf)
            for jj in range(mine):
                s = np.float32(0.0)
                for c in range(d_k):
                    s += q_row[c] * k_tile[jj, c]   # every thread reads the same k: a broadcast
                p_row[jj] = s
                tile_max = max(tile_max, s)
            m_new = max(m, tile_max)
            rescale = math.exp(m - m_new)        # once per tile, not once per key
            l *= rescale
            for c in range(d_v):
                acc[c] *= rescale
            for jj in range(mine):
                p = math.exp(p_row[jj] - m_new)
                l += p
                for c in range(d_v):
                    acc[c] += p * v_tile[jj, c]
            m = m_new
        cuda.syncthreads()                       # wait: all threads are done with the tiles before the next copy
    if tid < n_rows:
        inv_l = np.float32(1.0) / l if l > 0 else np.float32(0.0)  # l = 0: no visible key
        for c in range(d_v):
            out[h, i, c] = acc[c] * inv_l


# --- Counting the work and the traffic -----------------------------------------------------

def _visible(i, t_q, t_k, causal):
    """visible_keys on the host: keys query i sees."""
    return t_k if not causal else max(0, min(t_k, i + (t_k - t_q) + 1))


def flash_tile_counts(t_q, t_k=None, causal=True, block_q=BLOCK_Q, block_k=BLOCK_K):
    """Key tiles of one head that flash_attention_kernel_v2 loads and skips: (loaded, skipped).

    Summed over the ceil(T_q / block_q) blocks of queries; each block loads the tiles up to its
    last query's last visible key and skips the rest.
    """
    t_k = t_q if t_k is None else t_k
    loaded = skipped = 0
    for q0 in range(0, t_q, block_q):
        last = min(q0 + block_q, t_q) - 1
        tiles = ceil_div(_visible(last, t_q, t_k, causal), block_k)
        loaded += tiles
        skipped += ceil_div(t_k, block_k) - tiles
    return loaded, skipped


def flash_traffic(t_q, t_k, d_k, d_v=None, causal=True, version=2, block_q=BLOCK_Q):
    """Global-memory accesses of one head in the fused kernel, as count_memory counts them.

    -> {"q": loads, "k": loads, "v": loads, "out": stores}, in elements (4 bytes each).
    v1: every query reads each of its visible keys and values itself. v2: a block of block_q
    queries reads the keys and values up to its last query's last visible key, once.
    """
    d_v = d_k if d_v is None else d_v
    if version == 1:
        keys = sum(_visible(i, t_q, t_k, causal) for i in range(t_q))
    else:
        keys = sum(_visible(min(q0 + block_q, t_q) - 1, t_q, t_k, causal)
                   for q0 in range(0, t_q, block_q))
    return {"q": t_q * d_k, "k": keys * d_k, "v": keys * d_v, "out": t_q * d_v}


def pipeline_traffic(t_q, t_k, d_k, d_v=None, causal=True):
    """Global-memory accesses of one head in ``attention.attention``'s pipeline, as count_memory
    counts them: {stage: (loads, stores)} in elements (4 bytes each).

    scores: the tiled scores kernel (mask_kernel_v2 when causal: tiles wholly above the diagonal
    load nothing); a tile reads its rows of q and of k once; every score is written. softmax:
    every score read three times (max, sum, normalise; once for a row that sees no key), every
    weight written once. weighted_sum: the tiled product reads each weight once per tile of
    columns of v, each element of v once per tile of queries, and writes the output.
    """
    d_v = d_k if d_v is None else d_v
    tile, ws_tile = scores.TILE, weighted_sum.TILE
    q_loads = k_loads = 0
    for r0 in range(0, t_q, tile):                          # the scores kernel's tiles
        rows = min(tile, t_q - r0)
        for c0 in range(0, t_k, tile):
            if causal and c0 > r0 + rows - 1 + (t_k - t_q):
                continue                                    # skipped: only -inf written
            q_loads += rows * d_k
            k_loads += min(tile, t_k - c0) * d_k
    seeing = sum(_visible(i, t_q, t_k, causal) > 0 for i in range(t_q))   # rows with a key
    return {
        "scores": (q_loads + k_loads, t_q * t_k),
        "softmax": ((3 * seeing + (t_q - seeing)) * t_k, t_q * t_k),
        "weighted_sum": (t_q * t_k * ceil_div(d_v, ws_tile) + t_k * d_v * ceil_div(t_q, ws_tile),
                         t_q * d_v),
    }


def count_pipeline(q, k, v, causal=True):
    """Run the pipeline of ``attention.launch_attention`` kernel by kernel under count_memory.

    q: (BH, T_q, d_k), k: (BH, T_k, d_k), v: (BH, T_k, d_v) float32 NumPy arrays
    -> ({stage: MemoryReport}, out (BH, T_q, d_v)). The same kernels, grids and order as
    attention.launch_attention, except that the softmax is always version 1: both versions
    read every score three times and write every weight once (tests/test_softmax.py), and
    version 1 has no barriers, so it is far cheaper to simulate on a GPU machine, where the
    pipeline itself uses version 2. The scores and weights are ordinary arrays here, so every
    access to them is counted.
    """
    (bh, t_q, d_k), (t_k, d_v) = q.shape, v.shape[1:]
    s = np.empty((bh, t_q, t_k), np.float32)
    a = np.empty((bh, t_q, t_k), np.float32)
    out = np.empty((bh, t_q, d_v), np.float32)
    score_kernel = mask.mask_kernel_v2 if causal else scores.scores_kernel_v2
    reports = {
        "scores": sanitizer.count_memory(score_kernel, *scores.score_grid(bh, t_q, t_k), q, k,
                                         scores.scale_factor(d_k), s),
        "softmax": sanitizer.count_memory(softmax.softmax_kernel_v1, *softmax.softmax_grid(bh * t_q, 1),
                                          s.reshape(bh * t_q, t_k), a.reshape(bh * t_q, t_k)),
        "weighted_sum": sanitizer.count_memory(weighted_sum.weighted_sum_kernel_v2,
                                               *weighted_sum.weighted_sum_grid(bh, t_q, d_v), a, v, out),
    }
    return reports, out


def count_fused(q, k, v, causal=True, version=2):
    """Run the fused kernel once under count_memory: q (BH, T_q, d_k), k (BH, T_k, d_k),
    v (BH, T_k, d_v) float32 NumPy arrays -> (MemoryReport, out (BH, T_q, d_v))."""
    out = np.empty((q.shape[0], q.shape[1], v.shape[2]), np.float32)
    report = sanitizer.count_memory(KERNELS[version], *flash_grid(q.shape[0], q.shape[1], version),
                                    q, k, v, np.float32(1.0 / math.sqrt(q.shape[2])), bool(causal), out)
    return report, out


# --- Launcher --------------------------------------------------------------------------------

KERNELS = {1: flash_attention_kernel_v1, 2: flash_attention_kernel_v2}
# The simulator's cost is set by the multiply-adds each thread runs in Python, roughly this
# many per second (measured on a 2-core machine): a launch above the budget is refused.
SIMULATOR_MADDS_PER_SECOND = 1_000_000


def flash_grid(bh, t_q, version):
    """(grid, block) for bh heads of t_q queries: x over blocks of queries, y over heads."""
    rows = ROWS_PER_BLOCK if version == 1 else BLOCK_Q
    return (ceil_div(t_q, rows), bh), rows


def flash_attention(q, k, v, causal=True, version=2, kernel=None):
    """Attention softmax(mask(q k^T / sqrt(d_k))) v in one fused kernel, on the device.

    q: (..., T_q, d_k); k: (..., T_k, d_k); v: (..., T_k, d_v), float, same leading axes,
    d_k and d_v at most MAX_D -> (..., T_q, d_v) float32. causal: key j is hidden from query i
    when j > i + (T_k - T_q) (the queries are the last T_q positions); a query that sees no key
    gets zeros. version: 1 (one thread per query) or 2 (tiled); kernel: any kernel with
    flash_attention_kernel_v1's signature, launched on that version's grid.
    """
    require(version in KERNELS, f"version must be 1 or 2, got {version!r}")
    require(isinstance(causal, (bool, np.bool_)), f"causal must be True or False, got {causal!r}")
    q = as_float32("q", q, "(..., T_q, d_k)", min_ndim=2)
    k = as_float32("k", k, "(..., T_k, d_k)", min_ndim=2)
    v = as_float32("v", v, "(..., T_k, d_v)", min_ndim=2)
    require(k.shape[-1] == q.shape[-1],
            f"k must have d_k = {q.shape[-1]} in its last axis, like q {q.shape}; got shape {k.shape}")
    require(k.shape[:-2] == q.shape[:-2],
            f"k must have the leading axes of q {q.shape[:-2]}; got shape {k.shape}")
    require(v.shape[:-1] == k.shape[:-1],
            f"v must have the leading axes and T_k of k, {k.shape[:-1]} + (d_v,); got shape {v.shape}")
    require(q.shape[-1] <= MAX_D, f"q must have d_k <= {MAX_D} (MAX_D) for the fused kernel; got shape {q.shape}")
    require(v.shape[-1] <= MAX_D, f"v must have d_v <= {MAX_D} (MAX_D) for the fused kernel; got shape {v.shape}")
    lead = q.shape[:-2]
    (t_q, d_k), t_k, d_v = q.shape[-2:], k.shape[-2], v.shape[-1]
    bh = math.prod(lead)
    grid, block = flash_grid(bh, t_q, version)
    # Thread-equivalents for the shared budget: the multiply-adds dominate, not the thread count.
    madds = bh * sum(_visible(i, t_q, t_k, causal) for i in range(t_q)) * (d_k + d_v)
    check_simulator_budget("flash_attention", max(math.prod(grid) * block,
                                                  madds * SIMULATOR_THREADS_PER_SECOND // SIMULATOR_MADDS_PER_SECOND))
    d_out = cuda.device_array((bh, t_q, d_v), np.float32)
    (KERNELS[version] if kernel is None else kernel)[grid, block](
        cuda.to_device(q.reshape(bh, t_q, d_k)),            # (BH, T_q, d_k)
        cuda.to_device(k.reshape(bh, t_k, d_k)),            # (BH, T_k, d_k)
        cuda.to_device(v.reshape(bh, t_k, d_v)),            # (BH, T_k, d_v)
        np.float32(1.0 / math.sqrt(d_k)), bool(causal), d_out)
    out = d_out.copy_to_host().reshape(*lead, t_q, d_v)    # (..., T_q, d_v)
    if kernel is None:                                      # a kernel passed in answers for itself
        require_finite_result("flash_attention", out, "q, k or v")
    return out
