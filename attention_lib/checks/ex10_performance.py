"""Notebook 10's exercise: the FLOPs, bytes and arithmetic intensity of the naive and the tiled projection.

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

The main exercise, ``10_registers``: a kernel ``(q, k, out)`` computing out[i, j] = q[i] . k[j]
for q (T_q, D), k (T_k, D), one thread per query row holding its row of q in a
``cuda.local.array``, written so that the array lives in registers. It is judged on values
(random data, awkward sizes) and then by its row of the kernel report for sm_90
(``compiled_report``: a stack frame of 0 bytes, float32 multiply-adds in the hot loop). Diagnoses:
``still_local_memory`` (a stack frame left: an index the compiler cannot know),
``float64_arithmetic`` (an accumulator typed float64), ``not_compiled`` (no compiler here, or the
kernel does not compile for a GPU), besides the engine's.
"""

from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.stages import projection
from attention_lib.checks.engine import Exercise, output_array, read_output, register
from attention_lib.platform.launch import ceil_div

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


def _run(answer, case, rng, _launch):                   # NumPy: no kernel to launch
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
    exercise_id="10_arithmetic_intensity",
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


# --- The main exercise: keep a local array in registers -----------------------------------------

# The head width of the exercise's kernels: a module-level constant, so that loops over it have a
# bound the compiler knows (ANDREA-120M's d_k).
D = 64
ROWS_PER_BLOCK = 32
# The sizes tried, (T_q, T_k), then what the compiler makes of the kernel for an H100 / H200.
ROW_CASES = [(1, 1), (7, 19), (33, 5)]
COMPILED = "the kernel report for sm_90"
ARGUMENT_TYPES = ["array(float32, 2d, C)"] * 3          # q, k, out


def compiled_report(kernel):
    """The kernel report's row for a (q, k, out) kernel at sm_90, or {"error": one line} when it
    cannot be made here (no compiler installed, or a kernel that does not compile for a GPU)."""
    from attention_lib.measure import kernel_report
    try:
        return kernel_report.report_kernel(kernel, ARGUMENT_TYPES, ROWS_PER_BLOCK, arch="sm_90")
    except Exception as error:  # the compiler's own error, whatever its class
        lines = str(error).strip().splitlines() or [type(error).__name__]
        return {"error": f"{type(error).__name__}: {lines[-1]}"}


def launch_row_scores(kernel, q, k, launch):
    """Run a kernel with the signature (q, k, out), one thread per query row, on ROWS_PER_BLOCK-thread
    blocks, through `launch` (the judge's): q (T_q, D), k (T_k, D) float32 device arrays -> out
    (T_q, T_k) float32 NumPy array (the engine's UNWRITTEN where never written)."""
    if q.shape[1] != D or k.shape[1] != D:
        raise ValueError(f"q and k must be (T, {D}) float32, got {q.shape} and {k.shape}")
    full, out = output_array((q.shape[0], k.shape[0]), guard=0)
    launch(kernel, ceil_div(q.shape[0], ROWS_PER_BLOCK), ROWS_PER_BLOCK, q, k, out)
    return read_output(full, out)


def _run_rows(kernel, case, rng, launch):
    if case == COMPILED:
        report = compiled_report(kernel)
        if "error" in report:
            return np.array([np.inf, np.inf]), np.zeros(2), report
        float64 = report["hot_loop"]["ffma"] == 0          # double-precision multiply-adds instead
        return np.array([report["stack_bytes"], float(float64)]), np.zeros(2), report
    t_q, t_k = case
    q = rng.standard_normal((t_q, D)).astype(np.float32)
    k = rng.standard_normal((t_k, D)).astype(np.float32)
    got = launch_row_scores(kernel, cuda.to_device(q), cuda.to_device(k), launch)
    return got, reference.scores(q, k, scale=False), None


def _diagnose_rows(got, expected, report):
    if report is None:                           # a case of values: the engine's diagnosis
        return None
    if "error" in report:
        return "not_compiled", f"the compiler's report is unavailable: {report['error']}"
    if report["stack_bytes"] > 0:
        return "still_local_memory", (
            f"correct values, but the kernel report says {report['stack_bytes']} bytes of stack frame "
            f"(local memory, in device DRAM) and {report['registers']} registers: some index into the "
            "local array is still unknown when the kernel is compiled")
    return "float64_arithmetic", (
        f"no local memory left ({report['registers']} registers), but the hot loop has no float32 "
        f"multiply-add (FFMA) among its {report['hot_loop']['total']} instructions: a number typed as "
        "float64 (a plain 0.0) makes every multiply-add double precision, far slower on most GPUs; "
        "keep the arithmetic float32")


register(Exercise(
    exercise_id="10_registers",
    title="a row-scores kernel whose local array lives in registers (stack frame 0 bytes)",
    kind="kernel",
    run=_run_rows,
    cases=ROW_CASES + [COMPILED],
    describe_case=lambda c: c if c == COMPILED else f"T_q = {c[0]}, T_k = {c[1]}, D = {D}",
    hint=("a cuda.local.array becomes registers only when every index into it is a compile-time constant "
          "once the compiler has unrolled the loops: which of the kernel's loop bounds does the compiler "
          "know, and which only the launch?"),
    # float32 sums of 64 products of standard normals (values up to about 25) against float64.
    rtol=1e-5,
    atol=1e-4,
    diagnose=_diagnose_rows,
    diagnoses=("still_local_memory", "float64_arithmetic", "not_compiled"),
))
