"""Measure how fast Numba's CUDA simulator runs the course's kind of kernels.

Times a naive and a 16x16 shared-memory tiled 64x64 matmul at several values of Python's
thread switch interval (the simulator runs one Python thread per CUDA thread), and the
simulator's throughput in CUDA threads per second. Prints a table; the README quotes it.

    ATTENTION_LIB_BACKEND=simulator python scripts/simulator_speed.py
"""

import sys
import time

import numpy as np

import attention_lib  # noqa: F401  (chooses the backend before numba.cuda loads)
from numba import cuda

TILE = 16


@cuda.jit
def matmul_naive(a, b, out):
    col, row = cuda.grid(2)  # x runs along a row (neighbouring threads, neighbouring columns)
    if row < out.shape[0] and col < out.shape[1]:
        acc = 0.0
        for k in range(a.shape[1]):
            acc += a[row, k] * b[k, col]
        out[row, col] = acc


@cuda.jit
def matmul_tiled(a, b, out):
    a_tile = cuda.shared.array((TILE, TILE), dtype=np.float32)
    b_tile = cuda.shared.array((TILE, TILE), dtype=np.float32)
    ty, tx = cuda.threadIdx.y, cuda.threadIdx.x
    col, row = cuda.grid(2)  # x runs along a row (neighbouring threads, neighbouring columns)
    acc = 0.0
    for start in range(0, a.shape[1], TILE):
        a_tile[ty, tx] = a[row, start + tx] if row < a.shape[0] and start + tx < a.shape[1] else 0.0
        b_tile[ty, tx] = b[start + ty, col] if start + ty < b.shape[0] and col < b.shape[1] else 0.0
        cuda.syncthreads()
        for k in range(TILE):
            acc += a_tile[ty, k] * b_tile[k, tx]
        cuda.syncthreads()
    if row < out.shape[0] and col < out.shape[1]:
        out[row, col] = acc


def seconds(kernel, n):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    out = np.zeros((n, n), np.float32)
    blocks = ((n + TILE - 1) // TILE,) * 2
    start = time.perf_counter()
    kernel[blocks, (TILE, TILE)](a, b, out)
    elapsed = time.perf_counter() - start
    assert np.allclose(out, a @ b, atol=1e-3), "wrong result"
    return elapsed


if __name__ == "__main__":
    if not attention_lib.ON_SIMULATOR:
        sys.exit("This script measures the simulator: set ATTENTION_LIB_BACKEND=simulator")
    seconds(matmul_naive, 16)  # first launch pays for imports
    print("switch interval | naive 64x64 (4096 threads) | tiled 64x64 (8 barrier rounds)")
    for interval in (5e-3, 1e-3, 5e-4, 1e-4):
        sys.setswitchinterval(interval)
        naive, tiled = seconds(matmul_naive, 64), seconds(matmul_tiled, 64)
        print(f"{interval * 1e3:13.1f} ms | {naive:6.2f} s ({4096 / naive:5.0f} threads/s) | {tiled:6.2f} s")
