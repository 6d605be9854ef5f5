"""``10_registers`` (notebook 10, warm-up): a kernel ``(q, k, out)`` computing out[i, j] = q[i] . k[j],
one thread per query row holding its row of q in a ``cuda.local.array`` kept in registers (the
library's ``registers.row_scores_kernel_v2``: the kernel report, ptxas for sm_90, gives it a 0-byte
stack frame, where the notebook's ``row_scores_kernel_v1`` has 4 D bytes, its whole array in local
memory; tests/test_exercises_10.py holds both). The answer's own stack frame is its limit
(``NoLocalMemory``), read from its compile for sm_90. Its cases and limits are declared in the Exercise below;
``launch_row_scores`` launches 10_tiled_k's answer too.
"""

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import output_array, read_output
from attention_lib.checks.limits import MostAccessesPerThread, MostLoads, NoLocalMemory
from attention_lib.stages import registers

D = registers.D
# (T_q, T_k): one row, a partial block, a block one row short, one block and one row.
ROW_CASES = [(1, 1), (7, 19), (31, 2), (33, 5)]


def launch_row_scores(kernel, q, k, launch):
    """Run a kernel with the signature (q, k, out), one thread per query row, on registers'
    grid, through `launch` (the judge's): q (T_q, D), k (T_k, D) float32 device arrays -> out
    (T_q, T_k) float32 NumPy array (the engine's UNWRITTEN where never written)."""
    if q.shape[1] != D or k.shape[1] != D:
        raise ValueError(f"q and k must be (T, {D}) float32, got {q.shape} and {k.shape}")
    full, out = output_array((q.shape[0], k.shape[0]), guard=0)
    launch(kernel, *registers.row_scores_grid(q.shape[0]), q, k, out)
    return read_output(full, out)


def _run_rows(kernel, case, rng, launch):
    t_q, t_k = case
    q = rng.standard_normal((t_q, D)).astype(np.float32)
    k = rng.standard_normal((t_k, D)).astype(np.float32)
    got = launch_row_scores(kernel, cuda.to_device(q), cuda.to_device(k), launch)
    return got, reference.scores(q, k, scale=False)


register(Exercise(
    exercise_id="10_registers",
    kind="kernel",
    run=_run_rows,
    cases=ROW_CASES,
    describe_case=lambda c: f"T_q = {c[0]}, T_k = {c[1]}, D = {D}",
    hint=("a thread's local array becomes registers only when every index into it is a constant the compiler "
          "knows once it has unrolled the loops: which of the kernel's loop bounds does the compiler know, and "
          "which only the launch?"),
    more_hints=("where answers go wrong: changing one of the two loops over the row and not the other (both "
                "index the local array), reading q from main memory again for every key instead of from the "
                "local array, and an accumulator started from a plain zero, which Python types as a float64",),
    # float32 sums of 64 products of standard normals (values up to about 25) against float64.
    rtol=1e-5,
    atol=1e-4,
    limits=(MostLoads("q", 1, why="copy the thread's row into its local array once and read it from there"),
            MostAccessesPerThread("out", lambda case: case[1], access="store",
                                  why="a thread per query row writes its row's T_k scores"),
            NoLocalMemory()),
    solution=registers.row_scores_kernel_v2,
    forbidden=(registers.row_scores, registers.launch_row_scores),
))
