"""Notebook 01's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line."""

import pytest
from numba import cuda, float32

from attention_lib.checks import EXERCISES, check
from attention_lib.checks.ex01_projection import TILED_CASES, read_ceilings
from attention_lib.stages import projection

TILE = projection.TILE
WIDE_TILE = projection.WIDE_TILE


def verdict(exercise_id, answer):
    result = check(exercise_id, answer, verbose=False)
    assert "\n" not in str(result)
    return result


def test_every_exercise_has_two_hints_without_code():
    for exercise_id in ("01_projection_naive", "01_tiled_matmul", "01x_multiply_wide_tiles"):
        hints = EXERCISES[exercise_id].hints
        assert len(hints) >= 2 and hints[1].startswith("where answers go wrong")
        for text in hints:
            assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), text


# --- 01_projection_naive -----------------------------------------------------------------------

@cuda.jit
def naive(x, w, b, out):
    col, row = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        acc = float32(0.0)
        for k in range(x.shape[1]):
            acc += x[row, k] * w[k, col]
        if b.shape[0] > 0:
            acc += b[col]
        out[row, col] = acc


@cuda.jit
def no_bounds_guard(x, w, b, out):
    col, row = cuda.grid(2)
    acc = float32(0.0)
    for k in range(x.shape[1]):
        acc += x[row, k] * w[k, col]
    if b.shape[0] > 0:
        acc += b[col]
    out[row, col] = acc


@cuda.jit
def transposed_w(x, w, b, out):
    col, row = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        acc = float32(0.0)
        for k in range(x.shape[1]):
            acc += x[row, k] * w[col, k]          # w read as if it were (d_out, d_model)
        if b.shape[0] > 0:
            acc += b[col]
        out[row, col] = acc


@cuda.jit
def only_the_first_block(x, w, b, out):
    col, row = cuda.threadIdx.x, cuda.threadIdx.y   # forgets blockIdx: right while out fits one block
    if row < out.shape[0] and col < out.shape[1]:
        acc = float32(0.0)
        for k in range(x.shape[1]):
            acc += x[row, k] * w[k, col]
        if b.shape[0] > 0:
            acc += b[col]
        out[row, col] = acc


@cuda.jit
def forgets_the_bias(x, w, b, out):
    col, row = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        acc = float32(0.0)
        for k in range(x.shape[1]):
            acc += x[row, k] * w[k, col]
        out[row, col] = acc


@cuda.jit
def bias_always(x, w, b, out):
    col, row = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        acc = float32(0.0)
        for k in range(x.shape[1]):
            acc += x[row, k] * w[k, col]
        out[row, col] = acc + b[col]              # b is empty (0,) when there is no bias


@cuda.jit
def rows_and_columns_swapped(x, w, b, out):
    row, col = cuda.grid(2)                          # the row taken from the grid's x
    if row < out.shape[0] and col < out.shape[1]:
        acc = float32(0.0)
        for k in range(x.shape[1]):
            acc += x[row, k] * w[k, col]
        if b.shape[0] > 0:
            acc += b[col]
        out[row, col] = acc


@cuda.jit
def sum_in_float64(x, w, b, out):
    col, row = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        acc = 0.0                                   # a Python float: float64 on a GPU
        for k in range(x.shape[1]):
            acc += x[row, k] * w[k, col]
        if b.shape[0] > 0:
            acc += b[col]
        out[row, col] = acc


@cuda.jit
def rows_down_the_lanes(x, w, b, out):
    """Right values, one thread per output, but a block's threads walk down its rows first."""
    tid = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x
    row = cuda.blockIdx.y * cuda.blockDim.y + tid % cuda.blockDim.y
    col = cuda.blockIdx.x * cuda.blockDim.x + tid // cuda.blockDim.y
    if row < out.shape[0] and col < out.shape[1]:
        acc = float32(0.0)
        for k in range(x.shape[1]):
            acc += x[row, k] * w[k, col]
        if b.shape[0] > 0:
            acc += b[col]
        out[row, col] = acc


@cuda.jit
def sum_kept_in_out(x, w, b, out):
    """Right values: but the sum is added up in out, one read-modify-write of main memory a product."""
    col, row = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        out[row, col] = b[col] if b.shape[0] > 0 else float32(0.0)
        for k in range(x.shape[1]):
            out[row, col] += x[row, k] * w[k, col]


@cuda.jit
def sum_from_the_bias(x, w, b, out):
    """A right answer in another style: the sum starts from the bias, the k loop walks backwards."""
    col, row = cuda.grid(2)
    if row < out.shape[0] and col < out.shape[1]:
        acc = b[col] if b.shape[0] > 0 else float32(0.0)
        for k in range(x.shape[1] - 1, -1, -1):
            acc += x[row, k] * w[k, col]
        out[row, col] = acc


@cuda.jit
def calls_tile_matmul(x, w, b, out):
    col, row = cuda.grid(2)
    acc = projection.tile_matmul(x, w, row, col)
    if row < out.shape[0] and col < out.shape[1]:
        out[row, col] = acc + (b[col] if b.shape[0] > 0 else float32(0.0))


@cuda.jit
def not_written_yet(x, w, b, out):
    raise NotImplementedError()


@pytest.mark.parametrize("answer, diagnosis, says", [
    (naive, "ok", "correct at every size tried"),
    (sum_from_the_bias, "ok", "correct at every size tried"),
    (sum_kept_in_out, "output_rewritten", "at (T 1, d_model 5, d_out 5): the values are right, but thread (0, 0, 0) "
                                          "of block (0, 0, 0) stored out[0, 0] 6 times"),
    (no_bounds_guard, "out_of_bounds", "out-of-bounds read "),   # of x or of w: whichever thread gets there first
    (transposed_w, "w_transposed", "at (T 1, d_model 5, d_out 5): the result is x @ w^T"),
    (only_the_first_block, "race", "blocks never wait for each other"),     # every block writes the same elements: an inter-block race
    (forgets_the_bias, "bias_missing", "(T 7, d_model 24, d_out 20, bias): the values are x @ w without the bias"),
    (bias_always, "out_of_bounds", "global array 'b' has shape (0,)"),
    (rows_and_columns_swapped, "grid_axes_swapped", "at (T 33, d_model 17, d_out 20): 20 of 660 outputs were never written"),
    (sum_in_float64, "float64_arithmetic", "the compiled kernel computes in float64"),
    (rows_down_the_lanes, "uncoalesced", "at (T 33, d_model 17, d_out 20): the values are right, but a warp's load "
                                         "of x at"),
    (calls_tile_matmul, "calls_given_code", "tile_matmul"),
    (projection.projection_kernel_v1, "calls_given_code", "projection_kernel_v1"),
    (not_written_yet, "not_implemented", "not implemented yet"),
    (lambda x, w, b, out: None, "not_a_kernel", "@cuda.jit"),
])
def test_01_projection_naive(answer, diagnosis, says):
    result = verdict("01_projection_naive", answer)
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message


def test_a_python_float_is_named_with_its_line():
    """The float64 verdict names the Python float's line and the lines computing in float64."""
    import inspect
    first = inspect.getsourcelines(sum_in_float64.py_func)[1]
    message = verdict("01_projection_naive", sum_in_float64).message
    assert f"line {first + 4}: acc = 0.0" in message and f"at line {first + 5}: " in message, message


def test_a_tiled_kernel_missing_a_barrier_is_a_race_in_the_warm_up_too():
    @cuda.jit
    def tiled_without_second_barrier(x, w, b, out):
        x_tile = cuda.shared.array((TILE, TILE), float32)
        w_tile = cuda.shared.array((TILE, TILE), float32)
        col, row = cuda.grid(2)
        ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
        acc = float32(0.0)
        for start in range(0, x.shape[1], TILE):
            x_tile[ty, tx] = x[row, start + tx] if row < x.shape[0] and start + tx < x.shape[1] else float32(0.0)
            w_tile[ty, tx] = w[start + ty, col] if start + ty < w.shape[0] and col < w.shape[1] else float32(0.0)
            cuda.syncthreads()
            for k in range(TILE):
                acc += x_tile[ty, k] * w_tile[k, tx]
        if row < out.shape[0] and col < out.shape[1]:
            out[row, col] = acc + (b[col] if b.shape[0] > 0 else float32(0.0))
    result = verdict("01_projection_naive", tiled_without_second_barrier)
    assert result.diagnosis == "race", result
    assert "race on shared" in result.message and "syncthreads" in result.message


# --- 01_tiled_matmul -----------------------------------------------------------------------------

def tiled(mistake=None):
    """The solution, a device function tile_matmul(x, w, row, col), or the same with one mistake."""
    @cuda.jit(device=True)
    def tile_matmul(x, w, row, col):
        x_tile = cuda.shared.array((TILE, TILE), float32)
        w_tile = cuda.shared.array((TILE, TILE), float32)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        acc = float32(0.0)
        for start in range(0, x.shape[1] + (1 if mistake == "one_step_more" else 0), TILE):
            if mistake == "sum_restarted":
                acc = float32(0.0)
            if mistake == "unguarded":
                x_tile[ty, tx] = x[row, start + tx]
            elif mistake == "one_row_of_threads_copies_x":      # the block's first row of threads, a loop each
                if ty == 0:
                    for r in range(TILE):
                        x_row = row + r
                        x_tile[r, tx] = x[x_row, start + tx] if x_row < x.shape[0] and start + tx < x.shape[1] \
                            else float32(0.0)
            elif mistake == "loads_down_the_columns":          # thread (tx, ty) copies x_tile[tx, ty]
                r = row - ty + tx
                x_tile[tx, ty] = x[r, start + ty] if r < x.shape[0] and start + ty < x.shape[1] else float32(0.0)
            elif row < x.shape[0] and start + tx < x.shape[1]:
                x_tile[ty, tx] = x[row, start + tx]
            elif mistake != "no_zero_fill":
                x_tile[ty, tx] = float32(0.0)
            if start + ty < w.shape[0] and col < w.shape[1]:
                w_tile[ty, tx] = w[start + ty, col]
            else:
                w_tile[ty, tx] = float32(0.0)
            if mistake == "barrier_inside_the_guard":
                if row < x.shape[0] and col < w.shape[1]:
                    cuda.syncthreads()
            elif mistake != "no_first_barrier":
                cuda.syncthreads()
            for k in range(x.shape[1] if mistake == "k_over_d_model" else TILE):
                if mistake == "untiled":
                    if start + k < x.shape[1] and row < x.shape[0] and col < w.shape[1]:
                        acc += x[row, start + k] * w[start + k, col]
                else:
                    acc += x_tile[ty, k] * w_tile[k, tx]
            if mistake != "no_second_barrier":
                cuda.syncthreads()
        return acc
    return tile_matmul


@cuda.jit(device=True)
def stub(x, w, row, col):
    raise NotImplementedError()


@cuda.jit(device=True)
def calls_the_library(x, w, row, col):
    return projection.tile_matmul(x, w, row, col)


@pytest.mark.parametrize("answer, diagnosis, says", [
    (tiled(), "ok", "correct at every size tried ((T 1, d_model 5, d_out 3), (T 7, d_model 24, d_out 20, bias), "
                    "(T 18, d_model 17, d_out 33), (T 33, d_model 40, d_out 17, bias), (T 16, d_model 16, d_out 16, "
                    "bias), (T 17, d_model 32, d_out 15))"),
    (tiled("no_first_barrier"), "race", "race on shared"),
    (tiled("no_second_barrier"), "race", "race on shared"),
    (tiled("barrier_inside_the_guard"), "divergent_barrier", "On a GPU that hangs the block"),
    (tiled("unguarded"), "out_of_bounds", "global array 'x' has shape (1, 5)"),
    (tiled("k_over_d_model"), "out_of_bounds", "shared array"),
    (tiled("no_zero_fill"), "stale_tile", "which no thread of its block had written"),
    (tiled("untiled"), "no_reuse", "an element of x was read up to 4 times from global memory, where the limit is 1"),
    (tiled("loads_down_the_columns"), "uncoalesced", "the values are right, but a warp's load of x at"),
    (tiled("one_row_of_threads_copies_x"), "serial_copy", "at (T 7, d_model 24, d_out 20, bias): the values are "
                                                          "right, but one warp made 14 load instructions of x"),
    (tiled("one_step_more"), "extra_barriers", "at (T 16, d_model 16, d_out 16, bias): the values are right, but a "
                                               "thread passed 4 barriers, where the limit is 2"),
    (tiled("sum_restarted"), "wrong_values", "entries differ"),
    (calls_the_library, "calls_given_code", "tile_matmul"),
    (stub, "not_implemented", "not implemented yet"),
])
def test_01_tiled_matmul(answer, diagnosis, says):
    result = verdict("01_tiled_matmul", answer)
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message


def test_a_tile_refilled_with_its_own_old_value_is_stale_too():
    """x_tile keeps its slot's number past the edge (read, then written back): a read of a slot
    not refreshed since its last step, named as such on the step it happens."""
    @cuda.jit(device=True)
    def keeps_old_values(x, w, row, col):
        x_tile = cuda.shared.array((TILE, TILE), float32)
        w_tile = cuda.shared.array((TILE, TILE), float32)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        acc = float32(0.0)
        for start in range(0, x.shape[1], TILE):
            x_tile[ty, tx] = x[row, start + tx] if row < x.shape[0] and start + tx < x.shape[1] else x_tile[ty, tx]
            w_tile[ty, tx] = w[start + ty, col] if start + ty < w.shape[0] and col < w.shape[1] else float32(0.0)
            cuda.syncthreads()
            for k in range(TILE):
                acc += x_tile[ty, k] * w_tile[k, tx]
            cuda.syncthreads()
        return acc
    assert verdict("01_tiled_matmul", keeps_old_values).diagnosis == "stale_tile"


def test_the_read_ceilings_are_a_tiled_kernels_reads():
    assert read_ceilings(18, 33) == (3, 2)
    assert [read_ceilings(c.T, c.d_out) for c in TILED_CASES] == [(1, 1), (2, 1), (3, 2), (2, 3), (1, 1), (1, 2)]
    assert verdict("01_tiled_matmul", tiled("untiled")).diagnosis == "no_reuse"


# --- 01x_multiply_wide_tiles -------------------------------------------------------------------

@cuda.jit(device=True)
def multiply_wide(x_tile, w_tile, acc00, acc01, acc10, acc11):
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    for kk in range(TILE):
        x0, x1 = x_tile[ty, kk], x_tile[ty + TILE, kk]
        w0, w1 = w_tile[kk, tx], w_tile[kk, tx + TILE]
        acc00 += x0 * w0
        acc01 += x0 * w1
        acc10 += x1 * w0
        acc11 += x1 * w1
    return acc00, acc01, acc10, acc11


@cuda.jit(device=True)
def reads_each_product(x_tile, w_tile, acc00, acc01, acc10, acc11):
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    for kk in range(TILE):
        acc00 += x_tile[ty, kk] * w_tile[kk, tx]
        acc01 += x_tile[ty, kk] * w_tile[kk, tx + TILE]
        acc10 += x_tile[ty + TILE, kk] * w_tile[kk, tx]
        acc11 += x_tile[ty + TILE, kk] * w_tile[kk, tx + TILE]
    return acc00, acc01, acc10, acc11


@cuda.jit(device=True)
def sums_in_a_local_array(x_tile, w_tile, acc00, acc01, acc10, acc11):
    """Right values and reads, but the sums in an array indexed by numbers known only at run time."""
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    acc = cuda.local.array(4, float32)
    acc[0], acc[1], acc[2], acc[3] = acc00, acc01, acc10, acc11
    for kk in range(TILE):
        x0, x1 = x_tile[ty, kk], x_tile[ty + TILE, kk]
        w0, w1 = w_tile[kk, tx], w_tile[kk, tx + TILE]
        first = cuda.threadIdx.z                           # 0 in this launch, but not a constant
        acc[first] += x0 * w0
        acc[first + 1] += x0 * w1
        acc[first + 2] += x1 * w0
        acc[first + 3] += x1 * w1
    return acc[0], acc[1], acc[2], acc[3]


@cuda.jit(device=True)
def second_row_wrong(x_tile, w_tile, acc00, acc01, acc10, acc11):
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    for kk in range(TILE):
        x0, x1 = x_tile[ty, kk], x_tile[ty + 1, kk]
        w0, w1 = w_tile[kk, tx], w_tile[kk, tx + TILE]
        acc00 += x0 * w0
        acc01 += x0 * w1
        acc10 += x1 * w0
        acc11 += x1 * w1
    return acc00, acc01, acc10, acc11


@cuda.jit(device=True)
def stub_wide(x_tile, w_tile, acc00, acc01, acc10, acc11):
    raise NotImplementedError()


@pytest.mark.parametrize("answer, diagnosis, says", [
    (multiply_wide, "ok", "correct at every size tried"),
    (reads_each_product, "no_register_reuse", "at (T 1, d_model 5, d_out 3): the values are right, but one thread "
                                              "read shared memory 128 times, where the limit is 64"),
    (sums_in_a_local_array, "local_memory", "stack frame"),
    (second_row_wrong, "wrong_values", "entries differ"),
    (projection.multiply_wide_tiles, "calls_given_code", "multiply_wide_tiles"),
    (stub_wide, "not_implemented", "not implemented yet"),
])
def test_01x_multiply_wide_tiles(answer, diagnosis, says):
    result = verdict("01x_multiply_wide_tiles", answer)
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message
