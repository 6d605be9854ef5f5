"""GPU basics (notebook 00): threads, blocks, the grid, and a first kernel with its bounds guard.

Element-wise kernels on vectors of length n, one CUDA thread per element:
- NumPy reference: ``x + y`` and ``alpha * x + y``.
- ``add_kernel``: out[i] = x[i] + y[i]; ``scale_add_kernel``: out[i] = alpha * x[i] + y[i].
- ``whoami_kernel`` / ``whoami_2d_kernel``: each thread writes down who it is, to draw which
  thread handles which element.
- Launchers ``add``, ``scale_add``, ``whoami``, ``whoami_2d``: validate, copy, pick the grid,
  return NumPy. ``add`` and ``scale_add`` take a ``kernel=`` argument so that the exercise
  check can launch a student's kernel exactly as the library launches its own.
"""

import numpy as np
from numba import cuda

from attention_lib.platform.launch import ceil_div, check_grid, check_simulator_budget
from attention_lib.platform.validation import as_float32, require

# One block = 64 threads (two warps of 32). Small, so that the notebooks' vectors of a few
# dozen elements already need several blocks and a partly used last one.
THREADS_PER_BLOCK = 64
# 2-D launches: 8 x 8 = 64 threads, x along columns, y along rows.
BLOCK_2D = (8, 8)


# --- NumPy reference ---------------------------------------------------------------------

def scale_add_reference(alpha, x, y):
    """alpha * x + y in float64. x, y: (n,) -> (n,)."""
    return float(alpha) * np.asarray(x, np.float64) + np.asarray(y, np.float64)


# --- Kernels -----------------------------------------------------------------------------

@cuda.jit
def add_kernel(x, y, out):
    """out[i] = x[i] + y[i]; one thread per element. x, y, out: (n,) float32."""
    i = cuda.grid(1)           # blockIdx.x * blockDim.x + threadIdx.x
    if i < out.shape[0]:       # the last block may hang past the end of the vector
        out[i] = x[i] + y[i]


@cuda.jit
def scale_add_kernel(alpha, x, y, out):
    """out[i] = alpha * x[i] + y[i]; one thread per element. x, y, out: (n,) float32."""
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = alpha * x[i] + y[i]


@cuda.jit
def whoami_kernel(block_of, thread_of, global_of):
    """Each thread writes its block index, its index in the block and its global index.

    block_of, thread_of, global_of: (n,) int32.
    """
    i = cuda.grid(1)
    if i < global_of.shape[0]:
        block_of[i] = cuda.blockIdx.x
        thread_of[i] = cuda.threadIdx.x
        global_of[i] = i


@cuda.jit
def whoami_2d_kernel(block_of, thread_of):
    """2-D grid over a (rows, cols) matrix: each thread writes its linear block and thread ids.

    block_of, thread_of: (rows, cols) int32. x runs along a row, so neighbouring threads
    touch neighbouring columns (the order in which a row-major matrix sits in memory).
    """
    col, row = cuda.grid(2)    # cuda.grid(2) is (x, y): x is the column, y the row
    if row < block_of.shape[0] and col < block_of.shape[1]:
        block_of[row, col] = cuda.blockIdx.y * cuda.gridDim.x + cuda.blockIdx.x
        thread_of[row, col] = cuda.threadIdx.y * cuda.blockDim.x + cuda.threadIdx.x


# --- Launchers ---------------------------------------------------------------------------

def _vector_pair(x, y):
    x = as_float32("x", x, "(n,)", ndim=1)
    y = as_float32("y", y, "(n,)", ndim=1)
    require(x.shape == y.shape, f"y must have the shape of x {x.shape}, got {y.shape}")
    check_simulator_budget("basics", x.shape[0])
    return x, y


def add(x, y, kernel=add_kernel, threads_per_block=THREADS_PER_BLOCK):
    """x + y on the device. x, y: (n,) float -> (n,) float32."""
    x, y = _vector_pair(x, y)
    d_x, d_y = cuda.to_device(x), cuda.to_device(y)           # host -> device
    d_out = cuda.device_array_like(d_x)                       # uninitialised, on the device
    kernel[ceil_div(x.shape[0], threads_per_block), threads_per_block](d_x, d_y, d_out)
    return d_out.copy_to_host()                               # device -> host


def scale_add(alpha, x, y, kernel=scale_add_kernel, threads_per_block=THREADS_PER_BLOCK):
    """alpha * x + y on the device. alpha: float; x, y: (n,) float -> (n,) float32."""
    if not np.isscalar(alpha) or not np.isfinite(alpha):
        raise TypeError(f"alpha must be a finite number, got {alpha!r}")
    x, y = _vector_pair(x, y)
    d_x, d_y = cuda.to_device(x), cuda.to_device(y)
    d_out = cuda.device_array_like(d_x)
    kernel[ceil_div(x.shape[0], threads_per_block), threads_per_block](np.float32(alpha), d_x, d_y, d_out)
    return d_out.copy_to_host()


def whoami(n, threads_per_block=THREADS_PER_BLOCK):
    """Launch one thread per element of an (n,) vector; returns (block_of, thread_of, global_of)."""
    require(isinstance(n, int) and n >= 1, f"n must be a positive int, got {n!r}")
    check_simulator_budget("whoami", n)
    ids = [cuda.device_array(n, np.int32) for _ in range(3)]
    whoami_kernel[ceil_div(n, threads_per_block), threads_per_block](*ids)
    return tuple(d.copy_to_host() for d in ids)


def whoami_2d(rows, cols, block=BLOCK_2D):
    """Launch a 2-D grid over a (rows, cols) matrix; returns (block_of, thread_of), each (rows, cols)."""
    require(isinstance(rows, int) and isinstance(cols, int) and rows >= 1 and cols >= 1,
            f"rows and cols must be positive ints, got {rows!r}, {cols!r}")
    check_simulator_budget("whoami_2d", rows * cols)
    block_of = cuda.device_array((rows, cols), np.int32)
    thread_of = cuda.device_array((rows, cols), np.int32)
    grid = (ceil_div(cols, block[0]), ceil_div(rows, block[1]))   # (x: columns, y: rows)
    check_grid("whoami_2d", grid, x="cols", y="rows")
    whoami_2d_kernel[grid, block](block_of, thread_of)
    return block_of.copy_to_host(), thread_of.copy_to_host()
