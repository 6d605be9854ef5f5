"""Notebook 01's exercises: the projection x @ w (+ b), first one thread per output, then tiled.

``01_projection_naive`` (warm-up): projection_kernel_v1's signature ``(x, w, b, out)``, one
thread per output element, written before any kernel of the stage is shown. Named mistakes:
``w_transposed`` (w[col, k] for w[k, col], seen on a square w, where it stays in bounds),
``bias_missing`` and ``grid_axes_swapped`` (the row taken from the grid's x).

``01_tiled_matmul`` (main): the device function ``tile_matmul(x, w, row, col)`` of
projection_kernel_v2, its two shared tiles declared: the student writes the walk along d_model
(two guarded tile loads with a 0 past the edges, two barriers, the TILE multiply-adds). The check
runs it inside v2's kernel, every case traced once: races (``race``), a barrier some threads skip
(``divergent_barrier``), a tile slot read that no thread wrote in its step (``stale_tile``: the
value of an earlier step, or on a GPU whatever was there), and, once the values are right, the
reads per element of x and w against a tiled kernel's ceiling (``no_reuse``).
"""

import warnings
from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.measure import sanitizer
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import projection
from attention_lib.checks.engine import (Diagnosed, Exercise, host_output, output_array, read_output, register,
                                         traced_launch, unwritten)


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
    title="out = x @ w (+ b), one thread per output element",
    kind="kernel",
    run=_run_projection,
    # First a square w (as W_Q for all heads at once), so that w[col, k] in place of w[k, col]
    # stays in bounds and is named; then sizes that are not multiples of the 16 x 16 block,
    # one row only, several blocks down and across, with and without bias.
    # (33, 17, 20) second: a kernel taking the row from the grid's x misses row 32 there, and
    # nothing a kernel ignoring blockIdx would also miss.
    cases=[Case(1, 5, 5, False), Case(33, 17, 20, False), Case(7, 24, 20, True), Case(18, 9, 35, True)],
    hint=("one thread per output element: the 2-D grid gives the thread its place in out, and the "
          "thread computes one dot product, of a row of x with a column of w"),
    more_hints=("where answers go wrong: the grid's x axis runs across the columns of out; w is "
                "(d_model, d_out), so the summed index picks w's row; threads of the edge blocks "
                "that fall outside out must do nothing; and the bias, when b is not empty",),
    # float32 sums of up to 24 products of standard normals, against a float64 reference.
    rtol=1e-4,
    atol=1e-4,
    diagnose=_diagnose,
    diagnoses=("w_transposed", "bias_missing", "grid_axes_swapped"),
    solution=projection.projection_kernel_v1,
    forbidden=(projection.tile_matmul, projection.project),
))


# --- The main exercise: the tiled walk along d_model -----------------------------------------

def read_ceilings(T, d_out, tile=projection.TILE):
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


def stale_read(traced):
    """The first read of a shared-memory slot that no thread of its block wrote since the slot was
    read in an earlier barrier interval (or ever), as a sentence; None when every read sees a
    value written for it.

    In a tiled loop every step refills the tiles: a slot read at step s must have been written at
    step s. One left alone (no 0 written past an edge) still holds step s - 1's number, and on a
    GPU, at the first step, whatever the memory held before. The trace is in execution order, and
    two threads of a block touching one slot in one interval are a race, found before this.
    """
    for name, target in traced.launch.targets.items():
        if target.space != sanitizer.SHARED:
            continue
        last_write, last_read = {}, {}              # (block, element) -> barrier interval
        for element, kind, (block, thread), interval, _, _ in target.trace:
            slot = (block, element)
            if kind != sanitizer.LOAD:
                last_write[slot] = interval
                continue
            written, read = last_write.get(slot), last_read.get(slot)
            if written is None or (read is not None and written < read < interval):
                index = [int(i) for i in np.unravel_index(element, target.shape)]
                when = "no thread ever wrote" if written is None else "no thread wrote again after its last step"
                return (f"thread {thread} of block {block} read {name}{index}, which {when}: it holds an old "
                        "number (on a GPU, at the first step, whatever the memory held). Every step must "
                        "write every slot of both tiles, a 0 where the element lies past an edge")
            last_read[slot] = interval
    return None


def _run_tiled(tile_matmul, case, rng, launch):
    x, w, b = _problem(case, rng)
    got = host_output((case.T, case.d_out))
    grid, block = projection.projection_grid(case.T, case.d_out)
    # One traced run answers everything: races (RaceFound), out-of-bounds indices, barriers some
    # threads skip (the simulator's BarrierError), stale tile slots and the reads per element.
    with warnings.catch_warnings():      # a race or a stale tile computes with whatever shared memory held
        warnings.simplefilter("ignore", RuntimeWarning)       # (overflow: on a GPU, silently inf)
        traced = traced_launch(tiled_kernel(tile_matmul), grid, block, x, w, b, got)
    stale = stale_read(traced)
    if stale:
        raise Diagnosed("stale_tile", stale)
    expected = reference.project(x, w, b if case.bias else None)
    if np.allclose(got, expected, rtol=1e-4, atol=1e-4):
        x_ceiling, w_ceiling = read_ceilings(case.T, case.d_out)
        x_reads, w_reads = int(traced.loads("x").max()), int(traced.loads("w").max())
        if x_reads > x_ceiling or w_reads > w_ceiling:
            raise Diagnosed("no_reuse", (
                f"the values are right, but an element of x was read up to {x_reads} times (a tiled kernel: "
                f"{x_ceiling}) and one of w up to {w_reads} times (tiled: {w_ceiling}); copy each tile into "
                "shared memory once and let the whole block read it from there"))
    return got, expected


TILED_CASES = [Case(1, 5, 3, False), Case(7, 24, 20, True), Case(18, 17, 33, False), Case(33, 40, 17, True)]

register(Exercise(
    exercise_id="01_tiled_matmul",
    title="tile_matmul(x, w, row, col): the tiled walk along d_model, two guarded tile loads, two barriers",
    kind="device function",
    run=_run_tiled,
    # (1, 5, 3): one row, a d_model shorter than a tile; (7, 24, 20, bias): two steps along
    # d_model, the second half-empty, two blocks across; (18, 17, 33): two blocks down and three
    # across, the last of each partly used; (33, 40, 17, bias): three blocks down, three steps.
    cases=TILED_CASES,
    hint=("each step along d_model: the block copies one TILE x TILE piece of x and one of w into "
          "shared memory, one element per thread, waits, multiplies the pieces, and waits again"),
    more_hints=(
        "where answers go wrong: a thread whose element lies past an edge of x or w must still write its "
        "slot of the tile (with a value that adds nothing), or the slot keeps an old number",
        "and the barriers: every thread of the block reaches both, also those whose output lies outside "
        "out; without the second one a fast thread overwrites a tile with the next step's piece while "
        "slower threads still read the old one (the race finder will say so)"),
    rtol=1e-4,     # float32 sums of up to 40 products of standard normals, against float64
    atol=1e-4,
    diagnoses=("no_reuse",),
    solution=(projection.tile_matmul, projection.projection_kernel_v2),
    forbidden=(projection.projection_kernel_v1,),
))
