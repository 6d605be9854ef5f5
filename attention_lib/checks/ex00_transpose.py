"""``00_transpose`` (notebook 00, warm-up): a kernel ``(a, out)`` writing out = a^T, one thread per
element of a, launched on the library's grid of TRANSPOSE_BLOCK blocks (the library's
``basics.transpose_kernel``). Its cases, limits and named mistakes are declared in the Exercise
below; ``diagnose_one_short`` (a guard that leaves out's last row or column unwritten) serves
00_tiled_transpose too.
"""

import numpy as np
from numba import cuda

from attention_lib.stages import basics
from attention_lib.stages.basics import TRANSPOSE_BLOCK
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.ex00_transpose_grid import blocks_words
from attention_lib.checks.launch import output_array, read_output, unwritten
from attention_lib.checks.result import Diagnosed
from attention_lib.checks.limits import Coalesced, MostLoads, NoSerialCopy


def _transpose_cases(block=TRANSPOSE_BLOCK):
    """(rows, cols): one element; square under one block (a copy is seen); more rows than a block's
    x covers and fewer columns than its y (a row taken from x misses rows); wide; tall; exactly one
    block; a whole block down and one column short of two across."""
    bx, by = block
    return [(1, 1), (by - 1, by - 1), (bx + 3, by - 1), (by - 3, 5 * by), (2 * bx + 1, bx + 1), (by, bx),
            (2 * by, 2 * bx - 1)]


def _run_transpose(transpose_kernel, shape, rng, launch):
    rows, cols = shape
    a = rng.standard_normal((rows, cols)).astype(np.float32)
    full, out = output_array((cols, rows), guard=TRANSPOSE_BLOCK[0] * TRANSPOSE_BLOCK[1] * (rows + cols))
    grid = basics.grid_2d(rows, cols, TRANSPOSE_BLOCK)
    launch(transpose_kernel, grid, TRANSPOSE_BLOCK, cuda.to_device(a), out)
    got = read_output(full, out)
    _diagnose_transpose(got, a, grid)
    diagnose_one_short(transpose_kernel, launch, got, a.T, TRANSPOSE_BLOCK, (TRANSPOSE_BLOCK[1] + 1, TRANSPOSE_BLOCK[0] + 1))
    return got, np.ascontiguousarray(a.T)


def _index_range(name, first, count):
    """'rows 16 to 18', 'row 16', or '' when the range first..count - 1 is empty: only indices that exist."""
    if first >= count:
        return ""
    return f"{name} {first}" if first == count - 1 else f"{name}s {first} to {count - 1}"


def _last_line_unwritten(never, wrong):
    """'row' or 'column' when the entries of out never written are exactly its last row, or its last
    column, and every wrong entry is one of them: what a guard one short leaves. Else None."""
    if not never.any() or (wrong & ~never).any():
        return None
    rows, cols = never.shape
    if rows > 1 and never[-1].all() and not never[:-1].any():
        return "row"
    if cols > 1 and never[:, -1].all() and not never[:, :-1].any():
        return "column"
    return None


def _one_short_message(never, line):
    index = never.shape[0 if line == "row" else 1] - 1
    of_a = "column" if line == "row" else "row"
    return (f"{int(never.sum())} entries of out were never written, exactly out's last {line} ({line} {index}, "
            f"a's last {of_a}): a guard that stops one short. An index is inside while it is less than the "
            "size, not the size less one")


def _probe_one_short(kernel, launch, shape, block):
    """Where one launch of `kernel` on a (rows, cols) matrix leaves out's last row or column alone
    unwritten: ('row' or 'column', never), else None. For a case whose out has one row or one column,
    where writing nothing and a guard one short look the same."""
    rows, cols = shape
    a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    full, out = output_array((cols, rows), guard=block[0] * block[1] * (rows + cols))
    try:
        launch(kernel, basics.grid_2d(rows, cols, block), block, cuda.to_device(a), out)
        got = read_output(full, out)
    except Exception:  # noqa: BLE001  (the probe only names a mistake; the case's own verdict stands)
        return None
    never = unwritten(got)
    line = _last_line_unwritten(never, got != a.T)
    return (line, never) if line else None


def diagnose_one_short(kernel, launch, got, expected, block, probe_shape):
    """Diagnosed guard_one_short when out's last row or column alone is unwritten; when out has one row
    or one column and nothing of it was written, the same asked of a launch at probe_shape."""
    never = unwritten(got)
    line = _last_line_unwritten(never, got != expected)
    if line:
        raise Diagnosed("guard_one_short", _one_short_message(never, line))
    if never.all() and min(got.shape) == 1:
        probed = _probe_one_short(kernel, launch, probe_shape, block)
        if probed:
            rows, cols = probe_shape
            raise Diagnosed("guard_one_short", (
                f"nothing of out was written; at a of {rows} rows and {cols} columns, "
                + _one_short_message(probed[1], probed[0])))


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
            missed = [_index_range("row", grid[0] * bx, rows), _index_range("column", grid[1] * by, cols)]
            raise Diagnosed("row_is_x", (
                f"{int(never.sum())} entries of out were never written: those of a's "
                f"{' and '.join(m for m in missed if m)}, exactly what a kernel taking the row from the grid's x "
                "misses: cuda.grid(2) gives (x, y), and x is the column"))
    elif rows == cols > 1 and np.array_equal(got, a):
        raise Diagnosed("not_transposed", "out equals a: element (r, c) of a must land at (c, r) of out")


register(Exercise(
    exercise_id="00_transpose",
    kind="kernel",
    run=_run_transpose,
    cases=_transpose_cases(),
    describe_case=lambda s: f"a of {s[0]} rows and {s[1]} columns ({blocks_words(TRANSPOSE_BLOCK)})",
    hint=("each thread finds its element of a from its place in the 2-D grid, and writes it where the "
          "transpose puts it; the threads of the edge blocks that fall outside a do nothing"),
    more_hints=("where answers go wrong: the grid's x is the column (the fastest-moving index), y the "
                "row, so that neighbouring threads of a warp read neighbouring elements of a row of a; "
                "and the guard compares the row with a's rows and the column with a's columns",),
    rtol=0.0,     # a transpose moves values: exactly equal
    atol=0.0,
    limits=(MostLoads("a", 1, why="one thread per element reads its own element once"),
            NoSerialCopy("a"), NoSerialCopy("out", access="store"),
            # A warp is two rows of 16 threads: two runs of 64 bytes, each within one segment
            # or across two (a row of a starts anywhere); lanes down a column touch 8 or more.
            Coalesced("a", 4)),
    diagnoses=("row_is_x", "guard_one_short", "not_transposed"),
    solution=basics.transpose_kernel,
    forbidden=(basics.transpose,),
))
