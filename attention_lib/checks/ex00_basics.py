"""Notebook 00's exercises: a first element-wise kernel with its bounds guard, the grid of a 2-D
launch, a 2-D kernel and the same through a shared tile; and deep dive 00x's: the warps of a 2-D
launch, and a prediction of what one warp's load moves.

``00_scale_add`` (warm-up): out = alpha * x + y, one thread per element (basics.scale_add_kernel);
limits: each element of x and y read once, every warp's load of them one 128-byte segment.
``00_transpose_grid``: the smallest grid of a block that covers a (rows, cols) matrix, x across the
columns (basics.grid_2d). Named mistakes: ``grid_axes_swapped``, ``grid_too_small``,
``grid_too_large``.
``00_transpose`` (warm-up): out = a^T, one thread per element of a, launched on the library's grid
(basics.transpose_kernel); limits: each element of a read once, every warp moving a and out with
its lanes side by side, a warp's load of a at most 4 segments. Named mistakes: ``row_is_x`` (the
kernel takes the row from the grid's x: part of the matrix is never written), ``guard_one_short``
(out's last row or last column never written, and nothing else wrong) and ``not_transposed`` (a copy).
``00_tiled_transpose`` (main): out = a^T through a tile in shared memory, so that a warp's stores run
along a row of out as its loads run along a row of a (basics.transpose_tiled_kernel); limits: a read
once, every warp moving a and out with its lanes side by side, a warp's load of a and store of out at
most 4 segments, at most one barrier passed by each thread. Named mistakes: ``tile_not_transposed``
(the tile written back as it was read), ``tile_not_moved`` (each tile transposed where it stands) and
``guard_one_short`` (the store's guard leaves out's last row or last column unwritten).
``00x_warp_divergence`` (deep dive 00x): which warps of a 2-D launch split at the bounds guard
(basics.divergent_warps). Named mistakes: ``lanes_y_fastest`` (a block's threads dealt out to
warps down y first) and ``idle_warp_counted`` (a warp with no thread inside counted as split).
``00x_predict_segments`` (deep dive 00x): the 128-byte segments and 32-byte sectors one warp's
strided load touches (basics.warp_load_footprint), predicted before the sanitizer counts them.
Named mistakes: ``pair_swapped``, ``elements_not_bytes``, ``span_counted``.
"""

import numpy as np
from numba import cuda

from attention_lib.stages import basics
from attention_lib.stages.basics import TILED_TRANSPOSE_BLOCK, TRANSPOSE_BLOCK, WARP_SIZE  # noqa: F401  (the notebook imports TRANSPOSE_BLOCK here)
from attention_lib.checks.cases import edges
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import output_array, read_output, unwritten
from attention_lib.checks.result import Diagnosed
from attention_lib.checks.limits import Coalesced, MostBarriers, MostLoads, NoSerialCopy
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
    kind="kernel",
    run=_run_scale_add,
    # 1: fewer threads than a block; around one and two blocks of 64: a last block with one thread
    # in use, full, or one thread short.
    cases=edges(basics.THREADS_PER_BLOCK),
    describe_case=lambda n: f"n = {n} (blocks of {basics.THREADS_PER_BLOCK})",
    hint=("one thread per element: the thread's global index comes from its block and its place in "
          "the block, and the threads of the last block that fall past the end do nothing"),
    more_hints=("where answers go wrong: the thread's place in its block alone repeats in every block "
                "(add the threads of the blocks before it), and the guard compares the index with the "
                "length of the vector, which the last block overshoots",),
    limits=(MostLoads("x", 1, why="one thread per element reads its own element once"),
            MostLoads("y", 1, why="one thread per element reads its own element once"),
            Coalesced("x", 1), Coalesced("y", 1)),
    solution=basics.scale_add_kernel,
    forbidden=(basics.scale_add,),
))


# --- The grid of a 2-D launch ------------------------------------------------------------------

def _blocks_words(block):
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
    describe_case=lambda c: f"a matrix of {c[0]} rows and {c[1]} columns in {_blocks_words(c[2])}",
    hint=("a grid counts blocks in each direction: enough blocks of the block's width to cover the "
          "columns, and enough of its height to cover the rows"),
    more_hints=("where answers go wrong: CUDA's x comes first and runs across the columns (the "
                "fastest-moving index), y down the rows; and a count of blocks rounds up, so that a "
                "partly used block at the edge still gets launched",),
    rtol=0.0,
    atol=0.0,
    diagnoses=("grid_axes_swapped", "grid_too_small", "grid_too_large"),
    solution=basics.grid_2d,
))


# --- The warm-up: a 2-D kernel -------------------------------------------------------------------

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
    _diagnose_one_short(transpose_kernel, launch, got, a.T, TRANSPOSE_BLOCK, (TRANSPOSE_BLOCK[1] + 1, TRANSPOSE_BLOCK[0] + 1))
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


def _diagnose_one_short(kernel, launch, got, expected, block, probe_shape):
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
    describe_case=lambda s: f"a of {s[0]} rows and {s[1]} columns ({_blocks_words(TRANSPOSE_BLOCK)})",
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


# --- The main exercise: the transpose through shared memory ------------------------------------

def _tiled_cases(tile=basics.TRANSPOSE_TILE):
    """(rows, cols): one tile, where a tile written back untransposed shows; four tiles, where a tile
    transposed in place shows; a tile one short and one past each way (each guard tested alone); one
    element; several tiles with partial edges, wide and tall; a thin matrix."""
    return [(tile, tile), (2 * tile, 2 * tile), (tile - 1, tile + 1), (tile + 1, tile - 1), (1, 1),
            (2 * tile + 1, tile + 4), (tile + 4, 3 * tile - 1), (40, 3)]


def _tile_mistakes(a):
    """{code: (out, written)}: what the two usual tile mistakes write, out as (cols, rows) and written
    the entries they reach. Element (r, c) of a lies at (i, j) of its tile, whose corner is (r0, c0)."""
    rows, cols = a.shape
    tile = basics.TRANSPOSE_TILE
    r, c = np.indices(a.shape)
    r0, c0, i, j = r // tile * tile, c // tile * tile, r % tile, c % tile
    found = {}
    for code, (out_r, out_c) in {"tile_not_transposed": (c0 + i, r0 + j), "tile_not_moved": (r0 + j, c0 + i)}.items():
        inside = (out_r < cols) & (out_c < rows)
        out, written = np.zeros((cols, rows), np.float32), np.zeros((cols, rows), bool)
        out[out_r[inside], out_c[inside]] = a[inside]
        written[out_r[inside], out_c[inside]] = True
        found[code] = out, written
    return found


def _run_tiled_transpose(kernel, shape, rng, launch):
    rows, cols = shape
    a = rng.standard_normal((rows, cols)).astype(np.float32)
    expected = np.ascontiguousarray(a.T)
    full, out = output_array((cols, rows), guard=TILED_TRANSPOSE_BLOCK[0] * TILED_TRANSPOSE_BLOCK[1] * (rows + cols))
    launch(kernel, basics.grid_2d(rows, cols, TILED_TRANSPOSE_BLOCK), TILED_TRANSPOSE_BLOCK, cuda.to_device(a), out)
    got = read_output(full, out)
    wrong_entries = got != expected
    if wrong_entries.any():
        for code, (wrong, written) in _tile_mistakes(a).items():
            # The mistake explains the answer: it differs from the transpose somewhere it writes, the answer
            # holds what it writes there, and every wrong entry of the answer is one it writes.
            explains = (wrong[written] != expected[written]).any() and np.array_equal(got[written], wrong[written])
            if explains and not (wrong_entries & ~written).any():
                raise Diagnosed(code, {
                    "tile_not_transposed": "each tile of a landed in the right place of out, but untransposed: a "
                                           "thread must write back the tile's element across the diagonal from the "
                                           "one it loaded (its x and y exchanged), not its own",
                    "tile_not_moved": "each tile of a was transposed where it stands: block (x, y) must write its "
                                      "tile at block (y, x) of out, so the block's corner changes too, not only "
                                      "the thread's place in the tile"}[code])
        tile = basics.TRANSPOSE_TILE
        _diagnose_one_short(kernel, launch, got, expected, TILED_TRANSPOSE_BLOCK, (tile + 1, tile - 1))
    return got, expected


register(Exercise(
    exercise_id="00_tiled_transpose",
    kind="kernel",
    run=_run_tiled_transpose,
    cases=_tiled_cases(),
    describe_case=lambda s: (f"a of {s[0]} rows and {s[1]} columns (blocks of {TILED_TRANSPOSE_BLOCK[0]} x "
                             f"{TILED_TRANSPOSE_BLOCK[1]} threads)"),
    hint=("a block can share what it reads: if the whole block first copies its square of a into shared "
          "memory, a thread may then write out any element of that square, not only the one it read; "
          "pick for each thread the one that makes a warp write along a row of out"),
    more_hints=("the plan: every thread copies one element of the block's square of a into a shared tile, "
                "threads of a warp side by side along a row of a; the block waits until the tile is full; "
                "then every thread writes one element of out's square, threads of a warp side by side along "
                "a row of out. It takes from the tile not the slot it filled but the one mirrored across "
                "the diagonal: the tile's row is the thread's x, its column the thread's y. The square of "
                "out sits where the transpose puts the square of a: the block's x and y exchange roles. "
                "Those reads walk down a column of the tile: with rows of 16 words its 16 words fall in 2 "
                "banks, served in 8 rounds; a row one word longer (TRANSPOSE_TILE_PADDED, 17, since a "
                "shared array's shape must be a constant) puts them in 16",
                "where answers go wrong: the two guards differ (the load is bounded by a's rows and columns, "
                "the store by out's), and the barrier must be reached by every thread of the block, so it "
                "stands outside both guards"),
    rtol=0.0,     # a transpose moves values: exactly equal
    atol=0.0,
    limits=(MostLoads("a", 1, why="each element of a is read once, by one thread"),
            NoSerialCopy("a"), NoSerialCopy("out", access="store"),
            Coalesced("a", 4),
            # A warp is two rows of 16 threads: two runs of 64 bytes, in two to four segments; lanes down
            # a column of out touch one segment each, 8 or 16 for a warp.
            Coalesced("out", 4, access="store",
                      why="neighbouring threads of a warp should {verb} neighbouring addresses; a warp that "
                          "writes down a column of out touches a segment a lane. Go through the shared tile "
                          "so that the block writes rows of out"),
            MostBarriers(1, why="one barrier between filling the tile and reading it")),
    diagnoses=("tile_not_transposed", "tile_not_moved", "guard_one_short"),
    solution=basics.transpose_tiled_kernel,
    forbidden=(basics.transpose,),
))


# --- Deep dive 00x: which warps split at the guard --------------------------------------------

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


# --- Deep dive 00x: predict, then measure what one warp's load moves ---------------------------

def _footprints(stride, segment, sector):
    """(segments, sectors) of lane l reading element l * stride, with segments and sectors of the
    given sizes in the same unit as the addresses."""
    addresses = np.arange(WARP_SIZE) * stride
    return len(set(addresses // segment)), len(set(addresses // sector))


def _span(stride):
    """Every segment and sector from the first address to the last, touched or not."""
    last = (WARP_SIZE - 1) * stride * basics.FLOAT32_BYTES
    return last // basics.SEGMENT_BYTES + 1, last // basics.SECTOR_BYTES + 1


def _run_footprint(warp_load_footprint, stride, rng, launch):
    got = warp_load_footprint(stride)
    expected = basics.warp_load_footprint(stride)
    try:
        got = tuple(int(g) if float(g).is_integer() else float(g) for g in got)
    except (TypeError, ValueError):
        raise Diagnosed("wrong_shape", f"the answer is {got!r}, expected a pair (segments, sectors)")
    if len(got) == 2 and got != expected:
        in_elements = _footprints(stride, basics.SEGMENT_BYTES, basics.SECTOR_BYTES)
        if got == expected[::-1]:
            raise Diagnosed("pair_swapped", (
                f"the answer is {got}, expected {expected}: the pair is (segments, sectors), and a 128-byte "
                "segment holds four 32-byte sectors, so sectors are never fewer"))
        if got == in_elements:
            raise Diagnosed("elements_not_bytes", (
                f"the answer is {got}, expected {expected}: segments and sectors are counted in bytes, and "
                "a float32 takes 4 of them (a segment holds 32 float32, a sector 8)"))
        if got == _span(stride):
            raise Diagnosed("span_counted", (
                f"the answer is {got}, expected {expected}: it counts every segment from the first address "
                "to the last, but only those a lane reads are moved (32 lanes touch at most 32)"))
        raise Diagnosed("wrong_values", f"the answer (segments, sectors) is {got}, expected {expected}")
    return np.asarray(got, np.float64), np.asarray(expected, np.float64)


register(Exercise(
    exercise_id="00x_predict_segments",
    kind="function",
    run=_run_footprint,
    # Neighbours; one number for all (a broadcast); 2, 3, 8: a few lanes a sector or a segment;
    # 16, 31, 32, 33: about one segment a lane; 64, 100: lanes far apart.
    cases=[1, 0, 2, 3, 8, 16, 31, 32, 33, 64, 100],
    describe_case=lambda s: f"stride {s} (lane l reads float32 element {s} * l)",
    hint=("write down the byte address each of the 32 lanes reads, and see which 128-byte segment and "
          "which 32-byte sector it falls in: the warp's load moves each one touched, once"),
    more_hints=("where answers go wrong: addresses are in bytes (a float32 takes 4), several lanes that "
                "fall in one segment share it, and segments between the lanes that no lane reads are not "
                "moved",),
    rtol=0.0,
    atol=0.0,
    diagnoses=("pair_swapped", "elements_not_bytes", "span_counted"),
    solution=basics.warp_load_footprint,
))
