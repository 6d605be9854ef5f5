"""Sliding-window attention: the reference mask, the fused kernels with a window against it,
the key tiles they load (counted = formula), and the errors for a bad window."""

import numpy as np
import pytest
from attention_lib import reference
from attention_lib.measure import sanitizer, traffic
from attention_lib.stages import flash, mask


def qkv(rng, lead, t_q, t_k, d_k):
    return tuple(rng.standard_normal((*lead, t, d_k)).astype(np.float32) for t in (t_q, t_k, t_k))


# --- The reference: one definition of the window ------------------------------------------

@pytest.mark.parametrize("t_q, t_k, window", [(1, 1, 1), (7, 7, 3), (5, 9, 2), (9, 5, 3), (8, 8, 100)])
def test_the_window_mask_is_the_band_of_the_definition(t_q, t_k, window):
    off = t_k - t_q
    want = np.array([[i + off - window < j <= i + off for j in range(t_k)] for i in range(t_q)])
    got = reference.causal_mask(t_q, t_k, window)
    assert got.dtype == bool and np.array_equal(got, want)
    assert np.array_equal(got, got & reference.causal_mask(t_q, t_k))        # a subset of causal


def test_the_mask_kernels_take_0_for_none_and_the_launchers_refuse_it(rng):
    """The conventions, stated in mask.py and notebook 03: a window W >= 1 shows W keys, the query's
    own included; on the host None means none and 0 is refused; a kernel takes an int32 where 0
    stands for None (a kernel argument cannot be None)."""
    from attention_lib.stages import scores
    s = rng.standard_normal((1, 9, 12)).astype(np.float32)
    grid, block = scores.score_grid(*s.shape)
    for window, host in ((0, None), (1, 1), (4, 4)):
        d_s = s.copy()
        mask.mask_kernel[grid, block](d_s, np.int32(window))
        assert np.array_equal(d_s, reference.apply_causal_mask(s, host)), window
        assert np.array_equal(mask.apply_causal_mask(s, window=host), d_s)
    assert (np.isfinite(mask.apply_causal_mask(s, window=1)).sum(axis=-1) == 1).all()     # itself only
    for call in (lambda: mask.apply_causal_mask(s, window=0), lambda: mask.causal_scores(s, s, window=0)):
        with pytest.raises(ValueError, match=r"^window must be None or an int >= 1 .*, got 0$"):
            call()


def test_window_one_is_the_diagonal_and_a_wide_one_is_causal():
    assert np.array_equal(reference.causal_mask(6, window=1), np.eye(6, dtype=bool))
    assert np.array_equal(reference.causal_mask(4, 9, window=9), reference.causal_mask(4, 9))
    assert list(reference.causal_mask(8, window=3).sum(axis=1)) == [1, 2, 3, 3, 3, 3, 3, 3]


def test_reference_attention_with_a_window_masks_the_old_keys(rng):
    q, k, v = qkv(rng, (2,), 9, 9, 5)
    weights = reference.attention_weights(q, k, window=3)
    assert (weights[:, ~reference.causal_mask(9, window=3)] == 0).all()
    assert np.allclose(weights.sum(axis=-1), 1)
    assert np.allclose(reference.attention(q, k, v, window=3), weights @ v)


# --- The fused kernels against the reference -------------------------------------------------

# (leading axes, T_q, T_k, d_k, window): one position; less than a tile; every query sees only
# itself; a window of one tile; a window wider than the context; the last queries of a longer
# context (T_q < T_k); more queries than keys (rows that see nothing); heads, 33 (partial tiles).
CASES = [((), 1, 1, 5, 1), ((), 7, 7, 5, 3), ((), 19, 19, 16, 1), ((), 33, 33, 5, 16),
         ((), 19, 19, 5, 40), ((), 7, 33, 16, 3), ((), 20, 7, 5, 3), ((2,), 33, 33, 16, 7)]


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("case", CASES, ids=lambda c: "x".join(map(str, (*c[0], *c[1:]))))
def test_flash_attention_with_a_window_matches_the_reference(rng, version, case):
    lead, t_q, t_k, d_k, window = case
    q, k, v = qkv(rng, lead, t_q, t_k, d_k)
    got, lse = flash.flash_attention(q, k, v, version=version, window=window, return_lse=True)
    want = reference.attention(q, k, v, window=window)
    # As in test_flash: float32 sums of at most 33 terms against float64, a tenfold margin.
    assert got.dtype == np.float32 and got.shape == want.shape
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5), np.abs(got - want).max()
    s = reference.apply_causal_mask(reference.scores(q, k), window)
    with np.errstate(divide="ignore"):                          # log(0): a row that sees no key
        want_lse = np.log(np.exp(s).sum(axis=-1))
    assert np.array_equal(np.isneginf(lse), np.isneginf(want_lse))
    seen = np.isfinite(want_lse)
    assert np.allclose(lse[seen], want_lse[seen], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_a_window_of_one_returns_each_querys_own_value(rng, version):
    q, k, v = qkv(rng, (), 7, 40, 5)             # query i sits at i + 33 and sees key i + 33 only
    got = flash.flash_attention(q, k, v, version=version, window=1)
    assert np.allclose(got, v[33:], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("version", [2, 3])
def test_the_kernels_with_a_window_have_no_race(rng, version):
    q, k, v = qkv(rng, (1,), 40, 40, 5)
    args = (q, k, v, flash.flash_scale(version, 5), True, np.int32(7), np.int32(1),
            np.zeros((1, 40, 5), np.float32), np.zeros((1, 40), np.float32))
    kernel = flash.make_flash_v3(5) if version == 3 else flash.KERNELS[version]
    races = sanitizer.find_races(kernel, *flash.flash_grid(1, 40, version, 5), *args)
    assert races == [], [str(r) for r in races]
    assert np.allclose(args[7], reference.attention(q, k, v, window=7), rtol=1e-5, atol=1e-5)


# --- Tiles loaded: the host formula and the count ---------------------------------------------

@pytest.mark.parametrize("t_q, t_k, window", [(33, 33, 3), (64, 64, 16), (7, 70, 3), (40, 7, 2), (1, 1, 1)])
@pytest.mark.parametrize("block_q, block_k", [(16, 16), (64, 32), (32, 16)])
def test_band_tile_counts_equal_a_brute_force(t_q, t_k, window, block_q, block_k):
    """A tile is loaded iff a query of the block sees a key of it (block_band's test)."""
    visible = reference.causal_mask(t_q, t_k, window)
    loaded = sum(visible[q0:q0 + block_q, k0:k0 + block_k].any()
                 for q0 in range(0, t_q, block_q) for k0 in range(0, t_k, block_k))
    total = -(-t_q // block_q) * -(-t_k // block_k)
    assert flash.flash_tile_counts(t_q, t_k, block_q=block_q, block_k=block_k, window=window) == (loaded, total - loaded)
    for q0, rows, first, tiles in mask.band_key_tiles(t_q, t_k, True, window, block_q, block_k):
        seen = visible[q0:q0 + rows].any(axis=0)                 # keys some query of the block sees
        hit = [seen[k0:k0 + block_k].any() for k0 in range(0, t_k, block_k)]
        assert hit == [first <= tile < first + tiles for tile in range(len(hit))]


def test_a_window_costs_a_fixed_number_of_tiles_per_block():
    """T 1024, blocks of 32 queries, key tiles of 16, window 256: a block q0 >= 256 loads tiles
    q0/16 - 16 .. q0/16 + 1 (18); the 8 blocks before load 2, 4, .., 16. Causal: 2, 4, .., 64."""
    counts = {t: flash.flash_tile_counts(t, block_q=32, block_k=16, window=256)[0] for t in (1024, 2048)}
    assert counts[1024] == sum(range(2, 17, 2)) + 24 * 18 == 504
    assert flash.flash_tile_counts(1024, block_q=32, block_k=16) == (32 * 33, 32 * 31)
    assert counts[2048] - counts[1024] == 32 * 18          # linear in T: 18 tiles per block of queries


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("t_q, t_k, window", [(33, 33, 3), (7, 70, 3), (20, 7, 2)])
def test_windowed_traffic_formula_equals_the_count(rng, version, t_q, t_k, window):
    q, k, v = qkv(rng, (2,), t_q, t_k, 5)
    report, out = traffic.count_fused(q, k, v, True, version, window)
    assert np.allclose(out, reference.attention(q, k, v, window=window), rtol=1e-5, atol=1e-5)
    want = flash.flash_traffic(t_q, t_k, 5, causal=True, version=version, window=window)
    got = {name: int(report.loads(name).sum()) for name in "qkv"}
    got.update({name: int(report.stores(name).sum()) for name in ("out", "lse")})
    assert got == {name: 2 * n for name, n in want.items()}        # two heads
    assert want["k"] <= flash.flash_traffic(t_q, t_k, 5, version=version)["k"]   # never more than causal


def test_v3_starts_at_the_key_tile_of_the_first_visible_key(rng):
    """7 queries at positions 63 .. 69, window 3: the first visible key is 61, in v3's second key
    tile of 32 (d_k 5: one block of 64 queries), so keys 32 .. 69 are loaded, 38 of 70."""
    q, k, v = qkv(rng, (1,), 7, 70, 5)
    report, _ = traffic.count_fused(q, k, v, True, 3, window=3)
    assert (report.loads("k")[0, :32] == 0).all() and (report.loads("k")[0, 32:] == 1).all()
    assert flash.flash_traffic(7, 70, 5, version=3, window=3)["k"] == 38 * 5


def test_key_tiles_before_the_window_are_never_loaded(rng):
    """v2 on 64 queries in blocks of BLOCK_Q (16 on the simulator, 32 at GPU shapes), window 3: key
    j is loaded by exactly the blocks whose key range (band_key_tiles) holds it, so key 0 only by
    the blocks whose first query sees key tile 0, where the causal kernel loads it in every block."""
    t, b = 64, flash.BLOCK_Q
    q, k, v = qkv(rng, (1,), t, t, 5)
    report, _ = traffic.count_fused(q, k, v, True, 2, window=3)
    blocks = mask.band_key_tiles(t, t, True, 3, b, flash.BLOCK_K)
    want = [sum(first * flash.BLOCK_K <= j < mask.visible_count(q0 + rows - 1, t, t, True)
                for q0, rows, first, _ in blocks) for j in range(t)]
    assert np.array_equal(report.loads("k")[0], np.repeat(np.array(want)[:, None], 5, axis=1))
    causal, _ = traffic.count_fused(q, k, v, True, 2)
    assert causal.loads("k")[0, 0, 0] == t // b == len(blocks)
    assert report.loads("k")[0, 0, 0] == sum(first == 0 for _, _, first, _ in blocks) < t // b


# --- Bad windows ------------------------------------------------------------------------------

GOOD = np.zeros((2, 4, 5), np.float32)


@pytest.mark.parametrize("kwargs, message", [
    ({"window": 3, "causal": False}, r"^window 3 needs causal=True \(a sliding window is a causal mask\), got causal=False$"),
    ({"window": 0}, r"^window must be None or an int >= 1 \(the keys a query sees, itself included\), got 0$"),
    ({"window": -2}, r"^window must be None or an int >= 1 .*, got -2$"),
    ({"window": 2.5}, r"^window must be None or an int >= 1 .*, got 2\.5$"),
    ({"window": "4"}, r"^window must be None or an int >= 1 .*, got '4'$"),
    ({"window": True}, r"^window must be None or an int >= 1 .*, got True$"),
])
def test_bad_windows_are_one_line_errors_naming_window(kwargs, message):
    with pytest.raises(ValueError, match=message):
        flash.flash_attention(GOOD, GOOD, GOOD, **kwargs)
    with pytest.raises(ValueError, match=message):
        reference.attention(GOOD, GOOD, GOOD, **kwargs)


def test_a_numpy_int_window_is_accepted(rng):
    q, k, v = qkv(rng, (), 9, 9, 5)
    assert np.array_equal(flash.flash_attention(q, k, v, window=np.int64(3)), flash.flash_attention(q, k, v, window=3))


def masks_every_score(s, rows, k0, rg, cg, t_k):
    """A stand-in for v3_mask that hides every score of the tiles it is called for."""
    for x in range(S_SIZE):          # S_SIZE, NEG_INF: flash's compile-time names, as build_flash_v3 binds them
        s[x] = NEG_INF


def test_v3_masks_only_the_tiles_an_edge_of_the_band_crosses(rng):
    """T 128, window 96, d_k 5 (blocks of 64 queries, key tiles of 32): every query 64 .. 127 sees
    keys 32 .. 64, so of that block's tiles 0, 32, 64, 96 only tile 32 (keys 32 .. 63) holds no edge
    of the band. With v3_mask hiding everything, that tile alone is left: rows 64 .. 127 become
    attention over keys 32 .. 63, and rows 0 .. 63, whose every tile an edge crosses, see nothing."""
    q, k, v = qkv(rng, (1,), 128, 128, 5)
    kernel = flash.build_flash_v3(5, {"v3_mask": masks_every_score})
    got = flash.flash_attention(q, k, v, version=3, kernel=kernel, window=96)
    assert (got[0, :64] == 0).all()
    want = reference.attention(q[:, 64:], k[:, 32:64], v[:, 32:64], causal=False)
    assert np.allclose(got[0, 64:], want[0], rtol=1e-5, atol=1e-5)
