"""The causal mask (notebook 03): query i may not look at any key j after it.

A masked score is -inf, so that softmax turns it into exactly 0 (exp(-inf) = 0). With T_k keys
and T_q queries, the queries are the *last* T_q positions (as when decoding with a cache):
query i sits at position i + (T_k - T_q) and key j is masked when j > i + (T_k - T_q). A query
whose every key is masked (possible when T_q > T_k) gets an all -inf row, which the library's
softmax turns into all-zero weights (it attends to nothing), never NaN.

A sliding window is an option of the causal mask (Mistral-style models): with `window` W, query
i sees only the last W positions up to its own, keys i + off - W < j <= i + off (off = T_k -
T_q), so each query costs at most W keys however long the context.

- NumPy reference: ``attention_lib.reference.causal_mask`` and ``apply_causal_mask`` (both with
  ``window=``: the one definition of the window).
- ``mask_kernel``: masks a scores matrix in place, one thread per score, with or without a
  window.
- ``causal_scores_kernel``: the tiled scores kernel of ``scores.py`` with the mask fused in. A
  tile of S wholly above the diagonal (a test of blockIdx only, so the same answer for every
  thread of a block: the whole block leaves, none waits at a barrier of ``tile_dot``) is written
  as -inf without loading q or k or computing a dot product: for T much larger than TILE,
  almost half of the work.
- ``tile_is_masked`` + ``window_scores_kernel``: the same with a sliding window, skipping the
  tiles wholly before the window too.
- ``causal_tile_counts``: how many tiles the fused kernels compute and skip; ``visible_count``,
  ``first_visible``, ``block_key_tiles``, ``band_key_tiles``: the same key counts and tile
  skipping on the host for every tiled kernel (flash's too).
- Launchers ``apply_causal_mask(s, window=None)`` and ``causal_scores(q, k, scale=True,
  window=None)``.

The window's conventions: on the host a window is None (none) or an int >= 1, the keys a query
sees, itself included (``reference.check_window`` refuses anything else, 0 too); a kernel takes
an int32 where 0 stands for None, since a kernel argument cannot be None.
"""

import math

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.platform.launch import ceil_div, check_grid, check_simulator_budget
from attention_lib.stages.scores import TILE, flatten_qk, launch_scores, scale_factor, score_grid, tile_dot
from attention_lib.platform.validation import as_float32


# --- Kernels -----------------------------------------------------------------------------

@cuda.jit
def mask_kernel(s, window):
    """Causal mask in place: s[h, i, j] = -inf where j > i + (T_k - T_q), and with a sliding
    window (window >= 1; 0 for none) also where j <= i + (T_k - T_q) - window; one thread per score.

    s: (BH, T_q, T_k) float32; window: int32. Grid as for the scores kernels: x over keys j,
    y over queries i, z over heads h. Scores that stay are neither read nor written.
    """
    _, t_q, t_k = s.shape                              # (BH, T_q, T_k)
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < t_q and j < t_k:                            # bounds first
        position = i + (t_k - t_q)                     # where query i sits
        if j > position or (window > 0 and j <= position - window):   # the future, or too old
            s[h, i, j] = -math.inf


@cuda.jit
def causal_scores_kernel(q, k, inv_sqrt_dk, s):
    """Causal scores in one pass: scores_kernel_v2 (same arguments, grid and block) with the mask
    fused in. A tile wholly in the future writes -inf and leaves without reading q or k; a tile
    on the diagonal computes its scores, then masks j > i + (T_k - T_q).
    """
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    t_q, t_k = s.shape[1], s.shape[2]
    last_row = min((cuda.blockIdx.y + 1) * TILE, t_q) - 1   # the tile's last real query
    first_col = cuda.blockIdx.x * TILE                      # the tile's first key
    if first_col > last_row + (t_k - t_q):  # even its nearest score is in the future; blockIdx only, so
        if j < t_k:                         # the whole block leaves, loading nothing. Every i < T_q: the
            s[h, i, j] = -math.inf          # last row of tiles is never skipped (its last query sees T_k - 1)
        return
    acc = tile_dot(q, k, h, i, j)           # every thread of the block calls it: it has barriers
    if i < t_q and j < t_k:                 # a diagonal tile masks its upper part, the future
        s[h, i, j] = -math.inf if j > i + (t_k - t_q) else acc * inv_sqrt_dk


@cuda.jit(device=True)
def tile_is_masked(row_block, col_block, t_q, t_k, window):
    """True when no score of the tile (row_block, col_block) of the (t_q, t_k) scores is visible.

    The tile holds rows row_block * TILE .. and columns col_block * TILE .. (cut at t_q and t_k);
    query i sees key j when i + off - window < j <= i + off, off = t_k - t_q, and a window of
    0 means none (the causal mask alone). The same answer for every thread of a block.
    """
    offset = t_k - t_q
    first_row, first_col = row_block * TILE, col_block * TILE
    last_row = min(first_row + TILE, t_q) - 1
    last_col = min(first_col + TILE, t_k) - 1
    in_the_future = first_col > last_row + offset                  # even the nearest key is ahead
    too_far_back = window > 0 and last_col <= first_row + offset - window   # even the latest is too old
    return in_the_future or too_far_back


@cuda.jit
def window_scores_kernel(q, k, inv_sqrt_dk, window, s):
    """causal_scores_kernel with a sliding window (window >= 1; 0 for none): a block whose tile
    holds no visible score (tile_is_masked: wholly in the future, or wholly before the window)
    writes -inf and leaves without reading q or k; the others compute and mask score by score.

    q: (BH, T_q, d_k), k: (BH, T_k, d_k), s: (BH, T_q, T_k) float32; window: int32. Grid and
    block as scores_kernel_v2.
    """
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    t_q, t_k = s.shape[1], s.shape[2]
    if tile_is_masked(cuda.blockIdx.y, cuda.blockIdx.x, t_q, t_k, window):   # the same for the whole block
        if i < t_q and j < t_k:
            s[h, i, j] = -math.inf
        return
    acc = tile_dot(q, k, h, i, j)          # called by every thread of the block: it has barriers
    if i < t_q and j < t_k:
        position = i + (t_k - t_q)         # where query i sits
        visible = j <= position and (window == 0 or j > position - window)
        s[h, i, j] = acc * inv_sqrt_dk if visible else -math.inf


# --- Launchers ---------------------------------------------------------------------------

def launch_mask(kernel, s, window=None):
    """One in-place mask launch on the device array s (BH, T_q, T_k) float32; `kernel`: any with
    mask_kernel's signature, launched on score_grid (one thread per score)."""
    grid, block = score_grid(*s.shape)
    kernel[grid, block](s, np.int32(window or 0))


def apply_causal_mask(s, window=None, kernel=None):
    """Scores with every future key set to -inf, on the device; `s` itself is left unchanged.

    s: (..., T_q, T_k) float (-inf allowed: already masked scores) -> (..., T_q, T_k) float32.
    window: a sliding window (an int >= 1: keys more than window - 1 positions behind the query
    are masked too, as reference.causal_mask), or None. kernel: any kernel with
    mask_kernel's signature (default mask_kernel).
    """
    window = reference.check_window(window)
    s = as_float32("s", s, "(..., T_q, T_k)", min_ndim=2, allow_neg_inf=True)
    t_q, t_k = s.shape[-2:]
    bh = math.prod(s.shape[:-2])
    grid, block = score_grid(bh, t_q, t_k)
    check_grid("apply_causal_mask", grid, x="s's T_k in tiles of 16", y="s's T_q in tiles of 16", z="s's batch x heads")
    check_simulator_budget("apply_causal_mask", math.prod(grid) * math.prod(block))
    d_s = cuda.to_device(s.reshape(bh, t_q, t_k))      # (BH, T_q, T_k): a copy, masked in place
    launch_mask(mask_kernel if kernel is None else kernel, d_s, window)
    return d_s.copy_to_host().reshape(s.shape)


def causal_scores(q, k, scale=True, window=None, kernel=None):
    """Masked attention scores in one launch: q @ k^T (/ sqrt(d_k)), -inf where j > i + T_k - T_q
    (and, with a sliding window, where j <= i + T_k - T_q - window).

    q: (..., T_q, d_k) float; k: (..., T_k, d_k) float, same leading axes -> (..., T_q, T_k)
    float32. window: an int >= 1 (as reference.causal_mask) or None. kernel: any kernel with the
    signature of causal_scores_kernel, or with a window of window_scores_kernel (the defaults).
    """
    window = reference.check_window(window)
    q3, k3, lead = flatten_qk(q, k, "causal_scores")
    (bh, t_q, d_k), t_k = q3.shape, k3.shape[1]
    d_s = cuda.device_array((bh, t_q, t_k), np.float32)
    d_q, d_k3, scale = cuda.to_device(q3), cuda.to_device(k3), scale_factor(d_k, scale)
    if window is None:
        launch_scores(causal_scores_kernel if kernel is None else kernel, d_q, d_k3, scale, d_s)
    else:
        grid, block = score_grid(bh, t_q, t_k)
        (window_scores_kernel if kernel is None else kernel)[grid, block](d_q, d_k3, scale, np.int32(window), d_s)
    return d_s.copy_to_host().reshape(*lead, t_q, t_k)                # (..., T_q, T_k)


# --- Counting the work -------------------------------------------------------------------

def causal_tile_counts(t_q, t_k=None, tile=TILE, window=None):
    """Tiles of one head's (t_q, t_k) scores: (computed, skipped) by causal_scores_kernel, or with
    a sliding window by window_scores_kernel.

    A tile is skipped when its first key comes after its last query (the kernel's own test):
    per row of tiles, those past the last query's last visible key (block_key_tiles); with a
    window also those before its first query's first visible key (band_key_tiles).
    """
    t_k = t_q if t_k is None else t_k
    computed = sum(tiles for _, _, _, tiles in band_key_tiles(t_q, t_k, True, window, tile, tile))
    return computed, ceil_div(t_q, tile) * ceil_div(t_k, tile) - computed


def visible_count(i, t_q, t_k, causal):
    """visible_keys on the host: how many keys query i sees (0 .. T_k)."""
    return t_k if not causal else max(0, min(t_k, i + (t_k - t_q) + 1))


def first_visible(i, t_q, t_k, window=None):
    """first_key on the host: the first key query i sees (0 without a window, None)."""
    return 0 if window is None else max(0, i + (t_k - t_q) - window + 1)


def block_key_tiles(t_q, t_k, causal, block_q, block_k):
    """The causal tile skipping of a tiled kernel, one head: [(q0, rows, tiles), ...], one entry
    per block of block_q queries (q0 its first query, rows how many it has), where `tiles` is how
    many key tiles of block_k it computes: those up to its last query's last visible key. The
    other ceil(T_k / block_k) - tiles are skipped; none of their keys is visible to the block.
    """
    return [(q0, min(block_q, t_q - q0),
             ceil_div(visible_count(min(q0 + block_q, t_q) - 1, t_q, t_k, causal), block_k))
            for q0 in range(0, t_q, block_q)]


def band_key_tiles(t_q, t_k, causal, window, block_q, block_k):
    """block_key_tiles with a sliding window (None: none), as block_band skips tiles, one head:
    [(q0, rows, first, tiles), ...], where the block of queries q0 .. q0 + rows - 1 loads the
    key tiles first .. first + tiles - 1 of block_k: from the one holding its first query's first
    visible key to the one holding its last query's last. No key of the others is visible to it.
    """
    return [(q0, rows, first_visible(q0, t_q, t_k, window) // block_k,
             tiles - first_visible(q0, t_q, t_k, window) // block_k)
            for q0, rows, tiles in block_key_tiles(t_q, t_k, causal, block_q, block_k)]
