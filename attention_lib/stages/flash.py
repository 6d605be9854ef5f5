"""Fused attention (notebooks 07, 08 and 08x): softmax(mask(Q K^T / sqrt(d_k))) V in one kernel,
FlashAttention-style, the (T_q, T_k) scores and weights never stored. The file, in order:

- NumPy: ``online_update`` and ``online_attention``, attention a block of keys at a time (07).
- Key ranges on the device: ``visible_keys``, ``first_key`` (sliding window), ``block_band``.
- ``flash_attention_kernel_v1`` (07): a thread per query, key by key from global memory.
- ``flash_attention_kernel_v2`` (07): a block per BLOCK_Q queries (of up to V2_MAX_HEADS query
  heads that share a key/value head, 08x); Q, K, V tiles in shared memory, the walk over the
  block's band of key tiles (``v2_walk_keys``) folding one tile a step (``v2_fold_tile``); tiles
  outside the band skipped. ``walk_key_tiles`` (07's main exercise): the same walk written out, its
  bounds, staging, barriers and guard in one function, v2_fold_tile its one helper;
  ``kernel_v2_with(walk)``: kernel 2 with such a walk in place of its own.
- ``flash_attention_kernel_v3`` and its ``v3_*`` parts (08): FlashAttention-2's forward in FP32
  SIMT for one query head per key/value head, 128 threads, 64 rows, micro-tiles in registers,
  exp2, row reductions by warp shuffles (on the simulator as on a GPU). ``v3_sizes``,
  ``build_flash_v3`` and ``make_flash_v3(d_k)``: the kernel for a head width. ``FAST``: its
  floors for the kernel report.
- ``flash_attention_kernel_v3_grouped`` (08x): the same parts compiled again with the grouped
  ones (``v3_load_packed``, ``v3_mask_packed``, ``v3_write_packed``, ``v3_block_grouped``): the
  group's queries packed into the rows, a block of up to V3_MAX_SLICES slices of 64 rows sharing
  each K/V tile, in dynamic shared memory (``v3_shared_words``, ``v3_grouped_arrays``,
  ``v3_slices``, ``is_grouped``).
- ``v3_scores_to_p`` (08's main exercise): a tile's scores, a micro-tile a thread, stored to the
  shared P tile; ``kernel_v3_with(scores_to_p, d_k)``: kernel 3 with its scores passed that way
  (``v3_key_tile_through_p``).
- ``KERNELS``, ``DEFAULT_VERSION`` (3 on a GPU, 2 on the simulator, which runs it about 3 times
  faster), ``fused_kernel``, ``flash_grid``, ``launch_config``, ``flash_scale``,
  ``check_flash_inputs``, ``launch_flash`` (one launch on device arrays).
- ``flash_attention(q, k, v, causal=True, version=None, kernel=None, return_lse=False,
  window=None)``: the public launcher (with return_lse, each row's natural log-sum-exp, which
  the backward pass rebuilds P from).
- On the host: ``flash_tile_counts`` and ``flash_traffic`` (work and main-memory traffic as
  formulas, from mask's ``visible_count``, ``first_visible`` and ``band_key_tiles``;
  ``attention_lib.measure.traffic`` counts them with the sanitizer, tests/test_flash.py and
  tests/test_gqa.py hold the two equal).

Grouped-query attention: k and v may have H_kv heads where q has H (a multiple), ``group`` =
H / H_kv, query head h reads key/value head h // group. A tile a v2 or v3 block stages serves
every query head the block holds: v2 loads K/V group (up to 8) times less. v3's grouped kernel
packs the group's queries into its rows: one slice of 64 rows holds 64 / group positions of each
head, which is enough while a group's rows fit them (decoding); past that its block holds 64
positions of up to 4 heads, so at long contexts a group of up to 4 loads K/V as one head alone
does (a group of 12: 256 rows, 21 positions of each).
"""

import functools
import math
import types

import numpy as np
from numba import cuda, float32

from attention_lib.platform import dynamic_shared
from attention_lib import reference
from attention_lib.platform.dynamic_shared import shared_rows
from attention_lib.platform.launch import ceil_div, check_grid, check_simulator_budget, check_version
from attention_lib.platform.rebuild import rebuilt
from attention_lib.platform.runtime import ON_SIMULATOR, SIMULATOR_SHAPES
# The host's key counts and tile skipping are notebook 03's (the mask), shared by every tiled kernel.
from attention_lib.stages.mask import band_key_tiles, first_visible, visible_count
from attention_lib.platform.validation import attention_inputs, require, require_finite_result

# Largest head width the kernels accept: each thread keeps its query row and its output
# accumulator in local arrays of MAX_D float32, whose size must be known when compiling.
MAX_D = 128
# v1: queries (threads) per block.
ROWS_PER_BLOCK = 32
# v2: queries per block (one thread each) and keys per tile. Shared memory per block:
# (BLOCK_Q + 2 * BLOCK_K) * MAX_D * 4 bytes, 32 KiB on a GPU (static shared memory stops at
# 48 KiB). On a GPU a block's row of threads is one warp (a row per query head sharing K and V);
# K and V are re-read from main memory once per block of
# queries, so a larger BLOCK_Q reads them less often. On the simulator 16 and 16: ANDREA-sim's
# T = 32 is 2 x 2 tiles per head, and fewer threads per block start faster there.
# (simulator, GPU): a check runs an answer at both (attention_lib.checks.shapes).
SHAPE_CONSTANTS = {"BLOCK_Q": (16, 32)}
BLOCK_Q_GPU = SHAPE_CONSTANTS["BLOCK_Q"][1]
BLOCK_Q = SHAPE_CONSTANTS["BLOCK_Q"][0 if SIMULATOR_SHAPES else 1]
BLOCK_K = 16
# v2 under grouped-query attention: a block holds the same BLOCK_Q queries of up to this many
# query heads that share a key/value head (threads along the block's y axis), so each K/V tile
# is loaded once for all of them. 8 x 32 = 256 threads on a GPU; a larger group is split over
# blocks of its largest divisor <= 8 heads.
V2_MAX_HEADS = 8
NEG_INF = np.float32(-np.inf)    # float32: a float64 -inf would pull float64 arithmetic in


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
    m, l = np.full(q.shape[:-1], -np.inf), np.zeros(q.shape[:-1])   # (..., T_q) each
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


@cuda.jit(device=True)
def first_key(i, t_q, t_k, window):
    """The first key query i sees: 0 without a sliding window (window 0); with one, the oldest
    of the last `window` positions up to its own, i + (T_k - T_q) - window + 1, never below 0.
    Query i sees keys first_key .. visible_keys - 1 (reference.causal_mask with the window)."""
    if window == 0:
        return 0
    return max(0, i + (t_k - t_q) - window + 1)


@cuda.jit(device=True)
def block_band(q0, last, t_q, t_k, causal, window, tile):
    """The keys of the block of queries q0 .. last, the same in all its threads, as four ints
    (start, end, clear_from, clear_to): `start`, the first key of the tile of `tile` keys that holds
    the first key query q0 sees (a multiple of `tile`); `end`, one past the last key query `last`
    sees; keys clear_from .. clear_to - 1 are seen by every query of the block (none when
    clear_from >= clear_to). No query of the block sees a key before start or from end on."""
    start = first_key(q0, t_q, t_k, window) // tile * tile
    end = visible_keys(last, t_q, t_k, causal)
    return start, end, first_key(last, t_q, t_k, window), visible_keys(q0, t_q, t_k, causal)


@cuda.jit(device=True)
def v1_start_row(q_row, acc, q, h, i, scale, d_v):
    """Thread i's starting state in its local arrays ((MAX_D,) float32): q_row <- q[h, i] * scale
    (the scale folded into q once), acc[:d_v] <- 0."""
    for c in range(q.shape[2]):
        q_row[c] = q[h, i, c] * scale
    for c in range(d_v):
        acc[c] = 0.0


@cuda.jit(device=True)
def v1_walk_keys(q_row, acc, k, v, h, i, t_q, causal, window):
    """Query i's walk over the keys of head h it sees (window: 0, or a sliding window), one key
    at a time: score it against q_row (scaled, (d_k,)), fold it into acc ((d_v,), unnormalised)
    and the returned (m, l)."""
    t_k, d_k, d_v = k.shape[1], k.shape[2], v.shape[2]
    m, l = NEG_INF, np.float32(0.0)     # running max and sum of exp(s - m); float32, as on a GPU
    for j in range(first_key(i, t_q, t_k, window), visible_keys(i, t_q, t_k, causal)):   # no masked key
        s = np.float32(0.0)
        for c in range(d_k):
            s += q_row[c] * k[h, j, c]
        m_new = max(m, s)
        rescale = math.exp(m - m_new)   # 1 if the max stayed, 0 for the first key
        p = math.exp(s - m_new)
        l = l * rescale + p
        for c in range(d_v):
            acc[c] = acc[c] * rescale + p * v[h, j, c]
        m = m_new
    return m, l


@cuda.jit(device=True)
def write_row(out, lse, h, i, acc, m, l):
    """Row i of head h: out[h, i] <- acc / l ((d_v,) float32) and lse[h, i] <- m + log(l), the
    row's log-sum-exp; zeros and -inf for a row that saw no key (l = 0)."""
    inv_l = np.float32(1.0) / l if l > 0 else np.float32(0.0)
    for c in range(out.shape[2]):
        out[h, i, c] = acc[c] * inv_l
    lse[h, i] = m + math.log(l) if l > 0 else NEG_INF


@cuda.jit
def flash_attention_kernel_v1(q, k, v, scale, causal, window, group, out, lse):
    """Fused attention, one thread per query, reading K and V straight from global memory.

    q: (BH, T_q, d_k), k: (BH_kv, T_k, d_k), v: (BH_kv, T_k, d_v) float32, d_k, d_v <= MAX_D;
    scale: float32, 1/sqrt(d_k); causal: bool; window: int32, a sliding window (0: none; with
    causal only); group: int32, BH / BH_kv, query head h reads key/value head h // group
    (grouped-query attention; 1 without); out: (BH, T_q, d_v) and lse: (BH, T_q) float32, written.
    Grid: x over queries i (ROWS_PER_BLOCK to a block), y over query heads h.
    """
    i, h = cuda.grid(2)                          # x: the query, y: the head (blocks 1 high)
    if i >= q.shape[1]:                          # the last block may hang past T_q
        return
    q_row = cuda.local.array(MAX_D, np.float32)  # indexed by a run-time c: local memory
    acc = cuda.local.array(MAX_D, np.float32)
    v1_start_row(q_row, acc, q, h, i, scale, v.shape[2])
    m, l = v1_walk_keys(q_row, acc, k, v, h // group, i, q.shape[1], causal, window)   # the shared K/V head
    write_row(out, lse, h, i, acc, m, l)


@cuda.jit(device=True)
def v2_stage_rows(tile, src, h, r0, n, scale):
    """tile[r, c] <- src[h, r0 + r, c] * scale for rows r < n: the block's threads, numbered
    tid = x + BLOCK_Q y, copy element e = (row e // d, column e % d) for e = tid, tid + threads,
    ..., so threads side by side read addresses side by side. tile: shared (rows, MAX_D); src:
    (BH, T, d) float32."""
    d = src.shape[2]
    threads = cuda.blockDim.x * cuda.blockDim.y
    for e in range(cuda.threadIdx.x + cuda.threadIdx.y * cuda.blockDim.x, n * d, threads):
        r = e // d
        tile[r, e - r * d] = src[h, r0 + r, e - r * d] * scale


@cuda.jit(device=True)
def v2_stage_queries(q_tile, q_row, acc, q, q0, n_rows, scale, d_v, h0):
    """The block's n_rows queries from q0 of each of its blockDim.y query heads h0, h0 + 1, ...,
    scaled, into q_tile (shared), one head after another; each thread copies its own row (query
    q0 + threadIdx.x of head h0 + threadIdx.y) into q_row and zeroes acc ((d_v,))."""
    tid = cuda.threadIdx.x
    for g in range(cuda.blockDim.y):             # one head's tile at a time: the tile holds BLOCK_Q rows
        v2_stage_rows(q_tile, q, h0 + g, q0, n_rows, scale)
        cuda.syncthreads()                       # wait: head g's whole Q tile is in shared memory
        if cuda.threadIdx.y == g and tid < n_rows:
            for c in range(q.shape[2]):
                q_row[c] = q_tile[tid, c]        # each thread copies its own row (local memory)
        if g + 1 < cuda.blockDim.y:              # the same in every thread of the block
            cuda.syncthreads()                   # wait: head g's rows are copied before head g + 1's overwrite them
    for c in range(d_v):
        acc[c] = 0.0


@cuda.jit(device=True)
def v2_score_tile(p_row, q_row, k_tile, first, mine, d_k):
    """p_row[jj] <- q_row . k_tile[jj] (notebook 02's score; q_row is already scaled) for the
    tile's keys first .. mine - 1; returns their max. Every thread reads the same k_tile[jj, c]
    at the same moment: one broadcast."""
    tile_max = NEG_INF
    for jj in range(first, mine):
        s = np.float32(0.0)
        for c in range(d_k):
            s += q_row[c] * k_tile[jj, c]
        p_row[jj] = s
        tile_max = max(tile_max, s)
    return tile_max


@cuda.jit(device=True)
def v2_scale_row(acc, rescale, d_v):
    """acc[c] <- rescale * acc[c] for c < d_v: the old terms of the output brought to a new max."""
    for c in range(d_v):
        acc[c] *= rescale


@cuda.jit(device=True)
def v2_add_row(acc, p, v_tile, jj, d_v):
    """acc[c] <- acc[c] + p * v_tile[jj, c] for c < d_v: notebook 05's weighted sum, one key's
    term. Every thread reads the same v_tile[jj, c] at the same moment: one broadcast."""
    for c in range(d_v):
        acc[c] += p * v_tile[jj, c]


@cuda.jit(device=True)
def v2_fold_tile(p_row, q_row, k_tile, v_tile, acc, m, l, first, mine, d_k, d_v):
    """The online update for keys first .. mine - 1 (at least one) of the staged tiles: their scores
    against q_row into p_row, one rescale of l and acc ((d_v,)) by exp(m - m_new) for their new max
    m_new, then each key's weight exp(s - m_new) added to l and its value row to acc; returns (m_new, l)."""
    m_new = max(m, v2_score_tile(p_row, q_row, k_tile, first, mine, d_k))   # p_row: the scores
    rescale = math.exp(m - m_new)                # once per tile, not once per key as in v1
    l = l * rescale                              # the old sum brought to the new max
    v2_scale_row(acc, rescale, d_v)              # and the old output
    for jj in range(first, mine):
        p = math.exp(p_row[jj] - m_new)
        l += p
        v2_add_row(acc, p, v_tile, jj, d_v)
    return m_new, l


@cuda.jit(device=True)
def v2_walk_keys(k_tile, v_tile, p_row, q_row, acc, k, v, kv, q0, n_rows, t_q, causal, window):
    """The block's walk over its band of key tiles (block_band), by every thread: each tile's keys of
    key/value head kv and their values staged in the shared k_tile and v_tile ((BLOCK_K, MAX_D)
    float32), then the keys of it that this thread's query q0 + threadIdx.x sees (none past the
    block's n_rows queries) folded into its running (m, l, acc) (v2_fold_tile); returns (m, l).
    q_row: (d_k,) the query, scaled; acc: (d_v,), zeros on entry, unnormalised; p_row: (BLOCK_K,) scratch."""
    t_k, i = k.shape[1], q0 + cuda.threadIdx.x
    m, l = NEG_INF, np.float32(0.0)                  # nothing seen yet: the first fold rescales by exp(-inf) = 0
    my_first = first_key(i, t_q, t_k, window)        # my query sees keys my_first .. my_keys - 1
    my_keys = visible_keys(i, t_q, t_k, causal) if cuda.threadIdx.x < n_rows else 0
    start, end, _, _ = block_band(q0, q0 + n_rows - 1, t_q, t_k, causal, window, BLOCK_K)
    for k0 in range(start, end, BLOCK_K):            # the same tiles in every thread: all reach both barriers
        n = min(BLOCK_K, end - k0)                   # the band's last tile may be partial
        v2_stage_rows(k_tile, k, kv, k0, n, np.float32(1.0))
        v2_stage_rows(v_tile, v, kv, k0, n, np.float32(1.0))
        cuda.syncthreads()                           # wait: the K and V tiles are complete
        first, mine = max(0, my_first - k0), min(n, my_keys - k0)   # the keys of this tile my query sees
        if mine > first:                             # none: m may be -inf, and exp(-inf + inf) is NaN
            m, l = v2_fold_tile(p_row, q_row, k_tile, v_tile, acc, m, l, first, mine, k.shape[2], v.shape[2])
        cuda.syncthreads()                           # wait: every thread is done with the tiles before the next copy
    return m, l



@cuda.jit
def flash_attention_kernel_v2(q, k, v, scale, causal, window, group, out, lse):
    """v1's arguments; block (BLOCK_Q, G): G query heads sharing K/V head h0 // group; grid: flash_grid."""
    q_tile = cuda.shared.array((BLOCK_Q, MAX_D), np.float32)  # the block's queries, scaled
    k_tile = cuda.shared.array((BLOCK_K, MAX_D), np.float32)  # the current tile of keys
    v_tile = cuda.shared.array((BLOCK_K, MAX_D), np.float32)  # and of their values
    q_row, acc = cuda.local.array(MAX_D, np.float32), cuda.local.array(MAX_D, np.float32)  # local, as in v1
    p_row = cuda.local.array(BLOCK_K, np.float32)             # this thread's scores against a tile
    q0, i = cuda.blockIdx.x * BLOCK_Q, cuda.grid(1)           # the block's first query, mine
    h0 = cuda.blockIdx.y * cuda.blockDim.y                    # the block's first query head
    n_rows = min(BLOCK_Q, q.shape[1] - q0)                    # the last block may have fewer
    v2_stage_queries(q_tile, q_row, acc, q, q0, n_rows, scale, v.shape[2], h0)   # q_row, and acc zeroed
    m, l = v2_walk_keys(k_tile, v_tile, p_row, q_row, acc, k, v, h0 // group, q0, n_rows, q.shape[1], causal,
                        window)
    if i < q0 + n_rows:
        write_row(out, lse, h0 + cuda.threadIdx.y, i, acc, m, l)


@cuda.jit(device=True)
def walk_key_tiles(k_tile, v_tile, p_row, q_row, acc, k, v, kv, q0, n_rows, t_q, causal, window):
    """Kernel 2's walk with its bounds, staging, barriers and guard written out (notebook 07's main
    exercise; v2_walk_keys is the same walk made of helpers): the block's band of key tiles of
    key/value head kv, each staged in shared memory once, the keys of it this thread's query sees
    folded into the thread's running (m, l, acc) with v2_fold_tile. k: (BH_kv, T_k, d_k), v:
    (BH_kv, T_k, d_v) float32; k_tile, v_tile: shared (BLOCK_K, MAX_D) float32; p_row: (BLOCK_K,)
    float32 scratch; the block's queries are q0 .. q0 + n_rows - 1 of t_q, this thread's is
    q0 + threadIdx.x (none from n_rows on), of query head h0 + threadIdx.y: the block's G rows of
    threads (blockDim.y, G query heads sharing kv) stage each tile together, numbered row after
    row; q_row: (d_k,) its query, scaled by 1/sqrt(d_k); acc:
    (d_v,) zeros on entry, the unnormalised output on return; causal: bool; window: 0 (none) or a
    sliding window. Returns (m, l), float32: the largest score the query saw and the sum of
    exp(score - m), or -inf and 0 for a query that sees no key."""
    tid, threads, t_k, d_k, d_v = cuda.threadIdx.x, cuda.blockDim.x * cuda.blockDim.y, k.shape[1], k.shape[2], v.shape[2]
    start = max(0, q0 + t_k - t_q - window + 1) // BLOCK_K * BLOCK_K if window > 0 else 0   # the band's first tile
    end = min(t_k, q0 + n_rows + t_k - t_q) if causal else t_k      # one past the block's last query's last key
    first = max(0, q0 + tid + t_k - t_q - window + 1) if window > 0 else 0   # my query's keys: first .. stop - 1
    stop = (min(t_k, q0 + tid + t_k - t_q + 1) if causal else t_k) if tid < n_rows else 0
    m, l, me = NEG_INF, float32(0.0), tid + cuda.threadIdx.y * cuda.blockDim.x   # nothing seen yet; me: of all G rows
    for k0 in range(start, end, BLOCK_K):                           # the same tiles in every thread
        for e in range(me, min(BLOCK_K, end - k0) * d_k, threads):  # neighbouring threads, elements
            k_tile[e // d_k, e % d_k] = k[kv, k0 + e // d_k, e % d_k]
        for e in range(me, min(BLOCK_K, end - k0) * d_v, threads):
            v_tile[e // d_v, e % d_v] = v[kv, k0 + e // d_v, e % d_v]
        cuda.syncthreads()                                          # wait: both tiles are staged
        lo, hi = max(first, k0) - k0, min(stop, k0 + BLOCK_K) - k0  # my keys in this tile; none: no fold (m: -inf)
        m, l = v2_fold_tile(p_row, q_row, k_tile, v_tile, acc, m, l, lo, hi, d_k, d_v) if hi > lo else (m, l)
        cuda.syncthreads()                                          # wait: all are done with the tiles
    return m, l


def _kernel_v2_with(walk, block_q):
    return rebuilt(flash_attention_kernel_v2, {"v2_walk_keys": walk, "BLOCK_Q": block_q})   # two names replaced


def kernel_v2_with(walk):
    """flash_attention_kernel_v2 with `walk` (a device function with walk_key_tiles's contract) in
    place of its own walk, for the BLOCK_Q in force: a kernel with v2's signature, for
    flash_attention(..., version=2, kernel=...), with blocks of (BLOCK_Q, G) threads as flash_grid
    gives them. The queries' staging and the rows' writing are v2's."""
    return _kernel_v2_with(walk, BLOCK_Q)


# Floors the kernel report holds v3 to at d_k 64 (flash.flash_attention_kernel_v3 and its grouped
# kernel at 2 slices, ptxas -v and nvdisasm for sm_90): no stack frame, 16 warps per SM on an
# H200, and fused multiply-adds at least half of the hot loop's instructions.
FAST = {"flash_attention_kernel_v3": {"max_stack_bytes": 0, "min_warps_per_sm": 16, "min_ffma_fraction": 0.5},
        "flash_attention_kernel_v3_grouped": {"max_stack_bytes": 0, "min_warps_per_sm": 16, "min_ffma_fraction": 0.5}}


# --- Kernel 3: FlashAttention-2's forward, micro-tiles in registers --------------------------
#
# 128 threads per block: 16 row groups of 8 column groups; a warp is 4 row groups, and the 8
# lanes of a row group share its rows. Thread (rg, cg) owns rows rg + 16 a of the block's queries
# (a < MICRO_M), keys cg + 8 b of each key tile (b < MICRO_N) and output columns cg + 8 e
# (e < MICRO_D). Its pieces of S and O live in cuda.local.arrays that every loop over a
# compile-time constant indexes with constants once unrolled: registers, not local memory.
# The sizes below are those of head width 64; make_flash_v3 rebinds them for another d_k.
# This kernel serves one query head per key/value head; the grouped kernel below serves several.

THREADS_V3 = 128
ROW_GROUPS = 16
COL_GROUPS = 8
LOG2E = 1.4426950408889634       # exp(x) = 2 ** (x log2(e)): math.exp2 compiles to fewer instructions
LN2 = np.float32(math.log(2.0))
# 4 blocks of 128 threads, 16 warps, per SM: ptxas must fit a thread in 65,536 / 512 = 128 registers.
V3_JIT = {"launch_bounds": (THREADS_V3, 4)}


def v3_sizes(d_k):
    """Compile-time sizes of flash v3 for head width d_k (1 .. MAX_D): a dict of HEAD (d_k),
    HEAD_PAD (d_k rounded up to 8 column groups), TILE_M queries and TILE_N keys per tile,
    MICRO_M, MICRO_N, MICRO_D (rows, keys and output columns per thread), and the products
    Numba needs as plain numbers for array sizes: S_SIZE, O_SIZE (per-thread arrays),
    ROW_STRIDE = HEAD_PAD + 1 and P_STRIDE = TILE_N + 8 (rows of the Q and K tiles and of P,
    padded against bank conflicts; V's rows are not). Up to d_k 64 the tiles are 64 x 32 (42 KiB
    of shared memory at 64); wider heads halve them to stay under the 48 KiB a block may declare
    statically."""
    head_pad = ceil_div(d_k, COL_GROUPS) * COL_GROUPS
    tile_m, tile_n = (64, 32) if head_pad <= 64 else (32, 16)
    micro_m, micro_n, micro_d = tile_m // ROW_GROUPS, tile_n // COL_GROUPS, head_pad // COL_GROUPS
    return {"HEAD": d_k, "HEAD_PAD": head_pad, "TILE_M": tile_m, "TILE_N": tile_n,
            "MICRO_M": micro_m, "MICRO_N": micro_n, "MICRO_D": micro_d,
            "S_SIZE": micro_m * micro_n, "O_SIZE": micro_m * micro_d,
            "ROW_STRIDE": head_pad + 1, "P_STRIDE": tile_n + 8}


HEAD = 64
HEAD_PAD = 64
TILE_M = 64
TILE_N = 32
MICRO_M = 4
MICRO_N = 4
MICRO_D = 8
S_SIZE = 16
O_SIZE = 32
ROW_STRIDE = 65
P_STRIDE = 40


@cuda.jit(device=True)
def v3_load_tile(tile, src, h, r0, n, scale):
    """Copy rows r0 .. r0 + n - 1 of head h of src ((heads, T, HEAD) float32), times scale, into
    the shared tile ((rows, >= HEAD_PAD)). Its other rows and columns HEAD .. HEAD_PAD - 1 become
    0, so a padded key scores 0 and a padded value adds 0 (stale memory could hold NaN: 0 * NaN =
    NaN). Consecutive threads copy consecutive columns: coalesced reads."""
    for e in range(cuda.threadIdx.x, tile.shape[0] * HEAD_PAD, THREADS_V3):
        r = e // HEAD_PAD                    # a compile-time power of two for most heads
        c = e - r * HEAD_PAD
        x = np.float32(0.0)
        if r < n and c < HEAD:
            x = src[h, r0 + r, c] * scale
        tile[r, c] = x


@cuda.jit(device=True)
def v3_scores_step(s, q_tile, k_tile, rg, cg, d):
    """s[a * MICRO_N + b] += q[row rg + 16 a, d] * k[key cg + 8 b, d]: an outer product of
    MICRO_M query values and MICRO_N key values, MICRO_M + MICRO_N shared loads for
    MICRO_M * MICRO_N multiply-adds. The 8 lanes of a row group read 8 different keys (the
    padded row stride puts them in 8 banks), the 4 row groups of a warp the same ones (broadcast)."""
    qa = cuda.local.array(MICRO_M, np.float32)
    kb = cuda.local.array(MICRO_N, np.float32)
    for a in range(MICRO_M):
        qa[a] = q_tile[rg + ROW_GROUPS * a, d]
    for b in range(MICRO_N):
        kb[b] = k_tile[cg + COL_GROUPS * b, d]
    for a in range(MICRO_M):
        for b in range(MICRO_N):
            s[a * MICRO_N + b] += qa[a] * kb[b]


@cuda.jit(device=True)
def v3_scores(s, q_tile, k_tile, rg, cg):
    """This thread's micro-tile of S = Q K^T: s (S_SIZE,) float32 registers, the scores of the
    rows and keys thread (rg, cg) owns, in the ownership map's order. Four steps a trip, written out: NVVM leaves a loop body
    this large rolled and Numba has no #pragma unroll. The step index is unsigned: Numba checks
    every signed index for a negative value (Python's a[-1]); unsigned, the four steps' loads
    are one address and four constant offsets."""
    for x in range(S_SIZE):
        s[x] = 0.0
    for d in range(0, HEAD_PAD, 4):            # HEAD_PAD is a multiple of 8
        v3_scores_step(s, q_tile, k_tile, rg, cg, np.uint32(d))
        v3_scores_step(s, q_tile, k_tile, rg, cg, np.uint32(d + 1))
        v3_scores_step(s, q_tile, k_tile, rg, cg, np.uint32(d + 2))
        v3_scores_step(s, q_tile, k_tile, rg, cg, np.uint32(d + 3))


@cuda.jit(device=True)
def v3_mask(s, rows, k0, rg, cg, t_k):
    """Set to -inf the scores of keys a row does not see: after it (causal), past T_k, or before
    its sliding window. rows: (r0, t_q, causal, window), the block's first query and the launch's
    mask. The kernel calls it only for a tile that holds such a key: the tiles the diagonal or the
    window's edge crosses, and the last."""
    r0, t_q, causal, window = rows
    for a in range(MICRO_M):
        i = r0 + rg + ROW_GROUPS * a
        first = first_key(i, t_q, t_k, window)
        seen = visible_keys(i, t_q, t_k, causal)
        for b in range(MICRO_N):
            if k0 + cg + COL_GROUPS * b >= seen or k0 + cg + COL_GROUPS * b < first:
                s[a * MICRO_N + b] = NEG_INF


@cuda.jit(device=True)
def v3_row_reduce(x, take_max):
    """x (MICRO_M,): each thread's partial value per row -> the row's max (take_max) or sum over
    its 8 column groups, in every lane of the row group. Lanes cg and cg ^ w swap values: after
    w = 1, 2, 4 each lane has combined all 8. No shared memory, no barrier: the 8 lanes of a row
    group sit in one warp, and a shuffle is a meeting of the warp's lanes (on the simulator too)."""
    for a in range(MICRO_M):
        y = x[a]
        for w in (1, 2, 4):
            other = cuda.shfl_xor_sync(0xFFFFFFFF, y, w)
            y = max(y, other) if take_max else y + other
        x[a] = y


@cuda.jit(device=True)
def v3_online_update(s, m, l, o, tile_max):
    """Fold a tile's scores s (base 2: Q carries log2(e)) into the rows' running state.

    m (MICRO_M,): each row's running max, the same in all 8 threads of the row, as tile_max
    (MICRO_M,), the tile's row-wide max; l (MICRO_M,): this thread's partial sum of 2^(s - m)
    over its own keys; o (MICRO_M * MICRO_D,): its part of the unnormalised output. Every thread
    of a row rescales by the same 2^(m_old - m_new), so the partial sums stay exact and are
    added only once, at the end. s becomes p = 2^(s - m_new).
    """
    for a in range(MICRO_M):
        m_new = max(m[a], tile_max[a])
        shift = m_new if m_new != NEG_INF else np.float32(0.0)   # no key yet: l and o stay 0
        rescale = math.exp2(m[a] - shift)    # 1 if the max stayed, 0 at the row's first key
        l[a] *= rescale
        for e in range(MICRO_D):
            o[a * MICRO_D + e] *= rescale
        for b in range(MICRO_N):
            p = math.exp2(s[a * MICRO_N + b] - shift)
            s[a * MICRO_N + b] = p
            l[a] += p
        m[a] = m_new


@cuda.jit(device=True)
def v3_tile_max(tile_max, s):
    """tile_max (MICRO_M,): the max of each of this thread's rows of s over the whole tile: over
    its own keys, then across the 8 lanes of its row group (v3_row_reduce)."""
    for a in range(MICRO_M):
        y = s[a * MICRO_N]
        for b in range(1, MICRO_N):
            y = max(y, s[a * MICRO_N + b])
        tile_max[a] = y
    v3_row_reduce(tile_max, True)


@cuda.jit(device=True)
def v3_accumulate_step(o, p_tile, v_tile, rg, cg, j):
    """o[a * MICRO_D + e] += p[row rg + 16 a, key j] * v[key j, column cg + 8 e]: the outer
    product of MICRO_M weights and MICRO_D values of key j."""
    pa = cuda.local.array(MICRO_M, np.float32)
    ve = cuda.local.array(MICRO_D, np.float32)
    for a in range(MICRO_M):
        pa[a] = p_tile[rg + ROW_GROUPS * a, j]
    for e in range(MICRO_D):
        ve[e] = v_tile[j, cg + COL_GROUPS * e]
    for a in range(MICRO_M):
        for e in range(MICRO_D):
            o[a * MICRO_D + e] += pa[a] * ve[e]


@cuda.jit(device=True)
def v3_accumulate(o, p_tile, v_tile, rg, cg):
    """o += P V for this thread's rows and output columns cg + 8 e, over the tile's TILE_N keys
    (four keys a trip, written out as in v3_scores). A thread holds p only for its own keys and
    needs its rows' p for every key: the block writes P to the shared p_tile first."""
    for j in range(0, TILE_N, 4):              # TILE_N is a multiple of 16
        v3_accumulate_step(o, p_tile, v_tile, rg, cg, np.uint32(j))
        v3_accumulate_step(o, p_tile, v_tile, rg, cg, np.uint32(j + 1))
        v3_accumulate_step(o, p_tile, v_tile, rg, cg, np.uint32(j + 2))
        v3_accumulate_step(o, p_tile, v_tile, rg, cg, np.uint32(j + 3))


@cuda.jit(device=True)
def v3_store_p(p_tile, s, rg, cg):
    """Write this thread's p (in s) to the shared p_tile ((TILE_M, P_STRIDE)): the stride
    TILE_N + 8 puts the 4 row groups of a warp 8 banks apart, so the 32 lanes hit 32 banks."""
    for a in range(MICRO_M):
        for b in range(MICRO_N):
            p_tile[rg + ROW_GROUPS * a, cg + COL_GROUPS * b] = s[a * MICRO_N + b]


@cuda.jit(device=True)
def v3_scores_to_p(p_tile, q_tile, k_tile):
    """The tile's scores into shared memory, with no other barrier than the caller's: p_tile[i, j]
    = q_tile[i] . k_tile[j] over the HEAD_PAD columns, for i < TILE_M and j < TILE_N (notebook
    08's main exercise). p_tile: (TILE_M, P_STRIDE); q_tile, k_tile: (rows, ROW_STRIDE), float32.
    Thread t owns a MICRO_M x MICRO_N micro-tile: rows t // 8 + 16 a, keys t % 8 + 8 b (the
    ownership map). Each step of d loads its MICRO_M + MICRO_N values once into registers; a
    warp's reads hit 32 banks or broadcast, and its stores hit 32 banks."""
    cg, rg = cuda.threadIdx.x % COL_GROUPS, cuda.threadIdx.x // COL_GROUPS
    s = cuda.local.array(S_SIZE, np.float32)
    qa = cuda.local.array(MICRO_M, np.float32)
    kb = cuda.local.array(MICRO_N, np.float32)
    for x in range(S_SIZE):
        s[x] = 0.0
    for d in range(HEAD_PAD):
        for a in range(MICRO_M):
            qa[a] = q_tile[rg + ROW_GROUPS * a, d]
        for b in range(MICRO_N):
            kb[b] = k_tile[cg + COL_GROUPS * b, d]
        for x in range(S_SIZE):
            s[x] += qa[x // MICRO_N] * kb[x % MICRO_N]
    for x in range(S_SIZE):
        p_tile[rg + ROW_GROUPS * (x // MICRO_N), cg + COL_GROUPS * (x % MICRO_N)] = s[x]


@cuda.jit(device=True)
def v3_key_tile_through_p(k, v, smem, regs, h, k0, n, masked, rows, rg, cg):
    """v3_key_tile with the scores passed through shared memory: v3_scores_to_p writes the tile's
    S into p_tile, then each thread reads back its own micro-tile (the ownership map's order) and
    goes on as v3_key_tile does. One barrier more a tile than v3_key_tile (none before P: a thread
    writes its p over the very slots it read its scores from), and S through shared memory."""
    q_tile, k_tile, v_tile, p_tile = smem
    s, m, l, o, tile_max = regs
    v3_load_tile(k_tile, k, h, k0, n, np.float32(1.0))
    v3_load_tile(v_tile, v, h, k0, n, np.float32(1.0))
    cuda.syncthreads()                   # wait: the K and V tiles (the first time, Q too) are complete
    v3_scores_to_p(p_tile, q_tile, k_tile)
    cuda.syncthreads()                   # wait: the whole S tile is in p_tile
    for a in range(MICRO_M):
        for b in range(MICRO_N):
            s[a * MICRO_N + b] = p_tile[rg + ROW_GROUPS * a, cg + COL_GROUPS * b]   # P goes back to these slots
    if masked:
        v3_mask(s, rows, k0, rg, cg, k.shape[1])
    v3_tile_max(tile_max, s)
    v3_online_update(s, m, l, o, tile_max)
    v3_store_p(p_tile, s, rg, cg)
    cuda.syncthreads()                   # wait: the whole P tile is in shared memory
    v3_accumulate(o, p_tile, v_tile, rg, cg)
    cuda.syncthreads()                   # wait: all threads are done with K, V and P before the next copy


@cuda.jit(device=True)
def v3_start(m, l, o):
    """The rows' state before any key: max -inf, sums 0, output 0."""
    for a in range(MICRO_M):
        m[a] = NEG_INF
        l[a] = 0.0
    for x in range(O_SIZE):
        o[x] = 0.0


@cuda.jit(device=True)
def v3_key_tile(k, v, smem, regs, h, k0, n, masked, rows, rg, cg):
    """Keys k0 .. k0 + n - 1 (n <= TILE_N) of head h: copy K and V, score S (masked if `masked`;
    rows: the block's rows, for v3_mask), row max, online update, O += P V. smem: shared (q_tile,
    k_tile, v_tile, p_tile); regs: this thread's (s, m, l, o, tile_max)."""
    q_tile, k_tile, v_tile, p_tile = smem
    s, m, l, o, tile_max = regs
    v3_load_tile(k_tile, k, h, k0, n, np.float32(1.0))
    v3_load_tile(v_tile, v, h, k0, n, np.float32(1.0))
    cuda.syncthreads()                   # wait: the K and V tiles (the first time, Q too) are complete
    v3_scores(s, q_tile, k_tile, rg, cg)
    if masked:
        v3_mask(s, rows, k0, rg, cg, k.shape[1])
    v3_tile_max(tile_max, s)
    v3_online_update(s, m, l, o, tile_max)
    v3_store_p(p_tile, s, rg, cg)
    cuda.syncthreads()                   # wait: the whole P tile is in shared memory
    v3_accumulate(o, p_tile, v_tile, rg, cg)
    cuda.syncthreads()                   # wait: all threads are done with K, V and P before the next copy


@cuda.jit(device=True)
def v3_write(out, lse, regs, h, r0, rg, cg, t_q):
    """out[h, i] = o / l for this thread's rows i = r0 + rg + 16 a and its columns (l now the
    row's total), and the row's natural log-sum-exp ln(2^m l) = m ln 2 + ln l, written by the
    row's first lane."""
    s, m, l, o, tile_max = regs
    for a in range(MICRO_M):
        i = r0 + rg + ROW_GROUPS * a
        if i < t_q:
            inv_l = np.float32(1.0) / l[a] if l[a] > 0 else np.float32(0.0)   # l 0: no key seen
            for e in range(MICRO_D):
                if cg + COL_GROUPS * e < HEAD:
                    out[h, i, cg + COL_GROUPS * e] = o[a * MICRO_D + e] * inv_l
            if cg == 0:
                lse[h, i] = m[a] * LN2 + math.log(l[a]) if l[a] > 0 else NEG_INF


@cuda.jit(device=True)
def v3_block(q, k, v, scale, causal, window, out, lse, smem, regs):
    """The work of one block: TILE_M queries of head blockIdx.y against every key tile holding a
    key one of them sees (block_band). Block x takes the x-th block of queries from the end: in
    a causal launch the longest blocks come first in index order (CUDA does not promise the order
    in which blocks start; where it follows the index, the short ones fill in at the end).
    smem: shared (q_tile, k_tile, v_tile, p_tile); regs: this thread's (s, m, l, o, tile_max)."""
    rg, cg = cuda.threadIdx.x // COL_GROUPS, cuda.threadIdx.x % COL_GROUPS
    t_q, t_k, h = q.shape[1], k.shape[1], cuda.blockIdx.y
    r0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x) * TILE_M
    last = min(r0 + TILE_M, t_q) - 1
    v3_load_tile(smem[0], q, h, r0, last + 1 - r0, scale)     # Q times log2(e) / sqrt(d_k)
    v3_start(regs[1], regs[2], regs[3])
    start, block_keys, clear_from, clear_to = block_band(r0, last, t_q, t_k, causal, window, TILE_N)
    for k0 in range(start, block_keys, TILE_N):      # masked: a tile an edge of the band crosses
        v3_key_tile(k, v, smem, regs, h, k0, min(TILE_N, block_keys - k0),
                    k0 < clear_from or k0 + TILE_N > clear_to, (r0, t_q, causal, window), rg, cg)
    v3_row_reduce(regs[2], False)    # l: the row's total, from the 8 partial sums
    v3_write(out, lse, regs, h, r0, rg, cg, t_q)


@cuda.jit(**V3_JIT)
def flash_attention_kernel_v3(q, k, v, scale, causal, window, group, out, lse):
    """FlashAttention-2's forward for heads of width HEAD, one query head per key/value head
    (group 1; the grouped kernel serves more): v1's arguments, but scale is log2(e) / sqrt(d_k)
    (the scores come out in base 2, for exp2). Grid (ceil(T_q / TILE_M), BH), block THREADS_V3."""
    q_tile = cuda.shared.array((TILE_M, ROW_STRIDE), np.float32)    # Q, scaled
    k_tile = cuda.shared.array((TILE_N, ROW_STRIDE), np.float32)    # a tile of K
    v_tile = cuda.shared.array((TILE_N, HEAD_PAD), np.float32)      # and of V
    p_tile = cuda.shared.array((TILE_M, P_STRIDE), np.float32)      # P, for O += P V
    regs = (cuda.local.array(S_SIZE, np.float32),                    # s, then p
            cuda.local.array(MICRO_M, np.float32),                   # m: running max per row
            cuda.local.array(MICRO_M, np.float32),                   # l: partial sum per row
            cuda.local.array(O_SIZE, np.float32),                    # o: unnormalised output
            cuda.local.array(MICRO_M, np.float32))                   # tile_max
    v3_block(q, k, v, scale, causal, window, out, lse, (q_tile, k_tile, v_tile, p_tile), regs)


# --- Kernel 3 under grouped-query attention: packed rows, slices that share the K/V tiles -----
#
# The group's query heads share each K/V tile the block loads: row r of a key/value head's
# packed rows is query r // group of query head h * group + r % group. 64 rows take 43,392 of
# the 49,152 bytes a block may declare, so the grouped kernel's block is blockDim.y slices of
# 128 threads and TILE_M rows, one slice per head of the group up to V3_MAX_SLICES: every K/V
# tile is loaded once for TILE_M * slices rows. Its arrays are views of the launch's dynamic
# shared memory, laid out K, V, Q of all slices, then P of all slices. 4 slices are 512
# threads: ptxas must fit a thread in 65,536 / 512 = 128 registers, the one-slice kernel's cap.
# It is the parts above compiled again (build_flash_v3), with these in place of v3_load_tile
# and v3_mask, and its own block, rows and write.

V3_MAX_SLICES = 4
V3_GROUPED_JIT = {"launch_bounds": (THREADS_V3 * V3_MAX_SLICES, 1)}


@cuda.jit(device=True)
def v3_load_packed(tile, src, h, r0, n, group, scale):
    """v3_load_tile for packed rows, copied by all the block's slices: packed row r is row
    r // group of head h * group + r % group (group 1: row r of head h); consecutive threads of
    the block copy consecutive columns."""
    first, threads = cuda.threadIdx.x + cuda.threadIdx.y * THREADS_V3, THREADS_V3 * cuda.blockDim.y
    for e in range(first, tile.shape[0] * HEAD_PAD, threads):
        r = e // HEAD_PAD
        c = e - r * HEAD_PAD
        x = np.float32(0.0)
        if r < n and c < HEAD:
            x = src[h * group + (r0 + r) % group, (r0 + r) // group, c] * scale
        tile[r, c] = x


@cuda.jit(device=True)
def v3_load_shared_tile(tile, src, h, r0, n, scale):
    """The grouped kernel's v3_load_tile (K and V): rows of head h, copied by all its slices."""
    v3_load_packed(tile, src, h, r0, n, 1, scale)


@cuda.jit(device=True)
def v3_mask_packed(s, rows, k0, rg, cg, t_k):
    """The grouped kernel's v3_mask: rows (r0, t_q, causal, window, group), packed row r is query
    r // group."""
    r0, t_q, causal, window, group = rows
    for a in range(MICRO_M):
        i = (r0 + rg + ROW_GROUPS * a) // group
        first = first_key(i, t_q, t_k, window)
        seen = visible_keys(i, t_q, t_k, causal)
        for b in range(MICRO_N):
            if k0 + cg + COL_GROUPS * b >= seen or k0 + cg + COL_GROUPS * b < first:
                s[a * MICRO_N + b] = NEG_INF


@cuda.jit(device=True)
def v3_write_packed(out, lse, regs, h, r0, rg, cg, t_q, group):
    """v3_write for packed rows: row r is query r // group of query head h * group + r % group."""
    s, m, l, o, tile_max = regs
    for a in range(MICRO_M):
        r = r0 + rg + ROW_GROUPS * a
        if r < t_q * group:
            hq, i = h * group + r % group, r // group
            inv_l = np.float32(1.0) / l[a] if l[a] > 0 else np.float32(0.0)   # l 0: no key seen
            for e in range(MICRO_D):
                if cg + COL_GROUPS * e < HEAD:
                    out[hq, i, cg + COL_GROUPS * e] = o[a * MICRO_D + e] * inv_l
            if cg == 0:
                lse[hq, i] = m[a] * LN2 + math.log(l[a]) if l[a] > 0 else NEG_INF


@cuda.jit(device=True)
def v3_block_rows(t_q, group):
    """(h, b0, r0, last): the block's key/value head blockIdx.y, its first and last packed rows
    (of t_q * group) and this slice's first: TILE_M rows a slice, blockDim.y slices; block x
    takes the x-th block of rows from the end, as v3_block does."""
    rows = TILE_M * cuda.blockDim.y
    b0 = (cuda.gridDim.x - 1 - cuda.blockIdx.x) * rows
    return cuda.blockIdx.y, b0, b0 + cuda.threadIdx.y * TILE_M, min(b0 + rows, t_q * group) - 1


@cuda.jit(device=True)
def v3_block_grouped(q, k, v, scale, causal, window, group, out, lse, q_block, smem, regs):
    """v3_block for packed rows: the block's rows of key/value head h (v3_block_rows), its Q rows
    in q_block for all its slices; this slice walks the key tiles holding a key one of the
    block's queries sees, with smem this slice's (q_tile, k_tile, v_tile, p_tile)."""
    rg, cg = cuda.threadIdx.x // COL_GROUPS, cuda.threadIdx.x % COL_GROUPS
    t_q, t_k = q.shape[1], k.shape[1]
    h, b0, r0, last = v3_block_rows(t_q, group)
    v3_load_packed(q_block, q, h, b0, last + 1 - b0, group, scale)
    v3_start(regs[1], regs[2], regs[3])
    start, block_keys, clear_from, clear_to = block_band(b0 // group, last // group, t_q, t_k, causal, window, TILE_N)
    for k0 in range(start, block_keys, TILE_N):
        v3_key_tile(k, v, smem, regs, h, k0, min(TILE_N, block_keys - k0),
                    k0 < clear_from or k0 + TILE_N > clear_to, (r0, t_q, causal, window, group), rg, cg)
    v3_row_reduce(regs[2], False)
    v3_write_packed(out, lse, regs, h, r0, rg, cg, t_q, group)


def v3_shared_words(d_k, slices):
    """float32 words of dynamic shared memory the grouped kernel's block of `slices` slices
    uses at head width d_k (v3_grouped_arrays' layout)."""
    z = v3_sizes(d_k)
    return (z["TILE_N"] * (z["ROW_STRIDE"] + z["HEAD_PAD"])
            + slices * z["TILE_M"] * (z["ROW_STRIDE"] + z["P_STRIDE"]))


@cuda.jit(device=True)
def v3_grouped_arrays(words):
    """(q_block, (q_tile, k_tile, v_tile, p_tile)): the block's Q rows and this slice's
    arrays, as views of the dynamic shared memory `words` (float32, v3_shared_words long)."""
    rows, mine = TILE_M * cuda.blockDim.y, TILE_M * cuda.threadIdx.y
    q_at = TILE_N * (ROW_STRIDE + HEAD_PAD)
    p_at = q_at + rows * ROW_STRIDE
    q_block = shared_rows(words, q_at, rows, ROW_STRIDE)
    return q_block, (shared_rows(words, q_at + mine * ROW_STRIDE, TILE_M, ROW_STRIDE),
                     shared_rows(words, 0, TILE_N, ROW_STRIDE),
                     shared_rows(words, TILE_N * ROW_STRIDE, TILE_N, HEAD_PAD),
                     shared_rows(words, p_at + mine * P_STRIDE, TILE_M, P_STRIDE))


def v3_grouped_kernel(q, k, v, scale, causal, window, group, out, lse):
    """The source of flash_attention_kernel_v3_grouped (build_flash_v3 compiles it with the
    grouped parts): blockDim.y slices of packed rows sharing each K/V tile, grid
    (ceil(T_q * group / (TILE_M * slices)), BH_kv), block (THREADS_V3, slices), launched with
    v3_shared_words(d_k, slices) * 4 bytes of dynamic shared memory."""
    q_block, smem = v3_grouped_arrays(cuda.shared.array(0, float32))
    regs = (cuda.local.array(S_SIZE, np.float32),                    # s, then p
            cuda.local.array(MICRO_M, np.float32),                   # m: running max per row
            cuda.local.array(MICRO_M, np.float32),                   # l: partial sum per row
            cuda.local.array(O_SIZE, np.float32),                    # o: unnormalised output
            cuda.local.array(MICRO_M, np.float32))                   # tile_max
    v3_block_grouped(q, k, v, scale, causal, window, group, out, lse, q_block, smem, regs)


# The device functions of flash v3, callees first: build_flash_v3 recompiles them for a head
# width. The grouped kernel adds its own parts and puts two of them in place of the one-head ones.
V3_PARTS = (v3_load_tile, v3_scores_step, v3_scores, v3_mask, v3_row_reduce, v3_online_update, v3_tile_max,
            v3_accumulate_step, v3_accumulate, v3_store_p, v3_scores_to_p, v3_start, v3_key_tile, v3_write,
            v3_block)
V3_GROUPED_PARTS = (v3_load_packed, v3_block_rows, v3_write_packed, v3_block_grouped, v3_grouped_arrays)
V3_GROUPED_SWAPS = {"v3_load_tile": v3_load_shared_tile, "v3_mask": v3_mask_packed}


def build_flash_v3(d_k, replace=None, grouped=False):
    """flash_attention_kernel_v3 (grouped: flash_attention_kernel_v3_grouped) compiled anew for
    heads of width d_k (1 .. MAX_D): the same functions with v3_sizes(d_k) as their compile-time
    globals. replace: {part name: function} puts another function's code in a part's place (an
    exercise's answer, a test's mutant)."""
    require(isinstance(d_k, int) and 1 <= d_k <= MAX_D, f"d_k must be an int in 1 .. {MAX_D}, got {d_k!r}")
    names = {**globals(), **v3_sizes(d_k)}
    swaps = {**(V3_GROUPED_SWAPS if grouped else {}), **(replace or {})}
    for part in V3_PARTS + (V3_GROUPED_PARTS if grouped else ()):
        name = part.py_func.__name__
        fn = getattr(swaps.get(name, part), "py_func", swaps.get(name, part))
        names[name] = cuda.jit(device=True)(types.FunctionType(fn.__code__, names, name, None, fn.__closure__))
    fn, name = ((v3_grouped_kernel, "flash_attention_kernel_v3_grouped") if grouped
                else (flash_attention_kernel_v3.py_func, "flash_attention_kernel_v3"))
    return cuda.jit(**(V3_GROUPED_JIT if grouped else V3_JIT))(types.FunctionType(fn.__code__, names, name))


flash_attention_kernel_v3_grouped = build_flash_v3(HEAD, grouped=True)


@functools.lru_cache(maxsize=None)
def kernel_v3_with(scores_to_p, d_k=HEAD):
    """Kernel 3 for heads of width d_k with its scores passed through shared memory
    (v3_key_tile_through_p), `scores_to_p` (v3_scores_to_p's contract) writing them: notebook
    08's main exercise in the whole kernel. Launched as kernel 3 is (launch_flash, version 3)."""
    return build_flash_v3(d_k, {"v3_key_tile": v3_key_tile_through_p, "v3_scores_to_p": scores_to_p})


@functools.lru_cache(maxsize=None)
def make_flash_v3(d_k, grouped=False):
    """flash_attention_kernel_v3 (grouped: its grouped kernel) for heads of width d_k, built once
    per width (the module's own instances for HEAD)."""
    if d_k == HEAD:
        return flash_attention_kernel_v3_grouped if grouped else flash_attention_kernel_v3
    return build_flash_v3(d_k, grouped=grouped)


def is_grouped(kernel):
    """Whether `kernel` (or the stand-in a test passes for it) is v3's grouped kernel, whatever
    its head width or replaced parts: it is launched with slices and dynamic shared memory."""
    code = getattr(getattr(kernel, "py_func", None), "__code__", None)
    return code is v3_grouped_kernel.__code__


def v3_slices(t_q, group, d_k=HEAD):
    """Slices of the grouped kernel's block for t_q queries of `group` heads: one per head, up
    to V3_MAX_SLICES, no more than the t_q * group rows fill, and no more than this device's
    block may hold (dynamic_shared.largest_block_bytes); at least 1."""
    slices = min(V3_MAX_SLICES, group, ceil_div(t_q * group, v3_sizes(d_k)["TILE_M"]))
    while slices > 1 and 4 * v3_shared_words(d_k, slices) > dynamic_shared.largest_block_bytes():
        slices -= 1
    return slices


# --- Launcher --------------------------------------------------------------------------------

KERNELS = {1: flash_attention_kernel_v1, 2: flash_attention_kernel_v2, 3: flash_attention_kernel_v3}
# v3 on a GPU; on the simulator v2, which simulates about 3 times faster than v3 (T = 128,
# d = 64, causal: 1.1 s against 3.2 s, measured on a 2-core machine).
DEFAULT_VERSION = 2 if ON_SIMULATOR else 3


def v2_heads_per_block(group):
    """Query heads a v2 block serves at once: the largest divisor of group up to V2_MAX_HEADS."""
    return max(g for g in range(1, min(group, V2_MAX_HEADS) + 1) if group % g == 0)


def flash_grid(bh, t_q, version, d_k=HEAD, group=1, slices=1):
    """(grid, block) for bh query heads of t_q queries, `group` of them to a key/value head:
    x over blocks of queries, y over heads (version 3's block of queries depends on the head
    width d_k). Version 2's block is (BLOCK_Q, G) for G = v2_heads_per_block(group) heads, and
    y runs over the bh / G groups of G heads. Version 3's y runs over the bh / group key/value
    heads and x over blocks of TILE_M * slices of the group's t_q * group (query, head) rows;
    its block is THREADS_V3, or (THREADS_V3, slices) for the grouped kernel."""
    if version == 3:                    # a block's rows: the group's heads' queries, interleaved
        rows = v3_sizes(d_k)["TILE_M"] * slices
        return (ceil_div(t_q * group, rows), bh // group), THREADS_V3 if slices == 1 else (THREADS_V3, slices)
    if version == 2:
        heads = v2_heads_per_block(group)
        return (ceil_div(t_q, BLOCK_Q), bh // heads), (BLOCK_Q, heads)
    return (ceil_div(t_q, ROWS_PER_BLOCK), bh), ROWS_PER_BLOCK


def flash_scale(version, d_k):
    """The factor each kernel folds into Q: 1/sqrt(d_k), times log2(e) for v3's exp2."""
    return np.float32((LOG2E if version == 3 else 1.0) / math.sqrt(d_k))


def check_flash_inputs(q, k, v, version, causal, window=None):
    """validation.attention_inputs plus the fused kernels' limits: (q3, k3, v3, lead, group),
    q3 (BH, T_q, d_k), k3 (BH_kv, T_k, d_k), v3 (BH_kv, T_k, d_v) float32, or a one-line error
    naming the argument that is wrong."""
    check_version(version, KERNELS)
    require(isinstance(causal, (bool, np.bool_)), f"causal must be True or False, got {causal!r}")
    reference.check_window(window, causal)
    q3, k3, v3, lead, group = attention_inputs(q, k, v)
    q_shape, v_shape = (*lead, *q3.shape[1:]), (*np.shape(v)[:-1], v3.shape[2])
    require(q3.shape[2] <= MAX_D, f"q must have d_k <= {MAX_D} (MAX_D) for the fused kernel; got shape {q_shape}")
    require(v3.shape[2] <= MAX_D, f"v must have d_v <= {MAX_D} (MAX_D) for the fused kernel; got shape {v_shape}")
    require(version != 3 or v3.shape[2] == q3.shape[2],
            f"v must have d_v = d_k = {q3.shape[2]} for version 3; got shape {v_shape}")
    return q3, k3, v3, lead, group


def fused_kernel(version, t_q, group, d_k):
    """The library's kernel of `version` for t_q queries of `group` query heads per key/value
    head of width d_k: v3 is its grouped kernel whenever query heads share a key/value head."""
    if version == 3:
        return make_flash_v3(d_k, group > 1)
    return KERNELS[version]


def launch_config(kernel, version, bh, t_q, d_k, group, slices=None):
    """(grid, block, dynamic shared bytes) of a fused launch of `kernel` for bh query heads of
    t_q queries, `group` to a key/value head: flash_grid's, and for v3's grouped kernel its
    slices (v3_slices unless given) and their shared memory (0 for the other kernels)."""
    if not (version == 3 and is_grouped(kernel)):
        return (*flash_grid(bh, t_q, version, d_k, group), 0)
    slices = v3_slices(t_q, group, d_k) if slices is None else slices
    return (*flash_grid(bh, t_q, 3, d_k, group, slices), 4 * v3_shared_words(d_k, slices))


def launch_flash(kernel, version, q, k, v, causal, window, out, lse):
    """One fused launch on device arrays: q (BH, T_q, d_k), k (BH_kv, T_k, d_k), v (BH_kv, T_k,
    d_v) float32 -> out (BH, T_q, d_v) and lse (BH, T_q) float32, written; `kernel` with
    `version`'s signature, launched as launch_config says with its scale (window: None or an int)."""
    (bh, t_q, d_k), group = q.shape, q.shape[0] // k.shape[0]
    grid, block, nbytes = launch_config(kernel, version, bh, t_q, d_k, group)
    dynamic_shared.launch(kernel, grid, block, nbytes, q, k, v, flash_scale(version, d_k), bool(causal),
                          np.int32(window or 0), np.int32(group), out, lse)


def flash_attention(q, k, v, causal=True, version=None, kernel=None, return_lse=False, window=None):
    """Attention softmax(mask(q k^T / sqrt(d_k))) v in one fused kernel, on the device.

    q: (..., T_q, d_k); k: (..., T_k, d_k); v: (..., T_k, d_v), float, same leading axes, or
    (grouped-query attention) H query heads on q's axis -3 and H_kv key/value heads on k's and
    v's, H a multiple of H_kv (query head h reads key/value head h // (H // H_kv)); d_k and d_v
    at most MAX_D (version 3: d_v = d_k) -> (..., T_q, d_v) float32, and with
    return_lse also lse (..., T_q) float32, the natural log of each row's sum of exp(score)
    (-inf for a row that sees no key): the backward pass recomputes the weights from it.
    causal: key j is hidden from query i when j > i + (T_k - T_q) (the queries are the last
    T_q positions); a query that sees no key gets zeros. window: with causal, a sliding window
    (an int >= 1): query i sees only keys i + (T_k - T_q) - window < j, and key tiles wholly
    before the window are never loaded; None for none. version: 1 (one thread per query),
    2 (tiled), 3 (FlashAttention-2 style); default DEFAULT_VERSION. kernel: any kernel with
    the version's signature, launched on its grid with its scale (flash_scale).
    """
    version = DEFAULT_VERSION if version is None else version
    q, k, v, lead, group = check_flash_inputs(q, k, v, version, causal, window)   # (BH or BH_kv, T, d) each
    (bh, t_q, d_k), t_k, d_v = q.shape, k.shape[1], v.shape[2]
    checked = kernel is None                                # a kernel passed in answers for itself
    kernel = fused_kernel(version, t_q, group, d_k) if kernel is None else kernel
    require(version != 3 or group == 1 or is_grouped(kernel),
            f"kernel: v3's one-head kernel reads a key/value head per query head, but q has {group} query "
            "heads per key/value head; pass its grouped kernel, make_flash_v3(d_k, grouped=True)")
    grid, block, _ = launch_config(kernel, version, bh, t_q, d_k, group)
    check_grid("flash_attention", grid, x="q's T_q in blocks of queries", y="q's batch x heads")
    madds = bh * sum(visible_count(i, t_q, t_k, causal) - first_visible(i, t_q, t_k, window)
                     for i in range(t_q)) * (d_k + d_v)
    check_simulator_budget("flash_attention", math.prod(grid) * math.prod(np.atleast_1d(block)), madds)
    d_out = cuda.device_array((bh, t_q, d_v), np.float32)
    d_lse = cuda.device_array((bh, t_q), np.float32)
    q_dev, k_dev, v_dev = (cuda.to_device(a) for a in (q, k, v))  # (BH, T_q, d_k), (BH_kv, T_k, d) x 2
    launch_flash(kernel, version, q_dev, k_dev, v_dev, causal, window, d_out, d_lse)
    out = d_out.copy_to_host().reshape(*lead, t_q, d_v)    # (..., T_q, d_v)
    if checked:
        require_finite_result("flash_attention", out, "q, k or v")
    return (out, d_lse.copy_to_host().reshape(*lead, t_q)) if return_lse else out


# --- Counting the work and the traffic (host) -----------------------------------------------------

def flash_tile_counts(t_q, t_k=None, causal=True, block_q=BLOCK_Q, block_k=BLOCK_K, window=None):
    """Key tiles of one head that flash_attention_kernel_v2 loads and skips: (loaded, skipped).

    Summed over the ceil(T_q / block_q) blocks of queries; each block loads the tiles from its
    first query's first visible key (0 without a window) to its last query's last visible key
    and skips the rest (band_key_tiles).
    """
    t_k = t_q if t_k is None else t_k
    per_block = band_key_tiles(t_q, t_k, causal, window, block_q, block_k)
    loaded = sum(tiles for _, _, _, tiles in per_block)
    return loaded, len(per_block) * ceil_div(t_k, block_k) - loaded


def flash_traffic(t_q, t_k, d_k, d_v=None, causal=True, version=2, block_q=None, window=None, group=1):
    """Global-memory accesses of one key/value head and its `group` query heads (one head
    without grouped-query attention) in the fused kernel, as count_memory counts them.

    -> {"q": loads, "k": loads, "v": loads, "out": stores, "lse": stores}, in elements (4 bytes
    each). v1: every query reads each of its visible keys and values itself. v2 and v3: a block
    of block_q queries (default: the version's, BLOCK_Q, or v3's TILE_M for d_k times its
    v3_slices) reads the keys and values once, from the start of its first key tile
    (band_key_tiles, in tiles of BLOCK_K or v3's TILE_N) to its last query's last visible key; v2
    once for the v2_heads_per_block(group) heads of its block (all `group` up to V2_MAX_HEADS),
    v3 once for the whole group, whose queries a block's rows interleave (block_q // group
    queries of each head). window: a sliding window or None.
    """
    d_v = d_k if d_v is None else d_v
    if block_q is None:
        block_q = v3_sizes(d_k)["TILE_M"] * v3_slices(t_q, group, d_k) if version == 3 else BLOCK_Q
    if version == 1:
        keys = sum(visible_count(i, t_q, t_k, causal) - first_visible(i, t_q, t_k, window) for i in range(t_q))
    elif version == 2:
        keys = sum(visible_count(q0 + rows - 1, t_q, t_k, causal) - first * BLOCK_K
                   for q0, rows, first, _ in band_key_tiles(t_q, t_k, causal, window, block_q, BLOCK_K))
    else:
        tile = v3_sizes(d_k)["TILE_N"]
        keys = sum(visible_count((min(r0 + block_q, t_q * group) - 1) // group, t_q, t_k, causal)
                   - first_visible(r0 // group, t_q, t_k, window) // tile * tile
                   for r0 in range(0, t_q * group, block_q))
    reads = {1: group, 2: group // v2_heads_per_block(group), 3: 1}[version]   # K/V reads per kv head
    return {"q": group * t_q * d_k, "k": reads * keys * d_k, "v": reads * keys * d_v,
            "out": group * t_q * d_v, "lse": group * t_q}
