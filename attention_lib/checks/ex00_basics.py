"""Notebook 00's exercises: a first element-wise kernel with its bounds guard, then a 2-D one.

``00_scale_add`` (warm-up): out = alpha * x + y, one thread per element.
``00_transpose`` (main): the answer is a pair (transpose_kernel, transpose_grid): the student
computes the grid for a (rows, cols) matrix and a non-square block, and writes the 2-D kernel.
Named mistakes: ``grid_axes_swapped``, ``grid_too_small``, ``grid_too_large`` (the grid
function, asked about several shapes before any launch), ``row_is_x`` (the kernel takes the row
from the grid's x: part of the matrix is never written) and ``not_transposed`` (a copy).
"""

import numpy as np
from numba import cuda

from attention_lib.stages import basics
from attention_lib.checks.engine import Diagnosed, Exercise, output_array, read_output, register, unwritten
from attention_lib.platform.launch import ceil_div


def _run_scale_add(kernel, n, rng, launch):
    alpha = np.float32(rng.uniform(-2.0, 2.0))
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    threads = basics.THREADS_PER_BLOCK
    full, out = output_array(n, guard=threads)
    launch(kernel, ceil_div(n, threads), threads, alpha, cuda.to_device(x), cuda.to_device(y), out)
    return read_output(full, out), basics.scale_add_reference(alpha, x, y)


register(Exercise(
    exercise_id="00_scale_add",
    title="out[i] = alpha * x[i] + y[i], one thread per element",
    kind="kernel",
    run=_run_scale_add,
    # 1 and 7: fewer threads than a block; 64: exactly one block; 65 and 200: a partly used last block.
    cases=[1, 7, 64, 65, 200],
    describe_case=lambda n: f"n = {n} (blocks of {basics.THREADS_PER_BLOCK})",
    hint=("one thread per element: the thread's global index comes from its block and its place in "
          "the block, and the threads of the last block that fall past the end do nothing"),
))


# --- The main exercise: a 2-D kernel and its grid ------------------------------------------

# Not square on purpose: a grid with its axes swapped, or a kernel that takes the row from
# the grid's x, then misses part of the matrix instead of passing by luck.
TRANSPOSE_BLOCK = (16, 8)            # (x threads: across columns, y threads: down rows)
# (rows, cols) the grid function is asked about before anything is launched.
GRID_SHAPES = [(1, 1), (8, 16), (9, 17), (40, 5), (5, 40), (100, 3)]


def _check_grid(transpose_grid):
    """Diagnosed unless transpose_grid gives the smallest grid that covers each matrix."""
    bx, by = TRANSPOSE_BLOCK
    for rows, cols in GRID_SHAPES:
        got = tuple(int(g) for g in transpose_grid(rows, cols, TRANSPOSE_BLOCK))
        want = (ceil_div(cols, bx), ceil_div(rows, by))
        where = f"a ({rows}, {cols}) matrix with blocks of {TRANSPOSE_BLOCK}"
        if got == want:
            continue
        if got == (ceil_div(rows, bx), ceil_div(cols, by)) or got == want[::-1]:
            raise Diagnosed("grid_axes_swapped", (
                f"for {where} the grid is {got}, expected {want}: the grid's x counts blocks across the "
                "columns, its y counts blocks down the rows"))
        if got[0] * bx < cols or got[1] * by < rows:
            raise Diagnosed("grid_too_small", (
                f"for {where} the grid is {got}, which covers only {got[1] * by} rows x {got[0] * bx} columns; "
                "round the number of blocks up"))
        raise Diagnosed("grid_too_large", (
            f"for {where} the grid is {got}, expected {want}: it covers the matrix, but with whole blocks "
            "that have nothing to do"))


def _run_transpose(answer, shape, rng, launch):
    transpose_kernel, transpose_grid = answer
    _check_grid(transpose_grid)
    rows, cols = shape
    a = rng.standard_normal((rows, cols)).astype(np.float32)
    full, out = output_array((cols, rows), guard=TRANSPOSE_BLOCK[0] * TRANSPOSE_BLOCK[1] * (rows + cols))
    grid = transpose_grid(rows, cols, TRANSPOSE_BLOCK)
    launch(transpose_kernel, tuple(grid), TRANSPOSE_BLOCK, cuda.to_device(a), out)
    got = read_output(full, out)
    _diagnose_transpose(got, a, grid)
    return got, np.ascontiguousarray(a.T)


def _diagnose_transpose(got, a, grid):
    """Diagnosed when the written entries or the values show a typical kernel mistake."""
    rows, cols = a.shape
    bx, by = TRANSPOSE_BLOCK
    never = unwritten(got)                                          # (cols, rows), like out
    if never.any():
        c, r = np.indices(got.shape)
        # a kernel that takes the row from the grid's x reaches rows < gx * bx and cols < gy * by
        reached = (r < grid[0] * bx) & (c < grid[1] * by)
        if np.array_equal(~never, reached):
            raise Diagnosed("row_is_x", (
                f"{int(never.sum())} entries were never written, those of rows {grid[0] * bx} and on, "
                "or columns past the grid's y: cuda.grid(2) gives (x, y), and x is the column"))
    elif rows == cols > 1 and np.array_equal(got, a):
        raise Diagnosed("not_transposed", "out equals a: element (r, c) of a must land at (c, r) of out")


register(Exercise(
    exercise_id="00_transpose",
    title="out = a^T: a 2-D kernel and the grid that covers the matrix",
    kind="kernel and grid",
    run=_run_transpose,
    # (rows, cols): one element; square, under one block; then more rows than a block's x
    # covers and fewer columns (a row taken from x misses rows), wide and tall, partly used blocks.
    cases=[(1, 1), (7, 7), (19, 7), (5, 40), (33, 17)],
    describe_case=lambda s: f"a of shape {s} (blocks of {TRANSPOSE_BLOCK})",
    hint=("give every element of a a thread: the grid counts blocks in each direction, and in the "
          "kernel each thread finds its row and column from its place in the grid"),
    more_hints=("where it goes wrong: CUDA's x comes first and is the column (the fastest-moving index), "
                "y is the row; a count of blocks rounds up, and then the last blocks hang over the edge, "
                "so their extra threads must do nothing",),
    rtol=0.0,     # a transpose moves values: exactly equal
    atol=0.0,
    diagnoses=("grid_axes_swapped", "grid_too_small", "grid_too_large", "row_is_x", "not_transposed"),
))
