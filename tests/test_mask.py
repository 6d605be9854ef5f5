"""Notebook 03: the causal mask kernels against NumPy, and the work the fused kernels skip (the
exercises are tested in test_exercises_03.py, the window's conventions in test_window.py)."""

import math

import numpy as np
import pytest
from attention_lib import reference
from attention_lib.measure import sanitizer
from attention_lib.stages import mask, scores

# (T_q, T_k) with leading axes: one score; less than a tile; a partly used last tile over
# several heads; 5 queries that are the last of 9 positions (decoding with a cache); more
# queries than keys (the first rows see nothing at all); 4-D batch x heads.
SCORE_SHAPES = [(1, 1), (3, 7, 7), (2, 33, 33), (2, 5, 9), (6, 4), (2, 2, 7, 7)]


@pytest.mark.parametrize("shape", SCORE_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_apply_causal_mask_matches_the_reference_exactly(rng, shape):
    s = rng.standard_normal(shape).astype(np.float32)
    before = s.copy()
    got = mask.apply_causal_mask(s)
    assert got.dtype == np.float32 and got.shape == shape
    assert np.array_equal(got, reference.apply_causal_mask(s))    # kept scores are untouched
    assert np.array_equal(s, before)                               # the input is not modified


def test_masking_twice_changes_nothing(rng):
    once = mask.apply_causal_mask(rng.standard_normal((7, 7)))     # -inf is accepted as input
    assert np.array_equal(mask.apply_causal_mask(once), once)


def test_fully_masked_rows_become_zero_weights_not_nan(rng):
    # 6 queries, 4 keys: queries 0 and 1 sit before the first key, so they may see nothing.
    masked = mask.apply_causal_mask(rng.standard_normal((6, 4)))
    assert np.isneginf(masked[:2]).all() and np.isfinite(masked[2:, 0]).all()
    weights = reference.softmax(masked)
    assert not np.isnan(weights).any()
    assert (weights[:2] == 0).all() and np.allclose(weights[2:].sum(axis=-1), 1)
    with np.errstate(invalid="ignore"):                            # the naive softmax: 0 / 0
        naive = np.exp(masked) / np.exp(masked).sum(axis=-1, keepdims=True)
    assert np.isnan(naive[:2]).all()


def tolerance(d_k):
    """As in test_scores: float32 sums of d_k products against float64."""
    return 1e-6 * math.sqrt(d_k)


@pytest.mark.parametrize("q_shape, k_shape", [
    ((1, 1), (1, 1)), ((3, 7, 5), (3, 9, 5)), ((6, 3), (4, 3)), ((2, 33, 24), (2, 33, 24)),
    ((40, 8), (40, 8))], ids=lambda s: "x".join(map(str, s)))
def test_causal_scores_match_the_reference(rng, q_shape, k_shape):
    q, k = rng.standard_normal(q_shape), rng.standard_normal(k_shape)
    got = mask.causal_scores(q, k)
    want = reference.apply_causal_mask(reference.scores(q, k))
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(np.isneginf(got), np.isneginf(want))
    assert np.allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-5, atol=tolerance(q_shape[-1]))


def test_fusing_changes_no_value(rng):
    """The fused kernel computes the same float32 sums as scores_kernel_v2 then the mask."""
    q, k = rng.standard_normal((1, 20, 5)), rng.standard_normal((1, 20, 5))
    for scale in (True, False):
        separate = mask.apply_causal_mask(scores.scores(q, k, scale=scale, version=2))
        assert np.array_equal(mask.causal_scores(q, k, scale=scale), separate)


def test_tile_counts():
    assert mask.causal_tile_counts(1024) == (2080, 2016)          # ANDREA-120M: 64 x 64 tiles
    assert mask.causal_tile_counts(32) == (3, 1)
    assert mask.causal_tile_counts(33) == (6, 3)                  # row 32 alone in its tile
    assert mask.causal_tile_counts(1) == (1, 0)
    assert mask.causal_tile_counts(5, 9) == (1, 0)                # one tile: nothing to skip
    assert mask.causal_tile_counts(50, tile=1) == (50 * 51 // 2, 50 * 49 // 2)   # exactly j <= i


def expected_loads(t, d_k, tile=scores.TILE):
    """Loads of each row of q and of k by causal_scores_kernel on a (t, t) head: one per computed tile."""
    blocks = -(-t // tile)
    computed = [[c * tile <= min((r + 1) * tile, t) - 1 for c in range(blocks)] for r in range(blocks)]
    rows = np.arange(t) // tile
    q_loads = np.array([sum(computed[r]) for r in rows])                    # tiles along row block r
    k_loads = np.array([sum(computed[r][c] for r in range(blocks)) for c in rows])
    return np.repeat(q_loads[:, None], d_k, 1), np.repeat(k_loads[:, None], d_k, 1)


def test_the_fused_kernel_skips_the_tiles_above_the_diagonal(rng):
    t, d_k = 33, 24
    q = rng.standard_normal((1, t, d_k)).astype(np.float32)
    k = rng.standard_normal((1, t, d_k)).astype(np.float32)
    grid, block = scores.score_grid(1, t, t)
    fused = sanitizer.count_memory(mask.causal_scores_kernel, grid, block, q, k, np.float32(1),
                                   np.zeros((1, t, t), np.float32))
    q_loads, k_loads = expected_loads(t, d_k)
    assert np.array_equal(fused.loads("q")[0], q_loads) and np.array_equal(fused.loads("k")[0], k_loads)
    assert (fused.stores("s") == 1).all()                          # every score written once
    computed, skipped = mask.causal_tile_counts(t)                 # 6 and 3 of 3 x 3 tiles
    # Each thread of a computed tile reads TILE entries of q_tile per step along d_k (two steps).
    assert fused.loads("q_tile").sum() == computed * scores.TILE ** 2 * scores.TILE * 2
    # Unfused, every row of q is read once per column of tiles (3), every row of k 3 times.
    unfused = sanitizer.count_memory(scores.scores_kernel_v2, grid, block, q, k, np.float32(1),
                                     np.zeros((1, t, t), np.float32))
    assert (unfused.loads("q") == 3).all() and (unfused.loads("k") == 3).all()
    assert (fused.loads("q").sum(), unfused.loads("q").sum()) == (1224, 2376)


@pytest.mark.parametrize("shape, window", [((1, 1), 1), ((3, 7, 7), 3), ((2, 33, 33), 16), ((2, 5, 9), 2),
                                           ((6, 4), 2), ((19, 19), 40), ((19, 19), 1)],
                         ids=lambda c: "x".join(map(str, c)) if isinstance(c, tuple) else str(c))
def test_the_window_option_matches_the_reference_exactly(rng, shape, window):
    s = rng.standard_normal(shape).astype(np.float32)
    got = mask.apply_causal_mask(s, window=window)
    assert got.dtype == np.float32 and np.array_equal(got, reference.apply_causal_mask(s, window))
    visible = reference.causal_mask(*shape[-2:], window=window)
    assert np.isneginf(got[..., ~visible]).all() and np.isfinite(got[..., visible]).all()


def test_a_window_as_wide_as_the_context_is_the_causal_mask(rng):
    s = rng.standard_normal((2, 7, 12)).astype(np.float32)
    assert np.array_equal(mask.apply_causal_mask(s, window=12), mask.apply_causal_mask(s))
    assert not np.array_equal(mask.apply_causal_mask(s, window=6), mask.apply_causal_mask(s))


# (T_q, T_k with leading axes, window): one score; a window of one (each query sees itself); tiles
# skipped on both sides of the band; the last queries of a longer context; more queries than keys;
# a window wider than the context (the causal mask).
WINDOW_CASES = [((1, 1), 1, 1), ((2, 40, 5), 40, 1), ((40, 5), 40, 7), ((2, 9, 5), 33, 5), ((33, 4), 17, 3),
                ((19, 6), 19, 40)]


@pytest.mark.parametrize("q_shape, t_k, window", WINDOW_CASES, ids=lambda c: "x".join(map(str, c))
                         if isinstance(c, tuple) else str(c))
def test_windowed_causal_scores_match_the_reference(rng, q_shape, t_k, window):
    q = rng.standard_normal(q_shape)
    k = rng.standard_normal(q_shape[:-2] + (t_k, q_shape[-1]))
    got = mask.causal_scores(q, k, window=window)
    want = reference.apply_causal_mask(reference.scores(q, k), window)
    assert got.dtype == np.float32 and np.array_equal(np.isneginf(got), np.isneginf(want))
    assert np.allclose(got[np.isfinite(want)], want[np.isfinite(want)], rtol=1e-5, atol=tolerance(q_shape[-1]))


@pytest.mark.parametrize("t, window", [(40, 7), (33, 16), (20, None)])
def test_the_window_kernel_loads_only_the_tiles_it_computes(rng, t, window):
    """Each row of q is read once per computed tile of its row of tiles (d_k 5: one step), so the
    loads counted by the sanitizer are causal_tile_counts' computed tiles times TILE rows."""
    q, k = rng.standard_normal((2, 1, t, 5)).astype(np.float32)
    grid, block = scores.score_grid(1, t, t)
    report = sanitizer.count_memory(mask.window_scores_kernel, grid, block, q, k, np.float32(1),
                                    np.int32(window or 0), np.zeros((1, t, t), np.float32))
    computed, _ = mask.causal_tile_counts(t, window=window)
    rows_in_last = t - (grid[1] - 1) * scores.TILE
    blocks = mask.band_key_tiles(t, t, True, window, scores.TILE, scores.TILE)
    assert report.loads("q").sum() == sum(rows * tiles for _, rows, _, tiles in blocks) * 5
    assert len(blocks) == grid[1] and blocks[-1][1] == rows_in_last and computed == sum(b[3] for b in blocks)
    assert (report.stores("s") == 1).all()


def test_a_window_of_zero_in_the_kernel_is_the_causal_mask(rng):
    """The kernels' convention: window 0 stands for None (none), as the launchers pass it."""
    q, k = rng.standard_normal((2, 1, 33, 5)).astype(np.float32)
    grid, block = scores.score_grid(1, 33, 33)
    s = np.zeros((1, 33, 33), np.float32)
    mask.window_scores_kernel[grid, block](q, k, np.float32(1), np.int32(0), s)
    assert np.array_equal(s, mask.causal_scores(q, k, scale=False))


@pytest.mark.parametrize("call, error, message", [
    (lambda: mask.apply_causal_mask(np.zeros(4)), ValueError,
     r"^s must have shape \(\.\.\., T_q, T_k\) \(at least 2 axes\), got shape \(4,\)$"),
    (lambda: mask.apply_causal_mask(np.array([[0.0, np.inf]])), ValueError,
     r"^s contains inf at index \(0, 1\); it must be finite$"),
    (lambda: mask.apply_causal_mask(np.array([[0.0, np.nan]])), ValueError,
     r"^s contains nan at index \(0, 1\); it must be finite$"),
    (lambda: mask.apply_causal_mask(np.ones((2, 2), bool)), TypeError,
     r"^s must be a float array of shape \(\.\.\., T_q, T_k\), got dtype bool$"),
    (lambda: mask.causal_scores(np.zeros((3, 4)), np.zeros((3, 5))), ValueError,
     r"^k must have d_k = 4 in its last axis, like q \(3, 4\); got shape \(3, 5\)$"),
    (lambda: mask.apply_causal_mask(np.zeros((3, 3)), window=0), ValueError,
     r"^window must be None or an int >= 1 \(the keys a query sees, itself included\), got 0$"),
    (lambda: mask.apply_causal_mask(np.zeros((3, 3)), window=1.5), ValueError,
     r"^window must be None or an int >= 1 .*, got 1\.5$"),
    (lambda: mask.causal_scores(np.zeros((3, 4)), np.zeros((3, 4)), window=0), ValueError,
     r"^window must be None or an int >= 1 \(the keys a query sees, itself included\), got 0$"),
])
def test_bad_inputs_are_one_line_errors_naming_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()
