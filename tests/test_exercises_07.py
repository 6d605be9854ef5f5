"""Notebook 07's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line;
hints in levels, without code; the walk's check at both launches and compiled for a GPU."""

import math
import types

import numpy as np
import pytest
from numba import cuda

from attention_lib.checks import EXERCISES, check, hint, mutation
from attention_lib.stages import flash
from attention_lib.stages.flash import (BLOCK_K, block_band, first_key, v2_add_row, v2_scale_row, v2_score_tile,
                                        v2_stage_rows, visible_keys)


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

@cuda.jit(device=True)
def stage_by_rows(tile, src, h, r0, n):
    """A staging that gives each thread whole rows: right, but a warp's load spans n rows of src."""
    threads = cuda.blockDim.x * cuda.blockDim.y
    for r in range(cuda.threadIdx.x + cuda.threadIdx.y * cuda.blockDim.x, n, threads):
        for c in range(src.shape[2]):
            tile[r, c] = src[h, r0 + r, c]


def planted_walk(mistake):
    """flash.v2_walk_keys with one typical mistake (a string, compiled in as a constant)."""
    @cuda.jit(device=True)
    def walk(k_tile, v_tile, p_row, q_row, acc, m, l, k, v, kv, q0, n_rows, t_q, causal, window):
        t_k, i = k.shape[1], q0 + cuda.threadIdx.x
        my_first = first_key(i, t_q, t_k, window)
        my_keys = visible_keys(i, t_q, t_k, causal) if cuda.threadIdx.x < n_rows else 0
        start, end, _, _ = block_band(q0, q0 + n_rows - 1, t_q, t_k, causal, window, BLOCK_K)
        if mistake == "own_bounds":
            start, end = my_first // BLOCK_K * BLOCK_K, my_keys
        if mistake == "all_tiles":
            start, end = 0, t_k
        for k0 in range(start, end + BLOCK_K if mistake == "extra_step" else end, BLOCK_K):
            n = BLOCK_K if mistake == "stages_whole_tile" else min(BLOCK_K, end - k0)
            if mistake == "stages_by_rows":
                stage_by_rows(k_tile, k, kv, k0, n)
            else:
                v2_stage_rows(k_tile, k, kv, k0, n, np.float32(1.0))
            if mistake == "stages_twice":
                v2_stage_rows(k_tile, k, kv, k0, n, np.float32(1.0))
            v2_stage_rows(v_tile, v, kv, k0, n, np.float32(1.0))
            if mistake != "no_first_barrier":
                cuda.syncthreads()
            first = 0 if mistake in ("ignores_window", "no_mask") else max(0, my_first - k0)
            if mistake == "first_key_missed":
                first = max(0, my_first - k0 + 1)
            if mistake == "key_before_window":
                first = max(0, my_first - k0 - 1)
            mine = n if mistake == "no_mask" else min(n, my_keys - k0)
            if mistake == "misses_own_key":
                mine = min(n, my_keys - k0 - 1)
            if mistake == "key_after_own":
                mine = min(n, my_keys - k0 + 1)
            if mine > first or mistake == "no_guard":
                m_new = max(m, v2_score_tile(p_row, q_row, k_tile, first, mine, k.shape[2]))
                rescale = math.exp(m - m_new)
                rescale_l = np.float32(1.0) if mistake in ("no_rescale", "acc_only", "unstable") else rescale
                l = l * rescale_l
                if mistake == "float64":
                    l = l + 0.0
                if mistake != "max_not_kept":
                    m = m_new
                if mistake not in ("no_rescale", "l_only", "unstable"):
                    v2_scale_row(acc, rescale, v.shape[2])
                for jj in range(first, mine):
                    p = math.exp(p_row[jj]) if mistake == "unstable" else math.exp(p_row[jj] - m_new)
                    l += p
                    v2_add_row(acc, p, v_tile, jj, v.shape[2])
                if mistake == "barrier_in_branch":
                    cuda.syncthreads()
            if mistake not in ("no_second_barrier", "barrier_in_branch"):
                cuda.syncthreads()
        return m, l
    return walk


@cuda.jit(device=True)
def walk_stub(k_tile, v_tile, p_row, q_row, acc, m, l, k, v, kv, q0, n_rows, t_q, causal, window):
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
        assert any(c.window and c.window < block_q for c in cases) and any(c.large for c in cases)


def test_the_planted_walk_without_a_mistake_passes():
    assert check("07_walk_keys", planted_walk("none"), verbose=False).passed


@pytest.mark.filterwarnings("ignore::RuntimeWarning")          # a planted mistake's NaN and overflows
@pytest.mark.parametrize("mistake, diagnosis, says", [
    ("no_first_barrier", "race", "k_tile"),
    ("no_second_barrier", "race", "no barrier (cuda.syncthreads())"),
    ("barrier_in_branch", "divergent_barrier", "On a GPU that hangs the block"),
    ("own_bounds", "stale_tile", "which no thread of its block had written"),   # each stages its own rows
    ("stages_whole_tile", "out_of_bounds", "out-of-bounds "),
    ("all_tiles", "skips_too_few", "none of its queries sees a key of"),
    ("stages_twice", "no_reuse", "times from global memory"),
    ("extra_step", "extra_barriers", "holds no key of its band"),
    ("stages_by_rows", "uncoalesced", "segments of 128 bytes"),
    ("float64", "float64_arithmetic", "float64"),
    ("no_rescale", "online_softmax_no_rescale", "neither l nor acc was rescaled"),
    ("l_only", "rescale_l_only", "acc was not"),
    ("acc_only", "rescale_o_only", "l was not"),
    ("max_not_kept", "max_not_updated", "never kept"),
    ("no_guard", "nan_before_first_key", "exp(-inf - (-inf)) is NaN"),
    ("no_mask", "mask_not_applied", "past its own"),
    ("misses_own_key", "mask_includes_diagonal", "missed its own key"),
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


def test_an_answer_calling_the_librarys_kernel_or_walk_is_refused():
    @cuda.jit(device=True)
    def borrowed(k_tile, v_tile, p_row, q_row, acc, m, l, k, v, kv, q0, n_rows, t_q, causal, window):
        return flash.v2_walk_keys(k_tile, v_tile, p_row, q_row, acc, m, l, k, v, kv, q0, n_rows, t_q, causal,
                                  window)
    assert_diagnosis("07_walk_keys", borrowed, "calls_given_code", "v2_walk_keys")
