"""Deep dive 00x's exercises, 00x_warp_divergence and 00x_predict_segments: each solution gets ok,
each typical mistake its own diagnosis, in one line."""

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
    for exercise_id in ("00x_warp_divergence", "00x_predict_segments"):
        hints = EXERCISES[exercise_id].hints
        assert len(hints) >= 2 and hints[1].startswith("where answers go wrong")
        for text in hints:
            assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), text


def test_hints_print_by_level(capsys):
    hint("00x_warp_divergence", 2)
    assert capsys.readouterr().out.startswith("00x_warp_divergence, hint 2 of 2: where answers go wrong")


# --- 00x_warp_divergence -----------------------------------------------------------------------

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


def guarded(inside):
    """The solution written out with the guard inside(row, col, rows, cols) in place of row < rows and col < cols."""
    def answer(rows, cols, block):
        bx, by = block
        grid_x, grid_y = ceil_div(cols, bx), ceil_div(rows, by)
        out = np.zeros((grid_y, grid_x, bx * by // WARP_SIZE), bool)
        for index in np.ndindex(out.shape):
            lanes = np.arange(index[2] * WARP_SIZE, (index[2] + 1) * WARP_SIZE)
            row, col = index[0] * by + lanes // bx, index[1] * bx + lanes % bx
            out[index] = split(inside(row, col, rows, cols))
        return out
    return answer


def edge_inclusive(rows, cols, block):
    """col <= cols: the column just past the edge counted inside (wrong where a warp's columns end there)."""
    return warps_with(x_fastest, split)(rows, cols + 1, block)[:, :ceil_div(cols, block[0])]


@pytest.mark.parametrize("answer, diagnosis, says", [
    (divergent_warps, "ok", "correct on every case tried"),
    (warps_with(x_fastest, split), "ok", "correct on every case tried"),
    (warps_with(lambda lanes, bx, by: (lanes % by, lanes // by), split), "lanes_y_fastest",
     "at a 21 x 20 matrix, blocks of 16 threads across (x) and 8 down (y): your warps take the block's threads "
     "down y first"),
    (warps_with(x_fastest, lambda inside: not inside.all()), "idle_warp_counted",
     "at a 1 x 1 matrix, blocks of 16 threads across (x) and 8 down (y): a warp whose threads all fail the guard"),
    # the guard's complement (the threads outside) splits the same warps: right
    (guarded(lambda row, col, rows, cols: (row >= rows) | (col >= cols)), "ok", "correct on every case tried"),
    # a wrong guard gives, on the 1 x 1 matrix, the warps of an idle warp counted as split
    (guarded(lambda row, col, rows, cols: (row < rows) | (col < cols)), "guard_or",
     "at a 1 x 1 matrix, blocks of 16 threads across (x) and 8 down (y): your guard lets a thread in when its row or "
     "its column is inside"),
    (guarded(lambda row, col, rows, cols: col < cols), "guard_one_edge",
     "at a 1 x 1 matrix, blocks of 16 threads across (x) and 8 down (y): your guard tests one edge only"),
    (guarded(lambda row, col, rows, cols: row < rows), "guard_one_edge",
     "at a 21 x 20 matrix, blocks of 16 threads across (x) and 8 down (y): your guard tests one edge only"),
    (guarded(lambda row, col, rows, cols: (row < rows) ^ (col < cols)), "wrong_values", "entries differ"),
    (warps_with(lambda lanes, bx, by: (lanes // 32, lanes % 32), split), "wrong_values", "entries differ"),
    (edge_inclusive, "wrong_values", "at a 5 x 31 matrix, blocks of 16 threads across (x) and 8 down (y)"),
    (warps_with(x_fastest, lambda inside: inside.any()), "wrong_values", "entries differ"),
    (lambda rows, cols, block: divergent_warps(rows, cols, block).transpose(1, 0, 2), "wrong_shape",
     "at a 21 x 20 matrix, blocks of 16 threads across (x) and 8 down (y): the result has shape (2, 3, 4), "
     "expected (3, 2, 4)"),
    (basics.divergent_warps, "calls_given_code", "divergent_warps"),
    (stub, "not_implemented", "not implemented yet"),
])
def test_00x_warp_divergence(answer, diagnosis, says):
    result = verdict("00x_warp_divergence", answer)
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message


# --- 00x_predict_segments ------------------------------------------------------------------------

def footprint(stride):
    addresses = np.arange(32) * stride * 4                       # bytes
    return len(set(addresses // 128)), len(set(addresses // 32))


@pytest.mark.parametrize("answer, diagnosis, says", [
    (footprint, "ok", "correct on every case tried"),
    (lambda stride: footprint(stride)[::-1], "pair_swapped", "at stride 1 (lane l reads float32 element 1 * l): "
                                                              "the answer is (4, 1), expected (1, 4)"),
    (lambda stride: (len(set(np.arange(32) * stride // 128)), len(set(np.arange(32) * stride // 32))),
     "elements_not_bytes", "at stride 1 (lane l reads float32 element 1 * l): the answer is (1, 1), expected (1, 4)"),
    (lambda stride: (31 * stride * 4 // 128 + 1, 31 * stride * 4 // 32 + 1), "span_counted",
     "at stride 16 (lane l reads float32 element 16 * l): the answer is (16, 63), expected (16, 32)"),
    (lambda stride: (min(stride, 32), min(4 * stride, 32)), "wrong_values",
     "at stride 0 (lane l reads float32 element 0 * l): the answer (segments, sectors) is (0, 0), expected (1, 1)"),
    (lambda stride: (1, 4), "wrong_values", "at stride 0 (lane l reads float32 element 0 * l): the answer (segments, sectors) is (1, 4)"),
    (lambda stride: 1, "wrong_shape", "expected a pair (segments, sectors)"),
    (basics.warp_load_footprint, "calls_given_code", "warp_load_footprint"),
    (lambda stride: basics.warp_load_footprint(stride), "calls_given_code", "warp_load_footprint"),
])
def test_00x_predict_segments(answer, diagnosis, says):
    result = verdict("00x_predict_segments", answer)
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message


def test_the_sanitizer_counts_what_the_footprint_predicts():
    """The prediction is what the sanitizer measures for a warp reading a[lane * stride]."""
    from attention_lib.measure.trace import Traced

    @cuda.jit
    def read_strided(a, out, stride):
        lane = cuda.threadIdx.x
        out[lane] = a[lane * stride]

    for stride in (0, 1, 2, 3, 8, 31, 32, 33, 64):
        a = np.zeros(32 * max(stride, 1), np.float32)
        traced = Traced(read_strided, 1, 32, a, np.zeros(32, np.float32), stride)
        measured = traced.warp_segments("a"), traced.warp_segments("a", segment_bytes=32)
        assert measured == basics.warp_load_footprint(stride), stride
