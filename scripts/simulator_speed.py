"""Measure how fast Numba's CUDA simulator runs the library's own kernels.

Times, on the simulator, with numba-cuda's own threads (one operating-system thread per CUDA
thread) and with the greenlets attention_lib runs them as (attention_lib/platform/simulator.py):
the projection as a naive kernel (v1, no barrier) and as a 16x16-tiled one (v2, two barriers a
tile), softmax v2 (a barrier per step of its tree reduction) and the fused attention kernel
v2. Prints a table (the README quotes it) and the rates attention_lib.platform.launch budgets with.

    ATTENTION_LIB_BACKEND=simulator python scripts/simulator_speed.py
"""

import sys
import time

import numpy as np

import attention_lib
from attention_lib.platform import simulator
from attention_lib.stages import flash, projection, softmax
from numba import cuda

RNG = np.random.default_rng(0)


def random(*shape):
    return RNG.standard_normal(shape, dtype=np.float32)


X, W = random(64, 64), random(64, 64)                 # 4,096 outputs, one thread each
SCORES = random(64, 64)                               # 64 rows of 64 scores
Q, K, V = random(2, 64, 32), random(2, 64, 32), random(2, 64, 32)
CASES = {
    "projection v1, 64x64 @ 64x64 (4,096 threads, no barrier)": lambda: projection.project(X, W, version=1),
    "projection v2, the same tiled 16x16 (16 blocks, 8 barrier rounds)": lambda: projection.project(X, W, version=2),
    "softmax v2, 64 rows of 64": lambda: softmax.softmax(SCORES, version=2),
    "flash_attention v2, 2 heads, T = 64, d = 32, causal": lambda: flash.flash_attention(Q, K, V, version=2),
}


def seconds(case):
    start = time.perf_counter()
    case()
    return time.perf_counter() - start


@cuda.jit
def idle(out):
    for _ in range(out.shape[0]):
        cuda.syncthreads()


def rates():
    """Threads per second of an empty-bodied launch, and the cost of one barrier per thread."""
    idle[1, 32](np.zeros(0))
    plain, synced = (seconds(lambda: idle[16, 256](np.zeros(n))) for n in (0, 16))
    return 4096 / plain, (synced - plain) / (16 * 4096)


if __name__ == "__main__":
    if not attention_lib.ON_SIMULATOR:
        sys.exit("This script measures the simulator: set ATTENTION_LIB_BACKEND=simulator")
    for case in CASES.values():
        case()                                        # compile-free, but imports and caches warm up
    print("| kernel | numba-cuda's threads | greenlets | faster |")
    print("|---|---|---|---|")
    for name, case in CASES.items():
        with simulator.numba_cuda_threads():
            theirs = seconds(case)
        ours = seconds(case)
        print(f"| {name} | {theirs:.2f} s | {ours:.2f} s | {theirs / ours:.1f}x |")
    threads_per_s, barrier_s = rates()
    madds = 2 * sum(i + 1 for i in range(64)) * (32 + 32)
    print(f"\ngreenlets: {threads_per_s:,.0f} threads/s with an empty body, "
          f"{barrier_s * 1e6:.1f} us per thread per barrier, "
          f"flash v2 {madds / seconds(CASES['flash_attention v2, 2 heads, T = 64, d = 32, causal']):,.0f} "
          f"multiply-adds/s")
