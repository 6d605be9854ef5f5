"""Notebook 00's exercise: a first element-wise kernel with its bounds guard."""

import numpy as np
from numba import cuda

from attention_lib.stages import basics
from attention_lib.checks.engine import Exercise, assert_guard_intact, guarded_output, launch, register
from attention_lib.launch import ceil_div


def _run_scale_add(kernel, n, rng):
    alpha = np.float32(rng.uniform(-2.0, 2.0))
    x = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    threads = basics.THREADS_PER_BLOCK
    full, out = guarded_output(n, guard=threads)
    launch(kernel, ceil_div(n, threads), threads, alpha, cuda.to_device(x), cuda.to_device(y), out)
    assert_guard_intact(full, n)
    return out.copy_to_host(), basics.scale_add_reference(alpha, x, y)


register(Exercise(
    exercise_id="00_scale_add",
    title="out[i] = alpha * x[i] + y[i], one thread per element",
    kind="kernel",
    run=_run_scale_add,
    # 1 and 7: fewer threads than a block; 64: exactly one block; 65 and 200: a partly used last block.
    cases=[1, 7, 64, 65, 200],
    describe_case=lambda n: f"n = {n} (blocks of {basics.THREADS_PER_BLOCK})",
    hint="i = cuda.grid(1), then only if i < out.shape[0]: out[i] = alpha * x[i] + y[i]",
))
