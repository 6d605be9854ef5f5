"""Notebook 00's exercises: a first element-wise kernel with its bounds guard, a 2-D one and the
grid that covers it, then the warps of a 2-D launch.

``00_scale_add`` (warm-up): out = alpha * x + y, one thread per element (basics.scale_add_kernel).
``00_transpose`` (main): the answer is a pair (transpose_kernel, transpose_grid): the student
computes the grid for a (rows, cols) matrix and a non-square block (basics.grid_2d), and writes
the 2-D kernel (basics.transpose_kernel). Named mistakes: ``grid_axes_swapped``,
``grid_too_small``, ``grid_too_large`` (the grid function, asked about several shapes before any
launch), ``row_is_x`` (the kernel takes the row from the grid's x: part of the matrix is never
written) and ``not_transposed`` (a copy).
``00_warp_divergence``: which warps of a 2-D launch split at the bounds guard
(basics.divergent_warps). Named mistakes: ``lanes_y_fastest`` (a block's threads dealt out to
warps down y first) and ``idle_warp_counted`` (a warp with no thread inside counted as split).
"""

import numpy as np
from numba import cuda

from attention_lib.stages import basics
from attention_lib.stages.basics import TRANSPOSE_BLOCK, WARP_SIZE  # noqa: F401  (the notebook imports TRANSPOSE_BLOCK here)
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
    more_hints=("where answers go wrong: the thread's place in its block alone repeats in every block "
                "(add the threads of the blocks before it), and the guard compares the index with the "
                "length of the vector, which the last block overshoots",),
    solution=basics.scale_add_kernel,
    forbidden=(basics.scale_add,),
))


# --- The main exercise: a 2-D kernel and its grid ------------------------------------------

# (rows, cols) the grid function is asked about before anything is launched.
GRID_SHAPES = [(1, 1), (8, 16), (9, 17), (40, 5), (5, 40), (100, 3)]


def _blocks_words(block):
    return f"blocks of {block[0]} threads across (x) and {block[1]} down (y)"


def _check_grid(transpose_grid):
    """Diagnosed unless transpose_grid gives the smallest grid that covers each matrix."""
    bx, by = TRANSPOSE_BLOCK
    for rows, cols in GRID_SHAPES:
        got = tuple(int(g) for g in transpose_grid(rows, cols, TRANSPOSE_BLOCK))
        want = basics.grid_2d(rows, cols, TRANSPOSE_BLOCK)
        if got == want:
            continue
        # One convention throughout: the matrix in rows and columns, the grid as (x, y) blocks.
        where = (f"for a matrix of {rows} rows and {cols} columns in {_blocks_words(TRANSPOSE_BLOCK)}, "
                 f"the grid (x, y) is {got}")
        covers = f"{got[1] * by} rows and {got[0] * bx} columns"
        if got == (ceil_div(rows, bx), ceil_div(cols, by)) or got == want[::-1]:
            raise Diagnosed("grid_axes_swapped", (
                f"{where}, expected {want}: the grid's x counts blocks across the columns, its y blocks "
                "down the rows"))
        if got[0] * bx < cols or got[1] * by < rows:
            raise Diagnosed("grid_too_small", f"{where}, which covers only {covers}; round the number of blocks up")
        raise Diagnosed("grid_too_large", (
            f"{where}, expected {want}: it covers {covers}, with whole blocks that have nothing to do"))


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
    describe_case=lambda s: f"a of shape {s} ({s[0]} rows, {s[1]} columns)",
    hint=("give every element of a a thread: the grid counts blocks in each direction, and in the "
          "kernel each thread finds its row and column from its place in the grid"),
    more_hints=("where answers go wrong: CUDA's x comes first and is the column (the fastest-moving "
                "index), y is the row; a count of blocks rounds up, and then the last blocks hang over "
                "the edge, so their extra threads must do nothing",),
    rtol=0.0,     # a transpose moves values: exactly equal
    atol=0.0,
    diagnoses=("grid_axes_swapped", "grid_too_small", "grid_too_large", "row_is_x", "not_transposed"),
    solution=(basics.grid_2d, basics.transpose_kernel),
    forbidden=(basics.transpose,),
))


# --- Which warps split at the guard ----------------------------------------------------------

def _split(inside, warps):
    """(..., warps) bool: the warps (groups of lanes along the last axis) some of whose lanes are inside."""
    grouped = inside.reshape(*inside.shape[:-1], warps, -1)
    return grouped.any(axis=-1) & ~grouped.all(axis=-1)


def _variants(rows, cols, block):
    """What the usual wrong readings of the warp map give: {code: (blocks y, blocks x, warps) bool}."""
    bx, by = block
    grid_x, grid_y = basics.grid_2d(rows, cols, block)
    ids = np.arange(bx * by)
    by_index, bx_index = np.indices((grid_y, grid_x))

    def inside(row_in_block, col_in_block):
        row = by_index[..., None] * by + row_in_block            # (blocks y, blocks x, threads)
        col = bx_index[..., None] * bx + col_in_block
        return (row < rows) & (col < cols)

    warps = bx * by // WARP_SIZE
    y_fastest = inside(ids % by, ids // by)
    grouped = inside(ids // bx, ids % bx).reshape(grid_y, grid_x, warps, -1)
    return {"lanes_y_fastest": _split(y_fastest, warps),
            "idle_warp_counted": ~grouped.all(axis=-1)}


def _run_warps(divergent_warps, case, rng, launch):
    rows, cols, block = case
    got = np.asarray(divergent_warps(rows, cols, block))
    expected = basics.divergent_warps(rows, cols, block)
    if got.shape == expected.shape and got.dtype.kind in "biuf" and not np.array_equal(got != 0, expected):
        for code, wrong in _variants(rows, cols, block).items():
            if np.array_equal(got != 0, wrong):
                raise Diagnosed(code, {
                    "lanes_y_fastest": "your warps take the block's threads down y first; a block numbers "
                                       "its threads along x first (the id is y times the block's width "
                                       "plus x), and each run of 32 ids is a warp",
                    "idle_warp_counted": "a warp whose threads all fail the guard was counted as split; they "
                                         "all skip the body together, which costs nothing: a warp diverges "
                                         "only when some of its threads pass and others do not"}[code])
    return got.astype(np.float64) if got.dtype.kind in "biuf" else got, expected.astype(np.float64)


register(Exercise(
    exercise_id="00_warp_divergence",
    title="divergent_warps(rows, cols, block): the warps of a 2-D launch that split at the bounds guard",
    kind="function",
    run=_run_warps,
    # (rows, cols, block): one element (one split warp, three idle); 21 rows in blocks 16 wide
    # (a warp spans two rows: the bottom edge splits one); blocks one warp wide (the bottom edge
    # never splits, the right edge always); 8 x 8 blocks (a warp spans four rows); one long row.
    cases=[(1, 1, (16, 8)), (21, 20, (16, 8)), (7, 40, (32, 4)), (19, 13, (8, 8)), (3, 100, (64, 1))],
    describe_case=lambda c: f"a {c[0]} x {c[1]} matrix, {_blocks_words(c[2])}",
    hint=("a warp is 32 threads of one block whose linear ids follow each other, the id counting along "
          "x first; a warp splits at the guard when some of its threads land inside the matrix and "
          "some outside"),
    more_hints=("where answers go wrong: with a block narrower than 32 threads one warp covers several "
                "of the block's rows, so the row of a lane is its id divided by the block's width; and a "
                "warp lying wholly outside the matrix skips the body as one, without splitting",),
    rtol=0.0,
    atol=0.0,
    diagnoses=("lanes_y_fastest", "idle_warp_counted"),
    solution=basics.divergent_warps,
))
