"""Notebook 09's exercise: the FLOPs, bytes and arithmetic intensity of the naive and the tiled projection.

The answer is a NumPy function ``answer(T, d_model, d_out, tile)`` for out = x @ w with x
(T, d_model), w (d_model, d_out), float32 and no bias, returning a (2, 3) array: row 0 the naive
kernel (projection_kernel_v1), row 1 the tiled one (projection_kernel_v2 with tile x tile tiles);
columns FLOPs, bytes of global-memory traffic, FLOP per byte. Bytes count every load and store
as ``sanitizer.count_memory`` does (no caches), 4 bytes each; tests/test_bench.py checks that
this module's formula equals the counts. With tile = projection.WIDE_TILE (32) the tiled row is
also projection_kernel_v3's traffic.

Besides the engine's diagnoses, ``diagnose`` names the usual slips: elements counted instead
of bytes, a multiply-add counted as one FLOP, the stores forgotten, and blocks counted with a
rounded-down division (right only when the sizes are multiples of the tile).
"""

from typing import NamedTuple

import numpy as np

from attention_lib.stages import projection
from attention_lib.checks.engine import Exercise, register
from attention_lib.launch import ceil_div

BYTES = 4                       # float32


class Case(NamedTuple):
    """One size tried: x (T, d_model) @ w (d_model, d_out), tiles of tile x tile."""

    T: int
    d_model: int
    d_out: int
    tile: int

    def __str__(self):
        return f"(T {self.T}, d_model {self.d_model}, d_out {self.d_out}, tile {self.tile})"


def expected_cost(T, d_model, d_out, tile, floor=False):
    """The reference: (2, 3) float64 [[FLOPs, bytes, FLOP/byte] naive, [...] tiled].

    floor=True rounds the block counts down: the planted mistake diagnose looks for.
    """
    blocks = (lambda n: n // tile) if floor else (lambda n: ceil_div(n, tile))
    flops = projection.flops(T, d_model, d_out)
    stores = T * d_out
    naive = T * d_model * d_out + d_model * d_out * T + stores      # a row of x and a column of w per output
    tiled = T * d_model * blocks(d_out) + d_model * d_out * blocks(T) + stores
    cost = [[flops, BYTES * naive], [flops, BYTES * tiled]]
    return np.array([[f, b, f / b] for f, b in cost], dtype=np.float64)


def _run(answer, case, rng):
    got = answer(case.T, case.d_model, case.d_out, case.tile)
    return np.asarray(got, dtype=np.float64), expected_cost(*case), case


def _diagnose(got, expected, case):
    """Name a known slip from how the answer differs from the reference; None otherwise."""
    def close(a, b):
        return np.allclose(a, b, rtol=1e-9, atol=0)

    if close(got[:, 1] * BYTES, expected[:, 1]):
        return "bytes_counted_as_elements", ("the bytes are 4 times too small: you counted elements; each float32 "
                                "element is 4 bytes")
    if close(got[:, 0] * 2, expected[:, 0]):
        return "multiply_add_as_one_flop", "the FLOPs are half: a multiply-add is 2 FLOPs (a multiply and an add)"
    no_stores = expected[:, 1] - BYTES * case.T * case.d_out
    if close(got[:, 1], no_stores):
        return "stores_missing", "the stores are missing: every output element is written once (4 bytes)"
    if close(got[:, 1], expected_cost(*case, floor=True)[:, 1]):
        return "blocks_rounded_down", ("the tiled bytes are too small at these sizes: round the number of blocks "
                                "up, ceil(d_out / tile) and ceil(T / tile), as a partly used edge block "
                                "still loads its tiles")
    return None


register(Exercise(
    exercise_id="09_arithmetic_intensity",
    title="FLOPs, bytes and arithmetic intensity of the naive and the tiled projection",
    kind="function",
    run=_run,
    # Awkward sizes first (partly used edge blocks), then ANDREA-120M's fused QKV projection of
    # one sequence with the 16-wide tiles of v2 and the 32-wide output tiles of v3.
    cases=[Case(33, 24, 17, 16), Case(1, 5, 3, 16), Case(7, 24, 20, 4),
           Case(1024, 768, 2304, 16), Case(1024, 768, 2304, 32)],
    hint=("FLOPs = 2 * T * d_model * d_out for both. Naive bytes: each of the T * d_out outputs reads "
          "d_model elements of x and d_model of w, plus one store per output. Tiled: each x element "
          "is read ceil(d_out / tile) times, each w element ceil(T / tile) times, plus the stores. "
          "Times 4 bytes; intensity = FLOPs / bytes. Return np.array([[flops, naive_bytes, naive_intensity], "
          "[flops, tiled_bytes, tiled_intensity]])"),
    rtol=1e-9,
    atol=0.0,
    diagnose=_diagnose,
    diagnoses=('bytes_counted_as_elements', 'multiply_add_as_one_flop', 'stores_missing',
               'blocks_rounded_down'),
))
