"""Kernel 3 around a student's part, for notebook 08's exercises and deep dive 08x's (each in its own
module beside this one). Every answer is a ``@cuda.jit(device=True)`` function the check compiles
again in the flash module's namespace with the sizes of a case's head width (``flash.v3_sizes``), as
``flash.build_flash_v3`` compiles the library's parts: it may use flash's compile-time names
(MICRO_M, MICRO_N, MICRO_D, ROW_GROUPS, COL_GROUPS, HEAD, HEAD_PAD, THREADS_V3, NEG_INF) besides
``cuda``, ``math`` and ``np``. Each check runs the answer in a probe (one block that hands it chosen
values and reads back what it left, with the trace for the limits) and in kernel 3 built around it.
Kernel 3's tiles depend on the head width only, so one configuration is enough; at d_k 64 (a GPU's
head width) the probes and kernel 3 are compiled for sm_90, at the other widths they are launched
without compiling them again.
"""

import functools
import types

import numpy as np
from numba import cuda

from attention_lib.platform.rebuild import rebuilt
from attention_lib.stages import flash
from attention_lib.checks.launch import launch, output_array, read_output
from attention_lib.checks.result import Diagnosed

# The head width a GPU runs (ANDREA-120M): kernel 3 at this width is the one compiled for sm_90.
COMPILED_D = 64


def rebound(answer, d_k):
    """The answer's code as a device function whose globals are flash's, with the compile-time
    sizes of head width d_k (as build_flash_v3 compiles the parts)."""
    return rebuilt(answer, flash.v3_sizes(d_k), base=vars(flash), device=True)


def refuse_library_names(answer, names):
    """Diagnosed calls_given_code when the answer's code names one of flash's functions that do the
    work: compiled in flash's namespace, the name would find the library's own."""
    used = set(getattr(getattr(answer, "py_func", answer), "__code__", types.SimpleNamespace(co_names=())).co_names)
    for name in names:
        if name in used:
            raise Diagnosed("calls_given_code", f"the answer calls {name}, the library's own code for what the "
                            "exercise asks: write that part yourself")


# A launch the judge neither traces nor compiles: kernel 3 at the head widths past the one compiled
# (each width is a kernel of its own, and compiling each would cost the check seconds), and the
# grouped kernel (its dynamic shared memory).
quiet_launch = functools.partial(launch, compile=False)


@functools.lru_cache(maxsize=64)
def kernel3(answer, part, d_k, grouped=False):
    """Kernel 3 (or its grouped kernel) at head width d_k with the answer in the place of `part`,
    built once per answer and width (so the judge compiles it once)."""
    return flash.build_flash_v3(d_k, {part: answer}, grouped=grouped)


def attention_v3(kernel, launch, q, k, v, causal, window):
    """out (BH, T_q, d_k) float32 of one launch of kernel 3 `kernel` (grouped when q has more heads
    than k), every entry not written left UNWRITTEN; `launch` as the engine's (the grouped kernel,
    which needs dynamic shared memory, is launched quietly)."""
    (bh, t_q, d_k), group = q.shape, q.shape[0] // k.shape[0]
    grid, block, nbytes = flash.launch_config(kernel, 3, bh, t_q, d_k, group)
    full, out = output_array((bh, t_q, d_k), guard=d_k)
    lse = np.zeros((bh, t_q), np.float32)
    args = (cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), flash.flash_scale(3, d_k), bool(causal),
            np.int32(window or 0), np.int32(group), out, lse)
    if nbytes:
        quiet_launch(kernel, grid, block, *args, sharedmem=nbytes)
    else:
        launch(kernel, grid, block, *args)
    return read_output(full, out)



def traced_for(d_k):
    """A traced launch (races found, the trace kept for the case's limits), compiled for a GPU only
    at the head width a GPU runs."""
    return functools.partial(launch, trace=True, compile=d_k == COMPILED_D)
