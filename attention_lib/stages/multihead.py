"""Multi-head attention (notebook 06): split the width into heads, attend in all at once, merge, W_O.

With n_head heads, each head works in d_k = d_model / n_head dimensions (768 / 12 = 64 in
ANDREA-120M): head h owns columns h*d_k .. (h+1)*d_k - 1 of Q, K and V. Splitting is a
reshape and a transpose, (..., T, d_model) -> (..., T, n_head, d_k) -> (..., n_head, T, d_k),
so that every head is one (T, d_k) matrix of PyTorch's layout; merging undoes it. The NumPy
references are ``reference.split_heads``, ``reference.merge_heads`` and
``reference.multi_head_attention`` (not repeated here).

- ``split_heads_kernel``: one thread per element, out[b, h, t, c] = x[b, t, h*d_k + c].
- ``merge_heads_kernel``: the inverse, out[b, t, h*d_k + c] = heads[b, h, t, c].
  Both run on the same grid: x along c (within a head), y along t, z along (batch, head), so
  every head of every sequence is in one launch and neighbouring threads touch neighbouring
  addresses on both sides of the copy.
- ``qkv_scores_kernel`` and ``qkv_weighted_sum_kernel``: the layer's attention without those
  copies, as production kernels do it. The scores of every head are read in place from the fused
  projection (B, T, (n_head + 2 n_kv_head) d_k) through views of its columns, query head h with
  key/value head h // (n_head // n_kv_head) (grouped-query attention); the weighted sum reads V
  the same way and writes each head's output straight into its columns of the merged (B, T,
  d_model). They call the tiled device functions of notebooks 03 and 01 (``scores.tile_dot``,
  ``projection.tile_matmul``), causal tiles skipped.
- ``qkv_av_kernel``: the weighted sum of qkv_weighted_sum_kernel written out, with its own tiles,
  barriers and causal stop (notebook 06's main exercise), on a one-axis grid whose block numbers
  it maps to tiles itself (``qkv_av_grid``); its launcher ``qkv_av(a, qkv, n_head, n_kv_head=None,
  causal=False, kernel=None)``.
- ``head_partial_outputs``: the output projection as a sum over heads (NumPy, float64):
  concat(heads) @ W_O = sum_h head_h @ W_O[h*d_k:(h+1)*d_k, :]. When the heads live on
  different GPUs (tensor parallelism) each GPU computes its part of that sum, and adding the
  parts across GPUs is the all-reduce.
- Launchers ``split_heads(x, n_head, kernel=None)``, ``merge_heads(heads, kernel=None)`` and
  the whole layer, ``multi_head_attention(x, w_q, w_k, w_v, w_o, n_head, ...)``, which
  validates, copies x and the weights in and the output back; ``launch_layer`` runs the
  layer's five launches on device arrays in between (the fused QKV projection, the scores of
  every head, the softmax, the weighted sum into the merged layout, the W_O projection).
"""

import math

import numpy as np
from numba import cuda, float32

from attention_lib.stages import attention, projection, scores, softmax, weighted_sum
from attention_lib.stages.projection import TILE, tile_matmul
from attention_lib.stages.scores import tile_dot
from attention_lib.platform.launch import ceil_div, check_grid, check_simulator_budget
from attention_lib.platform.validation import as_float32, head_counts, require, require_finite_result, weight

# Blocks of 16 x 16 threads: x along c (a head's d_k columns), y along t. 16 consecutive
# threads copy 16 consecutive floats (64 bytes) on both sides; ANDREA-sim's d_k = 16 fills the
# x axis exactly, ANDREA-120M's d_k = 64 takes 4 blocks across.
BLOCK = (16, 16)
# CUDA's limit on gridDim.z, which carries batch x heads.
MAX_GRID_Z = 65535
# The projections inside multi_head_attention: the 128 x 128 kernel v4 on a GPU, the naive v1 on
# the simulator (projection.layer_version says why).
PROJECTION_VERSION = projection.layer_version()


# --- NumPy: the output projection as a sum over heads ------------------------------------

def check_head_groups(n_head, d_k, n_groups, w_o):
    """n_groups defaults to n_head and must divide it; w_o must have n_head * d_k rows."""
    n_groups = n_head if n_groups is None else n_groups
    require(n_head % n_groups == 0, f"n_groups {n_groups} must divide n_head {n_head}")
    require(w_o.shape[0] == n_head * d_k,
            f"w_o must have n_head * d_k = {n_head * d_k} rows, got shape {w_o.shape}")
    return n_groups


def head_partial_outputs(heads, w_o, n_groups=None):
    """concat(heads) @ w_o split into the partial products of groups of heads, in float64.

    heads: (..., n_head, T, d_k); w_o: (n_head * d_k, d_model); n_groups: groups of consecutive
    heads (GPUs, in tensor parallelism), default n_head -> (n_groups, ..., T, d_model).
    Summing the result over axis 0 gives merge_heads(heads) @ w_o.
    """
    heads, w_o = np.asarray(heads, np.float64), np.asarray(w_o, np.float64)
    *lead, n_head, T, d_k = heads.shape
    per_group = n_head // check_head_groups(n_head, d_k, n_groups, w_o)
    partials = np.zeros((n_head // per_group, *lead, T, w_o.shape[1]))
    for h in range(n_head):
        rows = w_o[h * d_k:(h + 1) * d_k, :]                     # (d_k, d_model): head h's rows
        partials[h // per_group] += heads[..., h, :, :] @ rows    # (..., T, d_k) @ (d_k, d_model)
    return partials


# --- Kernels -----------------------------------------------------------------------------

@cuda.jit
def split_heads_kernel(x, out):
    """out[b, h, t, c] = x[b, t, h*d_k + c]: cut the model width into heads, one thread per element.

    x: (B, T, d_model) float32; out: (B, n_head, T, d_k) float32, written; d_model = n_head * d_k.
    Grid: x runs over c (0 .. d_k - 1), y over t, z over b * n_head + h.
    """
    c, t = cuda.grid(2)
    bh = cuda.blockIdx.z                   # one (sequence, head) pair per grid layer
    n_head, d_k = out.shape[1], out.shape[3]
    b, h = bh // n_head, bh % n_head
    if t < out.shape[2] and c < d_k:       # edge blocks hang past T and d_k
        out[b, h, t, c] = x[b, t, h * d_k + c]   # head h starts at column h * d_k


@cuda.jit
def merge_heads_kernel(heads, out):
    """out[b, t, h*d_k + c] = heads[b, h, t, c]: put the heads side by side again.

    heads: (B, n_head, T, d_k) float32; out: (B, T, n_head * d_k) float32, written.
    The same grid as split_heads_kernel (over the elements of `heads`).
    """
    c, t = cuda.grid(2)
    bh = cuda.blockIdx.z
    n_head, d_k = heads.shape[1], heads.shape[3]
    b, h = bh // n_head, bh % n_head
    if t < heads.shape[2] and c < d_k:
        out[b, t, h * d_k + c] = heads[b, h, t, c]


@cuda.jit
def qkv_scores_kernel(qkv, n_head, n_kv_head, inv_sqrt_dk, causal, s):
    """Every head's scores read in place from the fused projection, no split copy:
    s[b * n_head + h, i, j] = (Q_h[i] . K_g[j]) * inv_sqrt_dk with g = h // (n_head // n_kv_head),
    -inf where causal and j > i.

    qkv: (B, T, (n_head + 2 n_kv_head) d_k) float32, [Q heads | K heads | V heads] along the last
    axis; s: (B * n_head, T, T) float32, written; inv_sqrt_dk: float32; causal: bool. Grid and
    block: scores_kernel_v2's on (B * n_head, T, T), x over keys j, y over queries i, z over
    b * n_head + h. A head is a view of qkv's columns: its strides are qkv's, nothing is copied.
    """
    j, i = cuda.grid(2)                          # x: key j, y: query i
    z, T = cuda.blockIdx.z, s.shape[1]           # grid layer z = b * n_head + h
    if causal and cuda.blockIdx.x > cuda.blockIdx.y:   # a tile right of the diagonal: all masked
        if i < T and j < T:
            s[z, i, j] = -math.inf
        return                                   # the whole block leaves: no barrier waits
    b, h = z // n_head, z % n_head
    d_k = qkv.shape[2] // (n_head + 2 * n_kv_head)   # qkv holds n_head + 2 n_kv_head heads side by side
    q_col, k_col = h * d_k, (n_head + h // (n_head // n_kv_head)) * d_k   # K's heads follow Q's
    acc = tile_dot(qkv[:, :, q_col:q_col + d_k], qkv[:, :, k_col:k_col + d_k], b, i, j)   # every thread
    if i < T and j < T:                          # edge blocks hang past T
        s[z, i, j] = np.float32(-math.inf) if causal and j > i else acc * inv_sqrt_dk


@cuda.jit
def qkv_weighted_sum_kernel(a, qkv, n_head, n_kv_head, causal, out):
    """Every head's output written straight into the merged layout, V read in place, no copy:
    out[b, i, h * d_k + c] = sum_j a[b * n_head + h, i, j] * V_g[j, c], g = h // (n_head // n_kv_head).

    a: (B * n_head, T, T) float32 weights, 0 above the diagonal when causal; qkv: as
    qkv_scores_kernel's; out: (B, T, n_head * d_k) float32, written. Grid and block:
    weighted_sum_grid(B * n_head, T, d_k). Causal: a block stops at its last query's last key.
    """
    col, row = cuda.grid(2)                      # col: a component c, row: a query i
    z, T = cuda.blockIdx.z, a.shape[1]
    b, h = z // n_head, z % n_head
    d_k = qkv.shape[2] // (n_head + 2 * n_kv_head)
    v_col = (n_head + n_kv_head + h // (n_head // n_kv_head)) * d_k   # V's heads follow K's
    k_end = T
    if causal:                                   # keys past the block's last query weigh 0
        k_end = min((cuda.blockIdx.y + 1) * projection.TILE, T)
    acc = tile_matmul(a[z, :, :k_end], qkv[b, :k_end, v_col:v_col + d_k], row, col)   # every thread
    if row < T and col < d_k:
        out[b, row, h * d_k + col] = acc         # head h's columns of the merged output


@cuda.jit
def qkv_av_kernel(a, qkv, n_head, n_kv_head, causal, out):
    """Every head's weighted sum, V read in place from qkv and the output written merged:
    out[b, i, h * d_k + c] = sum_j a[b * n_head + h, i, j] * V_g[j, c], g = h // (n_head // n_kv_head).

    a: (B * n_head, T, T) float32 weights, 0 above the diagonal when causal; qkv: (B, T, (n_head +
    2 n_kv_head) d_k) float32, [Q heads | K heads | V heads], V head g at columns v0 .. v0 + d_k - 1
    (v0 = (n_head + n_kv_head + g) d_k: an offset into qkv's rows, no copy); out: (B, T, n_head * d_k)
    float32, written; causal: bool. Grid: qkv_av_grid, B * n_head * ceil(T / TILE) * ceil(d_k / TILE)
    blocks of TILE x TILE threads along x; a block number counts the tiles of a head's columns
    fastest, then a's heads z = b * n_head + h, then the tiles of queries, so that neighbouring
    blocks read the same rows of weights. Each step loads a (TILE, TILE) tile of weights and one of values
    into shared memory, one element a thread; causal, a block stops after the key tile that holds
    its last query.
    """
    tiles = cuda.shared.array((2, TILE, TILE), float32)   # [0]: weights [query, key]; [1]: values [key, column]
    tx, ty, T, d_k = cuda.threadIdx.x, cuda.threadIdx.y, a.shape[1], qkv.shape[2] // (n_head + 2 * n_kv_head)
    col_tiles = (d_k + TILE - 1) // TILE                  # a block number: column tile, then a's head, then query tile
    z, row = cuda.blockIdx.x // col_tiles % a.shape[0], cuda.blockIdx.x // col_tiles // a.shape[0] * TILE + ty
    col, v0 = cuda.blockIdx.x % col_tiles * TILE + tx, (n_head + n_kv_head + z % n_head // (n_head // n_kv_head)) * d_k
    k_end, acc = min(T, row - ty + TILE) if causal else T, float32(0.0)   # causal: keys up to the block's last query
    for start in range(0, k_end, TILE):                   # the same steps for every thread of the block
        tiles[0, ty, tx] = a[z, row, start + tx] if row < T and start + tx < k_end else float32(0.0)
        tiles[1, ty, tx] = qkv[z // n_head, start + ty, v0 + col] if start + ty < k_end and col < d_k else float32(0.0)
        cuda.syncthreads()                                # both tiles loaded
        for j in range(TILE):                             # past an edge the tiles hold 0: adds nothing
            acc += tiles[0, ty, j] * tiles[1, j, tx]
        cuda.syncthreads()                                # all have read them: the next step overwrites
    if row < T and col < d_k:
        out[z // n_head, row, z % n_head * d_k + col] = acc   # head h's columns of the merged output


# --- Launchers ---------------------------------------------------------------------------

def head_grid(bh, T, d_k):
    """(grid, block) covering (bh, T, d_k): BLOCK-sized tiles of (c, t), one grid layer per head."""
    return (ceil_div(d_k, BLOCK[0]), ceil_div(T, BLOCK[1]), bh), BLOCK


def launch_heads(kernel, inputs, out, heads_shape):
    """Launch a split or merge kernel on device arrays; no checks (the launchers make them).

    heads_shape: (B, n_head, T, d_k), the shape of the per-head side of the copy.
    """
    B, n_head, T, d_k = heads_shape
    grid, block = head_grid(B * n_head, T, d_k)
    kernel[grid, block](inputs, out)


def _check_grid(B, n_head, T, d_k, what):
    require(B * n_head <= MAX_GRID_Z,
            f"{what}: batch x heads = {B * n_head} exceeds CUDA's {MAX_GRID_Z} grid layers; split the batch")
    grid, block = head_grid(B * n_head, T, d_k)
    check_grid(what, grid, x="d_k in tiles", y="T in tiles", z="batch x heads")
    check_simulator_budget(what, math.prod(grid) * math.prod(block))


def split_heads(x, n_head, kernel=None):
    """Cut the model width into heads on the device.

    x: (..., T, d_model) float; n_head: int dividing d_model
    -> (..., n_head, T, d_k) float32 with d_k = d_model / n_head; head h holds columns
    h*d_k .. (h+1)*d_k - 1 of x. kernel: one with split_heads_kernel's signature, launched the
    same way (a student's, for instance).
    """
    x = as_float32("x", x, "(..., T, d_model)", min_ndim=2)
    *lead, T, d_model = x.shape
    _, d_k = head_counts(d_model, n_head)
    B = math.prod(lead)
    _check_grid(B, n_head, T, d_k, "split_heads")
    kernel = split_heads_kernel if kernel is None else kernel
    d_out = cuda.device_array((B, n_head, T, d_k), np.float32)
    launch_heads(kernel, cuda.to_device(x.reshape(B, T, d_model)), d_out, d_out.shape)   # x: (B, T, d_model)
    return d_out.copy_to_host().reshape(*lead, n_head, T, d_k)              # (..., n_head, T, d_k)


def merge_heads(heads, kernel=None):
    """Put the heads side by side again on the device: the inverse of split_heads.

    heads: (..., n_head, T, d_k) float -> (..., T, n_head * d_k) float32. kernel: one with
    merge_heads_kernel's signature, launched the same way.
    """
    heads = as_float32("heads", heads, "(..., n_head, T, d_k)", min_ndim=3)
    *lead, n_head, T, d_k = heads.shape
    B = math.prod(lead)
    _check_grid(B, n_head, T, d_k, "merge_heads")
    kernel = merge_heads_kernel if kernel is None else kernel
    d_out = cuda.device_array((B, T, n_head * d_k), np.float32)
    heads = heads.reshape(B, n_head, T, d_k)                                  # (B, n_head, T, d_k)
    launch_heads(kernel, cuda.to_device(heads), d_out, heads.shape)
    return d_out.copy_to_host().reshape(*lead, T, n_head * d_k)             # (..., T, d_model)


def qkv_av_grid(B, T, n_head, d_k):
    """(grid, block) of a qkv_av_kernel launch: one block of TILE x TILE threads for each tile of queries
    and tile of a head's columns of every (sequence, head), B * n_head * ceil(T / TILE) * ceil(d_k / TILE)
    blocks along x. The kernel decides which block takes which tile."""
    return B * n_head * ceil_div(T, TILE) * ceil_div(d_k, TILE), (TILE, TILE)


def qkv_av(a, qkv, n_head, n_kv_head=None, causal=False, kernel=None):
    """Every head's weighted sum on the device, V read in place, the heads merged.

    a: (B * n_head, T, T) float weights (0 where j > i when causal, which is checked); qkv: (B, T,
    (n_head + 2 n_kv_head) d_k) float; n_kv_head: K/V heads (None: n_head) -> (B, T, n_head * d_k)
    float32. kernel: one with qkv_av_kernel's signature, launched the same way (qkv_av_grid).
    """
    a = as_float32("a", a, "(B * n_head, T, T)", ndim=3)
    qkv = as_float32("qkv", qkv, "(B, T, (n_head + 2 n_kv_head) d_k)", ndim=3)
    B, T, width = qkv.shape
    n_kv_head, _ = head_counts(n_head, n_head, n_kv_head)          # positive ints, n_kv_head dividing n_head
    require(isinstance(causal, (bool, np.bool_)), f"causal must be True or False, got {causal!r}")
    require(width % (n_head + 2 * n_kv_head) == 0,
            f"qkv must have a last axis of (n_head + 2 n_kv_head) d_k, a multiple of {n_head + 2 * n_kv_head}; "
            f"got shape {qkv.shape}")
    require(a.shape == (B * n_head, T, T),
            f"a must have shape (B * n_head, T, T) = {(B * n_head, T, T)}; got shape {a.shape}")
    require(not (causal and np.triu(a, 1).any()), "a must be 0 where j > i when causal=True")
    d_k = width // (n_head + 2 * n_kv_head)
    grid, block = qkv_av_grid(B, T, n_head, d_k)
    check_grid("qkv_av", grid, x="batch x heads x tiles of T x tiles of d_k")
    check_simulator_budget("qkv_av", grid * TILE * TILE, B * n_head * T * T * d_k)
    d_out = cuda.device_array((B, T, n_head * d_k), np.float32)
    kernel = qkv_av_kernel if kernel is None else kernel
    kernel[grid, block](cuda.to_device(a), cuda.to_device(qkv), n_head, n_kv_head, causal, d_out)
    return d_out.copy_to_host()                                     # (B, T, d_model)


def launch_layer(x, w_qkv, b_qkv, w_o, b_o, n_head, causal, n_kv_head=None):
    """The whole layer on device arrays in five launches, no checks (multi_head_attention makes them):
    x (B, T, d_model), w_qkv (d_model, (n_head + 2 n_kv_head) d_k) = [W_Q | W_K | W_V], b_qkv of its width or
    (0,), w_o, b_o alike -> new (B, T, d_model); float32. Heads are read in place, never split or merged."""
    n_kv_head = n_head if n_kv_head is None else n_kv_head
    (B, T, d_model), width = x.shape, w_qkv.shape[1]
    qkv = cuda.device_array((B * T, width), np.float32)           # [Q | K | V] of every position
    projection.launch_version(PROJECTION_VERSION, x.reshape(B * T, d_model), w_qkv, b_qkv, qkv)
    qkv = qkv.reshape(B, T, width)
    s = cuda.device_array((B * n_head, T, T), np.float32)         # every head's scores
    grid, block = scores.score_grid(B * n_head, T, T)
    qkv_scores_kernel[grid, block](qkv, n_head, n_kv_head, scores.scale_factor(d_model // n_head), causal, s)
    a = attention.launch_row_softmax(s)                           # (B * n_head, T, T) weights
    merged = cuda.device_array((B * T, d_model), np.float32)      # the heads side by side
    grid, block = weighted_sum.weighted_sum_grid(B * n_head, T, d_model // n_head)
    qkv_weighted_sum_kernel[grid, block](a, qkv, n_head, n_kv_head, causal, merged.reshape(B, T, d_model))
    out = cuda.device_array((B * T, d_model), np.float32)
    projection.launch_version(PROJECTION_VERSION, merged, w_o, b_o, out)   # W_O (+ b_O)
    return out.reshape(B, T, d_model)


def layer_threads(B, T, d_model, n_head, n_kv_head=None):
    """CUDA threads launch_layer starts, all launches together (for the simulator's budget)."""
    d_k = d_model // n_head
    n_kv_head = n_head if n_kv_head is None else n_kv_head
    projections = sum(math.prod(grid) * math.prod(block) for grid, block in
                      (projection.projection_grid_of(PROJECTION_VERSION, B * T, (n_head + 2 * n_kv_head) * d_k),
                       projection.projection_grid_of(PROJECTION_VERSION, B * T, d_model)))
    bh = B * n_head
    heads = (math.prod(scores.score_grid(bh, T, T)[0]) * scores.TILE ** 2
             + math.prod(softmax.softmax_grid(bh * T, attention.SOFTMAX_VERSION))
             + math.prod(weighted_sum.weighted_sum_grid(bh, T, d_k)[0]) * weighted_sum.TILE ** 2)
    return projections + heads


def _layer_weights(arrays, d_model, n_head, n_kv_head):
    """The layer's weights and biases {"w_q": ..., "b_o": ...} (a bias may be None), checked:
    W_Q, W_O (d_model, d_model); W_K, W_V (d_model, n_kv_head * d_k); b_Q, b_O (d_model,); b_K,
    b_V (n_kv_head * d_k,) -> the same dict, float32."""
    d_k, gqa = d_model // n_head, n_kv_head != n_head
    kv = (n_kv_head * d_k, "n_kv_head * d_k" if gqa else "d_model")
    widths = {"q": (d_model, "d_model"), "o": (d_model, "d_model"), "k": kv, "v": kv}
    why = "d_model = the last axis of x" + (f", n_kv_head * d_k = {n_kv_head} x {d_k}" if gqa else "")
    checked = {}
    for name, array in arrays.items():
        width, words = widths[name[-1]]
        shape, hint = ((d_model, width), f"(d_model, {words})") if name[0] == "w" else ((width,), f"({words},)")
        checked[name] = None if array is None else weight(name, array, shape, hint, why)
    return checked


def _fused_bias(biases, widths):
    """The biases side by side, zeros for a missing one (adding 0.0 changes no value); an empty
    (0,) array, the projection kernels' "no bias", when all are missing."""
    if all(b is None for b in biases):
        return np.zeros(0, np.float32)
    return np.concatenate([np.zeros(n, np.float32) if b is None else b for b, n in zip(biases, widths)])


def multi_head_attention(x, w_q, w_k, w_v, w_o, n_head, causal=True,
                         b_q=None, b_k=None, b_v=None, b_o=None, n_kv_head=None):
    """A whole multi-head self-attention layer on the device.

    x: (T, d_model) or (B, T, d_model) float; w_q, w_o: (d_model, d_model) float, used as x @ W;
    w_k, w_v: (d_model, n_kv_head * d_k), d_k = d_model / n_head; b_q, b_o: (d_model,), b_k, b_v:
    (n_kv_head * d_k,) float or None; n_head: int dividing d_model; n_kv_head: key/value heads,
    dividing n_head (None: n_head; fewer: grouped-query attention, query head h reads key/value
    head h // (n_head // n_kv_head); 1: multi-query attention); causal: each position sees only
    itself and the past -> the shape of x, float32.
    Steps (launch_layer): one fused projection [Q | K | V] = x @ [W_Q | W_K | W_V] (+ biases);
    Q, K and V split into heads; attention for every head of every sequence at once (the head
    on the grid's z axis); the heads merged; the output projection with W_O (+ b_O).
    """
    x = as_float32("x", x, "(T, d_model) or (B, T, d_model)", min_ndim=2)
    require(x.ndim <= 3, f"x must have shape (T, d_model) or (B, T, d_model), got shape {x.shape}")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be True or False, got {type(causal).__name__} {causal!r}")
    T, d_model = x.shape[-2:]
    n_kv_head, d_k = head_counts(d_model, n_head, n_kv_head)
    p = _layer_weights({"w_q": w_q, "w_k": w_k, "w_v": w_v, "w_o": w_o,
                        "b_q": b_q, "b_k": b_k, "b_v": b_v, "b_o": b_o}, d_model, n_head, n_kv_head)
    x3 = x.reshape(-1, T, d_model)                                 # (B, T, d_model); B = 1 for (T, d_model)
    # The whole layer's estimate first: _check_grid's covers the head copies only.
    B = x3.shape[0]
    madds = (B * T * d_model * (2 * d_model + 2 * n_kv_head * d_k)       # Q, K, V and the output projection
             + attention.pipeline_madds(B * n_head, T, T, d_k, d_k))
    check_simulator_budget("multi_head_attention", layer_threads(B, T, d_model, n_head, n_kv_head), madds)
    _check_grid(x3.shape[0], n_head, T, d_k, "multi_head_attention")
    widths = (d_model, n_kv_head * d_k, n_kv_head * d_k)
    w_qkv = np.concatenate([p["w_q"], p["w_k"], p["w_v"]], axis=1)           # (d_model, d_model + 2 n_kv_head d_k)
    b_qkv = _fused_bias([p["b_q"], p["b_k"], p["b_v"]], widths)             # (that width,) or (0,)
    b_o = _fused_bias([p["b_o"]], (d_model,))                                # (d_model,) or (0,)
    out = launch_layer(cuda.to_device(x3), cuda.to_device(w_qkv), cuda.to_device(b_qkv),
                       cuda.to_device(p["w_o"]), cuda.to_device(b_o), n_head, causal, n_kv_head)
    out = out.copy_to_host().reshape(x.shape)                      # (T, d_model) or (B, T, d_model)
    return require_finite_result("multi_head_attention", out, "x or the weights")
