"""Notebook 04: the row softmax kernels against NumPy, their memory traffic, barriers and warp
collectives. The exercises' planted mistakes are in test_exercises_04.py."""

import math

import attention_lib
import numpy as np
import pytest
from attention_lib import reference
from attention_lib.measure import sanitizer
from attention_lib.stages import mask, softmax
from numba import cuda

B = softmax.THREADS_PER_ROW

# Score shapes (..., T_q, T_k): one score; fewer rows and columns than a block; a partly used
# second block of rows (v1); rows longer than a block and not a multiple of it (v2's stride
# loop); fewer columns than threads; batch x heads. v2 runs a block per row and every barrier
# is slow on the simulator, so the shapes stay small.
SHAPES = [(1, 1), (7, 5), (33, 3), (3, 2 * B + 5), (5, B + 1), (2, 2, 7, 7)]


def scores_for(rng, shape, causal):
    s = rng.standard_normal(shape) * 2.0
    return (reference.apply_causal_mask(s) if causal else s).astype(np.float32)


def assert_matches_reference(got, s):
    """float32 exp (a few ulp) and sums of up to T_k terms against float64: errors around 1e-7
    of a weight at these sizes; rtol 1e-5 leaves room, atol 1e-6 covers weights near 0."""
    want = reference.softmax(s)
    assert got.dtype == np.float32 and got.shape == s.shape
    assert np.allclose(got, want, rtol=1e-5, atol=1e-6), np.abs(got - want).max()


@pytest.mark.parametrize("version", [1, 2, 3])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_softmax_matches_the_reference(rng, version, shape):
    s = scores_for(rng, shape, causal=False)
    assert_matches_reference(softmax.softmax(s, version=version), s)


@pytest.mark.parametrize("version, heads", [(1, 2), (2, 1), (3, 2)])   # v2: a block per row, so fewer rows
def test_causal_weights_match_and_have_the_three_properties(rng, version, heads):
    s = scores_for(rng, (heads, 33, 33), causal=True)
    a = softmax.softmax(s, version=version)
    assert_matches_reference(a, s)
    assert (a >= 0).all()
    assert np.allclose(a.sum(axis=-1), 1.0, atol=1e-6)
    assert (a[..., ~reference.causal_mask(33)] == 0).all()        # the future gets exactly 0
    # Monotone within a row: a larger score never gets a smaller weight.
    larger = s[..., :, None] > s[..., None, :]                     # (..., i, j, k): s_ij > s_ik
    assert (a[..., :, None] >= a[..., None, :])[larger].all()


@pytest.mark.parametrize("version", [1, 2, 3])
def test_large_scores_neither_overflow_nor_underflow(rng, version):
    s = scores_for(rng, (4, 33), causal=False)
    s[0] += 1000.0                              # exp(1000) overflows float32
    s[1] -= 1000.0                              # exp(-1000) underflows to 0
    s[2, 5] = 500.0                             # one score far above the rest
    got = softmax.softmax(s, version=version)
    assert np.isfinite(got).all()
    assert_matches_reference(got, s)
    assert np.allclose(got[:1], softmax.softmax(s[:1] - 1000.0, version=version), atol=1e-6)  # shift invariance
    assert got[2, 5] == 1.0


@pytest.mark.parametrize("version", [1, 2, 3])
def test_fully_masked_rows_get_zero_weights_not_nan(rng, version):
    # 6 queries against 4 keys: queries 0 and 1 come before every key, so see nothing.
    s = mask.apply_causal_mask(scores_for(rng, (2, 6, 4), causal=False))
    s[1, 4] = -np.inf                           # and one more row with every score masked
    got = softmax.softmax(s, version=version)
    assert not np.isnan(got).any()
    assert (got[:, :2] == 0).all() and (got[1, 4] == 0).all()
    assert np.allclose(got[0, 2:].sum(axis=-1), 1.0, atol=1e-6)
    assert_matches_reference(got, s)


def test_v2_handles_a_row_longer_than_the_block_with_one_score_left_over(rng):
    s = scores_for(rng, (1, 3 * B + 1), causal=False)
    s[0, -1] = 50.0                             # the last score, alone in the stride loop's last round
    got = softmax.softmax(s, version=2)
    assert_matches_reference(got, s)
    assert got[0, -1] > 0.99


@pytest.mark.parametrize("block", [1, 3, 8, 33, 100])
def test_online_softmax_equals_the_softmax(rng, block):
    s = scores_for(rng, (3, 5, 33), causal=True)
    s[0, 2] = -np.inf                           # a fully masked row
    s[1, 4, 20:] += 50.0                        # the max grows late in the row: l is rescaled
    got = softmax.online_softmax(s, block=block)
    assert np.allclose(got, reference.softmax(s), rtol=1e-12, atol=1e-15)   # both float64
    assert (got[0, 2] == 0).all()


def test_v3_reduces_in_registers_without_a_barrier(rng):
    """One warp per row: the lanes meet at 2 x 5 shuffles (the pair (m, l), 32 lanes merged in five
    steps) and at no barrier; shared memory is never touched, and every score is read twice (the
    pair's pass, the weights' pass) where kernels 1 and 2 read it three times."""
    s = scores_for(rng, (6, 70), causal=False)                # 6 rows: a block of 4 and one of 2
    out = np.zeros_like(s)
    report = sanitizer.count_memory(softmax.softmax_kernel_v3, *softmax.softmax_grid(6, 3), s, out)
    assert_matches_reference(out, s)
    assert (report.barriers, report.warp_collectives) == (0, 10)
    assert not [a for a in report.arrays.values() if a.space == "shared"]
    assert (report.loads("s") == 2).all() and (report.stores("out") == 1).all()
    v2 = sanitizer.count_memory(softmax.softmax_kernel_v2, *softmax.softmax_grid(6, 2), s, np.zeros_like(s))
    assert v2.barriers == 2 * (2 + int(np.log2(B))) and v2.warp_collectives == 0


def test_the_thread_block_for_a_row_is_a_power_of_two():
    assert B >= 2 and B & (B - 1) == 0


def test_the_kernel_argument_is_launched_on_the_versions_grid(rng):
    s = scores_for(rng, (5, 9), causal=False)
    assert np.array_equal(softmax.softmax(s, version=1, kernel=softmax.softmax_kernel_v1),
                          softmax.softmax(s, version=1))
    assert softmax.softmax_grid(70, 1) == (math.ceil(70 / softmax.ROWS_PER_BLOCK), softmax.ROWS_PER_BLOCK)
    assert softmax.softmax_grid(70, 2) == (70, B)


# --- Memory traffic and barriers -----------------------------------------------------------

@pytest.mark.parametrize("kernel, grid, block", [
    (softmax.softmax_kernel_v1, 1, softmax.ROWS_PER_BLOCK),
    (softmax.softmax_kernel_v2, 5, B)], ids=["v1", "v2"])
def test_each_score_is_read_three_times_and_each_weight_written_once(rng, kernel, grid, block):
    s = scores_for(rng, (5, B + 3), causal=False)
    out = np.zeros_like(s)
    report = sanitizer.count_memory(kernel, grid, block, s, out)
    assert (report.loads("s") == 3).all()       # the max pass, the sum pass, the normalise pass
    assert (report.stores("out") == 1).all() and (report.loads("out") == 0).all()
    assert_matches_reference(out, s)


def test_v2_shared_memory_traffic(rng):
    rows, t_k = 3, 9
    report = sanitizer.count_memory(softmax.softmax_kernel_v2, rows, B,
                                    scores_for(rng, (rows, t_k), False), np.zeros((rows, t_k), np.float32))
    # Per reduction and row: every thread writes its value once; each round of stride r reads
    # 2r entries and writes r (B - 1 entries written over all rounds); every thread reads partial[0].
    per_reduction_stores = B + (B - 1)
    per_reduction_loads = 2 * (B - 1) + B
    assert report.stores("partial").sum() == rows * 2 * per_reduction_stores
    assert report.loads("partial").sum() == rows * 2 * per_reduction_loads


@pytest.mark.parametrize("kernel, grid, block", [
    (softmax.softmax_kernel_v1, 2, softmax.ROWS_PER_BLOCK),
    (softmax.softmax_kernel_v2, 3, B)], ids=["v1", "v2"])
def test_the_kernels_have_no_race(rng, kernel, grid, block):
    s = scores_for(rng, (3, B + 3), causal=False)
    s[1] = -np.inf                              # the early exit of a fully masked row, too
    assert sanitizer.find_races(kernel, grid, block, s, np.zeros_like(s)) == []


@cuda.jit(device=True)
def block_max_missing_barrier(partial, value, missing):
    """softmax.block_max with barrier number `missing` left out (0: after the writes,
    1: between the rounds, 2: after reading the result)."""
    tid = cuda.threadIdx.x
    partial[tid] = value
    if missing != 0:
        cuda.syncthreads()
    stride = softmax.THREADS_PER_ROW // 2
    while stride > 0:
        if tid < stride:
            partial[tid] = max(partial[tid], partial[tid + stride])
        if missing != 1:
            cuda.syncthreads()
        stride //= 2
    result = partial[0]
    if missing != 2:
        cuda.syncthreads()
    return result


@cuda.jit
def softmax_v2_missing_barrier(s, out, missing):
    """softmax.softmax_kernel_v2 with one barrier of its max reduction left out."""
    partial = cuda.shared.array(softmax.THREADS_PER_ROW, np.float32)
    row, tid, t_k = cuda.blockIdx.x, cuda.threadIdx.x, s.shape[1]
    my_max = np.float32(-math.inf)
    for j in range(tid, t_k, softmax.THREADS_PER_ROW):
        my_max = max(my_max, s[row, j])
    row_max = block_max_missing_barrier(partial, my_max, missing)
    my_total = np.float32(0.0)
    for j in range(tid, t_k, softmax.THREADS_PER_ROW):
        my_total += math.exp(s[row, j] - row_max)
    inv_total = np.float32(1.0) / softmax.block_sum(partial, my_total)
    for j in range(tid, t_k, softmax.THREADS_PER_ROW):
        out[row, j] = math.exp(s[row, j] - row_max) * inv_total


@pytest.mark.filterwarnings("ignore::RuntimeWarning")   # a racy reduction may give 1 / 0
@pytest.mark.parametrize("missing", [0, 1, 2], ids=["after-writes", "between-rounds", "after-result"])
def test_every_barrier_of_the_reduction_is_needed(rng, missing):
    s = scores_for(rng, (1, B), causal=False)
    races = sanitizer.find_races(softmax_v2_missing_barrier, 1, B, s, np.zeros_like(s), missing)
    assert races and {r.array for r in races} == {"partial"}, [str(r) for r in races]
    assert all(r.space == "shared" for r in races)


# --- Bad input -----------------------------------------------------------------------------

@pytest.mark.parametrize("call, error, message", [
    (lambda: softmax.softmax(np.zeros(4)), ValueError,
     r"^s must have shape \(\.\.\., T_q, T_k\) \(at least 2 axes\), got shape \(4,\)$"),
    (lambda: softmax.softmax(np.array([[0.0, np.nan]])), ValueError,
     r"^s contains nan at index \(0, 1\); it must be finite$"),
    (lambda: softmax.softmax(np.array([[0.0], [np.inf]])), ValueError,
     r"^s contains inf at index \(1, 0\); it must be finite$"),
    (lambda: softmax.softmax(np.ones((2, 2), bool)), TypeError,
     r"^s must be a float array of shape \(\.\.\., T_q, T_k\), got dtype bool$"),
    (lambda: softmax.softmax(np.zeros((2, 0))), ValueError, r"^s must not be empty, got shape \(2, 0\)$"),
    (lambda: softmax.softmax(np.zeros((2, 2)), version=4), ValueError, r"^version must be 1, 2 or 3, got 4$"),
])
def test_bad_inputs_are_one_line_errors_naming_the_argument(call, error, message):
    with pytest.raises(error, match=message):
        call()


def test_the_simulator_budget_refuses_huge_launches():
    if not attention_lib.ON_SIMULATOR:
        pytest.skip("only the simulator refuses large launches")
    with pytest.raises(ValueError, match=r"^softmax: .* CUDA threads would take about"):
        softmax.softmax(np.zeros((16, 12, 1024, 64), np.float32))   # 196,608 rows, a block each


# --- The (m, l) merge -------------------------------------------------------------------------

@cuda.jit
def merge_all(pairs, out):
    """out[0] = the merge of every pair of pairs (n, 2), one after the other, by one thread."""
    m, l = np.float32(-math.inf), np.float32(0.0)
    for i in range(pairs.shape[0]):
        m, l = softmax.merge_stats(m, l, pairs[i, 0], pairs[i, 1])
    out[0], out[1] = m, l


@pytest.mark.parametrize("scores", [[0.5, 3.0, -1.0, 2.0], [-1000.0, -999.0], [1000.0, 1001.0, 999.5],
                                    [-np.inf, 1.0, -np.inf], [-np.inf, -np.inf]], ids=str)
def test_merging_single_scores_gives_the_max_and_the_shifted_sum(scores):
    s = np.array(scores, np.float32)
    out = np.zeros(2, np.float32)
    merge_all[1, 1](np.stack([s, np.ones_like(s)], axis=-1), out)      # a single score is the pair (s, 1)
    m = s.max()
    want_l = 0.0 if m == -np.inf else np.exp(s.astype(np.float64) - m).sum()
    assert out[0] == m and np.isclose(out[1], want_l, rtol=1e-6)


# --- The teaching kernel of the main exercise ------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 1), (3, B - 1), (2, B), (2, B + 1), (3, 2 * B + 5), (2, 2, 7, 7)],
                         ids=lambda s: "x".join(map(str, s)))
def test_the_block_softmax_kernel_matches_the_reference(rng, shape):
    s = scores_for(rng, shape, causal=False)
    s.reshape(-1, shape[-1])[0] = -np.inf       # a fully masked row: zeros, with no thread leaving early
    s.reshape(-1, shape[-1])[-1, 0] = 500.0     # a score far above the rest: its weight is 1
    got = softmax.softmax(s, version=2, kernel=softmax.block_softmax_kernel)
    assert_matches_reference(got, s)
    assert (got.reshape(-1, shape[-1])[0] == 0).all() and got.reshape(-1, shape[-1])[-1, 0] == 1.0


def test_the_block_softmax_kernel_counts_as_kernel_2(rng):
    """The same design as kernel 2: each score read three times, each weight written once, the two
    reductions' barriers (2 + log2 B each), also in a fully masked row, which kernel 2 leaves early."""
    s = scores_for(rng, (3, B + 3), causal=False)
    s[1] = -np.inf
    out = np.zeros_like(s)
    report = sanitizer.count_memory(softmax.block_softmax_kernel, *softmax.softmax_grid(3, 2), s, out)
    assert_matches_reference(out, s)
    assert (report.loads("s") == 3).all() and (report.stores("out") == 1).all()
    assert report.barriers == 2 * (2 + int(np.log2(B)))
    assert sanitizer.find_races(softmax.block_softmax_kernel, 3, B, s, np.zeros_like(s)) == []
