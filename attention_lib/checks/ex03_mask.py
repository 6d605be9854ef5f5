"""Notebook 03's exercises: the in-place causal mask, then the tile-skip test of a fused kernel.

``03_causal_mask`` (warm-up): the answer has mask_kernel's signature ``(s, window)`` and is launched on the library's
grid over random finite scores, with window 0 (none) and, in the last cases, a sliding window. A wrong
answer is compared with the usual wrong masks, by which entries
it changed: ``mask_not_applied`` (none), ``mask_includes_diagonal`` (j >= i: a position may
not even see itself), ``mask_wrong_side`` (the past masked instead of the future),
``mask_ignores_offset`` (j > i when T_k > T_q: the queries are the last T_q positions), and
``mask_value_not_neg_inf`` (the right entries, but set to something else than -inf, such as
-1e9 or 0), ``grid_axes_swapped`` (i taken from the grid's x: with T_q much larger than
T_k, whole rows are never reached, and on a GPU neighbouring threads would write addresses a
row apart, uncoalesced), ``mask_ignores_window`` (only the future masked when a window was given).

``03_tile_skip`` (main): a fused scores kernel for a sliding-window causal mask (query i sees
keys j with i + off - window < j <= i + off, off = T_k - T_q) calls the student's device
function ``tile_is_masked(row_block, col_block, t_q, t_k, window)`` and skips every tile it
says is wholly masked. The check runs the kernel, records which tiles it skipped, and
compares them with the tiles that are wholly masked: ``skips_visible_tile`` (a skipped tile
holds a visible score) and ``skips_too_few`` (the values are right, but fewer tiles were
skipped than could be; the message says which kind was missed).
"""

import math

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import scores
from attention_lib.stages.scores import TILE, tile_dot
from attention_lib.checks.engine import Diagnosed, Exercise, output_array, read_output, register


def _run_mask(kernel, case, rng, launch):
    bh, t_q, t_k, window = case
    s = rng.standard_normal((bh, t_q, t_k)).astype(np.float32)
    # The scores, then a guard zone that catches writes past the end on a real GPU.
    full, d_s = output_array(s.shape, guard=scores.TILE * scores.TILE)
    d_s.copy_to_device(s)                                # (BH, T_q, T_k), masked in place
    grid, block = scores.score_grid(bh, t_q, t_k)
    launch(kernel, grid, block, d_s, np.int32(window))
    return read_output(full, d_s), reference.apply_causal_mask(s, window or None), s, window


def _diagnose(got, expected, s, window):
    """Name the mistake from the set of entries the answer changed; None when it is none of them."""
    t_q, t_k = s.shape[-2:]
    offset = t_k - t_q
    i, j = np.arange(t_q)[:, None], np.arange(t_k)[None, :]
    changed = got != s                                  # (BH, T_q, T_k)
    grid_x, grid_y, _ = scores.score_grid(1, t_q, t_k)[0]
    reached = (i < grid_x * TILE) & (j < grid_y * TILE)     # where threads with i from x, j from y land
    future = j > i + offset
    if not reached.all() and np.array_equal(changed, (future & reached)[None].repeat(len(got), 0)):
        return "grid_axes_swapped", ("i was taken from the grid's x axis: the grid's x runs over keys "
                                     "(columns), y over queries (rows), so with more queries than keys "
                                     "whole rows were never reached; on a GPU such threads would also "
                                     "write addresses a row apart (uncoalesced)")
    if not changed.any():
        return "mask_not_applied", "no score was changed: write -inf where j > i + (T_k - T_q)"
    if not (changed == changed[0]).all():
        return None                                     # heads differ: the engine shows where
    changed = changed[0]                                # (T_q, T_k), the same in every head
    if window:
        if np.array_equal(changed, future):
            return "mask_ignores_window", (f"only the future was masked: with window = {window}, query i also may "
                                           "not see keys j <= i + (T_k - T_q) - window, too far behind it")
        return None                                     # the cases without a window named the rest
    if np.array_equal(changed, j > i + offset) and not np.isneginf(got[..., j > i + offset]).all():
        value = got[..., j > i + offset][~np.isneginf(got[..., j > i + offset])][0]
        return "mask_value_not_neg_inf", (f"the right scores were masked, but with {value:.6g}; use -math.inf, "
                                          "which softmax turns into exactly 0")
    if np.array_equal(changed, j >= i + offset):
        return "mask_includes_diagonal", ("the diagonal is masked too (j >= i): a position may see itself; "
                                          "mask only j > i + (T_k - T_q)")
    if np.array_equal(changed, j < i + offset) or np.array_equal(changed, j <= i + offset):
        return "mask_wrong_side", ("the past is masked instead of the future: key j is hidden from "
                                   "query i when j > i + (T_k - T_q)")
    if offset and np.array_equal(changed, j > i):
        return "mask_ignores_offset", (f"T_k = {t_k} keys but T_q = {t_q} queries: the queries are the "
                                       f"last {t_q} positions, so query i sits at i + {offset}; mask j > i + (T_k - T_q)")
    return None


register(Exercise(
    exercise_id="03_causal_mask",
    title="s[h, i, j] = -inf where j > i + (T_k - T_q), or j <= i + (T_k - T_q) - window, in place",
    kind="kernel",
    run=_run_mask,
    # (BH, T_q, T_k): one score; 7 x 7 (less than a block); 33 x 33 (a partly used last block,
    # several heads); then 5 queries against 9 keys, as when decoding with a cache; then 40
    # queries against 5 keys (rows 0..34 fully masked), where swapped grid axes miss rows; then
    # sliding windows: 4 over 19 x 19, and 3 with 5 queries against 12 keys.
    cases=[(1, 1, 1, 0), (2, 7, 7, 0), (3, 33, 33, 0), (2, 5, 9, 0), (1, 40, 5, 0), (2, 19, 19, 4), (1, 5, 12, 3)],
    describe_case=lambda c: f"BH = {c[0]}, T_q = {c[1]}, T_k = {c[2]}" + (f", window = {c[3]}" if c[3] else ""),
    hint=("one thread per score: a thread whose key lies in its query's future (or, with a window, "
          "too far in its past) overwrites its score with minus infinity, every other thread leaves "
          "its score alone"),
    more_hints=("where it goes wrong: with T_k keys and T_q queries the queries are the last T_q "
                "positions, so the diagonal is shifted by T_k - T_q; the diagonal itself stays visible; "
                "the grid's x axis is the key",),
    rtol=0.0,   # a mask moves no value: every score is either kept exactly or -inf
    atol=0.0,
    diagnose=_diagnose,
    diagnoses=('mask_includes_diagonal', 'mask_wrong_side', 'mask_not_applied', 'mask_ignores_offset',
               'mask_value_not_neg_inf', 'grid_axes_swapped', 'mask_ignores_window'),
))


# --- The main exercise: which tiles a sliding-window kernel may skip ------------------------

def wholly_masked_tiles(visible, tile=TILE):
    """(row blocks, col blocks) bool: True for the tiles of `visible` in which no score is visible."""
    t_q, t_k = visible.shape
    rows, cols = ceil_div(t_q, tile), ceil_div(t_k, tile)
    padded = np.zeros((rows * tile, cols * tile), bool)
    padded[:t_q, :t_k] = visible
    return ~padded.reshape(rows, tile, cols, tile).any(axis=(1, 3))


_KERNELS = {}


def window_kernel(tile_is_masked):
    """The fused sliding-window scores kernel, calling `tile_is_masked`; one kernel per device function.

    Arguments (q, k, inv_sqrt_dk, window, s, skipped): q (BH, T_q, d_k), k (BH, T_k, d_k)
    float32; window: int; s (BH, T_q, T_k) float32, written; skipped (BH, row blocks, col
    blocks) int32, set to 1 by each block that skipped its tile. Grid and block as
    scores.score_grid.
    """
    if tile_is_masked not in _KERNELS:
        @cuda.jit
        def kernel(q, k, inv_sqrt_dk, window, s, skipped):
            j, i = cuda.grid(2)
            h = cuda.blockIdx.z
            t_q, t_k = s.shape[1], s.shape[2]
            offset = t_k - t_q
            if tile_is_masked(cuda.blockIdx.y, cuda.blockIdx.x, t_q, t_k, window):
                # the same answer for the whole block: all of it leaves, none waits at a barrier
                if cuda.threadIdx.x == 0 and cuda.threadIdx.y == 0:
                    skipped[h, cuda.blockIdx.y, cuda.blockIdx.x] = 1
                if i < t_q and j < t_k:
                    s[h, i, j] = -math.inf
                return
            acc = tile_dot(q, k, h, i, j)              # every thread of the block: it has barriers
            if i < t_q and j < t_k:
                if j <= i + offset and j > i + offset - window:
                    s[h, i, j] = acc * inv_sqrt_dk
                else:
                    s[h, i, j] = -math.inf
        _KERNELS[tile_is_masked] = kernel
    return _KERNELS[tile_is_masked]


def _run_tile_skip(tile_is_masked, case, rng, launch):
    bh, t_q, t_k, window = case
    d_k = 5
    q = rng.standard_normal((bh, t_q, d_k)).astype(np.float32)
    k = rng.standard_normal((bh, t_k, d_k)).astype(np.float32)
    grid, block = scores.score_grid(bh, t_q, t_k)
    full, s = output_array((bh, t_q, t_k), guard=0)
    skipped = cuda.to_device(np.zeros((bh, grid[1], grid[0]), np.int32))
    launch(window_kernel(tile_is_masked), grid, block, cuda.to_device(q), cuda.to_device(k),
           scores.scale_factor(d_k), window, s, skipped)
    visible = reference.causal_mask(t_q, t_k, window)
    expected = np.where(visible, reference.scores(q, k), -np.inf)
    _judge_skipped(skipped.copy_to_host().astype(bool), visible, t_q, t_k, window)
    return read_output(full, s), expected


def _judge_skipped(skipped, visible, t_q, t_k, window):
    """Compare the tiles each head skipped with the wholly masked ones; raise Diagnosed if they differ."""
    masked = wholly_masked_tiles(visible)
    if not (skipped == skipped[0]).all():
        raise Diagnosed("skips_visible_tile", "the heads skipped different tiles: the test may use only its arguments")
    skipped = skipped[0]
    wrong = skipped & ~masked
    if wrong.any():
        r, c = (int(v) for v in np.argwhere(wrong)[0])
        raise Diagnosed("skips_visible_tile", (
            f"tile (row block {r}, col block {c}) was skipped but holds a visible score: "
            "test the tile's corner that is closest to being visible, for each side of the band"))
    if (masked & ~skipped).any():
        future = wholly_masked_tiles(reference.causal_mask(t_q, t_k))   # the causal mask alone
        missed = masked & ~skipped
        kind = ("before the window (too far in the past)" if not (missed & future).any()
                else "above the diagonal (in the future)")
        raise Diagnosed("skips_too_few", (
            f"the values are right, but {int(skipped.sum())} of the {int(masked.sum())} wholly masked tiles "
            f"were skipped; the ones missed lie {kind}"))


TILE_SKIP_CASES = [(1, 1, 1, 1), (2, 9, 33, 5), (1, 40, 40, 7), (1, 33, 17, 40)]

register(Exercise(
    exercise_id="03_tile_skip",
    title="tile_is_masked(row_block, col_block, t_q, t_k, window): may a sliding-window kernel skip this tile?",
    kind="device function",
    run=_run_tile_skip,
    # (BH, T_q, T_k, window): one score; 9 queries against 33 keys (offset 24), a narrow window,
    # two heads; 40 x 40 with tiles skipped on both sides of the band; 33 queries against 17
    # keys with a window wider than the context: the plain causal mask, rows 0..15 fully masked.
    cases=TILE_SKIP_CASES,
    describe_case=lambda c: f"BH = {c[0]}, T_q = {c[1]}, T_k = {c[2]}, window = {c[3]}",
    hint=("a tile may be skipped when even its most favourable score is masked: find, for each edge "
          "of the visible band, the corner of the tile that comes closest to it"),
    more_hints=(
        "where it goes wrong: the queries are the last T_q positions, so every query sits T_k - T_q "
        "places to the right of its row number; and a tile's score nearest the future edge is in its "
        "last row, not its first",
        "and the band has two edges: the future (keys after the query's position) and the past (keys a "
        "whole window or more behind it); a tile wholly beyond either edge is skipped"),
    rtol=1e-5,    # float32 sums of 5 products of standard normals, against float64
    atol=1e-5,
    diagnoses=("skips_visible_tile", "skips_too_few"),
))
