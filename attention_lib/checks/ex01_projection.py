"""Notebook 01's exercises: the projection x @ w (+ b), first one thread per output, then tiled.

``01_projection_naive`` (warm-up): projection_kernel_v1's signature ``(x, w, b, out)``, one
thread per output element. Named mistakes: ``w_transposed`` (w[col, k] for w[k, col], seen
on a square w, where it stays in bounds) and ``bias_missing``.

``01_tiled_matmul`` (main): the same signature and launch as projection_kernel_v2; the student
writes the body of the loop over tiles (two guarded tile loads, two barriers, the TILE
multiply-adds). Every case runs under the race finder; the last one also under a read-count
ceiling: each element of x may be read at most ceil(d_out / TILE) times and each element of
w at most ceil(T / TILE) times, so a correct but untiled answer gets ``no_reuse``.
"""

from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.measure import sanitizer
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import projection
from attention_lib.checks.engine import Diagnosed, Exercise, output_array, read_output, register


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


def _run_projection(kernel, case, rng, launch):
    x, w, b = _problem(case, rng)
    # An output with a guard zone behind it: one tile of rows (and a column) more than the last
    # block can reach, so a write past the end lands there, also on a real GPU.
    full, out = output_array((case.T, case.d_out), guard=projection.TILE * (case.d_out + 1))
    # The library's grid and blocks (projection.launch_projection), through the judge's launch
    # so that on the simulator an out-of-bounds index is reported in one line.
    grid, block = projection.projection_grid(case.T, case.d_out)
    launch(kernel, grid, block, cuda.to_device(x), cuda.to_device(w), cuda.to_device(b), out)
    return read_output(full, out), reference.project(x, w, b if case.bias else None), x, w, b


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
    cases=[Case(1, 5, 5, False), Case(7, 24, 20, True), Case(33, 17, 20, False), Case(18, 9, 35, True)],
    hint=("one thread per output element: the 2-D grid gives the thread its place in out, and the "
          "thread computes one dot product, of a row of x with a column of w"),
    more_hints=("where it goes wrong: the grid's x axis runs across the columns of out; w is "
                "(d_model, d_out), so the summed index picks w's row; threads of the edge blocks "
                "that fall outside out must do nothing; and the bias, when b is not empty",),
    # float32 sums of up to 24 products of standard normals, against a float64 reference.
    rtol=1e-4,
    atol=1e-4,
    diagnose=_diagnose,
    diagnoses=("w_transposed", "bias_missing"),
))


def read_ceilings(T, d_out, tile=projection.TILE):
    """The most reads of one element of x and of w that a TILE x TILE tiled projection makes.

    Each block of out reads its strip of x (TILE rows) and its strip of w (TILE columns) once:
    an element of x is read by the ceil(d_out / TILE) blocks of its row of blocks, an element
    of w by the ceil(T / TILE) blocks of its column.
    """
    return ceil_div(d_out, tile), ceil_div(T, tile)


def _run_tiled(kernel, case, rng, launch):
    got, expected, x, w, b = _run_projection(kernel, case, rng, launch)
    if case is TILED_CASES[-1] and np.allclose(got, expected, rtol=1e-4, atol=1e-4):
        # Right values at the largest size: now count the reads, once, on the simulator.
        grid, block = projection.projection_grid(case.T, case.d_out)
        report = sanitizer.count_memory(kernel, grid, block, x, w, b, np.zeros((case.T, case.d_out), np.float32))
        x_ceiling, w_ceiling = read_ceilings(case.T, case.d_out)
        x_reads, w_reads = int(report.loads("x").max()), int(report.loads("w").max())
        if x_reads > x_ceiling or w_reads > w_ceiling:
            raise Diagnosed("no_reuse", (
                f"the values are right, but an element of x was read up to {x_reads} times (a tiled kernel: "
                f"{x_ceiling}) and one of w up to {w_reads} times (tiled: {w_ceiling}); copy each tile into "
                "shared memory once and let the whole block read it from there"))
    return got, expected


TILED_CASES = [Case(1, 5, 3, False), Case(7, 24, 20, True), Case(18, 17, 33, False)]

register(Exercise(
    exercise_id="01_tiled_matmul",
    title="the tiled projection's loop body: two guarded tile loads, two barriers, TILE multiply-adds",
    kind="kernel",
    run=_run_tiled,
    # (1, 5, 3): one row, a d_model shorter than a tile; (7, 24, 20, bias): two steps along
    # d_model, the second half-empty, two blocks across; (18, 17, 33): two blocks down and three
    # across, the last of each partly used, and the read count.
    cases=TILED_CASES,
    hint=("each step along d_model: the block copies one TILE x TILE piece of x and one of w into "
          "shared memory, one element per thread, waits, multiplies the pieces, and waits again"),
    more_hints=(
        "where it goes wrong: a thread whose element lies past an edge of x or w must still write its "
        "slot of the tile (with a value that adds nothing), or old numbers stay in it",
        "and the second barrier: without it a fast thread overwrites a tile with the next step's piece "
        "while slower threads still read the old one (the race finder will say so)"),
    rtol=1e-4,     # float32 sums of up to 24 products of standard normals, against float64
    atol=1e-4,
    diagnoses=("no_reuse",),
))
