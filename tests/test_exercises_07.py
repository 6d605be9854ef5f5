"""Notebook 07's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line;
hints in levels, without code; the walk's check at both launches and compiled for a GPU."""

import math
import types

import numpy as np
import pytest
from numba import cuda, float32

from attention_lib.checks import EXERCISES, check, hint, mutation
from attention_lib.stages import flash
from attention_lib.stages.flash import BLOCK_K, NEG_INF


def library_copy(function):
    """The library's function as a new function object with the same code: what a student's
    solution is (the library's own object is refused as given code)."""
    return types.FunctionType(function.__code__, function.__globals__, function.__name__, function.__defaults__,
                              function.__closure__)


def assert_diagnosis(exercise_id, answer, diagnosis, says):
    result = check(exercise_id, answer, verbose=False)
    assert (result.diagnosis, says in result.message) == (diagnosis, True), result.message
    assert not result.passed and "\n" not in str(result)


@pytest.mark.parametrize("exercise_id", ["07_online_softmax", "07_walk_keys"])
def test_hints_come_in_levels_without_code(exercise_id, capsys):
    hints = EXERCISES[exercise_id].hints
    assert len(hints) >= 2
    hint(exercise_id, 2)
    assert capsys.readouterr().out.startswith(f"{exercise_id}, hint 2 of {len(hints)}: the plan")
    for text in hints:
        assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), text


# --- 07_online_softmax: one row's update in NumPy ----------------------------------------------

def without_rescale(m, l, acc, s_block, v_block):
    m_new = max(m, s_block.max())
    p = np.exp(s_block - m_new)
    return m_new, l + p.sum(), acc + p @ v_block


def rescales_l_only(m, l, acc, s_block, v_block):
    m_new = max(m, s_block.max())
    p = np.exp(s_block - m_new)
    return m_new, l * np.exp(m - m_new) + p.sum(), acc + p @ v_block


def inverted_rescale(m, l, acc, s_block, v_block):
    m_new = max(m, s_block.max())
    p = np.exp(s_block - m_new)
    with np.errstate(invalid="ignore", over="ignore"):
        return m_new, l * np.exp(m_new - m) + p.sum(), acc * np.exp(m_new - m) + p @ v_block


def normalises_acc(m, l, acc, s_block, v_block):
    m_new = max(m, s_block.max())
    rescale, p = np.exp(m - m_new), np.exp(s_block - m_new)
    l = l * rescale + p.sum()
    return m_new, l, (acc * rescale + p @ v_block) / l


def forgets_the_max(m, l, acc, s_block, v_block):
    with np.errstate(over="ignore", invalid="ignore"):
        p = np.exp(s_block)
    return max(m, s_block.max()), l + p.sum(), acc + p @ v_block


def unguarded(m, l, acc, s_block, v_block):
    """Right while the first block has a visible key; NaN for good after a first block all masked."""
    m_new = max(m, s_block.max())
    with np.errstate(invalid="ignore"):
        rescale, p = np.exp(m - m_new), np.exp(s_block - m_new)
    return m_new, l * rescale + p.sum(), acc * rescale + p @ v_block


def stub(m, l, acc, s_block, v_block):
    raise NotImplementedError()


def test_the_library_update_passes():
    result = check("07_online_softmax", library_copy(flash.online_update), verbose=False)
    assert result.passed and result.diagnosis == "ok", result.message


@pytest.mark.parametrize("answer, diagnosis, says", [
    (without_rescale, "online_softmax_no_rescale", "l and acc were not rescaled"),
    (rescales_l_only, "online_softmax_no_rescale", "acc was not rescaled"),
    (inverted_rescale, "wrong_values", "exp(m_new - m_old), which overflows"),
    (unguarded, "nan_before_first_key", "first block is all masked"),
    (normalises_acc, "wrong_values", "not divided by l"),
    (forgets_the_max, "wrong_values", "l is"),
    (lambda m, l, acc, s_block, v_block: (m, l), "raised_error", "got a tuple of 2"),
    (lambda m, l, acc, s_block, v_block: (s_block.max(), l, np.append(acc, 0.0)), "raised_error",
     "acc must keep shape (1,)"),
    (stub, "not_implemented", "Hint"),
    (lambda m, l, acc, s_block, v_block: flash.online_update(m, l, acc, s_block, v_block), "calls_given_code",
     "online_update"),
])
def test_planted_update_mistakes_get_their_diagnosis(answer, diagnosis, says):
    assert_diagnosis("07_online_softmax", answer, diagnosis, says)


# --- 07_walk_keys: kernel 2's walk over its band of key tiles ------------------------------------

def planted_walk(mistake):
    """flash.walk_key_tiles with one typical mistake (a string, compiled in as a constant)."""
    @cuda.jit(device=True)
    def walk(k_tile, v_tile, p_row, q_row, acc, k, v, kv, q0, n_rows, t_q, causal, window):
        t_k, d_k, d_v = k.shape[1], k.shape[2], v.shape[2]
        tid, me, threads = cuda.threadIdx.x, cuda.threadIdx.x + cuda.threadIdx.y * cuda.blockDim.x, \
            cuda.blockDim.x * cuda.blockDim.y              # the block's rows of threads (one per query head) copy together
        if mistake == "threads_16":
            threads = 16                                   # the simulator's BLOCK_Q, hard-coded
        if mistake == "rows_copy_alike":                   # each row of threads copies the whole tile
            me, threads = tid, cuda.blockDim.x
        shift = t_k - t_q
        last = q0 + n_rows - 1
        band_start = max(0, q0 + shift - window + 1) // BLOCK_K * BLOCK_K if window > 0 else 0
        band_end = min(t_k, last + shift + 1) if causal else t_k
        my_first = max(0, q0 + tid + shift - window + 1) if window > 0 else 0
        my_end = min(t_k, q0 + tid + shift + 1) if causal else t_k
        if tid >= n_rows and mistake != "folds_past_queries":   # that mistake: threads without a query fold too
            my_end = 0
        if mistake == "own_tiles":                         # each thread walks the tiles of its own keys
            band_start, band_end = my_first // BLOCK_K * BLOCK_K, my_end
        if mistake == "all_tiles":
            band_start, band_end = 0, t_k
        if mistake == "whole_last_tile":
            band_end = min(t_k, (band_end + BLOCK_K - 1) // BLOCK_K * BLOCK_K)
        m, l = NEG_INF, float32(0.0)
        if mistake == "max_at_zero":
            m = float32(0.0)
        for k0 in range(band_start, band_end + BLOCK_K if mistake == "extra_step" else band_end, BLOCK_K):
            n = BLOCK_K if mistake == "stages_whole_tile" else min(BLOCK_K, band_end - k0)
            if mistake == "stages_by_rows":                # each thread whole rows: a warp's load spans rows
                for r in range(me, n, threads):
                    for c in range(d_k):
                        k_tile[r, c] = k[kv, k0 + r, c]
            elif mistake == "stages_down_columns":         # neighbouring lanes down a column: rows apart
                for e in range(me, n * d_k, threads):
                    k_tile[e % n, e // n] = k[kv, k0 + e % n, e // n]
            elif mistake == "serial_stage":                # thread 0 copies the tile alone
                if me == 0:
                    for e in range(n * d_k):
                        k_tile[e // d_k, e % d_k] = k[kv, k0 + e // d_k, e % d_k]
            else:
                for e in range(me, n * d_k, threads):
                    r = e // d_k
                    k_tile[r, e - r * d_k] = k[kv, k0 + r, e - r * d_k]
            if mistake == "stages_twice":
                for e in range(me, n * d_k, threads):
                    r = e // d_k
                    k_tile[r, e - r * d_k] = k[kv, k0 + r, e - r * d_k]
            for e in range(me, n * d_v, threads):
                r = e // d_v
                v_tile[r, e - r * d_v] = v[kv, k0 + r, e - r * d_v]
            if mistake != "no_first_barrier":
                cuda.syncthreads()
            first, stop = max(my_first, k0) - k0, min(my_end, k0 + n) - k0
            if mistake in ("no_mask", "ignores_window"):
                first = 0
            if mistake == "no_mask":
                stop = n if tid < n_rows else 0
            if mistake == "first_key_missed":
                first = max(my_first + 1, k0) - k0
            if mistake == "key_before_window":
                first = max(my_first - 1, k0) - k0
            if mistake == "ignores_offset":             # query i stops at key i, as if T_k were T_q
                stop = min(my_end - shift, k0 + n) - k0
            if mistake == "misses_own_key":
                stop = min(my_end - 1, k0 + n) - k0
            if mistake == "key_after_own":
                stop = min(my_end + 1, k0 + n) - k0
            if stop > first or mistake == "no_guard":
                m_new = m
                for jj in range(first, stop):
                    s = float32(0.0)
                    for c in range(d_k):
                        s += q_row[c] * k_tile[jj, c]
                    p_row[jj] = s
                    m_new = max(m_new, s)
                rescale = math.exp(m - m_new)
                if mistake == "float64":
                    rescale = rescale * 1.0
                if mistake not in ("no_rescale", "acc_only", "unstable"):
                    l = l * rescale
                if mistake not in ("no_rescale", "l_only", "unstable"):
                    for c in range(d_v):
                        acc[c] *= rescale
                for jj in range(first, stop):
                    p = math.exp(p_row[jj]) if mistake == "unstable" else math.exp(p_row[jj] - m_new)
                    l += p
                    for c in range(d_v):
                        acc[c] += p * v_tile[jj, c]
                if mistake != "max_not_kept":
                    m = m_new
                if mistake == "barrier_in_branch":
                    cuda.syncthreads()
            if mistake not in ("no_second_barrier", "barrier_in_branch"):
                cuda.syncthreads()
        return m, l
    return walk


@cuda.jit(device=True)
def masked_by_scores(k_tile, v_tile, p_row, q_row, acc, k, v, kv, q0, n_rows, t_q, causal, window):
    """A right answer in another style: every key of the staged tile scored, the ones the query does not
    see set to -inf, a tile's max and sum in two passes over the scores (no scratch row), the band's
    bounds by ceil division, the staging with whole tiles zeroed past the band's end."""
    t_k, d_k, d_v = k.shape[1], k.shape[2], v.shape[2]
    tid = cuda.threadIdx.x
    me, threads = tid + cuda.blockDim.x * cuda.threadIdx.y, cuda.blockDim.x * cuda.blockDim.y
    i = q0 + tid
    own = i + t_k - t_q                                        # the query's own key
    lo = q0 + t_k - t_q - window + 1 if window > 0 else 0
    lo = lo if lo > 0 else 0
    hi = q0 + n_rows + t_k - t_q if causal else t_k
    hi = hi if hi < t_k else t_k
    tiles = (hi - lo // BLOCK_K * BLOCK_K + BLOCK_K - 1) // BLOCK_K
    m, l = -math.inf, float32(0.0)
    m = float32(m)
    for t in range(tiles):
        k0 = lo // BLOCK_K * BLOCK_K + t * BLOCK_K
        for e in range(me, BLOCK_K * d_k, threads):             # the whole tile, zeros past the band's end
            r, c = e // d_k, e % d_k
            k_tile[r, c] = k[kv, k0 + r, c] if k0 + r < hi else float32(0.0)
        for e in range(me, BLOCK_K * d_v, threads):
            r, c = e // d_v, e % d_v
            v_tile[r, c] = v[kv, k0 + r, c] if k0 + r < hi else float32(0.0)
        cuda.syncthreads()
        tile_max = float32(-math.inf)
        for jj in range(BLOCK_K):
            j = k0 + jj
            seen = tid < n_rows and j < t_k and (not causal or j <= own) and (window == 0 or j > own - window)
            if seen:
                s = float32(0.0)
                for c in range(d_k):
                    s += q_row[c] * k_tile[jj, c]
                tile_max = max(tile_max, s)
        if tile_max > float32(-math.inf):
            m_new = max(m, tile_max)
            rescale = math.exp(m - m_new)
            l *= rescale
            for c in range(d_v):
                acc[c] *= rescale
            for jj in range(BLOCK_K):
                j = k0 + jj
                seen = tid < n_rows and j < t_k and (not causal or j <= own) and (window == 0 or j > own - window)
                if seen:
                    s = float32(0.0)
                    for c in range(d_k):
                        s += q_row[c] * k_tile[jj, c]
                    p = math.exp(s - m_new)
                    l += p
                    for c in range(d_v):
                        acc[c] += p * v_tile[jj, c]
            m = m_new
        cuda.syncthreads()
    return m, l


@cuda.jit(device=True)
def walk_stub(k_tile, v_tile, p_row, q_row, acc, k, v, kv, q0, n_rows, t_q, causal, window):
    raise NotImplementedError()


def test_the_library_walk_passes_at_both_launches():
    result = check("07_walk_keys", mutation.solution_copy(EXERCISES["07_walk_keys"]), verbose=False)
    assert result.passed and result.diagnosis == "ok", result.message
    assert "with the simulator's launch sizes and a GPU's" in result.message


def test_the_walks_cases_come_from_both_launches_tiles():
    from attention_lib.checks import shapes
    simulated, gpu = (EXERCISES["07_walk_keys"].cases_for(c) for c in (shapes.SIMULATOR, shapes.GPU))
    for cases, block_q in ((simulated, 16), (gpu, 32)):
        pairs = {(c.T_q, c.T_k) for c in cases}
        assert {(block_q, block_q + 1), (block_q + 1, block_q), (2 * block_q + 1, block_q - 1)} <= pairs
        assert any(c.window and c.window < block_q for c in cases)
        assert {c.d_k for c in cases} >= {64, 128} and {"large", "low"} <= {c.scores for c in cases}
        assert cases[0].T_q > 1                       # a first case of one query would hide an index slip


def test_the_walks_score_cases_spread_past_88_in_a_tile_and_lie_below_minus_90():
    from attention_lib.checks import ex07_walk_keys as ex07
    rng = np.random.default_rng(0)
    large = ex07.large_scores(rng, 1, 17, 17, 16)
    s = large[0][0].astype(np.float64) @ large[1][0].T.astype(np.float64) / 4
    spread = [np.ptp(s[i, :i + 1][:BLOCK_K]) for i in range(1, 16)]
    assert max(spread) > 88
    for d_k in (16, 64):
        low = ex07.low_scores(rng, 1, 17, 17, d_k)
        s = low[0][0].astype(np.float64) @ low[1][0].T.astype(np.float64) / math.sqrt(d_k)
        assert s.max() < -104 and np.array_equal(s.astype(np.float32), s)     # exact, and exp(s) is 0 in float32


def test_the_planted_walk_without_a_mistake_and_another_style_pass():
    assert check("07_walk_keys", planted_walk("none"), verbose=False).passed
    result = check("07_walk_keys", masked_by_scores, verbose=False)
    assert result.passed, result.message


@pytest.mark.filterwarnings("ignore::RuntimeWarning")          # a planted mistake's NaN and overflows
@pytest.mark.parametrize("mistake, diagnosis, says", [
    ("no_first_barrier", "race", "k_tile"),
    ("no_second_barrier", "race", "no barrier (cuda.syncthreads())"),
    ("barrier_in_branch", "divergent_barrier", "On a GPU that hangs the block"),
    ("own_tiles", "divergent_barrier", "On a GPU that hangs the block"),
    ("stages_whole_tile", "out_of_bounds", "out-of-bounds "),
    ("whole_last_tile", "loads_past_band", "past the last key its queries see"),
    ("all_tiles", "skips_too_few", "none of its queries sees a key of"),
    ("stages_twice", "no_reuse", "times from global memory"),
    ("extra_step", "extra_barriers", "holds no key of its band"),
    ("stages_down_columns", "uncoalesced", "segments of 128 bytes"),
    ("stages_by_rows", "serial_copy", "a few lanes copy in a loop"),     # the last tile's one row, by one lane
    ("serial_stage", "serial_copy", "a few lanes copy in a loop"),
    ("threads_16", "stride_written_as_number", "stride written as a number"),
    ("rows_copy_alike", "staging_repeats_per_head", "not once by each row"),
    ("folds_past_queries", "folds_without_query", "own none"),
    ("float64", "float64_arithmetic", "float64"),
    ("no_rescale", "online_softmax_no_rescale", "neither l nor acc was rescaled"),
    ("l_only", "rescale_l_only", "acc was not"),
    ("acc_only", "rescale_o_only", "l was not"),
    ("max_not_kept", "max_not_updated", "never kept"),
    ("max_at_zero", "max_started_at_zero", "started at 0"),
    ("no_guard", "nan_before_first_key", "exp(-inf - (-inf)) is NaN"),
    ("no_mask", "mask_not_applied", "past its own"),
    ("misses_own_key", "diagonal_misplaced", "its own key was left out"),
    ("ignores_offset", "diagonal_misplaced", "the offset T_k - T_q (here 1) was ignored"),
    ("key_after_own", "mask_off_by_one", "the key just after its own"),
    ("ignores_window", "mask_ignores_window", "keys before it"),
    ("first_key_missed", "mask_off_by_one", "missed the first key it sees"),
    ("key_before_window", "window_off_by_one", "the key before the window"),
    ("unstable", "unstable_softmax", "running max"),      # exp of raw scores, never rescaled: exact until it overflows
])
def test_planted_walk_mistakes_get_their_diagnosis(mistake, diagnosis, says):
    assert_diagnosis("07_walk_keys", planted_walk(mistake), diagnosis, says)


def test_the_walk_stub_is_not_implemented():
    assert check("07_walk_keys", walk_stub, verbose=False).diagnosis == "not_implemented"


@cuda.jit(device=True)
def borrows_the_walk(k_tile, v_tile, p_row, q_row, acc, k, v, kv, q0, n_rows, t_q, causal, window):
    return flash.v2_walk_keys(k_tile, v_tile, p_row, q_row, acc, k, v, kv, q0, n_rows, t_q, causal, window)


@cuda.jit(device=True)
def borrows_the_band(k_tile, v_tile, p_row, q_row, acc, k, v, kv, q0, n_rows, t_q, causal, window):
    start, end, _, _ = flash.block_band(q0, q0 + n_rows - 1, t_q, k.shape[1], causal, window, BLOCK_K)
    return NEG_INF, float32(end - start)


@cuda.jit(device=True)
def borrows_the_keys(k_tile, v_tile, p_row, q_row, acc, k, v, kv, q0, n_rows, t_q, causal, window):
    return NEG_INF, float32(flash.visible_keys(q0, t_q, k.shape[1], causal))


@cuda.jit(device=True)
def borrows_the_staging(k_tile, v_tile, p_row, q_row, acc, k, v, kv, q0, n_rows, t_q, causal, window):
    flash.v2_stage_rows(k_tile, k, kv, 0, 1, float32(1.0))
    return NEG_INF, float32(0.0)


@pytest.mark.parametrize("answer, helper", [(borrows_the_walk, "v2_walk_keys"), (borrows_the_band, "block_band"),
                                            (borrows_the_keys, "visible_keys"), (borrows_the_staging, "v2_stage_rows")])
def test_an_answer_calling_the_librarys_walk_or_its_helpers_is_refused(answer, helper):
    assert_diagnosis("07_walk_keys", answer, "calls_given_code", helper)
