"""Notebook 03: the causal mask kernels against NumPy, the work the fused kernel skips, the exercise."""

import math

import numpy as np
import pytest
from attention_lib import reference
from attention_lib.measure import sanitizer
from attention_lib.stages import mask, scores
from attention_lib.checks import check
from numba import cuda

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
])
def test_bad_inputs_are_one_line_errors_naming_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()


# --- The exercise: planted mistakes --------------------------------------------------------

@cuda.jit
def masks_the_diagonal_too(s, window):
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < s.shape[1] and j < s.shape[2] and j >= i + (s.shape[2] - s.shape[1]):
        s[h, i, j] = -math.inf


@cuda.jit
def masks_the_past(s, window):
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < s.shape[1] and j < s.shape[2] and j < i + (s.shape[2] - s.shape[1]):
        s[h, i, j] = -math.inf


@cuda.jit
def masks_nothing(s, window):
    j, i = cuda.grid(2)
    if i < s.shape[1] and j < s.shape[2] and j > s.shape[2]:
        s[cuda.blockIdx.z, i, j] = -math.inf


@cuda.jit
def ignores_the_offset(s, window):
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < s.shape[1] and j < s.shape[2] and j > i:
        s[h, i, j] = -math.inf


@cuda.jit
def masks_with_minus_1e9(s, window):
    j, i = cuda.grid(2)
    h = cuda.blockIdx.z
    if i < s.shape[1] and j < s.shape[2] and j > i + (s.shape[2] - s.shape[1]):
        s[h, i, j] = -1e9


@cuda.jit
def no_bounds_guard(s, window):
    j, i = cuda.grid(2)
    if j > i + (s.shape[2] - s.shape[1]):
        s[cuda.blockIdx.z, i, j] = -math.inf


@cuda.jit
def ignores_the_window(s, window):
    j, i = cuda.grid(2)
    if i < s.shape[1] and j < s.shape[2] and j > i + (s.shape[2] - s.shape[1]):
        s[cuda.blockIdx.z, i, j] = -math.inf


@cuda.jit
def only_head_zero(s, window):
    j, i = cuda.grid(2)
    if i < s.shape[1] and j < s.shape[2] and j > i + (s.shape[2] - s.shape[1]):
        s[0, i, j] = -math.inf


def test_the_library_kernel_passes_the_exercise(capsys):
    result = check("03_causal_mask", mask.mask_kernel)
    assert result.passed and result.diagnosis == "ok"
    assert capsys.readouterr().out.startswith("✔ 03_causal_mask [ok]")


@pytest.mark.parametrize("answer, diagnosis, says", [
    (masks_the_diagonal_too, "mask_includes_diagonal", "a position may see itself"),
    (masks_the_past, "mask_wrong_side", "the past is masked"),
    (masks_nothing, "mask_not_applied", "no score was changed"),
    (ignores_the_offset, "mask_ignores_offset", "query i sits at i + 4"),
    (masks_with_minus_1e9, "mask_value_not_neg_inf", "-1e+09"),
    (no_bounds_guard, "out_of_bounds", "Guard the index"),
    (only_head_zero, "wrong_values", "entries differ"),
    (ignores_the_window, "mask_ignores_window", "with window = 4"),
])
def test_planted_mistakes_get_their_diagnosis(answer, diagnosis, says):
    result = check("03_causal_mask", answer, verbose=False)
    assert not result.passed
    assert (result.diagnosis, says in result.message) == (diagnosis, True), result.message
    assert "\n" not in str(result)
