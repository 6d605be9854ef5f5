"""Notebook 03's exercises: ``03_causal_mask`` (warm-up), a kernel ``(s, window)`` writing -inf in place
over the scores the causal mask, and a sliding window (0: none), hide (``mask.mask_kernel``);
``03_causal_scores`` (main), the fused causal scores kernel, tile_dot given, whose blocks leave
early from tiles wholly in the future (``mask.causal_scores_kernel``); ``03_tile_skip``, the device
function ``tile_is_masked(row_block, col_block, t_q, t_k, window)``, run inside the library's
window_scores_kernel (``mask.tile_is_masked``). Their cases and named mistakes are declared in the
Exercises below.
"""

import numpy as np

from attention_lib import reference
from attention_lib.platform.launch import ceil_div
from attention_lib.platform.rebuild import rebuilt
from attention_lib.stages import mask, scores
from attention_lib.stages.scores import TILE
from attention_lib.checks import cases
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import host_output, output_array, read_output, traced_launch, unwritten
from attention_lib.checks.result import Diagnosed
from attention_lib.checks.limits import Coalesced


def _run_mask(kernel, case, rng, launch):
    bh, t_q, t_k, window = case
    s = rng.standard_normal((bh, t_q, t_k)).astype(np.float32)
    # The scores, then a guard zone that catches writes past the end on a real GPU.
    full, d_s = output_array(s.shape, guard=scores.TILE * scores.TILE)
    d_s.copy_to_device(s)                                # (BH, T_q, T_k), masked in place
    grid, block = scores.score_grid(bh, t_q, t_k)
    launch(kernel, grid, block, d_s, np.int32(window))
    return read_output(full, d_s), reference.apply_causal_mask(s, window or None), s, window


def _masked_by(t_q, t_k, window):
    """(T_q, T_k) bool: the scores a sliding window of `window` (0: all of them) hides."""
    return np.ones((t_q, t_k), bool) if window < 1 else ~reference.causal_mask(t_q, t_k, window)


def _diagnose_mask(got, expected, s, window):
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
        if any(np.array_equal(changed, _masked_by(t_q, t_k, w)) for w in (window - 1, window + 1)):
            return "window_off_by_one", (f"the band is one key off: a window of {window} shows {window} keys, the "
                                         f"query's own included, so key j is hidden when j <= i + (T_k - T_q) - window")
        return None                                     # the cases without a window named the rest
    literal = [_masked_by(t_q, t_k, w) for w in range(0, t_k + 1)]
    if any(np.array_equal(changed, m) for m in literal if not np.array_equal(m, future)):
        return "window_zero_not_none", ("with window = 0, scores behind the query were masked too: 0 means no "
                                        "window at all (the plain causal mask), not a window of 0 keys")
    if np.array_equal(changed, future) and not np.isneginf(got[..., future]).all():
        value = got[..., future][~np.isneginf(got[..., future])][0]
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
    kind="kernel",
    run=_run_mask,
    # (BH, T_q, T_k, window): 7 x 7 (less than a block) first, where every wrong mask below
    # changes a different set of scores (on one score, masking the diagonal and taking window 0
    # for a window of no keys look alike); one score; 5 queries against 9 keys, as when decoding
    # with a cache; 40 queries against 5 keys (rows 0..34 fully masked), where swapped grid axes miss
    # rows (before a square size, where they are only uncoalesced); 33 x 33 (a partly used last
    # block, several heads); then sliding
    # windows: 4 over 19 x 19, 1 (each query sees itself only), and 3 with 5 queries against 12 keys.
    cases=[(2, 7, 7, 0), (1, 1, 1, 0), (2, 5, 9, 0), (1, 40, 5, 0), (3, 33, 33, 0), (2, 19, 19, 4),
           (1, 6, 6, 1), (1, 5, 12, 3)],
    describe_case=lambda c: f"BH = {c[0]}, T_q = {c[1]}, T_k = {c[2]}, window = {c[3]}",
    hint=("one thread per score: a thread whose key the mask hides from its query overwrites its score "
          "with minus infinity, every other thread leaves its score alone"),
    more_hints=(
        "the plan: take the key from the grid's x, the query from its y and the head from the block's z; a "
        "thread past an edge of s does nothing; the others find the position their query sits at (the "
        "queries are the last T_q positions, so query i sits T_k - T_q places further on) and hide the key "
        "when it lies after that position or, with a window, a whole window or more behind it",
        "where answers go wrong: the diagonal itself stays visible; a window of W shows W keys, the query's "
        "own included, and a window of 0 means none; the grid's x axis is the key; a large negative number "
        "is not minus infinity"),
    rtol=0.0,   # a mask moves no value: every score is either kept exactly or -inf
    atol=0.0,
    diagnose=_diagnose_mask,
    diagnoses=("mask_includes_diagonal", "mask_wrong_side", "mask_not_applied", "mask_ignores_offset",
               "mask_value_not_neg_inf", "grid_axes_swapped", "mask_ignores_window", "window_off_by_one",
               "window_zero_not_none"),
    # A warp of a 16 x 16 block is two rows of 16 threads: its stores along the keys lie in 2 runs of
    # 64 bytes, 2 to 4 segments of 128 bytes; lanes down a column of s touch one segment each.
    limits=(Coalesced("s", 4, access="store"),),
    solution=mask.mask_kernel,
    forbidden=(mask.apply_causal_mask, mask.launch_mask),
))


# --- Tiles: which a block computed, which are wholly masked ------------------------------------

def wholly_masked_tiles(visible, tile=TILE):
    """(row blocks, col blocks) bool: True for the tiles of `visible` in which no score is visible."""
    t_q, t_k = visible.shape
    rows, cols = ceil_div(t_q, tile), ceil_div(t_k, tile)
    padded = np.zeros((rows * tile, cols * tile), bool)
    padded[:t_q, :t_k] = visible
    return ~padded.reshape(rows, tile, cols, tile).any(axis=(1, 3))


def computed_tiles(traced, grid):
    """(heads, row blocks, col blocks) bool: the tiles whose block loaded an element of q or k."""
    computed = np.zeros((grid[2], grid[1], grid[0]), bool)
    for name in ("q", "k"):
        for element, kind, ((bx, by, bz), _), *_ in traced.launch.targets[name].trace:
            computed[bz, by, bx] = True
    return computed


def _tile_area(tiles, t_q, t_k):
    """(T_q, T_k) bool: the scores that lie in the tiles marked in `tiles` (row blocks, col blocks)."""
    return np.kron(tiles, np.ones((TILE, TILE), bool)).astype(bool)[:t_q, :t_k]


def _first_visible_score(visible, r, c):
    """(i, j) of a visible score in tile (r, c), for the messages."""
    rows, cols = np.nonzero(visible[r * TILE:(r + 1) * TILE, c * TILE:(c + 1) * TILE])
    return r * TILE + int(rows[0]), c * TILE + int(cols[0])


# --- The main exercise: the fused causal kernel's early exit -----------------------------------

def _run_causal_scores(kernel, case, rng, launch):
    bh, t_q, t_k, d_k = case
    q = rng.standard_normal((bh, t_q, d_k)).astype(np.float32)
    k = rng.standard_normal((bh, t_k, d_k)).astype(np.float32)
    grid, block = scores.score_grid(bh, t_q, t_k)
    got = host_output((bh, t_q, t_k))
    traced = traced_launch(kernel, grid, block, q, k, scores.scale_factor(d_k), got)
    visible = reference.causal_mask(t_q, t_k)
    expected = np.where(visible, reference.scores(q, k), -np.inf)
    masked, skipped = wholly_masked_tiles(visible), ~computed_tiles(traced, grid)
    wrong = skipped & ~masked
    if wrong.any():
        h, r, c = (int(v) for v in np.argwhere(wrong)[0])
        i, j = _first_visible_score(visible, r, c)
        raise Diagnosed("skips_visible_tile", (
            f"the block of tile (row block {r}, col block {c}) skipped it, but query {i} sees key {j} there: a tile "
            "may be skipped only when even its most favourable score, its last query against its first key, "
            "is in the future (query i sits at position i + T_k - T_q)"))
    never = unwritten(got)
    skipped_area = np.stack([_tile_area(t, t_q, t_k) for t in skipped])          # (BH, T_q, T_k)
    if never.any() and not (never & ~skipped_area).any():
        raise Diagnosed("skipped_tile_not_written", (
            f"{int(never.sum())} scores of the skipped tiles were never written: a block that skips its tile "
            "still owes each of its scores a -inf"))
    if np.array_equal(np.isneginf(got), np.isneginf(expected)) and np.allclose(
            got[np.isfinite(expected)], expected[np.isfinite(expected)], rtol=1e-5, atol=1e-5):
        extra = ~skipped & masked
        if extra.any():
            raise Diagnosed("skips_too_few", (
                f"the values are right, but {int(extra.sum())} of the {int(masked.sum()) * bh} tiles wholly in the "
                "future were computed (their blocks loaded q and k); let such a block write -inf and leave "
                "before the dot product"))
    return got, expected, q, k, skipped_area


def _diagnose_causal_scores(got, expected, q, k, skipped_area):
    """Name a wrong per-score mask or scale, from where got is -inf and what its finite values are."""
    t_q, t_k = got.shape[-2:]
    offset = t_k - t_q
    i, j = np.arange(t_q)[:, None], np.arange(t_k)[None, :]
    neg_inf = np.isneginf(got)
    variants = [(j > i + offset, None),
                (np.zeros((t_q, t_k), bool), ("diagonal_tile_unmasked",
                 "the computed tiles were written unmasked: in a tile on the diagonal the scores of keys after "
                 "their query (j > i + T_k - T_q) must still become -inf")),
                (j >= i + offset, ("mask_includes_diagonal",
                 "the diagonal is masked too (j >= i): a position may see itself; mask only j > i + (T_k - T_q)")),
                (j > i, ("mask_ignores_offset",
                 f"T_k = {t_k} keys but T_q = {t_q} queries: query i sits at position i + {offset}; "
                 "mask j > i + (T_k - T_q)"))]
    if offset:      # at an offset of 1 the two read alike; a mask of the diagonal failed at offset 0 before
        variants[2], variants[3] = variants[3], variants[2]
    for pattern, named in variants:
        if not np.array_equal(neg_inf, pattern[None] | skipped_area):
            continue
        if named is not None:
            return named
        raw, kept = reference.scores(q, k, scale=False), ~neg_inf
        d_k = q.shape[-1]
        if np.allclose(got[kept], raw[kept], rtol=1e-4, atol=1e-4):
            return "missing_scale", "the scores are q.k without the scale: multiply the sum by inv_sqrt_dk"
        if d_k > 1 and np.allclose(got[kept], raw[kept] / d_k, rtol=1e-4, atol=1e-4):
            return "scaled_by_d_k", (f"the scores came out divided by d_k = {d_k}: the scale applied twice, or d_k "
                                     "in place of its square root; multiply by inv_sqrt_dk exactly once")
        return None
    return None


def _causal_cases(configuration):
    """(BH, T_q, T_k, d_k), from the tile: one score; then T_k - T_q at 0, +-1, a tile - 1, a tile and a
    tile + 1, and more queries than keys (cases.offsets: a tile test written with >= for > is wrong
    exactly when the offset is 1 modulo the tile), the first in two heads; 9 queries that are the
    last of two tiles + 1 positions, in two heads (a test that forgets the offset, or tests the
    tile's first row, skips visible tiles); two tiles + 1, d_k a tile + 4 (3 x 3 tiles, 3 skipped,
    two steps along d_k); last, a few scores at the model's head width, 64."""
    tile = scores.TILE
    pairs = cases.offsets(tile)
    return ([(1, 1, 1, 1)] + [(2 if n == 0 else 1, t_q, t_k, 5) for n, (t_q, t_k) in enumerate(pairs)]
            + [(2, tile // 2 + 1, 2 * tile + 1, 5), (1, 2 * tile + 1, 2 * tile + 1, tile + 4), (1, 3, 5, 64)])


register(Exercise(
    exercise_id="03_causal_scores",
    kind="kernel",
    run=_run_causal_scores,
    cases=_causal_cases,
    describe_case=lambda c: f"BH = {c[0]}, T_q = {c[1]}, T_k = {c[2]}, d_k = {c[3]}",
    hint=("one score of a tile decides whether the whole tile lies in the future: the one closest to being "
          "visible, which sits in a corner of the tile. Which corner? Test only that score, from the block's "
          "position and the sizes alone, so that every thread of the block takes the same branch"),
    more_hints=(
        "the plan: from the block indices, the tile size and the sizes of s, find that corner's query and "
        "key (the last row of tiles may be cut short by T_q) and the position the query sits at (the queries "
        "are the last T_q positions). Apply the mask's own rule to that one score. If it is hidden, every "
        "thread writes minus infinity to its own score, if it has one, and returns. Otherwise every thread "
        "calls the tiled dot product, and a thread with a score stores it scaled, or minus infinity when the "
        "mask hides it",
        "where answers go wrong: a test that uses a thread's own query and key lets some threads of a block "
        "leave while the others wait at a barrier inside the dot product (undefined on a GPU); the key at "
        "the query's own position is visible; a tile of the last row may hold fewer queries than a whole tile"),
    rtol=1e-5,    # float32 sums of up to 20 products of standard normals, against float64
    atol=1e-5,
    diagnose=_diagnose_causal_scores,
    diagnoses=("skips_visible_tile", "skipped_tile_not_written", "skips_too_few", "diagonal_tile_unmasked",
               "mask_includes_diagonal", "mask_ignores_offset", "missing_scale", "scaled_by_d_k"),
    solution=mask.causal_scores_kernel,
    forbidden=(mask.causal_scores, mask.window_scores_kernel, mask.tile_is_masked, scores.scores_kernel_v2),
))


# --- The sliding-window tile test ---------------------------------------------------------------

def window_kernel(tile_is_masked):
    """mask.window_scores_kernel with `tile_is_masked` in the library's test's place, built once
    per device function: the same kernel text, calling the answer."""
    return rebuilt(mask.window_scores_kernel, {"tile_is_masked": tile_is_masked})


def _run_tile_skip(tile_is_masked, case, rng, launch):
    bh, t_q, t_k, window = case
    d_k = 5
    q = rng.standard_normal((bh, t_q, d_k)).astype(np.float32)
    k = rng.standard_normal((bh, t_k, d_k)).astype(np.float32)
    grid, block = scores.score_grid(bh, t_q, t_k)
    got = host_output((bh, t_q, t_k))
    traced = traced_launch(window_kernel(tile_is_masked), grid, block, q, k, scores.scale_factor(d_k),
                           np.int32(window), got)
    visible = reference.causal_mask(t_q, t_k, window or None)
    skipped = ~computed_tiles(traced, grid)
    if _swapped(skipped, t_q, t_k, window) is not None and _swapped_at_probe(tile_is_masked):
        r, c = _swapped(skipped, t_q, t_k, window)
        raise Diagnosed("tile_axes_swapped", (
            f"tile (row block {r}, col block {c}) was {'skipped' if skipped[0, r, c] else 'computed'} as if it were "
            f"tile (row block {c}, col block {r}): the tiles' rows and columns were swapped. row_block counts tiles "
            "of queries (the grid's y, blockIdx.y) and col_block tiles of keys (its x); take the tile's place from "
            "those two arguments, each on its own axis"))
    _judge_skipped(skipped, visible, t_q, t_k, window)
    return got, np.where(visible, reference.scores(q, k), -np.inf)


# (T_q, T_k, window) where a test with the tile's rows and columns swapped skips other tiles than a window
# of 0 taken for a window of no keys (the two agree on some cases without a window, 17 queries and 16 keys).
PROBE = (3 * TILE, 3 * TILE, TILE + 1)


def _tile_test(row_block, col_block, t_q, t_k, window):
    """The contract's test in plain arithmetic: True when tile (row_block, col_block) holds no visible
    score (at a place past the edges too, where a test with the tile's axes swapped asks it)."""
    offset = t_k - t_q
    first_row, first_col = row_block * TILE, col_block * TILE
    last_row, last_col = min(first_row + TILE, t_q) - 1, min(first_col + TILE, t_k) - 1
    return first_col > last_row + offset or (window > 0 and last_col <= first_row + offset - window)


def _swapped(skipped, t_q, t_k, window):
    """(row block, col block) of the first tile skipped wrongly when every head skipped the tiles that the
    contract's test skips with its row and column blocks swapped; None otherwise."""
    rows, cols = skipped.shape[1:]
    swapped = np.array([[_tile_test(c, r, t_q, t_k, window) for c in range(cols)] for r in range(rows)], bool)
    wrong = skipped[0] != wholly_masked_tiles(reference.causal_mask(t_q, t_k, window or None))
    if wrong.any() and (skipped == swapped).all():
        return tuple(int(v) for v in np.argwhere(wrong)[0])
    return None


def _swapped_at_probe(tile_is_masked):
    """Whether the window kernel with `tile_is_masked` skips, at PROBE, the tiles of the swapped reading."""
    t_q, t_k, window = PROBE
    q, k = np.ones((1, t_q, 1), np.float32), np.ones((1, t_k, 1), np.float32)
    grid, block = scores.score_grid(1, t_q, t_k)
    try:
        traced = traced_launch(window_kernel(tile_is_masked), grid, block, q, k, np.float32(1.0), np.int32(window),
                               host_output((1, t_q, t_k)), compile=False)
    except Exception:       # the answer's own failure shows at its own case: here it only rules the reading out
        return False
    return _swapped(~computed_tiles(traced, grid), t_q, t_k, window) is not None


def _judge_skipped(skipped, visible, t_q, t_k, window):
    """Compare the tiles each head skipped with the wholly masked ones; raise Diagnosed if they differ."""
    masked = wholly_masked_tiles(visible)
    if not (skipped == skipped[0]).all():
        raise Diagnosed("skips_visible_tile", "the heads skipped different tiles: the test may use only its arguments")
    skipped = skipped[0]
    wrong = skipped & ~masked
    if wrong.any():
        r, c = (int(v) for v in np.argwhere(wrong)[0])
        i, j = _first_visible_score(visible, r, c)
        # Tiles with no score in the future, the ones a window of 0 taken literally would hide.
        behind = wholly_masked_tiles(np.arange(t_k)[None, :] > np.arange(t_q)[:, None] + (t_k - t_q))
        if window == 0 and (behind | ~wrong).all():
            raise Diagnosed("window_zero_not_none", (
                f"with window = 0 the tile (row block {r}, col block {c}) was skipped, but query {i} sees key {j} "
                "there: 0 means no window (the causal mask alone), so only tiles wholly in the future may go"))
        raise Diagnosed("skips_visible_tile", (
            f"tile (row block {r}, col block {c}) was skipped but holds a visible score (query {i}, key {j}): "
            "test the tile's corner that is closest to being visible, for each side of the band"))
    if (masked & ~skipped).any():
        future = wholly_masked_tiles(reference.causal_mask(t_q, t_k))   # the causal mask alone
        missed = masked & ~skipped
        kind = ("before the window (too far in the past)" if not (missed & future).any()
                else "above the diagonal (in the future)")
        raise Diagnosed("skips_too_few", (
            f"the values are right, but {int(skipped.sum())} of the {int(masked.sum())} wholly masked tiles "
            f"were skipped; the ones missed lie {kind}"))


def _tile_skip_cases(configuration):
    """(BH, T_q, T_k, window), from the tile: one score; the causal edge at every offset of
    cases.offsets with window 0 (none); the windows of cases.window_edges, whose edge falls on a
    tile's first or last key or one key either side, with one row of query tiles (a tile of queries,
    the last of three tiles of keys) and once with three (the band's edge on tile (2, 0)); 9 queries
    that are the last of two tiles + 1 keys, a narrow window, two heads; more queries than keys
    under a window wider than the context."""
    tile = scores.TILE
    windows = cases.window_edges(tile)
    return ([(1, 1, 1, 1)] + [(1, t_q, t_k, 0) for t_q, t_k in cases.offsets(tile)]
            + [(1, tile, t, window) for t, window in windows] + [(1, 3 * tile, 3 * tile, tile + 1)]
            + [(2, tile // 2 + 1, 2 * tile + 1, 5), (1, 2 * tile + 1, tile + 1, 2 * tile + 8)])


register(Exercise(
    exercise_id="03_tile_skip",
    kind="device function",
    run=_run_tile_skip,
    cases=_tile_skip_cases,
    describe_case=lambda c: f"BH = {c[0]}, T_q = {c[1]}, T_k = {c[2]}, window = {c[3]}",
    hint=("a tile may be skipped when even its most favourable score is masked: for each edge of the "
          "visible band, one corner of the tile comes closest to it, and that corner's score decides"),
    more_hints=(
        "the plan: find the tile's first and last query and key, cut at T_q and T_k, and the position "
        "each of those queries sits at. Test the corner nearest the future edge with the causal rule and, "
        "when a window is given, the corner nearest the past edge with the window's rule. The tile may be "
        "skipped when either corner's score is hidden",
        "where answers go wrong: the queries are the last T_q positions; the last row and column of tiles "
        "may be cut short; a key at the query's own position is visible, one exactly a window behind is "
        "not; a window of 0 means there is no past edge at all"),
    rtol=1e-5,    # float32 sums of 5 products of standard normals, against float64
    atol=1e-5,
    diagnoses=("skips_visible_tile", "skips_too_few", "window_zero_not_none", "tile_axes_swapped"),
    solution=(mask.tile_is_masked, mask.window_scores_kernel),
    forbidden=(mask.causal_scores, mask.causal_scores_kernel),
))
