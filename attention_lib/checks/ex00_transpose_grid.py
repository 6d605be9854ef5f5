"""``00_transpose_grid`` (notebook 00): the smallest grid of a given block that covers a (rows, cols)
matrix, as the pair (blocks along x, blocks along y), x across the columns (the library's
``basics.grid_2d``). Its cases and named mistakes are declared in the Exercise below;
``blocks_words`` names a block in the cases of notebook 00's and deep dive 00x's 2-D exercises.
"""

import numbers

import numpy as np

from attention_lib.stages import basics
from attention_lib.stages.basics import TRANSPOSE_BLOCK
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.result import Diagnosed
from attention_lib.platform.launch import ceil_div


def blocks_words(block):
    return f"blocks of {block[0]} threads across (x) and {block[1]} down (y)"


def _grid_cases(block=TRANSPOSE_BLOCK):
    """(rows, cols, block): one element; one short of a block, a whole block and one more, in both
    directions; wide and tall; then other blocks (a grid function that reads the block, not 16 and 8)."""
    bx, by = block
    return [(1, 1, block), (by - 1, bx - 1, block), (by, bx, block), (by + 1, bx + 1, block),
            (2 * by, 2 * bx + 1, block), (5 * by, 5, block), (5, 5 * by, block), (100, 3, block),
            (9, 100, (32, 4)), (33, 7, (8, 8))]


def _run_grid(transpose_grid, case, rng, launch):
    rows, cols, block = case
    got = transpose_grid(rows, cols, block)
    want = basics.grid_2d(rows, cols, block)
    try:
        got = tuple(got)
    except TypeError:
        raise Diagnosed("wrong_shape", f"the grid is {got!r}, expected a pair (blocks along x, blocks along y)")
    if len(got) == 2 and got != want:
        _diagnose_grid(got, want, rows, cols, block)
    if got == want and not all(isinstance(g, numbers.Integral) for g in got):
        # Right numbers of the wrong type: Numba's launch takes a grid of numbers.Integral (Python or
        # NumPy integers) and refuses any other, a float even when whole (2.0).
        kinds = ", ".join(sorted({type(g).__name__ for g in got if not isinstance(g, numbers.Integral)}))
        raise Diagnosed("grid_not_integers", (
            f"the grid (x, y) is ({', '.join(str(g) for g in got)}), the right counts, but as {kinds}: a launch "
            "takes its numbers of blocks as integers (a Python int or a NumPy integer), and Numba refuses a "
            "float grid"))
    return np.asarray(got, np.float64), np.asarray(want, np.float64)


def _diagnose_grid(got, want, rows, cols, block):
    """Diagnosed when the pair `got` is a typical wrong grid; returns when it is none of them."""
    bx, by = block
    if not all(float(g).is_integer() for g in got):
        raise Diagnosed("wrong_values", f"the grid (x, y) is {got}, expected {want}: a grid counts whole blocks")
    got = tuple(int(g) for g in got)
    covers = f"{got[1] * by} rows and {got[0] * bx} columns"
    if got == (ceil_div(rows, bx), ceil_div(cols, by)) or got == want[::-1]:
        raise Diagnosed("grid_axes_swapped", (
            f"the grid (x, y) is {got}, expected {want}: the grid's x counts blocks across the columns, "
            "its y blocks down the rows"))
    if got[0] * bx < cols or got[1] * by < rows:
        raise Diagnosed("grid_too_small", f"the grid (x, y) is {got}, which covers only {covers}; round the "
                                          "number of blocks up")
    if (got[0] - 1) * bx >= cols or (got[1] - 1) * by >= rows:
        raise Diagnosed("grid_too_large", (
            f"the grid (x, y) is {got}, expected {want}: it covers {covers}, with whole blocks that have "
            "nothing to do"))


register(Exercise(
    exercise_id="00_transpose_grid",
    kind="function",
    run=_run_grid,
    cases=_grid_cases(),
    describe_case=lambda c: f"a matrix of {c[0]} rows and {c[1]} columns in {blocks_words(c[2])}",
    hint=("a grid counts blocks in each direction: enough blocks of the block's width to cover the "
          "columns, and enough of its height to cover the rows"),
    more_hints=("where answers go wrong: CUDA's x comes first and runs across the columns (the "
                "fastest-moving index), y down the rows; and a count of blocks rounds up, so that a "
                "partly used block at the edge still gets launched",),
    rtol=0.0,
    atol=0.0,
    diagnoses=("grid_axes_swapped", "grid_too_small", "grid_too_large", "grid_not_integers"),
    solution=basics.grid_2d,
))
