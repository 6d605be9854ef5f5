"""The backward pass of attention (notebook 11): dQ, dK, dV of each head, naive and fused. Notebook 11
derives the gradients (dV = P^T dO, dP = dO V^T, dS = P o (dP - D) with D = rowsum(dO o O), dQ =
dS K scale, dK = dS^T Q scale) and says why dQ takes a second pass rather than atomics. The file:

- NumPy: ``backward_loops`` (one head, the derivation's loops), ``backward`` (vectorised, any
  leading axes, float64), ``fold_kv_heads``, ``log_sum_exp``, ``numerical_gradient`` (central
  finite differences).
- Naive kernels: ``row_dot_kernel`` (D), ``transpose_kernel``, ``score_grad_kernel`` (dS, the
  warm-up exercise's), ``group_sum_kernel`` (a shared K/V head's gradient); ``launch_weights``
  (P from the forward's own kernels, with the window's mask), ``launch_naive_backward`` (one
  launch per gradient), ``launch_grouped_naive_backward`` for shared K/V heads.
- Fused kernels, FlashAttention-2-style, nothing T_q x T_k stored: ``flash_backward_dkdv_kernel``
  (a block per BLOCK_K keys walks the query tiles that see them; its ``dkdv_tile`` recomputes P
  from the forward's log-sum-exp and folds each pair into the key's accumulators) and
  ``flash_backward_dq_kernel`` (the second pass, a block per BLOCK_Q queries, ``dq_tile``); tiles
  holding no visible pair are never loaded (causal, sliding window); ``launch_fused_backward``.
- The dK/dV pass in one kernel (causal, one head a grid row, no window or shared K/V heads):
  ``dkdv_pass_kernel`` around ``dkdv_walk``, the main exercise's (the walk over the query tiles,
  their copies, barriers and recomputation; ``add_row`` adds a weighted row of a tile into a
  thread's sums), ``dkdv_pass_grid``, ``dkdv_pass`` (on NumPy arrays), ``pass_kernel_with`` (the
  kernel around another walk).
- Costs: ``visible_pairs``, ``fused_tile_visits``, ``backward_flops``, ``dq_strategies``,
  ``footprint`` (the traffic of both backwards is counted by the sanitizer:
  ``measure.traffic.count_backward_naive`` and ``count_backward_fused``).
- Launchers: ``attention_backward(q, k, v, d_out, causal=True, window=None)`` (naive) and
  ``flash_attention_backward(q, k, v, out, lse, d_out, causal=True, window=None)`` (fused).

Sliding windows: ``window=W`` as in the forward (``flash_attention(..., window=W)``, the mask of
``reference.causal_mask``): query i sees its own position and the W - 1 before it. In
FlashAttention's ``window_size=(left, right)`` (keys i - left .. i + right, the queries aligned
to the last positions as here) that is ``(W - 1, 0)``, not ``(W, 0)``: a port that passes W as
``left`` lets every query see one key more.

Grouped-query attention: k and v may have fewer heads than q (axis -3), as in the forward. A
key/value head's gradient sums what each query head of its group gives it: the naive backward
adds per-head gradients (``group_sum_kernel``), the fused dK/dV pass walks the query tiles of
every head of the group in one block, so the sum stays in its accumulators.
"""

import math

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.stages import attention, flash, mask, scores, weighted_sum
from attention_lib.platform.launch import ceil_div, check_simulator_budget
from attention_lib.platform.runtime import SIMULATOR_SHAPES
from attention_lib.platform.rebuild import rebuilt
from attention_lib.stages.kv_cache import row_dot   # a row . a shared tile's row: decoding's key score
from attention_lib.platform.validation import as_float32, require, require_finite_result

MAX_D = flash.MAX_D
# Fused kernels: keys per block of the dK/dV pass and queries per tile it walks (and the same two
# the other way round in the dQ pass). Shared memory per block: 2 tiles of BLOCK x MAX_D float32,
# 32 KiB at 32 on a GPU. On the simulator 16: fewer threads per block to simulate.
# (simulator, GPU): a check runs an answer at both (attention_lib.checks.shapes).
SHAPE_CONSTANTS = {"BLOCK_Q": (16, 32), "BLOCK_K": (16, 32)}
BLOCK_GPU = SHAPE_CONSTANTS["BLOCK_Q"][1]
BLOCK_Q = SHAPE_CONSTANTS["BLOCK_Q"][0 if SIMULATOR_SHAPES else 1]
BLOCK_K = SHAPE_CONSTANTS["BLOCK_K"][0 if SIMULATOR_SHAPES else 1]
# Element-wise kernels: rows per block of the row sums, entries per block of the group sums.
ROWS_PER_BLOCK = 32


# --- NumPy ---------------------------------------------------------------------------------

def backward_loops(q, k, v, d_out, causal=True, window=None):
    """The gradients of one head, entry by entry, as derived; float64. q: (T_q, d_k); k: (T_k, d_k);
    v: (T_k, d_v); d_out: (T_q, d_v) -> (dq, dk, dv), shapes of q, k, v. Python loops: small sizes."""
    q, k, v, d_out = (np.asarray(a, dtype=np.float64) for a in (q, k, v, d_out))
    p = reference.attention_weights(q, k, causal, window)   # (T_q, T_k)
    o = p @ v                                               # (T_q, d_v)
    (t_q, d_k), t_k = q.shape, k.shape[0]
    scale = 1.0 / math.sqrt(d_k)
    dq, dk, dv = np.zeros_like(q), np.zeros_like(k), np.zeros_like(v)
    for i in range(t_q):
        d_i = sum(d_out[i, c] * o[i, c] for c in range(v.shape[1]))    # rowsum(dO o O)
        for j in range(t_k):
            dv[j] += p[i, j] * d_out[i]                     # dV = P^T dO
            dp_ij = d_out[i] @ v[j]                         # dP = dO V^T
            ds_ij = p[i, j] * (dp_ij - d_i)                 # the softmax's Jacobian
            dq[i] += ds_ij * k[j] * scale                   # dQ = dS K * scale
            dk[j] += ds_ij * q[i] * scale                   # dK = dS^T Q * scale
    return dq, dk, dv


def backward(q, k, v, d_out, causal=True, window=None):
    """The gradients of attention, vectorised; float64. q: (..., T_q, d_k); k: (..., T_k, d_k);
    v: (..., T_k, d_v); d_out: (..., T_q, d_v), the loss's gradient with respect to attention's
    output -> (dq, dk, dv), shapes of q, k, v. window: a sliding window (causal only), as
    reference.attention takes it. k and v may have fewer heads on axis -3 (grouped-query
    attention): a K/V head's gradient sums its query heads' (fold_kv_heads)."""
    q, k_heads, v_heads, d_out = (np.asarray(a, dtype=np.float64) for a in (q, k, v, d_out))
    k, v = reference.share_kv_heads(k_heads, q), reference.share_kv_heads(v_heads, q)  # (..., H, T_k, d)
    scale = 1.0 / math.sqrt(q.shape[-1])
    p = reference.attention_weights(q, k, causal, window)   # (..., T_q, T_k)
    o = p @ v                                               # (..., T_q, d_v)
    dv = np.swapaxes(p, -1, -2) @ d_out                     # (..., T_k, d_v)
    dp = d_out @ np.swapaxes(v, -1, -2)                     # (..., T_q, T_k)
    d_rows = np.sum(d_out * o, axis=-1, keepdims=True)      # (..., T_q, 1)
    ds = p * (dp - d_rows)                                  # (..., T_q, T_k)
    dq = ds @ k * scale                                     # (..., T_q, d_k)
    dk = np.swapaxes(ds, -1, -2) @ q * scale                # (..., T_k, d_k)
    return dq, fold_kv_heads(dk, k_heads.shape), fold_kv_heads(dv, v_heads.shape)


def fold_kv_heads(grad, shape):
    """grad (..., H, T_k, d), one per query head -> `shape` (..., H_kv, T_k, d): each key/value
    head's sum over the H / H_kv query heads that read it (query head h reads h // group)."""
    if grad.shape == tuple(shape):
        return grad
    group = grad.shape[-3] // shape[-3]
    return grad.reshape(*shape[:-2], group, *shape[-2:]).sum(axis=-3)   # (..., H_kv, group, T_k, d)


def log_sum_exp(q, k, causal=True, window=None):
    """The forward's per-row statistic lse_i = log sum_j exp(S_ij) over the keys query i sees;
    float64.

    q: (..., T_q, d_k); k: (..., T_k, d_k) -> (..., T_q). P_ij = exp(S_ij - lse_i), so the
    backward rebuilds any entry of P from S and one number per row. A row that sees no key
    gets -inf (log of an empty sum).
    """
    window = reference.check_window(window, causal)
    s = reference.scores(q, reference.share_kv_heads(k, q))  # (..., T_q, T_k), scaled
    if causal:
        s = reference.apply_causal_mask(s, window)
    top = np.max(s, axis=-1)
    shift = np.where(np.isneginf(top), 0.0, top)
    with np.errstate(divide="ignore"):                      # log(0) = -inf for a row with no key
        return shift + np.log(np.sum(np.exp(s - shift[..., None]), axis=-1))


def numerical_gradient(loss, x, eps=1e-6):
    """d loss / d x by central differences, one entry at a time; float64.

    loss: a function of x returning a float; x: float64 array (changed in place, restored).
    Each entry costs two calls of loss; the error is of order eps^2 plus rounding / eps.
    """
    grad = np.zeros_like(x)
    for index in np.ndindex(x.shape):
        saved = x[index]
        x[index] = saved + eps
        up = loss(x)
        x[index] = saved - eps
        down = loss(x)
        x[index] = saved
        grad[index] = (up - down) / (2 * eps)
    return grad


# --- Naive kernels: the stage kernels, P stored ----------------------------------------------

@cuda.jit
def row_dot_kernel(d_out, out, d_rows):
    """D[h, i] = sum_c d_out[h, i, c] * out[h, i, c], one thread per row.

    d_out, out: (BH, T_q, d_v) float32; d_rows: (BH, T_q) float32, written.
    Grid: x over rows i (ROWS_PER_BLOCK to a block), y over heads h.
    """
    i, h = cuda.grid(2)
    if i < out.shape[1]:                         # the last block may hang past T_q
        acc = np.float32(0.0)
        for c in range(out.shape[2]):
            acc += d_out[h, i, c] * out[h, i, c]
        d_rows[h, i] = acc


@cuda.jit
def transpose_kernel(a, a_t):
    """a_t[h, j, i] = a[h, i, j], one thread per element.

    a: (BH, R, C) float32; a_t: (BH, C, R) float32, written. Grid: x over columns j, y over rows
    i, z over heads h (the scores' grid). Neighbouring threads read neighbouring addresses and
    write addresses R apart: the writes are not coalesced, which a shared-memory tile would fix.
    """
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < a.shape[1] and j < a.shape[2]:
        a_t[h, j, i] = a[h, i, j]


@cuda.jit
def score_grad_kernel(p, dp, d_rows, scale, d_raw):
    """d_raw[h, i, j] = scale * p[h, i, j] * (dp[h, i, j] - d_rows[h, i]), one thread per entry.

    p, dp: (BH, T_q, T_k) float32 (weights and their gradient); d_rows: (BH, T_q) float32, the
    row sums D; scale: float32, 1/sqrt(d_k); d_raw: (BH, T_q, T_k) float32, written: dS times the
    scale, the gradient of the unscaled products Q K^T, so that dQ = d_raw K and dK = d_raw^T Q.
    Grid: the scores' grid (x over keys j, y over queries i, z over heads h).
    """
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < p.shape[1] and j < p.shape[2]:
        d_raw[h, i, j] = scale * p[h, i, j] * (dp[h, i, j] - d_rows[h, i])


@cuda.jit
def group_sum_kernel(per_head, shared):
    """shared (BH_kv, T, d) float32, written: for key/value head g the sum of per_head (BH, T, d)
    over the query heads g * group .. (g + 1) * group - 1 that read it (grouped-query attention).
    A thread per element of shared; block (x, g) along its (T x d) entries."""
    e, g = cuda.grid(1), cuda.blockIdx.y
    t, c = e // shared.shape[2], e % shared.shape[2]
    if t < shared.shape[1]:
        group = per_head.shape[0] // shared.shape[0]
        total = np.float32(0.0)
        for r in range(group):
            total += per_head[g * group + r, t, c]
        shared[g, t, c] = total


def row_grid(bh, t_q):
    """(grid, block) of row_dot_kernel: x over rows, y over heads."""
    return (ceil_div(t_q, ROWS_PER_BLOCK), bh), ROWS_PER_BLOCK


def group_sum_grid(bh_kv, t, d):
    """(grid, block) of group_sum_kernel for (BH_kv, T, d): x over the T * d entries, y over heads."""
    return (ceil_div(t * d, ROWS_PER_BLOCK), bh_kv), ROWS_PER_BLOCK


def transposed(a):
    """A new device array (BH, C, R) holding a (BH, R, C) transposed, head by head."""
    a_t = cuda.device_array((a.shape[0], a.shape[2], a.shape[1]), np.float32)
    grid, block = scores.score_grid(*a.shape)
    transpose_kernel[grid, block](a, a_t)
    return a_t


def launch_weights(q, k, causal, window=None):
    """P = softmax(mask(q k^T / sqrt(d_k))) on device arrays, by the forward's stage kernels (notebook
    05's pipeline); with a sliding window, notebook 03's mask_kernel also hides the keys older than
    the window before the softmax. q (BH, T_q, d_k), k (BH, T_k, d_k) -> a new (BH, T_q, T_k) array."""
    if not window:
        return attention.launch_weights(q, k, causal)
    s = attention.launch_masked_scores(q, k, causal)        # (BH, T_q, T_k), the future -inf
    mask.launch_mask(mask.mask_kernel, s, window)           # and the keys before the window
    return attention.launch_row_softmax(s)


def launch_naive_backward(q, k, v, d_out, causal, dq, dk, dv, kernel=None, window=None):
    """The backward from the stage kernels, P stored: device arrays q (BH, T_q, d_k),
    k (BH, T_k, d_k), v (BH, T_k, d_v), d_out (BH, T_q, d_v); dq, dk, dv written (shapes of q,
    k, v). kernel: replaces score_grad_kernel (same signature and grid). No checks here."""
    (bh, t_q, d_k), t_k = q.shape, k.shape[1]
    p = launch_weights(q, k, causal, window)                # (BH, T_q, T_k), stored
    out = cuda.device_array(d_out.shape, np.float32)
    weighted_sum.launch_weighted_sum(p, v, out)             # O = P V, for the row sums
    d_rows = cuda.device_array((bh, t_q), np.float32)
    row_dot_kernel[row_grid(bh, t_q)](d_out, out, d_rows)   # D = rowsum(dO o O)
    weighted_sum.launch_weighted_sum(transposed(p), d_out, dv)         # dV = P^T dO
    dp = cuda.device_array((bh, t_q, t_k), np.float32)
    grid, block = scores.score_grid(bh, t_q, t_k)
    scores.scores_kernel_v2[grid, block](d_out, v, np.float32(1.0), dp)  # dP = dO V^T
    d_raw = cuda.device_array((bh, t_q, t_k), np.float32)
    (score_grad_kernel if kernel is None else kernel)[grid, block](
        p, dp, d_rows, scores.scale_factor(d_k), d_raw)     # dS * scale
    weighted_sum.launch_weighted_sum(d_raw, k, dq)          # dQ = dS K * scale
    weighted_sum.launch_weighted_sum(transposed(d_raw), q, dk)         # dK = dS^T Q * scale


def launch_grouped_naive_backward(q, k, v, d_out, causal, dq, dk, dv, kernel=None, window=None):
    """launch_naive_backward with k and v of BH_kv < BH heads (grouped-query attention): the stage
    kernels work on copies of each K/V head for its query heads (attention.share_kv_heads), then
    group_sum_kernel adds the copies' dK and dV into each K/V head's."""
    per_head = [cuda.device_array((q.shape[0], *a.shape[1:]), np.float32) for a in (dk, dv)]   # (BH, T_k, d)
    shared_k, shared_v = (attention.share_kv_heads(a, q.shape[0]) for a in (k, v))
    launch_naive_backward(q, shared_k, shared_v, d_out, causal, dq, *per_head, kernel, window)
    for summed, grad in zip((dk, dv), per_head):
        group_sum_kernel[group_sum_grid(*summed.shape)](grad, summed)


# --- Fused kernels: S and P recomputed tile by tile, nothing T x T stored ------------------

@cuda.jit(device=True)
def load_rows(src, h, r0, n, width, tile, threads):
    """Copy rows r0 .. r0 + n - 1 of src[h] (width columns) into tile[0:n]; every one of the
    block's `threads` threads calls it. Element e goes to thread e % threads: neighbours read
    neighbouring addresses."""
    for e in range(cuda.threadIdx.x, n * width, threads):
        r = e // width
        tile[r, e - r * width] = src[h, r0 + r, e - r * width]


@cuda.jit(device=True)
def load_entries(src, h, r0, n, stats, which, threads):
    """Copy src[h, r0 .. r0 + n - 1] (one number per row: lse or D) into stats[which, 0:n]."""
    for r in range(cuda.threadIdx.x, n, threads):
        stats[which, r] = src[h, r0 + r]


@cuda.jit(device=True)
def load_query_tiles(q, d_out, lse, d_rows, h, i0, q_tile, do_tile, stats):
    """The dK/dV pass's copy of queries i0 .. i0 + n - 1 of head h into shared memory: their q
    and dO rows, and their lse and D in stats[0] and stats[1]; n = BLOCK_Q but at the end. The
    whole block copies, then waits until the tiles are complete."""
    n = min(BLOCK_Q, q.shape[1] - i0)
    load_rows(q, h, i0, n, q.shape[2], q_tile, BLOCK_K)
    load_rows(d_out, h, i0, n, d_out.shape[2], do_tile, BLOCK_K)
    load_entries(lse, h, i0, n, stats, 0, BLOCK_K)
    load_entries(d_rows, h, i0, n, stats, 1, BLOCK_K)
    cuda.syncthreads()                                      # wait: the query tiles are complete


@cuda.jit(device=True)
def load_key_tiles(k, v, g, k0, n, k_tile, v_tile):
    """The dQ pass's copy of keys k0 .. k0 + n - 1 of K/V head g into shared memory, their k and
    v rows; the whole block copies, then waits until the tiles are complete."""
    load_rows(k, g, k0, n, k.shape[2], k_tile, BLOCK_Q)
    load_rows(v, g, k0, n, v.shape[2], v_tile, BLOCK_Q)
    cuda.syncthreads()                                      # wait: the K and V tiles are complete


@cuda.jit(device=True)
def queries_seeing(j, t_q, t_k, causal, window):
    """(first, end): the queries first .. end - 1 that see key j, the mirror of flash's first_key
    and visible_keys (the queries are the last T_q positions; window 0: none); (0, 0) for a
    thread past the last key. Query i sees j when j <= i + (T_k - T_q) < j + window."""
    if j >= t_k:
        return 0, 0
    if not causal:
        return 0, t_q
    first = max(0, j - (t_k - t_q))
    if window == 0:
        return first, t_q
    return first, max(first, min(t_q, j - (t_k - t_q) + window))


@cuda.jit(device=True)
def keys_seen(i, t_q, t_k, causal, window):
    """(first, end): the keys first .. end - 1 query i sees (flash.first_key, flash.visible_keys);
    (0, 0) for a thread past the last query."""
    if i >= t_q:
        return 0, 0
    return flash.first_key(i, t_q, t_k, window), flash.visible_keys(i, t_q, t_k, causal)


@cuda.jit(device=True)
def load_own_row(src, h, r, width, row, mine):
    """row[0:width] = src[h, r] for a thread that owns row r; zeros for one that owns none."""
    for c in range(width):
        row[c] = src[h, r, c] if mine else np.float32(0.0)   # float32 both ways: no float64 in the PTX


@cuda.jit(device=True)
def zero_row(row, width):
    """row[0:width] = 0: an accumulator before its first term."""
    for c in range(width):
        row[c] = 0.0


@cuda.jit(device=True)
def start_rows(a, b, h, r, a_row, b_row, acc_a, acc_b):
    """A thread's rows a[h, r] and b[h, r] (zeros for a thread past the end) and accumulators of
    their widths, zeroed (acc_b may be acc_a when only one is needed)."""
    mine = r < a.shape[1]
    load_own_row(a, h, r, a.shape[2], a_row, mine)
    load_own_row(b, h, r, b.shape[2], b_row, mine)
    zero_row(acc_a, a.shape[2])
    zero_row(acc_b, b.shape[2])


@cuda.jit(device=True)
def row_stats(lse, d_rows, h, i):
    """(lse[h, i], d_rows[h, i]) of a thread's query; zeros past the last query (it folds no key)."""
    if i < lse.shape[1]:
        return lse[h, i], d_rows[h, i]
    return np.float32(0.0), np.float32(0.0)


@cuda.jit(device=True)
def store_row(dst, h, r, acc, factor):
    """dst[h, r] = acc[0:width] * factor, for a thread that owns row r (r < dst.shape[1])."""
    if r < dst.shape[1]:
        for c in range(dst.shape[2]):
            dst[h, r, c] = acc[c] * factor


@cuda.jit(device=True)
def store_rows(dk, dv, g, j, dk_acc, dv_acc, scale):
    """Key j's gradients of K/V head g: dk[g, j] = scale * dk_acc (dK = scale * sum_i dS_ij Q_i) and
    dv[g, j] = dv_acc, for a thread that owns a key."""
    store_row(dk, g, j, dk_acc, scale)
    store_row(dv, g, j, dv_acc, np.float32(1.0))


@cuda.jit(device=True)
def dkdv_tile(q_tile, do_tile, stats, rows_from, rows_to, k_row, v_row, dk_acc, dv_acc, scale, d_k, d_v):
    """Fold the queries in rows rows_from .. rows_to - 1 of the shared tiles (those that see this
    thread's key j) into key j's accumulators: dv_acc += P_ij dO_i, dk_acc += dS_ij Q_i.

    q_tile, do_tile: shared (BLOCK_Q, MAX_D) float32, row r holding a query's q and dO; stats:
    shared (2, BLOCK_Q) float32, stats[0, r] the query's log-sum-exp from the forward, stats[1, r]
    its row sum D; k_row, v_row: (MAX_D,) float32, key j's k and v; dk_acc, dv_acc: (MAX_D,)
    float32, its sums so far (dK unscaled: the kernel multiplies by scale once at the end);
    scale: float32, 1/sqrt(d_k); d_k, d_v: the widths in use.
    """
    for r in range(rows_from, rows_to):
        s = row_dot(k_row, q_tile, r, d_k) * scale          # S_ij, recomputed: one dot product
        p = math.exp(s - stats[0, r])                       # P_ij = exp(S_ij - lse_i): no pass over the row
        ds = p * (row_dot(v_row, do_tile, r, d_v) - stats[1, r])   # dS_ij = P_ij (dP_ij - D_i)
        for c in range(d_v):
            dv_acc[c] += p * do_tile[r, c]                  # dV_j += P_ij dO_i
        for c in range(d_k):
            dk_acc[c] += ds * q_tile[r, c]                  # dK_j += dS_ij Q_i


@cuda.jit(device=True)
def query_ranges(j, j0, t_q, t_k, causal, window):
    """(first, end, start, stop): the queries first .. end - 1 that see key j, and the query tiles
    its block (keys from j0) walks, from start (a multiple of BLOCK_Q: the tile holding the first
    query that sees key j0) to stop (the last query that sees its last key), the same in all the
    block's threads, so that all reach the same barriers."""
    first, end = queries_seeing(j, t_q, t_k, causal, window)
    block_first = queries_seeing(j0, t_q, t_k, causal, window)[0]
    stop = queries_seeing(min(j0 + BLOCK_K, t_k) - 1, t_q, t_k, causal, window)[1]
    return first, end, block_first - block_first % BLOCK_Q, stop


@cuda.jit
def flash_backward_dkdv_kernel(q, k, v, d_out, lse, d_rows, scale, causal, window, dk, dv):
    """dk, dv (BH_kv, T_k, d) from q, d_out (BH, T_q, d), k, v (BH_kv, T_k, d), lse, d_rows (BH, T_q); window int32."""
    q_tile = cuda.shared.array((BLOCK_Q, MAX_D), np.float32)   # the tile's queries
    do_tile = cuda.shared.array((BLOCK_Q, MAX_D), np.float32)  # and their output gradients
    stats = cuda.shared.array((2, BLOCK_Q), np.float32)        # and their lse (row 0) and D (row 1)
    k_row, v_row = cuda.local.array(MAX_D, np.float32), cuda.local.array(MAX_D, np.float32)
    dk_acc, dv_acc = cuda.local.array(MAX_D, np.float32), cuda.local.array(MAX_D, np.float32)
    g, j0 = cuda.blockIdx.y, cuda.blockIdx.x * BLOCK_K          # block (x, g): BLOCK_K keys of K/V head g
    j, group = j0 + cuda.threadIdx.x, q.shape[0] // k.shape[0]  # a thread per key; query heads per K/V head
    start_rows(k, v, g, j, k_row, v_row, dk_acc, dv_acc)
    first, end, start, stop = query_ranges(j, j0, q.shape[1], k.shape[1], causal, window)
    for h in range(g * group, (g + 1) * group):                # the query heads that read K/V head g
        for i0 in range(start, stop, BLOCK_Q):
            load_query_tiles(q, d_out, lse, d_rows, h, i0, q_tile, do_tile, stats)   # and waits
            dkdv_tile(q_tile, do_tile, stats, max(first - i0, 0), min(end - i0, BLOCK_Q), k_row, v_row,
                      dk_acc, dv_acc, scale, q.shape[2], v.shape[2])
            cuda.syncthreads()                                 # wait: all are done with them before the next copy
    store_rows(dk, dv, g, j, dk_acc, dv_acc, scale)


@cuda.jit(device=True)
def dq_tile(k_tile, v_tile, keys_from, keys_to, q_row, do_row, lse_i, d_i, dq_acc, scale, d_k, d_v):
    """Fold the keys in rows keys_from .. keys_to - 1 of the shared tiles (those query i sees) into
    its dQ accumulator: dkdv_tile's recompute, seen from the query (dQ scaled at the end)."""
    for r in range(keys_from, keys_to):
        s = row_dot(q_row, k_tile, r, d_k) * scale          # S_ij again
        p = math.exp(s - lse_i)
        ds = p * (row_dot(do_row, v_tile, r, d_v) - d_i)
        for c in range(d_k):
            dq_acc[c] += ds * k_tile[r, c]                  # dQ_i += dS_ij K_j


@cuda.jit
def flash_backward_dq_kernel(q, k, v, d_out, lse, d_rows, scale, causal, window, dq):
    """dq (BH, T_q, d_k) float32, written; the other arguments as flash_backward_dkdv_kernel's.
    Block (x, h): BLOCK_Q queries of head h, a thread each, over the key tiles of K/V head
    h // group they see (the forward's band: flash.block_band)."""
    k_tile = cuda.shared.array((BLOCK_K, MAX_D), np.float32)   # the current tile of keys
    v_tile = cuda.shared.array((BLOCK_K, MAX_D), np.float32)   # and of their values
    q_row, do_row = cuda.local.array(MAX_D, np.float32), cuda.local.array(MAX_D, np.float32)
    dq_acc = cuda.local.array(MAX_D, np.float32)
    (t_q, d_k), (t_k, d_v) = q.shape[1:], v.shape[1:]
    h, q0 = cuda.blockIdx.y, cuda.blockIdx.x * BLOCK_Q
    i = q0 + cuda.threadIdx.x                                  # this thread's query
    start_rows(q, d_out, h, i, q_row, do_row, dq_acc, dq_acc)  # one accumulator: dQ
    first, end = keys_seen(i, t_q, t_k, causal, window)
    lse_i, d_i = row_stats(lse, d_rows, h, i)
    start, stop = flash.block_band(q0, min(q0 + BLOCK_Q, t_q) - 1, t_q, t_k, causal, window, BLOCK_K)[:2]
    g = h // (q.shape[0] // k.shape[0])                        # the K/V head query head h reads
    for k0 in range(start, stop, BLOCK_K):
        load_key_tiles(k, v, g, k0, min(BLOCK_K, stop - k0), k_tile, v_tile)   # and waits
        dq_tile(k_tile, v_tile, max(first - k0, 0), min(end - k0, BLOCK_K), q_row, do_row, lse_i, d_i,
                dq_acc, scale, d_k, d_v)
        cuda.syncthreads()                                     # wait: all are done with them before the next copy
    store_row(dq, h, i, dq_acc, scale)                         # dQ = scale * sum_j dS_ij K_j


def fused_grids(bh, t_q, t_k, bh_kv=None):
    """{"dkdv": (grid, block), "dq": (grid, block)} of the two fused kernels for bh query heads
    and bh_kv key/value heads (default bh)."""
    bh_kv = bh if bh_kv is None else bh_kv
    return {"dkdv": ((ceil_div(t_k, BLOCK_K), bh_kv), BLOCK_K), "dq": ((ceil_div(t_q, BLOCK_Q), bh), BLOCK_Q)}


def launch_fused_backward(q, k, v, out, lse, d_out, causal, dq, dk, dv, window=None, dkdv_kernel=None):
    """The fused backward on device arrays (shapes as the kernels', k and v with BH or fewer
    heads; window None or an int); dq, dk, dv written. dkdv_kernel: replaces the dK/dV kernel
    (same signature and grid)."""
    bh, t_q, d_k = q.shape
    d_rows = cuda.device_array((bh, t_q), np.float32)
    row_dot_kernel[row_grid(bh, t_q)](d_out, out, d_rows)   # D = rowsum(dO o O): T_q numbers
    grids, scale = fused_grids(bh, t_q, k.shape[1], k.shape[0]), scores.scale_factor(d_k)
    window = np.int32(window or 0)
    (dkdv_kernel or flash_backward_dkdv_kernel)[grids["dkdv"]](q, k, v, d_out, lse, d_rows, scale, bool(causal),
                                                               window, dk, dv)
    flash_backward_dq_kernel[grids["dq"]](q, k, v, d_out, lse, d_rows, scale, bool(causal), window, dq)


# --- The dK/dV pass in one kernel: notebook 11's main exercise, its walk ---------------------------

@cuda.jit(device=True)
def add_row(acc, w, tile, r, width):
    """acc[0:width] += w * tile[r, 0:width]: row r of a shared tile, weighted, into a thread's sums."""
    for c in range(width):
        acc[c] += w * tile[r, c]


@cuda.jit(device=True)
def dkdv_walk(q, d_out, lse, d_rows, t_k, q_tile, do_tile, stats, k_row, v_row, dk_acc, dv_acc, scale):
    """Block (x, h) of dkdv_pass_kernel walks the query tiles that see its keys; each thread folds the
    queries that see its key j = x * BLOCK_K + threadIdx.x into its sums: dv_acc += P_ij dO_i and dk_acc
    += dS_ij Q_i (unscaled), P_ij rebuilt from the forward's lse. Causal, the queries the last T_q of
    T_k positions (query i sees key j when j <= i + T_k - T_q). q: (BH, T_q, d_k), d_out: (BH, T_q,
    d_v), lse, d_rows: (BH, T_q), float32; q_tile, do_tile: shared (BLOCK_Q, MAX_D), stats: shared (2,
    BLOCK_Q), float32, the block's to fill; k_row, v_row: (MAX_D,) key j's rows (zeros past T_k);
    dk_acc, dv_acc: (MAX_D,) its sums; scale: float32 1/sqrt(d_k). Every thread of the block calls it."""
    (t_q, d_k), d_v, h, tid = q.shape[1:], d_out.shape[2], cuda.blockIdx.y, cuda.threadIdx.x
    seen_from = cuda.blockIdx.x * BLOCK_K - (t_k - t_q)         # key j0 + x is seen from query seen_from + x on
    for i0 in range(max(0, seen_from) // BLOCK_Q * BLOCK_Q, t_q, BLOCK_Q):   # no tile above the diagonal
        n = min(BLOCK_Q, t_q - i0)
        for e in range(tid, n * d_k, BLOCK_K):                  # element e of the rows, a lane each: coalesced
            q_tile[e // d_k, e % d_k] = q[h, i0 + e // d_k, e % d_k]
        for e in range(tid, n * d_v, BLOCK_K):
            do_tile[e // d_v, e % d_v] = d_out[h, i0 + e // d_v, e % d_v]
        for r in range(tid, n, BLOCK_K):
            stats[0, r], stats[1, r] = lse[h, i0 + r], d_rows[h, i0 + r]
        cuda.syncthreads()                                      # wait: the step's tiles are complete
        for r in range(max(0, seen_from + tid - i0), n):        # its queries that see key j (none past T_k)
            p = math.exp(row_dot(k_row, q_tile, r, d_k) * scale - stats[0, r])   # P_ij = exp(S_ij - lse_i)
            add_row(dv_acc, p, do_tile, r, d_v)                 # dV_j += P_ij dO_i
            add_row(dk_acc, p * (row_dot(v_row, do_tile, r, d_v) - stats[1, r]), q_tile, r, d_k)   # dK_j += dS_ij Q_i
        cuda.syncthreads()                                      # wait: all are done with them before the next copy


@cuda.jit
def dkdv_pass_kernel(q, k, v, d_out, lse, d_rows, scale, dk, dv):
    """Causal dK and dV, a thread per key: dk (BH, T_k, d_k), dv (BH, T_k, d_v) written from q (BH, T_q,
    d_k), k, v, d_out (BH, T_q, d_v), lse and d_rows (BH, T_q), float32; scale: float32 1/sqrt(d_k).
    Launch on dkdv_pass_grid: block (x, h) holds keys x * BLOCK_K .. of head h, and dkdv_walk walks
    the query tiles for it. flash_backward_dkdv_kernel without the window and the shared K/V heads."""
    q_tile = cuda.shared.array((BLOCK_Q, MAX_D), np.float32)   # a step's queries
    do_tile = cuda.shared.array((BLOCK_Q, MAX_D), np.float32)  # and their output gradients
    stats = cuda.shared.array((2, BLOCK_Q), np.float32)        # and their lse (row 0) and D (row 1)
    k_row, v_row = cuda.local.array(MAX_D, np.float32), cuda.local.array(MAX_D, np.float32)
    dk_acc, dv_acc = cuda.local.array(MAX_D, np.float32), cuda.local.array(MAX_D, np.float32)
    h, j = cuda.blockIdx.y, cuda.blockIdx.x * BLOCK_K + cuda.threadIdx.x
    start_rows(k, v, h, j, k_row, v_row, dk_acc, dv_acc)
    dkdv_walk(q, d_out, lse, d_rows, k.shape[1], q_tile, do_tile, stats, k_row, v_row, dk_acc, dv_acc, scale)
    store_rows(dk, dv, h, j, dk_acc, dv_acc, scale)


def pass_kernel_with(walk):
    """dkdv_pass_kernel compiled with `walk` (a device function with dkdv_walk's contract) in
    dkdv_walk's place, at the tile sizes BLOCK_Q and BLOCK_K this module holds when it is asked (a
    check runs an answer at the simulator's and at a GPU's)."""
    if walk is dkdv_walk:
        return dkdv_pass_kernel
    return _pass_kernel_with(walk, BLOCK_Q, BLOCK_K)


def _pass_kernel_with(walk, block_q, block_k):
    """pass_kernel_with's kernel, one per walk and tile sizes: its names are a copy of the module's,
    so the sizes it sees are those of the moment it was made."""
    return rebuilt(dkdv_pass_kernel, {"dkdv_walk": walk, "BLOCK_Q": block_q, "BLOCK_K": block_k})


def dkdv_pass_grid(bh, t_k):
    """(grid, block) of dkdv_pass_kernel: x over tiles of BLOCK_K keys, y over heads."""
    return (ceil_div(t_k, BLOCK_K), bh), BLOCK_K


def dkdv_pass(q, k, v, d_out, lse, d_rows, kernel=None):
    """dK and dV of causal attention by dkdv_pass_kernel (or `kernel`, with its signature and grid), on
    NumPy arrays. q: (BH, T_q, d_k); k: (BH, T_k, d_k); v: (BH, T_k, d_v); d_out: (BH, T_q, d_v);
    lse: (BH, T_q), the forward's log-sum-exp (-inf for a row that sees no key); d_rows: (BH, T_q),
    the row sums D -> (dk, dv) float32 with the shapes of k and v."""
    q, k, v, d_out = (as_float32(name, a, hint, min_ndim=3) for name, a, hint in
                      (("q", q, "(BH, T_q, d_k)"), ("k", k, "(BH, T_k, d_k)"), ("v", v, "(BH, T_k, d_v)"),
                       ("d_out", d_out, "(BH, T_q, d_v)")))
    (bh, t_q, d_k), (t_k, d_v) = q.shape, v.shape[1:]
    require(q.ndim == 3 and k.shape == (bh, t_k, d_k) and v.shape == (bh, t_k, d_v) and d_out.shape == (bh, t_q, d_v),
            f"q, k, v, d_out must have shapes (BH, T_q, d_k), (BH, T_k, d_k), (BH, T_k, d_v), (BH, T_q, d_v); "
            f"got {q.shape}, {k.shape}, {v.shape}, {d_out.shape}")
    require(max(d_k, d_v) <= MAX_D, f"q and v must have d_k, d_v <= {MAX_D} (MAX_D); got d_k {d_k}, d_v {d_v}")
    lse = as_float32("lse", lse, "(BH, T_q)", min_ndim=2, allow_neg_inf=True)
    d_rows = as_float32("d_rows", d_rows, "(BH, T_q)", min_ndim=2)
    for name, a in (("lse", lse), ("d_rows", d_rows)):
        require(a.shape == (bh, t_q), f"{name} must have shape {(bh, t_q)}; got shape {a.shape}")
    check_simulator_budget("dkdv_pass", bh * t_k, bh * visible_pairs(t_q, t_k) * (2 * d_k + 2 * d_v))
    dk, dv = (cuda.device_array(a.shape, np.float32) for a in (k, v))
    (kernel or dkdv_pass_kernel)[dkdv_pass_grid(bh, t_k)](*(cuda.to_device(a) for a in (q, k, v, d_out, lse, d_rows)),
                                                         scores.scale_factor(d_k), dk, dv)
    return dk.copy_to_host(), dv.copy_to_host()


# --- Costs -----------------------------------------------------------------------------------

def _queries_seeing(j, t_q, t_k, causal, window):
    """queries_seeing on the host: (first, end) of the queries that see key j (window None: none)."""
    if not causal:
        return 0, t_q
    first = max(0, j - (t_k - t_q))
    return first, t_q if window is None else max(first, min(t_q, j - (t_k - t_q) + window))


def visible_pairs(t_q, t_k, causal=True, window=None):
    """(query, key) pairs of one head that are not masked."""
    return int(reference.causal_mask(t_q, t_k, window).sum()) if causal else t_q * t_k


def fused_tile_visits(t_q, t_k, causal=True, window=None, block_q=BLOCK_Q, block_k=BLOCK_K):
    """(query tile, key tile) pairs of one head that the fused kernels visit with tiles of
    block_q queries and block_k keys (default: this configuration's): {"dkdv", "dq"}, each a
    boolean (ceil(T_q / block_q), ceil(T_k / block_k)) map (True: the tile is computed)."""
    n_qt, n_kt = ceil_div(t_q, block_q), ceil_div(t_k, block_k)
    dkdv, dq = np.zeros((n_qt, n_kt), bool), np.zeros((n_qt, n_kt), bool)
    for kt in range(n_kt):                  # the dK/dV pass: a key block walks the queries that see it
        first = _queries_seeing(kt * block_k, t_q, t_k, causal, window)[0]
        end = _queries_seeing(min((kt + 1) * block_k, t_k) - 1, t_q, t_k, causal, window)[1]
        for i0 in range(first - first % block_q, end, block_q):
            dkdv[i0 // block_q, kt] = True
    for qt in range(n_qt):                  # the dQ pass: a query block walks its band of keys
        last = min((qt + 1) * block_q, t_q) - 1
        start = mask.first_visible(qt * block_q, t_q, t_k, window) // block_k
        dq[qt, start:ceil_div(mask.visible_count(last, t_q, t_k, causal), block_k)] = True
    return {"dkdv": dkdv, "dq": dq}


def backward_flops(t_q, t_k, d_k, d_v=None, causal=True, window=None):
    """Floating-point operations of one head's backward, 2 per multiply-add, over the visible
    pairs: {"given P": the four products dV, dP, dQ, dK; "fused": the same plus S recomputed in
    both passes and dP in the dQ pass; "fused, dQ by atomics": S recomputed once}."""
    d_v = d_k if d_v is None else d_v
    pairs = visible_pairs(t_q, t_k, causal, window)
    given_p = 2 * pairs * (d_v + d_v + d_k + d_k)           # dV, dP, dQ, dK
    return {"given P": given_p,
            "fused": given_p + 2 * pairs * (d_k + d_k + d_v),
            "fused, dQ by atomics": given_p + 2 * pairs * d_k}


def dq_strategies(t_q, t_k, d_k, d_v=None, causal=True, window=None, block_q=BLOCK_Q, block_k=BLOCK_K):
    """What each way of summing dQ over key blocks costs, for one head, with tiles of block_q
    queries and block_k keys (at ANDREA-120M pass the GPU's, BLOCK_GPU): {strategy: {...}}.

    "second pass" (this library): extra multiply-adds (S and dP again), dQ stored once.
    "atomics": every query tile the dK/dV pass visits adds its partial dQ (block_q x d_k) into
    main memory with one atomic add per element.
    """
    d_v = d_k if d_v is None else d_v
    visits = fused_tile_visits(t_q, t_k, causal, window, block_q, block_k)
    pairs = visible_pairs(t_q, t_k, causal, window)
    return {
        "second pass": {"extra multiply-adds": pairs * (d_k + d_v + d_k), "atomic adds": 0,
                        "dq stores": t_q * d_k},
        "atomics": {"extra multiply-adds": pairs * d_k, "atomic adds": int(visits["dkdv"].sum()) * block_q * d_k,
                    "dq stores": 0},
    }


def footprint(bh, t_q, t_k, d_v):
    """Bytes of intermediate arrays each backward allocates in main memory (float32):
    {"naive": P, P^T, dP, dS, dS^T (T_q x T_k each; S the forward kernel's scores besides) plus
    O and D; "fused": D only (lse and O come from the forward)}."""
    return {"naive": 4 * bh * (6 * t_q * t_k + t_q * d_v + t_q), "fused": 4 * bh * t_q}


# --- Launchers -------------------------------------------------------------------------------

def _flatten(what, q, k, v, d_out, causal, window, extra=()):
    """Validate q, k, v, d_out, the window (and `extra`: (name, array, hint, shape, allow_neg_inf)
    tuples); returns (q3, k3, v3, d_out3, [extra3...], lead), each flattened to (BH, ...) float32.
    The simulator budget counts a thread per query and per key and the multiply-adds of the
    fused backward's two passes."""
    q3, k3, v3, lead = attention._flatten(q, k, v, causal, what, share_kv=True)
    window = reference.check_window(window, causal)
    (bh, t_q, d_k), (t_k, d_v) = q3.shape, v3.shape[1:]
    require(max(d_k, d_v) <= MAX_D, f"q and v must have d_k, d_v <= {MAX_D} (MAX_D); got d_k {d_k}, d_v {d_v}")
    d_out = as_float32("d_out", d_out, "(..., T_q, d_v)", min_ndim=2)
    require(d_out.shape == (*lead, t_q, d_v),
            f"d_out must have shape {(*lead, t_q, d_v)} (the output's); got shape {d_out.shape}")
    flat = []
    for name, array, hint, shape, neg_inf in extra:
        array = as_float32(name, array, hint, min_ndim=1, allow_neg_inf=neg_inf)
        require(array.shape == (*lead, *shape), f"{name} must have shape {(*lead, *shape)}; got shape {array.shape}")
        flat.append(array.reshape(bh, *shape))
    madds = bh * visible_pairs(t_q, t_k, causal, window) * (3 * d_k + 3 * d_v)
    check_simulator_budget(what, bh * (t_q + t_k), madds)
    return (q3, k3, v3, d_out.reshape(bh, t_q, d_v), *flat, lead)


def _results(what, dq, dk, dv, lead, lead_kv):
    """Copy the three gradients back with the leading axes restored (q's, and k's for dk and
    dv), and refuse non-finite ones."""
    grads = tuple(a.copy_to_host().reshape(*axes, *a.shape[1:])
                  for a, axes in ((dq, lead), (dk, lead_kv), (dv, lead_kv)))
    for grad in grads:
        require_finite_result(what, grad, "q, k, v or d_out")
    return grads


def attention_backward(q, k, v, d_out, causal=True, window=None, kernel=None):
    """The gradients of attention(q, k, v, causal) for the output gradient d_out, on the device,
    with the stage kernels (the weights P are computed and stored, T_q x T_k per head).

    q: (..., T_q, d_k); k: (..., T_k, d_k); v: (..., T_k, d_v); d_out: (..., T_q, d_v), float,
    the same leading axes, or k and v with fewer heads on axis -3 (grouped-query attention, as
    attention takes them) -> (dq, dk, dv) float32 with the shapes of q, k, v. window: a sliding
    window as flash_attention's (causal only; FlashAttention's window_size=(window - 1, 0)), or
    None. kernel: replaces score_grad_kernel (same signature and grid).
    """
    q3, k3, v3, do3, lead = _flatten("attention_backward", q, k, v, d_out, causal, window)
    dq, dk, dv = (cuda.device_array(a.shape, np.float32) for a in (q3, k3, v3))
    launch = launch_naive_backward if k3.shape[0] == q3.shape[0] else launch_grouped_naive_backward
    launch(*(cuda.to_device(a) for a in (q3, k3, v3, do3)), causal, dq, dk, dv, kernel, window)
    return _results("attention_backward", dq, dk, dv, lead, np.shape(k)[:-2])


def flash_attention_backward(q, k, v, out, lse, d_out, causal=True, window=None):
    """The gradients of flash_attention(q, k, v, causal, window=window), fused: nothing
    T_q x T_k is stored.

    q: (..., T_q, d_k); k: (..., T_k, d_k); v: (..., T_k, d_v); out: (..., T_q, d_v), the
    forward's output; lse: (..., T_q), the forward's log-sum-exp of each row of scaled scores
    (-inf for a row that sees no key); d_out: (..., T_q, d_v); float, the same leading axes (k
    and v may have fewer heads on axis -3, as flash_attention takes them) -> (dq, dk, dv) float32
    with the shapes of q, k, v. window: the forward's sliding window (causal only), or None:
    query i sees keys i + (T_k - T_q) - window < j <= i + (T_k - T_q), its own position and the
    window - 1 before it; FlashAttention's window_size=(window - 1, 0), not (window, 0).
    """
    require(isinstance(causal, (bool, np.bool_)), f"causal must be True or False, got {causal!r}")
    t_q, d_v = np.shape(d_out)[-2:] if np.ndim(d_out) >= 2 else (None, None)
    q3, k3, v3, do3, out3, lse3, lead = _flatten(
        "flash_attention_backward", q, k, v, d_out, causal, window,
        extra=(("out", out, "(..., T_q, d_v)", (t_q, d_v), False), ("lse", lse, "(..., T_q)", (t_q,), True)))
    dq, dk, dv = (cuda.device_array(a.shape, np.float32) for a in (q3, k3, v3))
    launch_fused_backward(*(cuda.to_device(a) for a in (q3, k3, v3, out3, lse3, do3)), causal, dq, dk, dv, window)
    return _results("flash_attention_backward", dq, dk, dv, lead, np.shape(k)[:-2])
