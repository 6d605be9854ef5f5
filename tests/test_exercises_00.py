"""Notebook 00's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line
(deep dive 00x's: tests/test_exercises_00x.py)."""

import numpy as np
import pytest
from numba import cuda, float32

from attention_lib.checks import EXERCISES, check, hint
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import basics


def verdict(exercise_id, answer):
    result = check(exercise_id, answer, verbose=False)
    assert "\n" not in str(result)
    return result


def test_every_exercise_has_two_hints_without_code():
    for exercise_id in ("00_scale_add", "00_transpose_grid", "00_transpose"):
        hints = EXERCISES[exercise_id].hints
        assert len(hints) >= 2 and hints[1].startswith("where answers go wrong")
        for text in hints:
            assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), text


def test_hints_print_by_level(capsys):
    hint("00_transpose", 2)
    assert capsys.readouterr().out.startswith("00_transpose, hint 2 of 2: where answers go wrong")


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
def blocks_interleaved(alpha, x, y, out):
    i = cuda.threadIdx.x * cuda.gridDim.x + cuda.blockIdx.x   # every element once, but lanes 2 or more apart
    if i < out.shape[0]:
        out[i] = alpha * x[i] + y[i]


@cuda.jit
def reads_x_twice(alpha, x, y, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = y[i] + alpha * x[i] if x[i] == x[i] else x[i]    # a test that reads x again


@cuda.jit
def one_thread_does_everything(alpha, x, y, out):
    """Right values, each element read once, each load one segment: but thread 0 does every element."""
    if cuda.grid(1) == 0:
        for i in range(out.shape[0]):
            out[i] = alpha * x[i] + y[i]


@cuda.jit
def grid_stride_loop(alpha, x, y, out):
    """A right answer in another style: a loop over the grid's stride, one pass on this launch."""
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
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


def test_a_grid_stride_loop_passes():
    result = verdict("00_scale_add", grid_stride_loop)
    assert (result.diagnosis, result.passed) == ("ok", True), result.message


@pytest.mark.parametrize("answer, diagnosis, says", [
    (no_bounds_guard, "out_of_bounds", "out-of-bounds "),
    (forgets_alpha, "wrong_values", "at n = 1 (blocks of 64): got "),
    (skips_the_last_element, "wrong_values", "never written"),
    (only_the_first_block, "race", "blocks never wait for each other"),     # every block writes the same elements: an inter-block race
    (blocks_interleaved, "uncoalesced", "at n = 65 (blocks of 64): the values are right, but a warp's load of x"),
    (reads_x_twice, "no_reuse", "an element of x was read up to 3 times from global memory, where the limit is 1"),
    (one_thread_does_everything, "serial_copy", "at n = 63 (blocks of 64): the values are right, but thread (0, 0, 0) "
                                                "of block (0, 0, 0) made 63 loads of x, where the limit is 1"),
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


# --- 00_transpose_grid --------------------------------------------------------------------

def transpose_grid(rows, cols, block):
    return ceil_div(cols, block[0]), ceil_div(rows, block[1])


def swapped_grid(rows, cols, block):
    return ceil_div(rows, block[0]), ceil_div(cols, block[1])


def rounded_down_grid(rows, cols, block):
    return max(cols // block[0], 1), max(rows // block[1], 1)


def one_block_too_many(rows, cols, block):
    return cols // block[0] + 1, rows // block[1] + 1


def hard_coded_block(rows, cols, block):
    return ceil_div(cols, 16), ceil_div(rows, 8)


def true_division(rows, cols, block):
    return cols / block[0], rows / block[1]


def ceil_of_floats(rows, cols, block):
    return np.ceil(cols / block[0]), np.ceil(rows / block[1])


def numpy_integers(rows, cols, block):
    """A right answer in another style: NumPy integers, which a launch takes as it takes ints."""
    return np.int64(-(-cols // block[0])), np.int32(-(-rows // block[1]))


@pytest.mark.parametrize("answer, diagnosis, says", [
    (transpose_grid, "ok", "correct on every case tried"),
    (numpy_integers, "ok", "correct on every case tried"),
    (swapped_grid, "grid_axes_swapped",
     "at a matrix of 7 rows and 15 columns in blocks of 16 threads across (x) and 8 down (y): the grid (x, y) "
     "is (1, 2), expected (1, 1): the grid's x counts blocks across the columns"),
    (rounded_down_grid, "grid_too_small",
     "at a matrix of 9 rows and 17 columns in blocks of 16 threads across (x) and 8 down (y): the grid (x, y) "
     "is (1, 1), which covers only 8 rows and 16 columns; round the number of blocks up"),
    (one_block_too_many, "grid_too_large",
     "at a matrix of 8 rows and 16 columns in blocks of 16 threads across (x) and 8 down (y): the grid (x, y) "
     "is (2, 2), expected (1, 1): it covers 16 rows and 32 columns, with whole blocks that have nothing to do"),
    (hard_coded_block, "grid_too_small", "at a matrix of 9 rows and 100 columns in blocks of 32 threads across"),
    (true_division, "wrong_values", "a grid counts whole blocks"),
    (ceil_of_floats, "grid_not_integers",
     "at a matrix of 1 rows and 1 columns in blocks of 16 threads across (x) and 8 down (y): the grid (x, y) is "
     "(1.0, 1.0), the right counts, but as float64: a launch takes its numbers of blocks as integers"),
    (lambda rows, cols, block: (1, 1, 1), "wrong_shape", "the result has shape (3,), expected (2,)"),
    (lambda rows, cols, block: 1, "wrong_shape", "expected a pair (blocks along x, blocks along y)"),
    (basics.grid_2d, "calls_given_code", "grid_2d"),
])
def test_00_transpose_grid(answer, diagnosis, says):
    result = verdict("00_transpose_grid", answer)
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message


def test_the_grid_cases_name_the_matrix_they_ask_about():
    """Each verdict names the matrix and block of the case that failed, nothing else."""
    result = verdict("00_transpose_grid", swapped_grid)
    assert result.message.count("rows") == 2 and "(1 rows" not in result.message, result.message


# --- 00_transpose --------------------------------------------------------------------------

@cuda.jit
def transpose_kernel(a, out):
    col, row = cuda.grid(2)
    if row < a.shape[0] and col < a.shape[1]:
        out[col, row] = a[row, col]


@cuda.jit
def row_from_x(a, out):
    r, c = cuda.grid(2)
    if r < a.shape[0] and c < a.shape[1]:
        out[c, r] = a[r, c]


@cuda.jit
def row_from_x_when_wide(a, out):
    """Right while a has no more columns than rows; takes the row from the grid's x on a wide a."""
    if a.shape[1] > a.shape[0]:
        r, c = cuda.grid(2)
    else:
        c, r = cuda.grid(2)
    if r < a.shape[0] and c < a.shape[1]:
        out[c, r] = a[r, c]


@cuda.jit
def copies(a, out):
    c, r = cuda.grid(2)
    if r < out.shape[0] and c < out.shape[1]:
        out[r, c] = a[r, c]


@cuda.jit
def row_guard_one_short(a, out):
    c, r = cuda.grid(2)
    if r < a.shape[0] - 1 and c < a.shape[1]:
        out[c, r] = a[r, c]


@cuda.jit
def column_guard_one_short(a, out):
    c, r = cuda.grid(2)
    if r < a.shape[0] and c < a.shape[1] - 1:
        out[c, r] = a[r, c]


@cuda.jit
def writes_nothing(a, out):
    """Reads its element but never stores it: a 1 x 1 out unwritten, which is no guard one short."""
    c, r = cuda.grid(2)
    if r < a.shape[0] and c < a.shape[1] and a[r, c] != a[r, c]:
        out[c, r] = a[r, c]


@cuda.jit
def no_guard(a, out):
    c, r = cuda.grid(2)
    out[c, r] = a[r, c]


@cuda.jit
def guard_on_out(a, out):
    c, r = cuda.grid(2)
    if r < out.shape[0] and c < out.shape[1]:
        out[c, r] = a[r, c]


@cuda.jit
def lanes_down_the_columns(a, out):
    """Every element once, right values: but a block's threads walk down its columns first."""
    tid = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    r = cuda.blockIdx.y * cuda.blockDim.y + tid % cuda.blockDim.y
    c = cuda.blockIdx.x * cuda.blockDim.x + tid // cuda.blockDim.y
    if r < a.shape[0] and c < a.shape[1]:
        out[c, r] = a[r, c]


@cuda.jit
def one_thread_per_row(a, out):
    """Right values, every element read once, each load coalesced: but one lane in 16 loops over a row."""
    col, row = cuda.grid(2)
    if row < a.shape[0] and col == 0:
        for c in range(a.shape[1]):
            out[c, row] = a[row, c]


@cuda.jit
def one_thread_for_everything(a, out):
    if cuda.grid(2) == (0, 0):
        for r in range(a.shape[0]):
            for c in range(a.shape[1]):
                out[c, r] = a[r, c]


@cuda.jit
def transpose_of_library(a, out):
    basics.transpose_kernel(a, out)


@pytest.mark.parametrize("answer, diagnosis, says", [
    (transpose_kernel, "ok", "correct at every size"),
    (row_from_x, "row_is_x", "at a of 19 rows and 7 columns (blocks of 16 threads across (x) and 8 down (y)): "
                             "21 entries of out were never written: those of a's rows 16 to 18, exactly"),
    (row_from_x_when_wide, "row_is_x", "at a of 5 rows and 40 columns (blocks of 16 threads across (x) and 8 down "
                                       "(y)): 160 entries of out were never written: those of a's columns 8 to 39, "
                                       "exactly"),
    (copies, "not_transposed", "at a of 7 rows and 7 columns"),
    (row_guard_one_short, "guard_one_short", "at a of 1 rows and 1 columns (blocks of 16 threads across (x) and 8 "
                                             "down (y)): nothing of out was written; at a of 9 rows and 17 columns, "
                                             "17 entries of out were never written, exactly out's last column "
                                             "(column 8, a's last row)"),
    (column_guard_one_short, "guard_one_short", "exactly out's last row (row 16, a's last column)"),
    (writes_nothing, "wrong_values", "at a of 1 rows and 1 columns"),
    (no_guard, "out_of_bounds", "out-of-bounds "),
    (guard_on_out, "out_of_bounds", "global array 'a' has shape (19, 7)"),
    (lanes_down_the_columns, "uncoalesced", "at a of 5 rows and 40 columns (blocks of 16 threads across (x) and 8 down (y)): the values are right, but a warp's load of a"),
    (one_thread_per_row, "serial_copy", "at a of 7 rows and 7 columns (blocks of 16 threads across (x) and 8 down "
                                        "(y)): the values are right, but one warp made 7 load instructions of a"),
    (one_thread_for_everything, "serial_copy", "one warp made 49 load instructions of a"),
    (transpose_of_library, "calls_given_code", "transpose_kernel"),
    (basics.transpose_kernel, "calls_given_code", "transpose_kernel"),
    ((transpose_kernel, transpose_grid), "not_a_kernel", "expected a @cuda.jit kernel"),
])
def test_00_transpose(answer, diagnosis, says):
    result = verdict("00_transpose", answer)
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message


@pytest.mark.parametrize("answer, shape", [(row_from_x, (19, 7)), (row_from_x_when_wide, (5, 40))])
def test_row_is_x_names_only_rows_and_columns_that_exist(answer, shape):
    """The verdict names the rows and columns of a that were missed, each of them inside a."""
    import re
    message = verdict("00_transpose", answer).message
    named = re.search(r"those of a's (.*?), exactly", message).group(1)
    for kind, first, last in re.findall(r"(rows?|columns?) (\d+)(?: to (\d+))?", named):
        size = shape[0] if kind.startswith("row") else shape[1]
        assert int(first) <= int(last or first) < size, message


# --- 00_tiled_transpose ---------------------------------------------------------------------

TILE, PADDED = basics.TRANSPOSE_TILE, basics.TRANSPOSE_TILE_PADDED


@cuda.jit
def tiled_transpose(a, out):
    """A right answer written in another style: the padded width as a number, corners named for out."""
    tile = cuda.shared.array((16, 17), float32)
    x, y = cuda.threadIdx.x, cuda.threadIdx.y
    if cuda.blockIdx.y * TILE + y < a.shape[0] and cuda.blockIdx.x * TILE + x < a.shape[1]:
        tile[y, x] = a[cuda.blockIdx.y * TILE + y, cuda.blockIdx.x * TILE + x]
    cuda.syncthreads()
    out_row, out_col = cuda.blockIdx.x * TILE + y, cuda.blockIdx.y * TILE + x
    if out_row < out.shape[0] and out_col < out.shape[1]:
        out[out_row, out_col] = tile[x, y]


@cuda.jit
def tile_filled_transposed(a, out):
    """A right answer of another design: the tile filled down its columns (a transposed store, 2 words a
    bank with the padding), then read along its rows."""
    tile = cuda.shared.array((TILE, PADDED), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    r0, c0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
    if r0 + ty < a.shape[0] and c0 + tx < a.shape[1]:
        tile[tx, ty] = a[r0 + ty, c0 + tx]
    cuda.syncthreads()
    if c0 + ty < out.shape[0] and r0 + tx < out.shape[1]:
        out[c0 + ty, r0 + tx] = tile[ty, tx]


@cuda.jit
def unpadded_tile(a, out):
    """Right values, coalesced: but a tile of 16-word rows read down a column, 8 words in one bank."""
    tile = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    r0, c0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
    if r0 + ty < a.shape[0] and c0 + tx < a.shape[1]:
        tile[ty, tx] = a[r0 + ty, c0 + tx]
    cuda.syncthreads()
    if c0 + ty < out.shape[0] and r0 + tx < out.shape[1]:
        out[c0 + ty, r0 + tx] = tile[tx, ty]


@cuda.jit
def unpadded_tile_filled_transposed(a, out):
    """Right values, coalesced: but a tile of 16-word rows stored down a column, 8 words in one bank."""
    tile = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    r0, c0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
    if r0 + ty < a.shape[0] and c0 + tx < a.shape[1]:
        tile[tx, ty] = a[r0 + ty, c0 + tx]
    cuda.syncthreads()
    if c0 + ty < out.shape[0] and r0 + tx < out.shape[1]:
        out[c0 + ty, r0 + tx] = tile[ty, tx]


@cuda.jit
def tile_copy_by_one_thread(a, out):
    tile = cuda.shared.array((TILE, PADDED), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    r0, c0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
    if tx == 0 and ty == 0:
        for i in range(TILE):
            for j in range(TILE):
                if r0 + i < a.shape[0] and c0 + j < a.shape[1]:
                    tile[i, j] = a[r0 + i, c0 + j]
    cuda.syncthreads()
    if c0 + ty < out.shape[0] and r0 + tx < out.shape[1]:
        out[c0 + ty, r0 + tx] = tile[tx, ty]


@cuda.jit
def rows_of_out_written_by_lane_0(a, out):
    tile = cuda.shared.array((TILE, PADDED), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    r0, c0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
    if r0 + ty < a.shape[0] and c0 + tx < a.shape[1]:
        tile[ty, tx] = a[r0 + ty, c0 + tx]
    cuda.syncthreads()
    if tx == 0:
        for j in range(TILE):
            if c0 + ty < out.shape[0] and r0 + j < out.shape[1]:
                out[c0 + ty, r0 + j] = tile[j, ty]


def _tiled(store):
    """A tiled transpose whose last line is `store` (the tile loaded right, the barrier in place)."""
    namespace = {"cuda": cuda, "float32": float32, "TILE": TILE, "PADDED": PADDED}
    exec("def kernel(a, out):\n"
         "    tile = cuda.shared.array((TILE, PADDED), float32)\n"
         "    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y\n"
         "    r0, c0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE\n"
         "    if r0 + ty < a.shape[0] and c0 + tx < a.shape[1]:\n"
         "        tile[ty, tx] = a[r0 + ty, c0 + tx]\n"
         "    cuda.syncthreads()\n" + store, namespace)
    return cuda.jit(namespace["kernel"])


@cuda.jit
def barrier_inside_the_load_guard(a, out):
    tile = cuda.shared.array((TILE, PADDED), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    r0, c0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
    if r0 + ty < a.shape[0] and c0 + tx < a.shape[1]:
        tile[ty, tx] = a[r0 + ty, c0 + tx]
        cuda.syncthreads()
    if c0 + ty < out.shape[0] and r0 + tx < out.shape[1]:
        out[c0 + ty, r0 + tx] = tile[tx, ty]


@cuda.jit
def no_barrier(a, out):
    tile = cuda.shared.array((TILE, PADDED), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    r0, c0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
    if r0 + ty < a.shape[0] and c0 + tx < a.shape[1]:
        tile[ty, tx] = a[r0 + ty, c0 + tx]
    if c0 + ty < out.shape[0] and r0 + tx < out.shape[1]:
        out[c0 + ty, r0 + tx] = tile[tx, ty]


@cuda.jit
def tile_loaded_down_columns(a, out):
    tile = cuda.shared.array((TILE, PADDED), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    r0, c0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
    if r0 + tx < a.shape[0] and c0 + ty < a.shape[1]:
        tile[tx, ty] = a[r0 + tx, c0 + ty]
    cuda.syncthreads()
    if c0 + ty < out.shape[0] and r0 + tx < out.shape[1]:
        out[c0 + ty, r0 + tx] = tile[tx, ty]


@cuda.jit
def padded_shape_as_an_expression(a, out):
    tile = cuda.shared.array((TILE, TILE + 1), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    r0, c0 = cuda.blockIdx.y * TILE, cuda.blockIdx.x * TILE
    if r0 + ty < a.shape[0] and c0 + tx < a.shape[1]:
        tile[ty, tx] = a[r0 + ty, c0 + tx]
    cuda.syncthreads()
    if c0 + ty < out.shape[0] and r0 + tx < out.shape[1]:
        out[c0 + ty, r0 + tx] = tile[tx, ty]


SIXTEEN = "at a of 16 rows and 16 columns (blocks of 16 x 16 threads): "


@pytest.mark.parametrize("answer, diagnosis, says", [
    (tiled_transpose, "ok", "correct at every size"),
    (tile_filled_transposed, "ok", "correct at every size"),
    (unpadded_tile, "bank_conflict", SIXTEEN + "the values are right, but a warp's read of tile at"),
    (unpadded_tile, "bank_conflict", "puts 8 different words in one bank of shared memory (8 rounds instead of 1), "
                                     "where the limit is 2"),
    (unpadded_tile_filled_transposed, "bank_conflict", SIXTEEN + "the values are right, but a warp's store of tile "
                                                       "at"),
    (_tiled("    if c0 + ty < out.shape[0] and r0 + tx < out.shape[1]:\n"
            "        out[c0 + ty, r0 + tx] = float32(0.0)\n"
            "        out[c0 + ty, r0 + tx] = tile[tx, ty]\n"),
     "output_rewritten", SIXTEEN + "the values are right, but thread (0, 0, 0) of block (0, 0, 0) stored out[0, 0] "
                                   "2 times"),
    (transpose_kernel, "uncoalesced", SIXTEEN + "the values are right, but a warp's store of out at"),
    (tile_copy_by_one_thread, "serial_copy", SIXTEEN + "the values are right, but one warp made 256 load instructions "
                                             "of a"),
    (rows_of_out_written_by_lane_0, "serial_copy", "one warp made 16 store instructions of out"),
    (_tiled("    if c0 + ty < out.shape[0] and r0 + tx < out.shape[1] and c0 + tx < out.shape[0]:\n"
            "        out[c0 + ty, r0 + tx] = tile[tx, ty]\n"),
     "wrong_values", "at a of 15 rows and 17 columns (blocks of 16 x 16 threads): 14 of 255 entries were never written"),
    (_tiled("    if c0 + ty < out.shape[0] and r0 + tx < out.shape[1]:\n        out[c0 + ty, r0 + tx] = tile[ty, tx]\n"),
     "tile_not_transposed", SIXTEEN + "each tile of a landed in the right place of out, but untransposed"),
    (_tiled("    if r0 + ty < out.shape[0] and c0 + tx < out.shape[1]:\n        out[r0 + ty, c0 + tx] = tile[tx, ty]\n"),
     "tile_not_moved", "at a of 32 rows and 32 columns (blocks of 16 x 16 threads): each tile of a was transposed "
                       "where it stands"),
    (_tiled("    if r0 + ty < a.shape[0] and c0 + tx < a.shape[1]:\n        out[c0 + ty, r0 + tx] = tile[tx, ty]\n"),
     "out_of_bounds", "at a of 15 rows and 17 columns (blocks of 16 x 16 threads): out-of-bounds write out[0, 15]"),
    (_tiled("    if c0 + ty < out.shape[0] and r0 + tx < out.shape[1]:\n        out[c0 + ty, r0 + tx] = tile[tx, ty]\n"
            "    cuda.syncthreads()\n"), "extra_barriers", "a thread passed 2 barriers, where the limit is 1"),
    (barrier_inside_the_load_guard, "divergent_barrier", "at a of 15 rows and 17 columns"),
    (barrier_inside_the_load_guard, "divergent_barrier", "keep every barrier out of guards, early returns and loops "
                                                         "that differ between threads, and guard only the work"),
    (_tiled("    if c0 + ty < out.shape[0] - 1 and r0 + tx < out.shape[1]:\n"
            "        out[c0 + ty, r0 + tx] = tile[tx, ty]\n"),
     "guard_one_short", SIXTEEN + "16 entries of out were never written, exactly out's last row (row 15, a's last "
                                  "column): a guard that stops one short"),
    (_tiled("    if c0 + ty < out.shape[0] and r0 + tx < out.shape[1] - 1:\n"
            "        out[c0 + ty, r0 + tx] = tile[tx, ty]\n"),
     "guard_one_short", "exactly out's last column (column 15, a's last row)"),
    (no_barrier, "race", SIXTEEN + "race on shared 'tile'"),
    (tile_loaded_down_columns, "uncoalesced", "a warp's load of a at"),
    (padded_shape_as_an_expression, "not_gpu_code", "cuda.shared.array's shape must be a constant the compiler knows"),
    (basics.transpose_tiled_kernel, "calls_given_code", "transpose_tiled_kernel"),
])
def test_00_tiled_transpose(answer, diagnosis, says):
    result = verdict("00_tiled_transpose", answer)
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message


def test_the_tiled_transposes_hints_give_the_idea_then_the_plan_in_words():
    hints = EXERCISES["00_tiled_transpose"].hints
    assert [h.split(":")[0] for h in hints[1:]] == ["the plan", "where answers go wrong"]
    for text in hints:
        assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), text
