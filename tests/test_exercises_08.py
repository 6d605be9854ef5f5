"""Notebook 08's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line;
hints in levels, without code."""

import math
import types

import numpy as np
import pytest
from numba import cuda

from attention_lib.checks import EXERCISES, check, hint
from attention_lib.stages import flash
from attention_lib.stages.flash import MICRO_D, MICRO_M, MICRO_N, NEG_INF


def library_copy(function):
    """The library's device function as a new function object with the same code: what a student's
    solution is (the library's own object is refused as given code)."""
    fn = function.py_func
    return cuda.jit(device=True)(types.FunctionType(fn.__code__, fn.__globals__, fn.__name__, None, fn.__closure__))


def assert_diagnosis(exercise_id, answer, diagnosis, says):
    result = check(exercise_id, answer, verbose=False)
    assert (result.diagnosis, says in result.message) == (diagnosis, True), result.message
    assert not result.passed and "\n" not in str(result)


@pytest.mark.parametrize("exercise_id", ["08_row_reduce", "08_online_update"])
def test_hints_come_in_levels_without_code(exercise_id, capsys):
    hints = EXERCISES[exercise_id].hints
    assert len(hints) >= 2
    hint(exercise_id, 2)
    assert capsys.readouterr().out.startswith(f"{exercise_id}, hint 2 of {len(hints)}: where answers go wrong")
    for text in hints:
        assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), text


# --- 08_row_reduce: the row group's butterfly ---------------------------------------------------

def planted_reduce(mistake):
    """flash.v3_row_reduce with one typical mistake (a string, compiled in as a constant)."""
    @cuda.jit(device=True)
    def reduce(x, take_max):
        for a in range(MICRO_M):
            y = x[a]
            for w in ((1, 2) if mistake == "two_steps" else (1, 2, 4, 8, 16) if mistake == "five_steps"
                      else (1, 2, 4)):
                if mistake == "partial_mask":          # names lanes 0-7 only, called by all 32
                    other = cuda.shfl_xor_sync(0x000000FF, y, w)
                elif mistake == "under_a_branch":      # the upper half of each row group skips it
                    other = cuda.shfl_xor_sync(0xFFFFFFFF, y, w) if cuda.laneid % 8 < 4 else y
                elif mistake == "shfl_down":           # a one-way tree: the total reaches lane 0 only
                    other = cuda.shfl_down_sync(0xFFFFFFFF, y, w)
                else:
                    other = cuda.shfl_xor_sync(0xFFFFFFFF, y, w)
                if mistake == "always_max":
                    y = max(y, other)
                else:
                    y = max(y, other) if take_max else y + other
            if mistake != "not_written_back":
                x[a] = y
    return reduce


@cuda.jit(device=True)
def reduce_stub(x, take_max):
    raise NotImplementedError()


def test_the_library_reduction_passes():
    result = check("08_row_reduce", library_copy(flash.v3_row_reduce), verbose=False)
    assert result.passed and result.diagnosis == "ok", result.message


def test_the_planted_reduction_without_a_mistake_passes():
    assert check("08_row_reduce", planted_reduce("none"), verbose=False).passed


@pytest.mark.parametrize("mistake, diagnosis, says", [
    ("partial_mask", "divergent_barrier", "leaves the calling lane out"),
    ("under_a_branch", "divergent_barrier", "On a GPU that hangs the block"),
    ("two_steps", "butterfly_missing_step", "only 4 of its row group's 8 lanes"),
    ("five_steps", "reduced_across_rows", "32 lanes were combined"),
    ("shfl_down", "not_in_every_lane", "only the first lane of each row group"),
    ("always_max", "max_and_sum_swapped", "the row's max, not its sum"),
    ("not_written_back", "wrong_values", "entries differ"),
])
def test_planted_reduction_mistakes_get_their_diagnosis(mistake, diagnosis, says):
    assert_diagnosis("08_row_reduce", planted_reduce(mistake), diagnosis, says)


def test_the_reduction_stub_is_not_implemented():
    assert check("08_row_reduce", reduce_stub, verbose=False).diagnosis == "not_implemented"


def test_a_reduction_calling_the_librarys_is_refused():
    @cuda.jit(device=True)
    def borrowed(x, take_max):
        v3_row_reduce(x, take_max)      # noqa: F821  (a name flash's namespace would resolve)
    assert_diagnosis("08_row_reduce", borrowed, "calls_given_code", "v3_row_reduce")


# --- 08_online_update: v3's online update --------------------------------------------------------

def planted_update(mistake):
    """flash.v3_online_update with one typical mistake (a string, compiled in as a constant)."""
    @cuda.jit(device=True)
    def update(s, m, l, o, tile_max):
        for a in range(MICRO_M):
            m_new = max(m[a], tile_max[a])
            shift = m_new if (m_new != NEG_INF or mistake == "no_guard") else np.float32(0.0)
            rescale = math.exp(m[a] - shift) if mistake == "natural_exp" else math.exp2(m[a] - shift)
            if mistake not in ("no_rescale", "o_only"):
                l[a] *= rescale
            for e in range(1 if mistake == "first_column_only" else MICRO_D):
                if mistake not in ("no_rescale", "l_only"):
                    o[a * MICRO_D + e] *= rescale
            for b in range(MICRO_N):
                p = math.exp(s[a * MICRO_N + b] - shift) if mistake == "natural_exp" else \
                    math.exp2(s[a * MICRO_N + b] - shift)
                s[a * MICRO_N + b] = p
                l[a] += p
            if mistake != "max_kept":
                m[a] = m_new
    return update


@cuda.jit(device=True)
def update_stub(s, m, l, o, tile_max):
    raise NotImplementedError()


def test_the_library_update_passes():
    result = check("08_online_update", library_copy(flash.v3_online_update), verbose=False)
    assert result.passed and result.diagnosis == "ok", result.message


def test_the_planted_update_without_a_mistake_passes():
    assert check("08_online_update", planted_update("none"), verbose=False).passed


@pytest.mark.filterwarnings("ignore::RuntimeWarning")          # a planted mistake's NaN and overflows
@pytest.mark.parametrize("mistake, diagnosis, says", [
    ("no_rescale", "online_softmax_no_rescale", "neither l nor o was rescaled"),
    ("l_only", "rescale_l_only", "o was not"),
    ("o_only", "rescale_o_only", "l was not"),
    ("max_kept", "max_not_updated", "never stored"),
    ("natural_exp", "natural_exp", "exp2, not exp"),
    ("no_guard", "nan_before_first_key", "2^(-inf - (-inf)), NaN"),
    ("first_column_only", "missed_output_columns", "only its first was rescaled"),
])
def test_planted_update_mistakes_get_their_diagnosis(mistake, diagnosis, says):
    assert_diagnosis("08_online_update", planted_update(mistake), diagnosis, says)


def test_the_update_stub_is_not_implemented():
    assert check("08_online_update", update_stub, verbose=False).diagnosis == "not_implemented"


def test_an_update_calling_the_librarys_is_refused():
    @cuda.jit(device=True)
    def borrowed(s, m, l, o, tile_max):
        v3_online_update(s, m, l, o, tile_max)      # noqa: F821  (a name flash's namespace would resolve)
    assert_diagnosis("08_online_update", borrowed, "calls_given_code", "v3_online_update")
