"""Notebook 02: the scores kernels against NumPy, their memory reads, the launchers' checks (the
exercises are tested in test_exercises_02.py)."""

import math

import numpy as np
import pytest
from attention_lib import reference
from attention_lib.measure import sanitizer
from attention_lib.stages import scores

# (q shape, k shape): one score; heads with T_q != T_k and d_k 5; a 4-D batch x heads; 33 x 33
# with d_k 24 (a partly used last tile of S, and of d_k: 24 = 16 + 8).
SHAPES = [((1, 1), (1, 1)), ((3, 7, 5), (3, 9, 5)), ((2, 3, 7, 5), (2, 3, 4, 5)),
          ((2, 33, 24), (2, 33, 24))]


def tolerance(d_k):
    """float32 sums of d_k products of standard normals against float64: the rounding errors of
    the d_k additions add up like a random walk, about 6e-8 * sqrt(d_k) times the typical size
    of the sum (sqrt(d_k)) before scaling, so 1e-6 * sqrt(d_k) leaves a wide margin."""
    return 1e-6 * math.sqrt(d_k)


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("q_shape, k_shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_scores_match_the_reference(rng, version, q_shape, k_shape):
    q, k = rng.standard_normal(q_shape), rng.standard_normal(k_shape)
    got = scores.scores(q, k, version=version)
    assert got.dtype == np.float32 and got.shape == q_shape[:-1] + (k_shape[-2],)
    assert np.allclose(got, reference.scores(q, k), rtol=1e-5, atol=tolerance(q_shape[-1]))


@pytest.mark.parametrize("q_shape, t_k", [((1, 1), 1), ((3, 7, 5), 9), ((2, 3, 17, 20), 4), ((2, 33, 24), 33)],
                         ids=lambda s: "x".join(map(str, s)) if isinstance(s, tuple) else str(s))
def test_scores_from_k_transposed_match_the_reference(rng, q_shape, t_k):
    q = rng.standard_normal(q_shape)
    k = rng.standard_normal(q_shape[:-2] + (t_k, q_shape[-1]))
    for scale in (True, False):
        got = scores.scores_kt(q, np.swapaxes(k, -1, -2), scale=scale)
        assert got.dtype == np.float32 and got.shape == q_shape[:-1] + (t_k,)
        want = reference.scores(q, k, scale=scale)
        assert np.allclose(got, want, rtol=1e-5, atol=tolerance(q_shape[-1]) * (1 if scale else math.sqrt(q_shape[-1])))


def test_the_kt_kernel_reads_each_element_once_per_tile_coalesced(rng):
    """q and kt are read once per tile of s that needs them, as v2 reads q and k; a warp's load of kt
    (two rows of 16 neighbouring keys) touches at most 4 segments of 128 bytes."""
    from attention_lib.measure.trace import Traced
    t_q, t_k, d_k = 7, 20, 21                # one row of tiles, two columns of tiles, two steps
    q = rng.standard_normal((1, t_q, d_k)).astype(np.float32)
    kt = rng.standard_normal((1, d_k, t_k)).astype(np.float32)
    grid, block = scores.score_grid(1, t_q, t_k)
    traced = Traced(scores.scores_kt_kernel, grid, block, q, kt, np.float32(1), np.zeros((1, t_q, t_k), np.float32))
    assert traced.races() == []
    assert (traced.loads("q") == 2).all() and (traced.loads("kt") == 1).all()
    assert traced.warp_segments("kt") <= 4


@pytest.mark.parametrize("version", [1, 2])
def test_unscaled_scores_are_the_plain_dot_products(rng, version):
    q, k = rng.standard_normal((2, 7, 20)), rng.standard_normal((2, 5, 20))
    got = scores.scores(q, k, scale=False, version=version)
    assert np.allclose(got, q @ np.swapaxes(k, -1, -2), rtol=1e-5, atol=tolerance(20) * math.sqrt(20))


def test_the_scale_is_one_precomputed_float32():
    assert scores.scale_factor(64) == np.float32(0.125) and scores.scale_factor(64).dtype == np.float32
    assert scores.scale_factor(4096) == np.float32(1 / 64)
    assert scores.scale_factor(64, scale=False) == 1.0


def test_a_kernel_passed_in_is_the_one_launched(rng):
    q, k = rng.standard_normal((3, 4)), rng.standard_normal((5, 4))
    assert np.allclose(scores.scores(q, k, version=2, kernel=scores.scores_kernel_v1),
                       reference.scores(q, k), rtol=1e-5, atol=tolerance(4))


def test_unit_variance_components_give_dot_products_of_std_sqrt_d_k(rng):
    """The notebook's claim, in NumPy: std of q.k is sqrt(d_k); after the scale, 1."""
    for d_k in (64, 256, 4096):
        q, k = rng.standard_normal((2, 4000, d_k))
        raw = np.einsum("nd,nd->n", q, k)
        assert abs(raw.std() / math.sqrt(d_k) - 1) < 0.05
        assert abs((raw / math.sqrt(d_k)).std() - 1) < 0.05
        # Unit-norm vectors instead: the dot product shrinks like 1/sqrt(d_k).
        unit = np.einsum("nd,nd->n", q / np.linalg.norm(q, axis=1, keepdims=True),
                         k / np.linalg.norm(k, axis=1, keepdims=True))
        assert abs(unit.std() * math.sqrt(d_k) - 1) < 0.05


def test_the_tiled_kernel_reads_q_and_k_once_per_tile_not_once_per_score(rng):
    t_q, t_k, d_k = 7, 20, 5                 # one row of tiles, two columns of tiles
    q = rng.standard_normal((1, t_q, d_k)).astype(np.float32)
    k = rng.standard_normal((1, t_k, d_k)).astype(np.float32)
    grid, block = scores.score_grid(1, t_q, t_k)
    naive = sanitizer.count_memory(scores.scores_kernel_v1, grid, block, q, k, np.float32(1),
                                   np.zeros((1, t_q, t_k), np.float32))
    tiled = sanitizer.count_memory(scores.scores_kernel_v2, grid, block, q, k, np.float32(1),
                                   np.zeros((1, t_q, t_k), np.float32))
    assert (naive.loads("q") == t_k).all() and (naive.loads("k") == t_q).all()   # once per score
    assert (tiled.loads("q") == 2).all() and (tiled.loads("k") == 1).all()       # once per tile
    assert (tiled.stores("s") == 1).all()


def shared_accesses(kernel, name, grid, block, *args):
    """{(block, barrier interval, warp, kind): [flat element of `name`, ...]} of one launch,
    from the sanitizer's trace (the shared array's real shape, padding included)."""
    launch = sanitizer._launch(kernel, grid, block, args, sanitizer._TRACE)
    groups = {}
    for element, kind, (blk, (tx, ty, _)), interval, _site, _step in launch.targets[name].trace:
        warp = (tx + ty * block[0]) // 32
        groups.setdefault((blk, interval, warp, kind), []).append(element)
    return groups


def test_the_transposed_k_tile_is_stored_and_read_without_bank_conflicts(rng):
    t_q, t_k, d_k = 5, 19, 20                # two tiles of keys, two steps along d_k
    q = rng.standard_normal((1, t_q, d_k)).astype(np.float32)
    k = rng.standard_normal((1, t_k, d_k)).astype(np.float32)
    grid, block = scores.score_grid(1, t_q, t_k)
    groups = shared_accesses(scores.scores_kernel_v2, "kt_tile", grid, block, q, k, np.float32(1),
                             np.zeros((1, t_q, t_k), np.float32))
    stores = [g for key, g in groups.items() if key[3] == sanitizer.STORE]
    assert len(stores) == 2 * 2 * 8          # 2 blocks x 2 steps x 8 warps, one store per thread
    for elements in stores:                  # 32 stores of one warp: 32 different banks
        assert len(elements) == 32 and len({e % 32 for e in elements}) == 32
    reads = [g for key, g in groups.items() if key[3] == sanitizer.LOAD]
    for elements in reads:                   # per step 16 reads per thread: group them by row cc
        by_row = {}
        for e in elements:
            by_row.setdefault(e // scores.KT_WIDTH, set()).add(e)
        for words in by_row.values():        # distinct words never share a bank (equal ones broadcast)
            assert len(words) == 16 and len({e % 32 for e in words}) == 16
    # The unpadded layout, rows of TILE words, would put a warp's 32 stores into 4 banks.
    tx, ty = np.meshgrid(np.arange(16), np.arange(2))
    assert len(np.unique((tx * scores.TILE + ty) % 32)) == 4
    assert len(np.unique((tx * scores.KT_WIDTH + ty) % 32)) == 32


@pytest.mark.parametrize("call, error, message", [
    (lambda q: scores.scores(q[0, 0], q), ValueError,
     r"^q must have shape \(\.\.\., T_q, d_k\) \(at least 2 axes\), got shape \(4,\)$"),
    (lambda q: scores.scores(q, q[..., :3]), ValueError,
     r"^k must have d_k = 4 in its last axis, like q \(2, 3, 4\); got shape \(2, 3, 3\)$"),
    (lambda q: scores.scores(q, q[:1]), ValueError,
     r"^k must have the leading axes of q \(2,\); got shape \(1, 3, 4\)$"),
    (lambda q: scores.scores(q, q.astype(complex)), TypeError,
     r"^k must be a float array of shape \(\.\.\., T_k, d_k\), got dtype complex128$"),
    (lambda q: scores.scores(np.where(q > 1e9, 0, np.nan), q), ValueError,
     r"^q contains nan at index \(0, 0, 0\); it must be finite$"),
    (lambda q: scores.scores(q, q, version=3), ValueError, r"^version must be 1 or 2, got 3$"),
    (lambda q: scores.scores_kt(q, q), ValueError,
     r"^kt must have shape \(2, 4\) \+ \(T_k,\) \(the leading axes and d_k of q \(2, 3, 4\)\); got shape \(2, 3, 4\)$"),
    (lambda q: scores.scores_kt(q, q[0, 0]), ValueError,
     r"^kt must have shape \(\.\.\., d_k, T_k\) \(at least 2 axes\), got shape \(4,\)$"),
])
def test_bad_inputs_are_one_line_errors_naming_the_argument(rng, call, error, message):
    with pytest.raises(error, match=message):
        call(rng.standard_normal((2, 3, 4)))


def test_the_simulator_refuses_a_full_size_launch(monkeypatch):
    from attention_lib.platform import launch
    monkeypatch.setattr(launch, "ON_SIMULATOR", True)
    monkeypatch.delenv(launch.ALLOW_SLOW_VARIABLE, raising=False)
    q = np.zeros((12, 1024, 64), np.float32)    # one layer of ANDREA-120M: 12.6 M threads
    with pytest.raises(ValueError, match=r"^scores: 12,582,912 CUDA threads would take about"):
        scores.scores(q, q)


def test_the_grid_at_full_size_is_the_gpus_on_either_backend():
    # ANDREA-120M: batch 8 x 12 heads, T 1024: 64 x 64 tiles of 16 x 16 per head
    assert scores.score_grid(96, 1024, 1024) == ((64, 64, 96), (16, 16))


# --- The teaching kernel: the whole tiled body, K in its own layout ------------------------------

@pytest.mark.parametrize("q_shape, t_k", [((1, 1), 1), ((3, 17, 5), 15), ((2, 2, 16, 33), 17), ((15, 64), 33),
                                          ((1, 17, 128), 16)],
                         ids=lambda s: "x".join(map(str, s)) if isinstance(s, tuple) else str(s))
def test_the_teaching_kernel_matches_the_reference(rng, q_shape, t_k):
    """Partly used tiles of S on both axes, d_k of one short step, one past two steps, 64 and 128."""
    q = rng.standard_normal(q_shape)
    k = rng.standard_normal(q_shape[:-2] + (t_k, q_shape[-1]))
    d_k = q_shape[-1]
    for scale in (True, False):
        got = scores.scores(q, k, scale=scale, kernel=scores.scores_tiled_kernel)
        assert got.dtype == np.float32 and got.shape == q_shape[:-1] + (t_k,)
        atol = tolerance(d_k) * (1 if scale else math.sqrt(d_k))
        assert np.allclose(got, reference.scores(q, k, scale=scale), rtol=1e-5, atol=atol)


def test_the_teaching_kernel_reads_once_per_tile_coalesced_and_without_bank_conflicts(rng):
    """q read once per tile of keys and k once per tile of queries; warp loads of q and k and stores of s
    at most 4 segments; every warp access of a tile reaches each bank for one word at most."""
    from attention_lib.measure.trace import Traced
    t_q, t_k, d_k = 17, 20, 21               # two tiles each way, two steps
    q = rng.standard_normal((1, t_q, d_k)).astype(np.float32)
    k = rng.standard_normal((1, t_k, d_k)).astype(np.float32)
    grid, block = scores.score_grid(1, t_q, t_k)
    traced = Traced(scores.scores_tiled_kernel, grid, block, q, k, np.float32(0.3),
                    np.zeros((1, t_q, t_k), np.float32))
    assert traced.races() == [] and traced.barriers == 4
    assert (traced.loads("q") == 2).all() and (traced.loads("k") == 2).all()
    assert max(traced.worst_warp_load(name)[0] for name in ("q", "k")) <= 4
    assert traced.worst_warp_load("s", kind=sanitizer.STORE)[0] <= 4
    for name in ("q_tile", "kt_tile"):
        for kind in (sanitizer.LOAD, sanitizer.STORE):
            for elements in traced._warp_requests(name, kind).values():
                words = set(elements)
                assert len(words) == len({w % 32 for w in words}), (name, kind)
