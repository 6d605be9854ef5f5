"""``00_scale_add`` (notebook 00, warm-up): a kernel ``(alpha, x, y, out)`` computing
out = alpha * x + y, one thread per element, the threads of the last block past the end doing
nothing (the library's ``basics.scale_add_kernel``). Its cases and limits are declared in the
Exercise below.
"""

import numpy as np
from numba import cuda

from attention_lib.stages import basics
from attention_lib.checks.cases import edges
from attention_lib.checks.engine import Exercise, register
from attention_lib.checks.launch import output_array, read_output
from attention_lib.checks.limits import Coalesced, MostAccessesPerThread, MostLoads
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
            Coalesced("x", 1), Coalesced("y", 1),
            # One thread per element: the launch has a thread for every element, so no thread needs more
            # than its own (a grid-stride loop over this launch makes one pass too).
            MostAccessesPerThread("x", 1, why="one thread per element: each thread reads its own element of x"),
            MostAccessesPerThread("y", 1, why="one thread per element: each thread reads its own element of y"),
            MostAccessesPerThread("out", 1, access="store",
                                  why="one thread per element: each thread writes its own element of out")),
    solution=basics.scale_add_kernel,
    forbidden=(basics.scale_add,),
))
