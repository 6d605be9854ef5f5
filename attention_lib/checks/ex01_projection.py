"""Notebook 01's exercises and deep dive 01x's: ``01_projection_naive`` (warm-up), a kernel
``(x, w, b, out)`` computing the projection x @ w (+ b), one thread per output element
(``projection.projection_kernel_v1``); ``01_tiled_matmul`` (main), the device function
``tile_matmul(x, w, row, col)``, shared tiles and all, walking d_model a tile at a time inside
projection_kernel_v2 (``projection.tile_matmul``); ``01x_multiply_wide_tiles``, the device function
adding one step's products to a thread's 2 x 2 sums inside projection_kernel_v3
(``projection.multiply_wide_tiles``). Their cases, limits and named mistakes are declared in the
Exercises below.
"""

from typing import NamedTuple

import numpy as np
from numba import cuda, float32

from attention_lib import reference
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import projection
from attention_lib.stages.projection import TILE, WIDE_TILE, load_wide_tiles, store_output
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import host_output, output_array, read_output, traced_launch, unwritten
from attention_lib.checks.result import Diagnosed
from attention_lib.checks.limits import (Coalesced, MostBarriers, MostLoads, NoLocalMemory, NoSerialCopy, RefilledTiles,
                                         SharedLoadsPerThread, StoredOnce)


class Case(NamedTuple):
    """One size tried: x (T, d_model), w (d_model, d_out), with or without a bias b (d_out,)."""

    T: int
    d_model: int
    d_out: int
    bias: bool

    def __str__(self):
        return f"(T {self.T}, d_model {self.d_model}, d_out {self.d_out}{', bias' if self.bias else ''})"


def _problem(case, rng):
    x = rng.standard_normal((case.T, case.d_model)).astype(np.float32)
    w = rng.standard_normal((case.d_model, case.d_out)).astype(np.float32)
    b = rng.standard_normal(case.d_out).astype(np.float32) if case.bias else np.zeros(0, np.float32)
    return x, w, b


def _output(case):
    # An output with a guard zone behind it: one tile of rows (and a column) more than the last
    # block can reach, so a write past the end lands there, also on a real GPU.
    return output_array((case.T, case.d_out), guard=projection.TILE * (case.d_out + 1))


def _run_projection(kernel, case, rng, launch):
    x, w, b = _problem(case, rng)
    full, out = _output(case)
    # The library's grid and blocks (projection.launch_projection), through the judge's launch
    # so that on the simulator an out-of-bounds index is reported in one line.
    grid, block = projection.projection_grid(case.T, case.d_out)
    launch(kernel, grid, block, cuda.to_device(x), cuda.to_device(w), cuda.to_device(b), out)
    got = read_output(full, out)
    _diagnose_grid(got, grid, block)
    return got, reference.project(x, w, b if case.bias else None), x, w, b


def _diagnose_grid(got, grid, block):
    """grid_axes_swapped when exactly the outputs a kernel taking the row from the grid's x reaches
    were written: rows below the x extent and columns below the y extent of the launch."""
    never = unwritten(got)
    if never.any():
        rows, cols = np.indices(got.shape)
        reached = (rows < grid[0] * block[0]) & (cols < grid[1] * block[1])
        first_block = (rows < block[1]) & (cols < block[0])     # a kernel ignoring blockIdx reaches these
        if np.array_equal(~never, reached) and not np.array_equal(reached, first_block):
            raise Diagnosed("grid_axes_swapped", (
                f"{int(never.sum())} of {got.size} outputs were never written, exactly those a kernel "
                "taking the row from the grid's x misses: cuda.grid(2) gives (x, y), and x runs across "
                "the columns of out"))


def _naive_cases(tile=TILE):
    """(T, d_model, d_out, bias): first a square w (as W_Q for all heads at once), so that w[col, k]
    in place of w[k, col] stays in bounds and is named; then (33, 17, 20), where a kernel taking the
    row from the grid's x misses row 32 and nothing a kernel ignoring blockIdx would also miss; then
    the last block of rows and of columns holding 1, 2, 3, 4, 7, 15 or all 16 of its threads' outputs,
    with and without bias."""
    return [(1, 5, 5, False), (2 * tile + 1, tile + 1, tile + 4, False), (7, 24, 20, True),
            (tile + 2, 9, 2 * tile + 3, True), (tile, tile, tile, True), (tile - 1, 2 * tile, 2 * tile - 1, False)]


def _diagnose(got, expected, x, w, b):
    """Name the mistake when `got` equals a known wrong formula; None otherwise."""
    bias = b if b.shape[0] else 0.0
    if w.shape[0] == w.shape[1] and np.allclose(got, x.astype(np.float64) @ w.T + bias, rtol=1e-4, atol=1e-4):
        return "w_transposed", ("the result is x @ w^T: w is (d_model, d_out), so the index that runs over "
                                "d_model picks w's row and the output's column picks w's column")
    if b.shape[0] and np.allclose(got, reference.project(x, w), rtol=1e-4, atol=1e-4):
        return "bias_missing", "the values are x @ w without the bias: add b[col] when b is not empty"
    return None


register(Exercise(
    exercise_id="01_projection_naive",
    kind="kernel",
    run=_run_projection,
    cases=[Case(*c) for c in _naive_cases()],
    hint=("one thread per output element: the 2-D grid gives the thread its place in out, and the "
          "thread computes one dot product, of a row of x with a column of w"),
    more_hints=("where answers go wrong: the grid's x axis runs across the columns of out; w is "
                "(d_model, d_out), so the summed index picks w's row; threads of the edge blocks "
                "that fall outside out must do nothing; the bias, when b is not empty; and the sum, which "
                "builds up in a local variable and reaches out once, when it is done",),
    # float32 sums of up to 32 products of standard normals, against a float64 reference.
    rtol=1e-4,
    atol=1e-4,
    # A warp is two rows of 16 threads of out: x's two rows, one number each (two segments at most);
    # w's 16 neighbouring columns of one row, 64 bytes (one segment, or two across a boundary).
    # A thread owns one output, whose value is known once its whole sum is: one store of it is enough,
    # where a sum kept in out takes d_model read-modify-writes of main memory.
    limits=(Coalesced("x", 2), Coalesced("w", 2),
            StoredOnce("out", why="keep the running sum in a local variable and store the output once, when its "
                                  "sum (and bias) is done: a sum added up in out costs a main-memory store per "
                                  "product")),
    diagnose=_diagnose,
    diagnoses=("w_transposed", "bias_missing", "grid_axes_swapped", "output_rewritten"),
    solution=projection.projection_kernel_v1,
    forbidden=(projection.tile_matmul, projection.project),
))


# --- The main exercise: the tiled walk along d_model -----------------------------------------

def read_ceilings(T, d_out, tile=TILE):
    """The most reads of one element of x and of w that a TILE x TILE tiled projection makes.

    Each block of out reads its strip of x (TILE rows) and its strip of w (TILE columns) once:
    an element of x is read by the ceil(d_out / TILE) blocks of its row of blocks, an element
    of w by the ceil(T / TILE) blocks of its column.
    """
    return ceil_div(d_out, tile), ceil_div(T, tile)


_KERNELS = {}


def tiled_kernel(tile_matmul):
    """projection_kernel_v2 around the device function `tile_matmul(x, w, row, col)`; one kernel per
    function. Same arguments, grid and blocks as v2."""
    if tile_matmul not in _KERNELS:
        @cuda.jit
        def kernel(x, w, b, out):
            col, row = cuda.grid(2)
            acc = tile_matmul(x, w, row, col)       # every thread of the block: it has barriers
            if row < out.shape[0] and col < out.shape[1]:
                if b.shape[0] > 0:
                    acc += b[col]
                out[row, col] = acc
        _KERNELS[tile_matmul] = kernel
    return _KERNELS[tile_matmul]


def _run_tiled(tile_matmul, case, rng, launch):
    x, w, b = _problem(case, rng)
    got = host_output((case.T, case.d_out))
    grid, block = projection.projection_grid(case.T, case.d_out)
    # One traced run answers everything: races (RaceFound), out-of-bounds indices, barriers some
    # threads skip (the simulator's BarrierError), and the limits, measured on its trace.
    traced_launch(tiled_kernel(tile_matmul), grid, block, x, w, b, got)     # a device function: traced here
    return got, reference.project(x, w, b if case.bias else None)


def _tiled_cases(tile=TILE):
    """(T, d_model, d_out, bias): one row and a d_model shorter than a tile; two steps along d_model,
    the second half-empty, two blocks across; two blocks down and three across, the last of each
    partly used; three blocks down and three steps; then d_model a whole number of tiles (a walk
    must stop there: one step more only adds zeros), one block exactly, and one row past a block."""
    return [Case(1, 5, 3, False), Case(7, 24, 20, True), Case(tile + 2, tile + 1, 2 * tile + 1, False),
            Case(2 * tile + 1, 40, tile + 1, True), Case(tile, tile, tile, True),
            Case(tile + 1, 2 * tile, tile - 1, False)]


TILED_CASES = _tiled_cases()

register(Exercise(
    exercise_id="01_tiled_matmul",
    kind="device function",
    run=_run_tiled,
    cases=TILED_CASES,
    hint=("what can a block share? Its 16 rows of out all need the same rows of x, its 16 columns the same "
          "columns of w: walk along d_model one tile-wide step at a time, the block copying one piece of "
          "each into shared memory, one element per thread, and every thread multiplying from there"),
    more_hints=(
        "where answers go wrong, the plan: two shared tiles of TILE by TILE; per step, each thread copies "
        "one element of the x piece (its own row, the step's column under its x) and one of the w piece "
        "(the step's row under its y, its own column), a 0 where the element lies past an edge of x or w; "
        "then a barrier, so that both tiles are complete; then TILE multiply-adds along its row of the x "
        "tile and its column of the w tile; then a second barrier, so that no thread overwrites a tile "
        "another still reads",
        "and the barriers: every thread of the block reaches both, also those whose output lies outside "
        "out (they copy elements their neighbours need); a barrier inside an if that some threads skip "
        "hangs the block on a GPU or lets it run on with wrong values"),
    rtol=1e-4,     # float32 sums of up to 40 products of standard normals, against float64
    atol=1e-4,
    limits=(RefilledTiles(),
            MostLoads("x", lambda case: read_ceilings(case.T, case.d_out)[0],
                      why="copy each tile into shared memory once and let the whole block read it from there"),
            MostLoads("w", lambda case: read_ceilings(case.T, case.d_out)[1],
                      why="copy each tile into shared memory once and let the whole block read it from there"),
            # A warp is two rows of 16 threads: two runs of 16 neighbours (64 bytes) of x or of w,
            # each within one segment or across two.
            Coalesced("x", 4), Coalesced("w", 4), NoSerialCopy("x"), NoSerialCopy("w"),
            MostBarriers(lambda case: 2 * ceil_div(case.d_model, TILE),
                         why="two per step along d_model, and ceil(d_model / TILE) steps"),),
    diagnoses=("no_reuse", "uncoalesced", "extra_barriers"),
    solution=(projection.tile_matmul, projection.projection_kernel_v2),
    forbidden=(projection.projection_kernel_v1,),
))


# --- Deep dive 01x: a 2 x 2 micro-tile in registers --------------------------------------------

_WIDE_KERNELS = {}


def wide_kernel(multiply_wide_tiles):
    """projection_kernel_v3 around the device function `multiply_wide_tiles(x_tile, w_tile, acc00,
    acc01, acc10, acc11)`; one kernel per function. Same arguments, grid and blocks as v3."""
    if multiply_wide_tiles not in _WIDE_KERNELS:
        @cuda.jit
        def kernel(x, w, b, out):
            x_tile = cuda.shared.array((WIDE_TILE, TILE), float32)
            w_tile = cuda.shared.array((TILE, WIDE_TILE), float32)
            row0 = cuda.blockIdx.y * WIDE_TILE + cuda.threadIdx.y
            col0 = cuda.blockIdx.x * WIDE_TILE + cuda.threadIdx.x
            acc00 = acc01 = acc10 = acc11 = float32(0.0)
            for start in range(0, x.shape[1], TILE):
                load_wide_tiles(x, w, x_tile, w_tile, start, row0, col0)
                cuda.syncthreads()
                acc00, acc01, acc10, acc11 = multiply_wide_tiles(x_tile, w_tile, acc00, acc01, acc10, acc11)
                cuda.syncthreads()
            store_output(out, b, row0, col0, acc00)
            store_output(out, b, row0, col0 + TILE, acc01)
            store_output(out, b, row0 + TILE, col0, acc10)
            store_output(out, b, row0 + TILE, col0 + TILE, acc11)
        _WIDE_KERNELS[multiply_wide_tiles] = kernel
    return _WIDE_KERNELS[multiply_wide_tiles]


def _run_wide(multiply_wide_tiles, case, rng, launch):
    x, w, b = _problem(case, rng)
    got = host_output((case.T, case.d_out))
    grid, block = projection.projection_grid_v3(case.T, case.d_out)
    traced_launch(wide_kernel(multiply_wide_tiles), grid, block, x, w, b, got)
    return got, reference.project(x, w, b if case.bias else None)


def shared_reads_ceiling(case, per_k=2 * projection.MICRO):
    """The most shared reads a thread of v3 makes: per step of k, one number of each of its two rows of
    x's tile and of its two columns of w's tile, TILE values of k a step."""
    return per_k * TILE * ceil_div(case.d_model, TILE)


def _wide_cases(tile=TILE, wide=WIDE_TILE):
    """(T, d_model, d_out, bias): one output; one row and one column past a block's 32 x 32 tile (its
    second rows and columns partly used) with two steps of k; a whole tile of rows, three blocks across;
    a d_model one short of a step."""
    return [Case(1, 5, 3, False), Case(wide + 1, tile + 1, wide - 1, False), Case(wide, 2 * tile, wide + 1, True),
            Case(tile + 3, tile - 1, 2 * wide + 5, True)]


register(Exercise(
    exercise_id="01x_multiply_wide_tiles",
    kind="device function",
    run=_run_wide,
    cases=_wide_cases(),
    hint=("per value of k, the thread's two outputs of a row share one number of x, and its two outputs "
          "of a column share one number of w: four numbers from shared memory feed four multiply-adds"),
    more_hints=("where answers go wrong, the plan: for each k of the step, read the two numbers of x (rows "
                "ty and ty plus TILE of x's tile) and the two of w (columns tx and tx plus TILE of w's tile) "
                "into local variables once, then add the four products to the four sums; a local array "
                "indexed by a loop variable may land in local memory, four named variables do not",),
    rtol=1e-4,
    atol=1e-4,
    limits=(SharedLoadsPerThread(shared_reads_ceiling, code="no_register_reuse",
                                 why="read each number of a tile once per k into a register, and use it for both "
                                     "of its products"),
            NoLocalMemory()),
    diagnoses=("no_register_reuse",),
    solution=projection.multiply_wide_tiles,
))
