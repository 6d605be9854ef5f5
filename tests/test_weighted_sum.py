"""Notebook 05: the weighted-sum kernels (A @ V) against NumPy, the reuse of projection's tiled
matmul, their memory reads counted, the causal kernel's skipped tiles, and bad inputs. The
exercises' planted mistakes are in test_exercises_05.py."""

import numpy as np
import pytest
from attention_lib import reference
from attention_lib.measure import sanitizer
from attention_lib.stages import projection, softmax, weighted_sum
from attention_lib.platform.launch import ceil_div
from numba import cuda

TILE = projection.TILE
# (leading axes, T_q, T_k, d_v): one weight; fewer rows and columns than a tile; T 33 = two
# tiles and one row more; T_q != T_k; d_v 24 (two tiles, the second partly used); batch x heads.
AWKWARD = [((), 1, 1, 1), ((), 7, 5, 24), ((), 33, 33, 5), ((), 5, 33, 7), ((2, 3), 7, 9, 5)]


def tolerance(t_k):
    """float32 kernel vs float64 reference: each output sums T_k products of order 1, and the
    rounding errors of a sum of K terms grow like sqrt(K) times float32's 1e-7; 1e-5 * sqrt(K)
    leaves room."""
    return 1e-5 * np.sqrt(t_k)


def weights_and_values(rng, lead, t_q, t_k, d_v, causal=False):
    """Real attention weights (rows >= 0, summing to 1) from random scores, and random values."""
    s = rng.standard_normal((*lead, t_q, t_k))
    a = reference.softmax(reference.apply_causal_mask(s) if causal else s).astype(np.float32)
    v = rng.standard_normal((*lead, t_k, d_v)).astype(np.float32)
    return a, v


@pytest.mark.parametrize("version", [1, 2])
@pytest.mark.parametrize("lead, t_q, t_k, d_v", AWKWARD, ids=str)
def test_weighted_sum_matches_the_reference(rng, version, lead, t_q, t_k, d_v):
    a, v = weights_and_values(rng, lead, t_q, t_k, d_v)
    got = weighted_sum.weighted_sum(a, v, version=version)
    assert got.dtype == np.float32 and got.shape == (*lead, t_q, d_v)
    tol = tolerance(t_k)
    assert np.allclose(got, reference.weighted_sum(a, v), rtol=tol, atol=tol)


@pytest.mark.parametrize("version", [1, 2])
def test_any_matrix_works_not_only_softmax_weights(rng, version):
    # A @ V is a plain matrix product: negative entries, rows not summing to 1.
    a = rng.standard_normal((2, 17, 18)).astype(np.float32)
    v = rng.standard_normal((2, 18, 3)).astype(np.float32)
    got = weighted_sum.weighted_sum(a, v, version=version)
    assert np.allclose(got, reference.weighted_sum(a, v), rtol=tolerance(18), atol=tolerance(18))


def test_the_two_versions_give_the_same_numbers(rng):
    # The same products added in the same order (k = 0, 1, ...), zeros past the edges adding
    # nothing: equal to the last bit.
    a, v = weights_and_values(rng, (3,), 20, 19, 6, causal=True)
    assert np.array_equal(weighted_sum.weighted_sum(a, v, version=1), weighted_sum.weighted_sum(a, v, version=2))


def test_each_output_row_mixes_only_the_values_it_is_given_weight_on(rng):
    a, v = weights_and_values(rng, (), 7, 7, 4, causal=True)
    got = weighted_sum.weighted_sum(a, v)
    assert np.allclose(got[0], v[0], rtol=1e-6, atol=1e-6)           # row 0 sees only itself
    one_hot = np.eye(7, dtype=np.float32)[::-1]                       # row i takes value row 6 - i
    assert np.array_equal(weighted_sum.weighted_sum(one_hot, v), v[::-1])
    uniform = np.full((3, 7), 1 / 7, np.float32)                       # the average of all values
    assert np.allclose(weighted_sum.weighted_sum(uniform, v), v.mean(axis=0), rtol=1e-5, atol=1e-6)


def test_heads_are_independent(rng):
    a, v = weights_and_values(rng, (2, 3), 6, 5, 4)
    got = weighted_sum.weighted_sum(a, v)
    assert np.array_equal(got[1, 2], weighted_sum.weighted_sum(a[1, 2], v[1, 2]))


@pytest.mark.parametrize("version", [1, 2])
def test_the_kernel_argument_is_launched_on_the_grid(rng, version):
    a, v = weights_and_values(rng, (2,), 7, 5, 3)
    launched = []

    class Recorder:
        """Stands in for a kernel: records each launch's grid and block, then runs the real one."""

        def __getitem__(self, config):
            launched.append(config)
            return weighted_sum.KERNELS[version][config]

    got = weighted_sum.weighted_sum(a, v, version=version, kernel=Recorder())
    # once, the head on the grid's z axis
    assert launched == [weighted_sum.weighted_sum_grid(2, 7, 3)] == [((1, 1, 2), (TILE, TILE))]
    assert np.allclose(got, reference.weighted_sum(a, v), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("t_q, t_k, d_v", [(33, 20, 5), (16, 16, 24)])
def test_global_reads_per_element_are_projections(rng, t_q, t_k, d_v):
    # A plays x and V plays w: projection.global_reads(T_q, d_v, version) holds for both versions.
    a, v = weights_and_values(rng, (2,), t_q, t_k, d_v)
    out = np.full((2, t_q, d_v), np.nan, np.float32)
    report = sanitizer.count_memory(weighted_sum.weighted_sum_kernel_v2,
                                    *weighted_sum.weighted_sum_grid(2, t_q, d_v), a, v, out)
    a_reads, v_reads = projection.global_reads(t_q, d_v, 2)
    assert (a_reads, v_reads) == (ceil_div(d_v, TILE), ceil_div(t_q, TILE))
    assert np.all(report.loads("a") == a_reads) and np.all(report.loads("v") == v_reads)
    assert np.all(report.stores("out") == 1) and report.loads("out").sum() == 0
    assert np.allclose(out, reference.weighted_sum(a, v), rtol=tolerance(t_k), atol=tolerance(t_k))
    # Version 1 reads each weight d_v times, each value T_q times, as projection_kernel_v1 does.
    out1 = np.zeros((2, t_q, d_v), np.float32)
    report1 = sanitizer.count_memory(weighted_sum.weighted_sum_kernel_v1,
                                     *weighted_sum.weighted_sum_grid(2, t_q, d_v), a, v, out1)
    assert projection.global_reads(t_q, d_v, 1) == (d_v, t_q)
    assert np.all(report1.loads("a") == d_v) and np.all(report1.loads("v") == t_q)
    assert np.all(report1.stores("out") == 1)


@pytest.mark.parametrize("version", [1, 2])
def test_the_kernels_have_no_race(rng, version):
    a, v = weights_and_values(rng, (2,), 7, 20, 3)                     # two steps along T_k
    out = np.zeros((2, 7, 3), np.float32)
    assert sanitizer.find_races(weighted_sum.KERNELS[version],
                                *weighted_sum.weighted_sum_grid(2, 7, 3), a, v, out) == []


def test_launch_weighted_sum_works_on_device_arrays(rng):
    a, v = weights_and_values(rng, (2,), 7, 5, 3)
    d_out = cuda.device_array((2, 7, 3), np.float32)
    weighted_sum.launch_weighted_sum(cuda.to_device(a), cuda.to_device(v), d_out)
    assert np.allclose(d_out.copy_to_host(), reference.weighted_sum(a, v), rtol=1e-5, atol=1e-5)


def test_softmax_then_weighted_sum_stays_within_the_values(rng):
    # Each output is a weighted average: every coordinate lies between the smallest and the
    # largest value of the rows it may see.
    s = reference.apply_causal_mask(rng.standard_normal((9, 9)) * 3).astype(np.float32)
    v = rng.standard_normal((9, 4)).astype(np.float32)
    out = weighted_sum.weighted_sum(softmax.softmax(s, version=1), v)
    lower = np.minimum.accumulate(v, axis=0)                           # smallest over rows 0..i
    upper = np.maximum.accumulate(v, axis=0)
    assert (out >= lower - 1e-6).all() and (out <= upper + 1e-6).all()


@pytest.mark.parametrize("call, error, message", [
    (lambda a, v: weighted_sum.weighted_sum(a[0, 0], v), ValueError,
     r"^a must have shape \(\.\.\., T_q, T_k\) \(at least 2 axes\), got shape \(5,\)$"),
    (lambda a, v: weighted_sum.weighted_sum(a, v[0, 0]), ValueError,
     r"^v must have shape \(\.\.\., T_k, d_v\) \(at least 2 axes\), got shape \(3,\)$"),
    (lambda a, v: weighted_sum.weighted_sum(a, v[:, :4]), ValueError,
     r"^v must have T_k = 5 rows \(the last axis of a \(2, 4, 5\)\); got shape \(2, 4, 3\)$"),
    (lambda a, v: weighted_sum.weighted_sum(a, v[:1]), ValueError,
     r"^v must have the leading axes of a \(2,\); got shape \(1, 5, 3\)$"),
    (lambda a, v: weighted_sum.weighted_sum(a, v, version=3), ValueError,
     r"^version must be 1 or 2, got 3$"),
    (lambda a, v: weighted_sum.weighted_sum(a > 0, v), TypeError,
     r"^a must be a float array of shape \(\.\.\., T_q, T_k\), got dtype bool$"),
    (lambda a, v: weighted_sum.weighted_sum(a, np.where(v > 0, np.nan, v)), ValueError,
     r"^v contains nan at index \(\d+, \d+, \d+\); it must be finite$"),
    (lambda a, v: weighted_sum.weighted_sum(np.where(a > 0.5, -np.inf, a), v), ValueError,
     r"^a contains -inf at index \(\d+, \d+, \d+\); it must be finite$"),
])
def test_bad_inputs_are_one_line_errors_naming_the_argument(rng, call, error, message):
    a, v = weights_and_values(rng, (2,), 4, 5, 3)
    with pytest.raises(error, match=message):
        call(a, v)


def test_the_simulator_refuses_a_full_size_weighted_sum(monkeypatch):
    from attention_lib.platform import launch
    monkeypatch.setattr(launch, "ON_SIMULATOR", True)
    monkeypatch.delenv(launch.ALLOW_SLOW_VARIABLE, raising=False)
    # ANDREA-120M, one sequence: 12 heads of (1024, 1024) @ (1024, 64). Checked before any copy.
    with pytest.raises(ValueError, match=r"^weighted_sum: 786,432 CUDA threads would take about"):
        weighted_sum.weighted_sum(np.zeros((12, 1024, 1024), np.float32), np.zeros((12, 1024, 64), np.float32))


# --- Causal weights: the tiles above the diagonal are skipped --------------------------------

@pytest.mark.parametrize("lead, t_q, t_k, d_v", [((), 1, 1, 1), ((2,), 33, 33, 5), ((), 7, 35, 17),
                                                 ((), 35, 19, 3)], ids=str)
def test_causal_weighted_sum_matches_the_reference(rng, lead, t_q, t_k, d_v):
    # T_q < T_k: the queries are the last positions; T_q > T_k: the first queries see no key
    a, v = weights_and_values(rng, lead, t_q, t_k, d_v, causal=True)
    got = weighted_sum.weighted_sum(a, v, causal=True)
    assert got.dtype == np.float32 and got.shape == (*lead, t_q, d_v)
    assert np.allclose(got, reference.weighted_sum(a, v), rtol=tolerance(t_k), atol=tolerance(t_k))


@pytest.mark.parametrize("bh, t_q, t_k, d_v", [(1, 35, 35, 5), (2, 20, 37, 17), (1, 37, 20, 3)])
def test_causal_kernel_skips_the_tiles_the_formula_counts(rng, bh, t_q, t_k, d_v):
    a, v = weights_and_values(rng, (bh,), t_q, t_k, d_v, causal=True)
    out = np.full((bh, t_q, d_v), np.nan, np.float32)
    report = sanitizer.count_memory(weighted_sum.weighted_sum_causal_kernel,
                                    *weighted_sum.weighted_sum_grid(bh, t_q, d_v), a, v, out)
    assert np.allclose(out, reference.weighted_sum(a, v), rtol=tolerance(t_k), atol=tolerance(t_k))
    loads = report.loads("a")                                   # (bh, t_q, t_k)
    across = ceil_div(d_v, TILE)                                # blocks that read each loaded tile
    loaded = skipped = 0
    for h in range(bh):
        for r in range(0, t_q, TILE):
            # a block of queries reads the keys its last query sees, and nothing after them
            last_query = min(r + TILE, t_q) - 1 + (t_k - t_q)
            sees = np.arange(t_k) <= last_query
            block = loads[h, r:r + TILE]
            assert np.all(block[:, sees] == across) and np.all(block[:, ~sees] == 0)
            for c in range(0, t_k, TILE):
                read = loads[h, r:r + TILE, c:c + TILE].any()
                loaded, skipped = loaded + read, skipped + (not read)
    assert (loaded * across, skipped * across) == weighted_sum.causal_tile_counts(bh, t_q, t_k, d_v)
    # nothing it skips carries weight: every nonzero weight was read
    assert np.all(loads[a != 0] == across)


def test_causal_tile_counts_at_full_size():
    # ANDREA-120M, one head: T 1024 = 64 tiles of 16; 64 * 63 / 2 = 2016 of 4096 tiles skipped,
    # for each of the 4 blocks across d_k 64 and each of the 96 heads of a batch of 8.
    n = 1024 // TILE
    assert weighted_sum.causal_tile_counts(1, 1024, 1024, 16) == (n * (n + 1) // 2, n * (n - 1) // 2)
    assert weighted_sum.causal_tile_counts(96, 1024, 1024, 64) == (96 * 4 * 2080, 96 * 4 * 2016)


def test_causal_needs_zero_weights_above_the_diagonal(rng):
    a, v = weights_and_values(rng, (), 5, 6, 2)                  # not causal: a[0, 1] > 0
    with pytest.raises(ValueError, match=r"^a must be 0 where j > i \+ \(T_k - T_q\) when causal=True; "
                                         r"got 0\.\d+ at \(head 0, i 0, j 2\)$"):
        weighted_sum.weighted_sum(a, v, causal=True)
    with pytest.raises(ValueError, match=r"^causal=True needs version 2 \(version 1 has no tile to skip\)$"):
        weighted_sum.weighted_sum(a, v, version=1, causal=True)
    with pytest.raises(ValueError, match=r"^causal must be True or False, got 'yes'$"):
        weighted_sum.weighted_sum(a, v, causal="yes")


def test_causal_kernel_has_no_race(rng):
    a, v = weights_and_values(rng, (2,), 20, 37, 3, causal=True)     # blocks stopping at different steps
    out = np.zeros((2, 20, 3), np.float32)
    assert sanitizer.find_races(weighted_sum.weighted_sum_causal_kernel,
                                *weighted_sum.weighted_sum_grid(2, 20, 3), a, v, out) == []


def test_the_grid_at_full_size_is_the_gpus_on_either_backend():
    # ANDREA-120M: 96 heads, T 1024, d_k 64: 4 x 64 blocks of 16 x 16 per head
    assert weighted_sum.weighted_sum_grid(96, 1024, 64) == ((4, 64, 96), (16, 16))
