"""Notebook 00's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line."""

import numpy as np
import pytest
from numba import cuda

from attention_lib.checks import EXERCISES, check, hint
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import basics


def verdict(exercise_id, answer):
    result = check(exercise_id, answer, verbose=False)
    assert "\n" not in str(result)
    return result


def test_every_exercise_has_two_hints_without_code():
    for exercise_id in ("00_scale_add", "00_transpose", "00_warp_divergence"):
        hints = EXERCISES[exercise_id].hints
        assert len(hints) >= 2 and hints[1].startswith("where answers go wrong")
        for text in hints:
            assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), text


def test_hints_print_by_level(capsys):
    hint("00_warp_divergence", 2)
    assert capsys.readouterr().out.startswith("00_warp_divergence, hint 2 of 2: where answers go wrong")


# --- 00_scale_add ----------------------------------------------------------------------------

@cuda.jit
def scale_add_kernel(alpha, x, y, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = alpha * x[i] + y[i]


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
def calls_the_library(alpha, x, y, out):
    basics.scale_add_kernel(alpha, x, y, out)


@cuda.jit
def not_written_yet(alpha, x, y, out):
    raise NotImplementedError()


def test_the_solution_passes(capsys):
    result = check("00_scale_add", scale_add_kernel)
    assert result.passed and result.diagnosis == "ok"
    assert capsys.readouterr().out.startswith("✔ 00_scale_add [ok]")


@pytest.mark.parametrize("answer, diagnosis, says", [
    (no_bounds_guard, "out_of_bounds", "out-of-bounds "),
    (forgets_alpha, "wrong_values", "entries differ"),
    (skips_the_last_element, "wrong_values", "never written"),
    (only_the_first_block, "race", "blocks never wait for each other"),     # every block writes the same elements: an inter-block race
    (calls_the_library, "calls_given_code", "scale_add_kernel"),
    (basics.scale_add_kernel, "calls_given_code", "scale_add_kernel"),
    (not_written_yet, "not_implemented", "not implemented yet"),
    (None, "not_implemented", "not implemented yet"),
    (lambda alpha, x, y: alpha * x + y, "not_a_kernel", "@cuda.jit"),
])
def test_planted_mistakes_get_their_diagnosis(answer, diagnosis, says):
    result = verdict("00_scale_add", answer)
    assert not result.passed
    assert result.diagnosis == diagnosis
    assert says in result.message


# --- 00_transpose --------------------------------------------------------------------------

def transpose_grid(rows, cols, block):
    return ceil_div(cols, block[0]), ceil_div(rows, block[1])


@cuda.jit
def transpose_kernel(a, out):
    col, row = cuda.grid(2)
    if row < a.shape[0] and col < a.shape[1]:
        out[col, row] = a[row, col]


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
    ((transpose_kernel, swapped_grid), "grid_axes_swapped",
     "for a matrix of 8 rows and 16 columns in blocks of 16 threads across (x) and 8 down (y), the grid (x, y) "
     "is (1, 2), expected (1, 1): the grid's x counts blocks across the columns"),
    ((transpose_kernel, rounded_down_grid), "grid_too_small",
     "for a matrix of 9 rows and 17 columns in blocks of 16 threads across (x) and 8 down (y), the grid (x, y) "
     "is (1, 1), which covers only 8 rows and 16 columns; round the number of blocks up"),
    ((transpose_kernel, one_block_too_many), "grid_too_large", "with whole blocks that have nothing to do"),
    ((row_from_x, transpose_grid), "row_is_x", "at a of shape (19, 7) (19 rows, 7 columns)"),
    ((copies, transpose_grid), "not_transposed", "at a of shape (7, 7)"),
    ((no_guard, transpose_grid), "out_of_bounds", "out-of-bounds "),
    ((transpose_kernel, basics.grid_2d), "calls_given_code", "grid_2d"),
    ((basics.transpose_kernel, transpose_grid), "calls_given_code", "transpose_kernel"),
])
def test_00_transpose(answer, diagnosis, says):
    result = verdict("00_transpose", answer)
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message


# --- 00_warp_divergence ------------------------------------------------------------------------

WARP_SIZE = 32


def divergent_warps(rows, cols, block):
    """The exercise's solution, written out."""
    bx, by = block
    grid_x, grid_y = ceil_div(cols, bx), ceil_div(rows, by)
    diverges = np.zeros((grid_y, grid_x, bx * by // WARP_SIZE), bool)
    for block_y in range(grid_y):
        for block_x in range(grid_x):
            for warp in range(bx * by // WARP_SIZE):
                lanes = np.arange(warp * WARP_SIZE, (warp + 1) * WARP_SIZE)
                row, col = block_y * by + lanes // bx, block_x * bx + lanes % bx
                inside = (row < rows) & (col < cols)
                diverges[block_y, block_x, warp] = inside.any() and not inside.all()
    return diverges


def warps_with(lane_place, counts):
    """A divergent_warps whose lanes sit at lane_place(lanes, bx, by) -> (row, col) in the block and
    whose warp counts when counts(inside) says so."""
    def answer(rows, cols, block):
        bx, by = block
        grid_x, grid_y = ceil_div(cols, bx), ceil_div(rows, by)
        out = np.zeros((grid_y, grid_x, bx * by // WARP_SIZE), bool)
        for index in np.ndindex(out.shape):
            lanes = np.arange(index[2] * WARP_SIZE, (index[2] + 1) * WARP_SIZE)
            r, c = lane_place(lanes, bx, by)
            out[index] = counts(((index[0] * by + r) < rows) & ((index[1] * bx + c) < cols))
        return out
    return answer


x_fastest = lambda lanes, bx, by: (lanes // bx, lanes % bx)          # noqa: E731
split = lambda inside: inside.any() and not inside.all()             # noqa: E731


def stub(rows, cols, block):
    raise NotImplementedError()


@pytest.mark.parametrize("answer, diagnosis, says", [
    (divergent_warps, "ok", "correct at every size"),
    (warps_with(x_fastest, split), "ok", "correct at every size"),
    (warps_with(lambda lanes, bx, by: (lanes % by, lanes // by), split), "lanes_y_fastest",
     "at a 21 x 20 matrix, blocks of 16 threads across (x) and 8 down (y): your warps take the block's threads "
     "down y first"),
    (warps_with(x_fastest, lambda inside: not inside.all()), "idle_warp_counted",
     "at a 1 x 1 matrix, blocks of 16 threads across (x) and 8 down (y): a warp whose threads all fail the guard"),
    (warps_with(lambda lanes, bx, by: (lanes // 32, lanes % 32), split), "wrong_values", "entries differ"),
    (warps_with(x_fastest, lambda inside: inside.any()), "wrong_values", "entries differ"),
    (lambda rows, cols, block: divergent_warps(rows, cols, block).transpose(1, 0, 2), "wrong_shape",
     "at a 21 x 20 matrix, blocks of 16 threads across (x) and 8 down (y): the result has shape (2, 3, 4), "
     "expected (3, 2, 4)"),
    (basics.divergent_warps, "calls_given_code", "divergent_warps"),
    (stub, "not_implemented", "not implemented yet"),
])
def test_00_warp_divergence(answer, diagnosis, says):
    result = verdict("00_warp_divergence", answer)
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message
