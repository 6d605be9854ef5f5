"""Notebook 01's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line."""

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
def tiled_projection_missing_barrier(x, w, b, out):
    """A tiled projection whose second barrier is missing: a fast thread overwrites a tile
    that slower threads are still reading."""
    x_tile = cuda.shared.array((TILE, TILE), dtype=np.float32)
    w_tile = cuda.shared.array((TILE, TILE), dtype=np.float32)
    col, row = cuda.grid(2)
    ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
    acc = np.float32(0.0)
    for start in range(0, x.shape[1], TILE):
        x_tile[ty, tx] = x[row, start + tx] if row < x.shape[0] and start + tx < x.shape[1] else 0.0
        w_tile[ty, tx] = w[start + ty, col] if start + ty < w.shape[0] and col < w.shape[1] else 0.0
        cuda.syncthreads()
        for k in range(TILE):
            acc += x_tile[ty, k] * w_tile[k, tx]
    if row < out.shape[0] and col < out.shape[1]:
        out[row, col] = acc + (b[col] if b.shape[0] > 0 else 0.0)


def test_a_missing_barrier_is_diagnosed_as_a_race():
    from attention_lib.stages import projection
    assert TILE == projection.TILE
    result = check("01_projection_naive", tiled_projection_missing_barrier, verbose=False)
    assert result.diagnosis == "race", result
    assert "race on shared" in result.message and "syncthreads" in result.message


def test_the_tiled_library_kernel_is_race_checked_and_passes():
    from attention_lib.stages import projection
    from attention_lib.checks import engine
    assert engine._shares_memory(projection.projection_kernel_v2)       # through its device function
    assert not engine._shares_memory(projection.projection_kernel_v1)
    assert check("01_projection_naive", projection.projection_kernel_v2, verbose=False).passed




# --- 01_tiled_matmul ---------------------------------------------------------------------

def tiled(mistake=None):
    """The solution's loop body, or the same with one typical mistake."""
    @cuda.jit
    def kernel(x, w, b, out):
        x_tile = cuda.shared.array((TILE, TILE), float32)
        w_tile = cuda.shared.array((TILE, TILE), float32)
        col, row = cuda.grid(2)
        ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
        acc = float32(0.0)
        for start in range(0, x.shape[1], TILE):
            if mistake == "unguarded":
                x_tile[ty, tx] = x[row, start + tx]
            elif row < x.shape[0] and start + tx < x.shape[1]:
                x_tile[ty, tx] = x[row, start + tx]
            else:
                x_tile[ty, tx] = float32(0.0)
            if start + ty < w.shape[0] and col < w.shape[1]:
                w_tile[ty, tx] = w[start + ty, col]
            else:
                w_tile[ty, tx] = float32(0.0)
            if mistake != "no_first_barrier":
                cuda.syncthreads()
            for k in range(TILE):
                if mistake == "untiled":
                    if start + k < x.shape[1] and row < x.shape[0] and col < w.shape[1]:
                        acc += x[row, start + k] * w[start + k, col]
                else:
                    acc += x_tile[ty, k] * w_tile[k, tx]
            if mistake != "no_second_barrier":
                cuda.syncthreads()
        if row < out.shape[0] and col < out.shape[1]:
            out[row, col] = acc + (b[col] if b.shape[0] > 0 else float32(0.0))
    return kernel


@pytest.mark.parametrize("mistake, diagnosis, says", [
    (None, "ok", "correct at every size"),
    ("no_first_barrier", "race", "race on shared"),
    ("no_second_barrier", "race", "race on shared"),
    ("unguarded", "out_of_bounds", "Guard the index"),
    ("untiled", "no_reuse", "an element of x was read up to 36 times (a tiled kernel: 3)"),
])
def test_01_tiled_matmul(mistake, diagnosis, says):
    result = verdict("01_tiled_matmul", tiled(mistake))
    assert (result.diagnosis, result.passed) == (diagnosis, diagnosis == "ok"), result.message
    assert says in result.message, result.message


def test_01_the_library_kernels_against_the_tiled_exercise():
    assert verdict("01_tiled_matmul", projection.projection_kernel_v2).passed
    assert verdict("01_tiled_matmul", projection.projection_kernel_v1).diagnosis == "no_reuse"
