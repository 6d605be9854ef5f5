"""GPU basics (notebook 00, deep dive 00x): threads, blocks, the grid, and a first kernel with its
bounds guard.

Element-wise kernels on vectors of length n, one CUDA thread per element:
- NumPy reference: ``x + y`` and ``alpha * x + y``.
- ``add_kernel``: out[i] = x[i] + y[i]; ``scale_add_kernel``: out[i] = alpha * x[i] + y[i].
- ``whoami_kernel`` / ``whoami_2d_kernel``: each thread writes down who it is, to draw which
  thread handles which element.
- ``transpose_kernel``: out[c, r] = a[r, c], a 2-D grid over a (rows, cols) matrix: a warp reads
  along a row of a and writes down a column of out.
- ``transpose_tiled_kernel``: the same through a tile in shared memory, so that a warp's writes run
  along a row of out too.
- ``grid_2d``: the smallest 2-D grid covering a (rows, cols) matrix, x across the columns.
- ``divergent_warps`` (00x): which warps of a 2-D launch have threads on both sides of the bounds guard.
- ``warp_load_footprint`` (00x): the 128-byte segments and 32-byte sectors one warp's strided load
  touches.
- Launchers ``add``, ``scale_add``, ``whoami``, ``whoami_2d``, ``transpose``: validate, copy, pick
  the grid, return NumPy. ``add``, ``scale_add`` and ``transpose`` take a ``kernel=`` argument so
  that the exercise checks can launch a student's kernel exactly as the library launches its own.
"""

import numpy as np
from numba import cuda, float32

from attention_lib.platform.launch import ceil_div, check_grid, check_simulator_budget
from attention_lib.platform.validation import as_float32, require

# One block = 64 threads (two warps of 32). Small, so that the notebooks' vectors of a few
# dozen elements already need several blocks and a partly used last one.
THREADS_PER_BLOCK = 64
# 2-D launches: 8 x 8 = 64 threads, x along columns, y along rows.
BLOCK_2D = (8, 8)
# The transpose's block: 16 threads along x (columns), 8 along y (rows). Not square on purpose:
# a grid or a kernel with its axes swapped then misses part of the matrix instead of passing by luck.
TRANSPOSE_BLOCK = (16, 8)
# The tiled transpose: a square tile of a, one element a thread of a square block. Its shared copy has
# one column of padding (a shared array's shape is a constant, not an expression).
TRANSPOSE_TILE = 16
TRANSPOSE_TILE_PADDED = TRANSPOSE_TILE + 1
TILED_TRANSPOSE_BLOCK = (TRANSPOSE_TILE, TRANSPOSE_TILE)
# Threads of a block are dealt out to warps of 32 in order of their linear id (x fastest).
WARP_SIZE = 32
# Global memory moves 32-byte sectors; 4 sectors make a 128-byte segment (a cache line).
SEGMENT_BYTES = 128
SECTOR_BYTES = 32
FLOAT32_BYTES = 4


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


@cuda.jit
def transpose_kernel(a, out):
    """out[col, row] = a[row, col]; one thread per element of a. a: (rows, cols) float32,
    out: (cols, rows) float32. Launch on grid_2d(rows, cols, block)."""
    col, row = cuda.grid(2)                   # x is a's column: a warp reads along a row of a
    if row < a.shape[0] and col < a.shape[1]:
        out[col, row] = a[row, col]           # ... and writes down a column of out


@cuda.jit
def transpose_tiled_kernel(a, out):
    """out[col, row] = a[row, col] through a tile in shared memory: a warp reads along a row of a and
    writes along a row of out. a: (rows, cols) float32, out: (cols, rows) float32. Launch on
    grid_2d(rows, cols, TILED_TRANSPOSE_BLOCK): block (bx, by) moves a's tile at rows by * TILE,
    columns bx * TILE to out's tile at rows bx * TILE, columns by * TILE."""
    # The padding column puts a tile's column in 16 different banks: a warp reads two columns, so at most
    # two words share a bank (two rounds, where an unpadded tile takes eight).
    tile = cuda.shared.array((TRANSPOSE_TILE, TRANSPOSE_TILE_PADDED), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    a_row0, a_col0 = cuda.blockIdx.y * TRANSPOSE_TILE, cuda.blockIdx.x * TRANSPOSE_TILE
    if a_row0 + ty < a.shape[0] and a_col0 + tx < a.shape[1]:
        tile[ty, tx] = a[a_row0 + ty, a_col0 + tx]          # neighbouring lanes, neighbouring columns of a
    cuda.syncthreads()                                      # the whole tile is in before any column of it is read
    if a_col0 + ty < out.shape[0] and a_row0 + tx < out.shape[1]:
        out[a_col0 + ty, a_row0 + tx] = tile[tx, ty]        # neighbouring lanes, neighbouring columns of out


# --- Grids and warps ---------------------------------------------------------------------

def grid_2d(rows, cols, block):
    """(blocks along x, blocks along y): the smallest grid of `block` = (bx, by) threads that
    covers a (rows, cols) matrix with one thread per element, x across the columns."""
    return ceil_div(cols, block[0]), ceil_div(rows, block[1])


def divergent_warps(rows, cols, block):
    """Which warps of the launch grid_2d(rows, cols, block) split at the bounds guard
    `row < rows and col < cols`: some of their threads pass it, others do not.

    block = (bx, by) with bx * by a multiple of WARP_SIZE. Returns a bool array of shape
    (blocks along y, blocks along x, warps per block).
    """
    bx, by = block
    grid_x, grid_y = grid_2d(rows, cols, block)
    diverges = np.zeros((grid_y, grid_x, bx * by // WARP_SIZE), bool)
    for block_y in range(grid_y):
        for block_x in range(grid_x):
            for warp in range(bx * by // WARP_SIZE):
                lane_ids = np.arange(warp * WARP_SIZE, (warp + 1) * WARP_SIZE)   # linear thread ids
                row = block_y * by + lane_ids // bx       # x runs fastest through the ids
                col = block_x * bx + lane_ids % bx
                inside = (row < rows) & (col < cols)
                diverges[block_y, block_x, warp] = inside.any() and not inside.all()
    return diverges


def warp_load_footprint(stride):
    """(segments, sectors): how many 128-byte segments and 32-byte sectors one warp's load touches
    when lane l reads float32 element l * stride of an array that starts on a segment boundary."""
    addresses = np.arange(WARP_SIZE) * stride * FLOAT32_BYTES        # (32,) bytes from the start
    return len(set(addresses // SEGMENT_BYTES)), len(set(addresses // SECTOR_BYTES))


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
    grid = grid_2d(rows, cols, block)                         # (x: columns, y: rows)
    check_grid("whoami_2d", grid, x="cols", y="rows")
    whoami_2d_kernel[grid, block](block_of, thread_of)
    return block_of.copy_to_host(), thread_of.copy_to_host()


def transpose(a, kernel=transpose_kernel, block=TRANSPOSE_BLOCK):
    """a.T on the device. a: (rows, cols) float -> (cols, rows) float32."""
    a = as_float32("a", a, "(rows, cols)", ndim=2)
    rows, cols = a.shape
    check_simulator_budget("transpose", rows * cols)
    grid = grid_2d(rows, cols, block)
    check_grid("transpose", grid, x="cols", y="rows")
    out = cuda.device_array((cols, rows), np.float32)
    kernel[grid, block](cuda.to_device(a), out)
    return out.copy_to_host()
