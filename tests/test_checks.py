"""The exercise checker: planted mistakes get their diagnosis, the right answer passes."""

import numpy as np
import pytest
from attention_lib.stages import basics
from attention_lib.checks import EXERCISES, check
from numba import cuda


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


def test_an_unknown_exercise_is_named():
    with pytest.raises(ValueError, match="exercise_id must be one of"):
        check("99_nothing", basics.scale_add_kernel)


def _sizes(case):
    """The integer sizes of a case (an int or a tuple of fields); flags such as bias=True are not sizes."""
    fields = case if isinstance(case, tuple) else (case,)
    return [f for f in fields if isinstance(f, (int, np.integer)) and not isinstance(f, (bool, np.bool_))]


def test_every_exercise_tries_awkward_sizes():
    for exercise in EXERCISES.values():
        sizes = [_sizes(case) for case in exercise.cases]
        assert len(exercise.cases) >= 3, exercise.exercise_id
        assert any(1 in s for s in sizes), f"{exercise.exercise_id} never tries a size of 1"
        assert any(n > 1 and n % 2 for s in sizes for n in s), f"{exercise.exercise_id} tries no odd size"


TILE = 16                    # the block of the exercise's launch (projection.TILE)


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
