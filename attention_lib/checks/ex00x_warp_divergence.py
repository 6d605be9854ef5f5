"""``00x_warp_divergence`` (deep dive 00x): a function ``(rows, cols, block)`` giving which warps of the
launch ``grid_2d(rows, cols, block)`` split at the bounds guard, a bool for each (block along y,
block along x, warp) (the library's ``basics.divergent_warps``). Its cases and named mistakes are
declared in the Exercise below.
"""

import numpy as np

from attention_lib.stages import basics
from attention_lib.stages.basics import WARP_SIZE
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.ex00_transpose_grid import blocks_words
from attention_lib.checks.result import Diagnosed


def _split(inside, warps):
    """(..., warps) bool: the warps (groups of lanes along the last axis) some of whose lanes are inside."""
    grouped = inside.reshape(*inside.shape[:-1], warps, -1)
    return grouped.any(axis=-1) & ~grouped.all(axis=-1)


def _variants(rows, cols, block):
    """What the usual wrong readings of the warp map give: [(code, (blocks y, blocks x, warps) bool)]."""
    bx, by = block
    grid_x, grid_y = basics.grid_2d(rows, cols, block)
    ids = np.arange(bx * by)
    by_index, bx_index = np.indices((grid_y, grid_x))

    def place(row_in_block, col_in_block):
        """(row, col) of each thread: (blocks y, blocks x, threads) each."""
        return by_index[..., None] * by + row_in_block, bx_index[..., None] * bx + col_in_block

    def inside(row_in_block, col_in_block):
        row, col = place(row_in_block, col_in_block)
        return (row < rows) & (col < cols)

    warps = bx * by // WARP_SIZE
    row, col = place(ids // bx, ids % bx)
    y_fastest = inside(ids % by, ids // by)
    grouped = inside(ids // bx, ids % bx).reshape(grid_y, grid_x, warps, -1)
    return [("lanes_y_fastest", _split(y_fastest, warps)),
            ("idle_warp_counted", ~grouped.all(axis=-1)),
            # the guard written wrong: either edge letting a thread in, or one edge tested alone
            ("guard_or", _split((row < rows) | (col < cols), warps)),
            ("guard_one_edge", _split(col < cols, warps)),
            ("guard_one_edge", _split(row < rows, warps))]


def _reading(divergent_warps, got, case):
    """The code of the wrong reading the answer gives at this case and at every other case of the
    exercise (one case alone can hide the reading: on a 1 x 1 matrix an idle warp counted as split
    and a guard with `or` give the same warps); None when there is none."""
    for n, (code, wrong) in enumerate(_variants(*case)):
        if np.array_equal(got != 0, wrong) and all(
                _gives(divergent_warps, other, _variants(*other)[n][1]) for other in _warp_cases() if other != case):
            return code
    return None


def _gives(divergent_warps, case, wrong):
    """Whether the answer gives the warps `wrong` at `case`."""
    try:
        got = np.asarray(divergent_warps(*case))
    except Exception:  # the answer's own error shows at its own case; here it only rules the reading out
        return False
    return got.shape == wrong.shape and got.dtype.kind in "biuf" and np.array_equal(got != 0, wrong)


WRONG_READINGS = {
    "lanes_y_fastest": "your warps take the block's threads down y first; a block numbers its threads along x "
                       "first (the id is y times the block's width plus x), and each run of 32 ids is a warp",
    "idle_warp_counted": "a warp whose threads all fail the guard was counted as split; they all skip the body "
                         "together, which costs nothing: a warp diverges only when some of its threads pass and "
                         "others do not",
    "guard_or": "your guard lets a thread in when its row or its column is inside; a thread is inside the "
                "matrix only when both are, row < rows and col < cols",
    "guard_one_edge": "your guard tests one edge only (the columns, or the rows); the 2-D guard has two, "
                      "row < rows and col < cols, and a warp can split at either",
}


def _run_warps(divergent_warps, case, rng, launch):
    rows, cols, block = case
    got = np.asarray(divergent_warps(rows, cols, block))
    expected = basics.divergent_warps(rows, cols, block)
    if got.shape == expected.shape and got.dtype.kind in "biuf" and not np.array_equal(got != 0, expected):
        code = _reading(divergent_warps, got, case)
        if code is not None:
            raise Diagnosed(code, WRONG_READINGS[code])
    return got.astype(np.float64) if got.dtype.kind in "biuf" else got, expected.astype(np.float64)


def _warp_cases(warp=WARP_SIZE):
    """(rows, cols, block): one element (one split warp, three idle); blocks half a warp wide, so
    that a warp spans two rows (the bottom edge splits the warp holding the last row and the next);
    blocks one warp wide (the bottom edge never splits); 8 x 8 blocks (a warp spans four rows); one
    long row in blocks two warps wide. Then edges on a warp's boundary: the last column one short of
    the end of a warp's columns, and a matrix exactly one warp wide in blocks two warps wide (its
    second warp wholly outside: idle, not split)."""
    half = warp // 2
    return [(1, 1, (half, 8)), (21, 20, (half, 8)), (7, 40, (warp, 4)), (19, 13, (8, 8)), (3, 100, (2 * warp, 1)),
            (5, 2 * half - 1, (half, 8)), (3, warp, (2 * warp, 1)), (2 * (warp // 8) + 1, 8, (8, 8))]


register(Exercise(
    exercise_id="00x_warp_divergence",
    kind="function",
    run=_run_warps,
    cases=_warp_cases(),
    describe_case=lambda c: f"a {c[0]} x {c[1]} matrix, {blocks_words(c[2])}",
    hint=("a warp is 32 threads of one block whose linear ids follow each other, the id counting along "
          "x first; a warp splits at the guard when some of its threads land inside the matrix and "
          "some outside"),
    more_hints=("where answers go wrong: with a block narrower than 32 threads one warp covers several "
                "of the block's rows, so the row of a lane is its id divided by the block's width; and a "
                "warp lying wholly outside the matrix skips the body as one, without splitting",),
    rtol=0.0,
    atol=0.0,
    diagnoses=("lanes_y_fastest", "idle_warp_counted", "guard_or", "guard_one_edge"),
    solution=basics.divergent_warps,
))
