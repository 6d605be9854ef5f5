"""Notebook 00's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line."""

import math

import numpy as np
import pytest
from numba import cuda, float32

from attention_lib import reference
from attention_lib.checks import EXERCISES, check, hint
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import basics, projection
from attention_lib.stages.scores import TILE


def verdict(exercise_id, answer):
    result = check(exercise_id, answer, verbose=False)
    assert "\n" not in str(result)
    return result




@cuda.jit
def no_bounds_guard(alpha, x, y, out):
    i = cuda.grid(1)
    out[i] = alpha * x[i] + y[i]


@cuda.jit
def forgets_alpha(alpha, x, y, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] + y[i]


@cuda.jit
def skips_the_last_element(alpha, x, y, out):
    i = cuda.grid(1)
    if i < out.shape[0] - 1:
        out[i] = alpha * x[i] + y[i]


@cuda.jit
def only_the_first_block(alpha, x, y, out):
    i = cuda.threadIdx.x                 # forgets blockIdx: right only while n <= one block
    if i < out.shape[0]:
        out[i] = alpha * x[i] + y[i]


@cuda.jit
def not_written_yet(alpha, x, y, out):
    raise NotImplementedError()


def test_the_library_kernel_passes(capsys):
    result = check("00_scale_add", basics.scale_add_kernel)
    assert result.passed and result.diagnosis == "ok"
    assert capsys.readouterr().out.startswith("✔ 00_scale_add [ok]")


@pytest.mark.parametrize("answer, diagnosis, says", [
    (no_bounds_guard, "out_of_bounds", "Guard the index"),
    (forgets_alpha, "wrong_values", "entries differ"),
    (skips_the_last_element, "wrong_values", "never written"),
    (only_the_first_block, "wrong_values", "n = 65"),
    (not_written_yet, "not_implemented", "not implemented yet"),
    (None, "not_implemented", "not implemented yet"),
    (lambda alpha, x, y: alpha * x + y, "not_a_kernel", "@cuda.jit"),
])
def test_planted_mistakes_get_their_diagnosis(answer, diagnosis, says):
    result = check("00_scale_add", answer, verbose=False)
    assert not result.passed
    assert result.diagnosis == diagnosis
    assert says in result.message
    assert "\n" not in str(result)




# --- 00_transpose --------------------------------------------------------------------------

def transpose_grid(rows, cols, block):
    return ceil_div(cols, block[0]), ceil_div(rows, block[1])


@cuda.jit
def transpose_kernel(a, out):
    c, r = cuda.grid(2)
    if r < a.shape[0] and c < a.shape[1]:
        out[c, r] = a[r, c]


def swapped_grid(rows, cols, block):
    return ceil_div(rows, block[0]), ceil_div(cols, block[1])


def rounded_down_grid(rows, cols, block):
    return max(cols // block[0], 1), max(rows // block[1], 1)


def one_block_too_many(rows, cols, block):
    return cols // block[0] + 1, rows // block[1] + 1


@cuda.jit
def row_from_x(a, out):
    r, c = cuda.grid(2)
    if r < a.shape[0] and c < a.shape[1]:
        out[c, r] = a[r, c]


@cuda.jit
def copies(a, out):
    c, r = cuda.grid(2)
    if r < out.shape[0] and c < out.shape[1]:
        out[r, c] = a[r, c]


@cuda.jit
def no_guard(a, out):
    c, r = cuda.grid(2)
    out[c, r] = a[r, c]


@pytest.mark.parametrize("answer, diagnosis, says", [
    ((transpose_kernel, transpose_grid), "ok", "correct at every size"),
    ((transpose_kernel, swapped_grid), "grid_axes_swapped", "the grid's x counts blocks across the columns"),
    ((transpose_kernel, rounded_down_grid), "grid_too_small", "round the number of blocks up"),
    ((transpose_kernel, one_block_too_many), "grid_too_large", "nothing to do"),
    ((row_from_x, transpose_grid), "row_is_x", "at a of shape (19, 7)"),
    ((copies, transpose_grid), "not_transposed", "at a of shape (7, 7)"),
    ((no_guard, transpose_grid), "out_of_bounds", "Guard the index"),
])
def test_00_transpose(answer, diagnosis, says):
    result = verdict("00_transpose", answer)
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message
