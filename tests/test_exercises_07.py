"""Notebook 07's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line;
hints in levels, without code."""

import math
import types

import numpy as np
import pytest
from numba import cuda

from attention_lib.checks import EXERCISES, check, hint
from attention_lib.stages import flash
from attention_lib.stages.flash import BLOCK_K, v2_add_row, v2_scale_row, v2_score_tile, v2_stage_rows


def library_copy(function, device=False):
    """The library's function as a new function object with the same code: what a student's
    solution is (the library's own object is refused as given code)."""
    fn = getattr(function, "py_func", function)
    copy = types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    return cuda.jit(device=True)(copy) if device else copy


def assert_diagnosis(exercise_id, answer, diagnosis, says):
    result = check(exercise_id, answer, verbose=False)
    assert (result.diagnosis, says in result.message) == (diagnosis, True), result.message
    assert not result.passed and "\n" not in str(result)


@pytest.mark.parametrize("exercise_id", ["07_online_softmax", "07_key_tile"])
def test_hints_come_in_levels_without_code(exercise_id, capsys):
    hints = EXERCISES[exercise_id].hints
    assert len(hints) >= 2
    hint(exercise_id, 2)
    assert capsys.readouterr().out.startswith(f"{exercise_id}, hint 2 of {len(hints)}: where answers go wrong")
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


def stub(m, l, acc, s_block, v_block):
    raise NotImplementedError()


def test_the_library_update_passes():
    result = check("07_online_softmax", library_copy(flash.online_update), verbose=False)
    assert result.passed and result.diagnosis == "ok", result.message


@pytest.mark.parametrize("answer, diagnosis, says", [
    (without_rescale, "online_softmax_no_rescale", "l and acc were not rescaled"),
    (rescales_l_only, "online_softmax_no_rescale", "acc was not rescaled"),
    (inverted_rescale, "wrong_values", "exp(m_new - m_old) overflows"),
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


# --- 07_key_tile: kernel 2's step over one key tile ---------------------------------------------

def planted_key_tile(mistake):
    """flash.v2_key_tile with one typical mistake (a string, compiled in as a constant)."""
    @cuda.jit(device=True)
    def key_tile(k_tile, v_tile, p_row, q_row, acc, m, l, k, v, kv, k0, n, my_first, my_keys):
        rows = BLOCK_K if mistake == "stages_whole_tile" else n
        v2_stage_rows(k_tile, k, kv, k0, rows, np.float32(1.0))
        v2_stage_rows(v_tile, v, kv, k0, rows, np.float32(1.0))
        if mistake != "no_first_barrier":
            cuda.syncthreads()
        first = 0 if mistake in ("ignores_window", "no_mask") else max(0, my_first - k0)
        mine = n if mistake == "no_mask" else min(n, my_keys - k0 - (1 if mistake == "misses_own_key" else 0))
        if mine > first or mistake == "no_guard":
            m_new = max(m, v2_score_tile(p_row, q_row, k_tile, first, mine, k.shape[2]))
            rescale = math.exp(m - m_new)
            if mistake in ("no_rescale", "acc_only", "unstable"):
                rescale_l = np.float32(1.0)
            else:
                rescale_l = rescale
            l = l * rescale_l
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
    return key_tile


@cuda.jit(device=True)
def key_tile_stub(k_tile, v_tile, p_row, q_row, acc, m, l, k, v, kv, k0, n, my_first, my_keys):
    raise NotImplementedError()


def test_the_library_key_tile_passes():
    result = check("07_key_tile", library_copy(flash.v2_key_tile, device=True), verbose=False)
    assert result.passed and result.diagnosis == "ok", result.message


def test_the_planted_answer_without_a_mistake_passes():
    assert check("07_key_tile", planted_key_tile("none"), verbose=False).passed


@pytest.mark.filterwarnings("ignore::RuntimeWarning")          # a planted mistake's NaN and overflows
@pytest.mark.parametrize("mistake, diagnosis, says", [
    ("no_first_barrier", "race", "k_tile"),
    ("no_second_barrier", "race", "no barrier (cuda.syncthreads())"),
    ("barrier_in_branch", "divergent_barrier", "On a GPU that hangs the block"),
    ("stages_whole_tile", "out_of_bounds", "out-of-bounds "),
    ("no_rescale", "online_softmax_no_rescale", "neither l nor acc was rescaled"),
    ("l_only", "rescale_l_only", "acc was not"),
    ("acc_only", "rescale_o_only", "l was not"),
    ("max_not_kept", "max_not_updated", "never kept"),
    ("no_guard", "nan_before_first_key", "exp(-inf - (-inf)) is NaN"),
    ("no_mask", "mask_not_applied", "past its own"),
    ("misses_own_key", "mask_includes_diagonal", "missed its own key"),
    ("ignores_window", "mask_ignores_window", "with a window of 5"),
    ("unstable", "unstable_softmax", "running max"),      # exp of raw scores, never rescaled: exact until it overflows
])
def test_planted_key_tile_mistakes_get_their_diagnosis(mistake, diagnosis, says):
    assert_diagnosis("07_key_tile", planted_key_tile(mistake), diagnosis, says)


def test_the_key_tile_stub_is_not_implemented():
    assert check("07_key_tile", key_tile_stub, verbose=False).diagnosis == "not_implemented"


def test_an_answer_calling_the_librarys_kernel_or_step_is_refused():
    @cuda.jit(device=True)
    def borrowed(k_tile, v_tile, p_row, q_row, acc, m, l, k, v, kv, k0, n, my_first, my_keys):
        return flash.v2_key_tile(k_tile, v_tile, p_row, q_row, acc, m, l, k, v, kv, k0, n, my_first, my_keys)
    assert_diagnosis("07_key_tile", borrowed, "calls_given_code", "v2_key_tile")
