"""Notebook 01's exercise: the projection x @ w (+ b) with one thread per output element."""

from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.stages import projection
from attention_lib.checks.engine import Exercise, assert_guard_intact, guarded_output, launch, register


class Case(NamedTuple):
    """One size tried: x (T, d_model), w (d_model, d_out), with or without a bias b (d_out,)."""

    T: int
    d_model: int
    d_out: int
    bias: bool

    def __str__(self):
        return f"(T {self.T}, d_model {self.d_model}, d_out {self.d_out}{', bias' if self.bias else ''})"


def _run_projection(kernel, case, rng):
    x = rng.standard_normal((case.T, case.d_model)).astype(np.float32)
    w = rng.standard_normal((case.d_model, case.d_out)).astype(np.float32)
    b = rng.standard_normal(case.d_out).astype(np.float32) if case.bias else np.zeros(0, np.float32)
    n = case.T * case.d_out
    # NaN-filled output with a guard zone behind it: one tile of rows (and a column) more than
    # the last block can reach, so a write past the end lands there, also on a real GPU.
    full, flat = guarded_output(n, guard=projection.TILE * (case.d_out + 1))
    out = flat.reshape(case.T, case.d_out)                      # (T, d_out) view of the first n
    # The library's grid and blocks (projection.launch_projection), through the engine's launch
    # so that on the simulator an out-of-bounds index is reported in one line.
    grid, block = projection.launch_shape(case.T, case.d_out)
    launch(kernel, grid, block, cuda.to_device(x), cuda.to_device(w), cuda.to_device(b), out)
    assert_guard_intact(full, n)
    return out.copy_to_host(), reference.project(x, w, b if case.bias else None)


register(Exercise(
    exercise_id="01_projection_naive",
    title="out = x @ w (+ b), one thread per output element",
    kind="kernel",
    run=_run_projection,
    # First a square w (as W_Q for all heads at once), so that w[col, k] in place of w[k, col]
    # stays in bounds and shows up as wrong values; then sizes that are not multiples of the
    # 16 x 16 block, one row only, several blocks down and across, with and without bias.
    cases=[Case(1, 5, 5, False), Case(7, 24, 20, True), Case(33, 17, 20, False), Case(18, 9, 35, True)],
    hint=("col, row = cuda.grid(2); only if row < out.shape[0] and col < out.shape[1]: add up "
          "x[row, k] * w[k, col] over k in range(x.shape[1]) (w is (d_model, d_out): k picks its row), "
          "add b[col] when b.shape[0] > 0, and write out[row, col]"),
    # float32 sums of up to 24 products of standard normals, against a float64 reference.
    rtol=1e-4,
    atol=1e-4,
))
