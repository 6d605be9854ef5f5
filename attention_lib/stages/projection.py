"""Q/K/V projection (notebook 01): three learned linear maps of the same input, as matmul kernels.

Q = x @ W_Q (+ b_Q), K = x @ W_K (+ b_K), V = x @ W_V (+ b_V). All three are one operation,
``out = x @ w (+ b)`` with x: (rows, d_model), w: (d_model, d_out), b: (d_out,), so the
kernels below compute that, and the launchers flatten any leading batch axes into rows.
The NumPy reference is ``attention_lib.reference.project``.

- ``projection_kernel_v1``: one thread per output element; each thread reads a row of x and a
  column of w straight from global memory (x is read d_out times, w T times, per element).
- ``tile_matmul`` + ``projection_kernel_v2``: the same thread-to-output mapping, but each block
  loads (TILE, TILE) tiles of x and w into shared memory once and every thread of the block
  reuses them (x is read ceil(d_out / TILE) times, w ceil(T / TILE) times, per element). The
  tile loop is a device function so that ``weighted_sum.py`` (A @ V, notebook 05) runs the same
  loop on each head's slices: one tiled matmul in the library, not two copies.
- ``store_output`` + ``projection_kernel_v3`` (notebook 09): register tiling. Each thread of a
  (TILE, TILE) block computes a 2 x 2 micro-tile of outputs (MICRO = 2), so a block covers
  (WIDE_TILE, WIDE_TILE) = 32 x 32 outputs. Per step along d_model a thread reads 2 + 2 numbers
  from shared memory for 4 multiply-adds (v2: 2 for 1), and each x and w element is read from
  global memory half as often as in v2 (ceil(d_out / 32), ceil(T / 32)). Its grid is
  ``wide_launch_shape``; ``project(..., version=3)`` picks it.
- Biases: ``b`` is always passed; an empty one, shape (0,), means "no bias". Numba kernels
  cannot take ``None``, and a separate bias kernel would read and write the whole output again;
  ``b.shape[0] > 0`` costs one comparison per thread and nothing is read when there is no bias.
- Fused QKV: GPT-2's ``c_attn`` keeps W_Q, W_K, W_V side by side as one (d_model, 3 * d_model)
  matrix; one matmul (one launch, three times the blocks) then gives [Q | K | V] along the last
  axis. ``project_qkv`` does that and splits the result.
- ``flops`` and ``global_reads``: the work and the global-memory reads of one launch, by
  formula; the sanitizer (``attention_lib.sanitizer.count_memory``) measures the same reads.
- Launchers ``project`` and ``project_qkv`` validate, copy, pick the grid (``launch_shape``) and
  return NumPy float32; ``launch_projection`` is the launch itself, on device arrays, which the
  exercise check uses to run a student's kernel exactly as the library runs its own.
"""

import numpy as np
from numba import cuda, float32

from attention_lib.launch import barrier_seconds, ceil_div, check_grid, check_simulator_budget
from attention_lib.validation import as_float32, require

# Side of the square tiles of projection_kernel_v2, and of the thread blocks of both versions:
# 16 x 16 = 256 threads, a common block size on a GPU; small enough that the simulator's T 32
# already needs two blocks down, and that sizes such as T 33 leave the edge blocks partly used.
TILE = 16
BLOCK = (TILE, TILE)


# --- Kernels -----------------------------------------------------------------------------

@cuda.jit
def projection_kernel_v1(x, w, b, out):
    """out[row, col] = sum_k x[row, k] * w[k, col] (+ b[col]); one thread per output element.

    x: (rows, d_model), w: (d_model, d_out), b: (d_out,) or (0,) for no bias,
    out: (rows, d_out), all float32.
    """
    col, row = cuda.grid(2)                     # x runs along the columns of out
    if row < out.shape[0] and col < out.shape[1]:
        acc = float32(0.0)                      # float32: a bare 0.0 would make acc float64
        for k in range(x.shape[1]):
            acc += x[row, k] * w[k, col]        # a row of x times a column of w
        if b.shape[0] > 0:
            acc += b[col]
        out[row, col] = acc


@cuda.jit(device=True)
def tile_matmul(x, w, row, col):
    """x[row, :] . w[:, col] for thread (row, col) of a (TILE, TILE) block, computed with the whole block.

    x: (rows, K), w: (K, cols) float32, 2-D (or 2-D views, such as one head's a[h] and v[h] in
    weighted_sum.py, which reuses this loop). Returns the float32 sum. Every thread of the block
    must call it (it waits at barriers), also threads whose (row, col) lies past the edge of the
    output: they help load the tiles and get 0.
    """
    x_tile = cuda.shared.array((TILE, TILE), float32)
    w_tile = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    acc = float32(0.0)
    for start in range(0, x.shape[1], TILE):    # walk along K one tile at a time
        # Each thread loads one element of each tile. Past the edge of x or w it stores 0,
        # which adds nothing to the sum, so any size works; threads outside the output still
        # load, because their neighbours need the tile and every thread must reach the barriers.
        k = start + tx
        if row < x.shape[0] and k < x.shape[1]:
            x_tile[ty, tx] = x[row, k]
        else:
            x_tile[ty, tx] = 0.0
        k = start + ty
        if k < w.shape[0] and col < w.shape[1]:
            w_tile[ty, tx] = w[k, col]
        else:
            w_tile[ty, tx] = 0.0
        cuda.syncthreads()                      # wait until the whole tile pair is loaded
        for j in range(TILE):
            acc += x_tile[ty, j] * w_tile[j, tx]
        cuda.syncthreads()                      # wait until everyone is done with the tiles
                                                # before the next step overwrites them
    return acc


@cuda.jit
def projection_kernel_v2(x, w, b, out):
    """The same product as v1, tiled: each block stages (TILE, TILE) tiles in shared memory.

    x: (rows, d_model), w: (d_model, d_out), b: (d_out,) or (0,) for no bias,
    out: (rows, d_out), all float32. Launch with (TILE, TILE) blocks. The tile loop is the
    device function tile_matmul, shared with the weighted sum of notebook 05.
    """
    col, row = cuda.grid(2)
    acc = tile_matmul(x, w, row, col)           # called by every thread: it contains barriers
    if row < out.shape[0] and col < out.shape[1]:
        if b.shape[0] > 0:
            acc += b[col]
        out[row, col] = acc


# projection_kernel_v3: each thread computes MICRO x MICRO = 2 x 2 outputs, so a block of
# (TILE, TILE) = 256 threads covers a (WIDE_TILE, WIDE_TILE) = 32 x 32 tile of out.
MICRO = 2
WIDE_TILE = MICRO * TILE


@cuda.jit(device=True)
def store_output(out, b, row, col, acc):
    """out[row, col] = acc (+ b[col]) when (row, col) lies inside out: one output of a micro-tile."""
    if row < out.shape[0] and col < out.shape[1]:
        if b.shape[0] > 0:
            acc += b[col]
        out[row, col] = acc


@cuda.jit
def projection_kernel_v3(x, w, b, out):
    """The same product as v1 and v2, register-tiled: each thread computes 2 x 2 outputs.

    x: (rows, d_model), w: (d_model, d_out), b: (d_out,) or (0,) for no bias,
    out: (rows, d_out), all float32. Launch with (TILE, TILE) blocks on wide_launch_shape:
    block (bx, by) computes the (WIDE_TILE, WIDE_TILE) tile of out at rows by * WIDE_TILE,
    columns bx * WIDE_TILE. Thread (tx, ty) owns rows ty and ty + TILE and columns tx and
    tx + TILE of that tile: its four sums live in registers (acc00 .. acc11). Per step along
    d_model each thread reads 2 numbers of x_tile and 2 of w_tile and does 4 multiply-adds:
    one shared-memory load per multiply-add, where v2 needs two.
    """
    x_tile = cuda.shared.array((WIDE_TILE, TILE), float32)   # [row in the block's tile, k in step]
    w_tile = cuda.shared.array((TILE, WIDE_TILE), float32)   # [k in step, column in the block's tile]
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row0 = cuda.blockIdx.y * WIDE_TILE + ty     # this thread's first row; the second is row0 + TILE
    col0 = cuda.blockIdx.x * WIDE_TILE + tx     # its first column; the second is col0 + TILE
    acc00 = float32(0.0)                        # (row0, col0)
    acc01 = float32(0.0)                        # (row0, col0 + TILE)
    acc10 = float32(0.0)                        # (row0 + TILE, col0)
    acc11 = float32(0.0)                        # (row0 + TILE, col0 + TILE)
    for start in range(0, x.shape[1], TILE):    # walk along d_model one tile at a time
        # Each thread loads 2 elements of each tile, zero past the edges. Neighbouring tx read
        # neighbouring k of x and neighbouring columns of w: consecutive addresses (coalesced).
        k = start + tx
        for i in range(MICRO):
            row = row0 + i * TILE
            if row < x.shape[0] and k < x.shape[1]:
                x_tile[ty + i * TILE, tx] = x[row, k]
            else:
                x_tile[ty + i * TILE, tx] = 0.0
        k = start + ty
        for j in range(MICRO):
            col = col0 + j * TILE
            if k < w.shape[0] and col < w.shape[1]:
                w_tile[ty, tx + j * TILE] = w[k, col]
            else:
                w_tile[ty, tx + j * TILE] = 0.0
        cuda.syncthreads()                      # wait until both tiles are loaded
        for kk in range(TILE):
            x0 = x_tile[ty, kk]                 # 2 loads from x_tile and 2 from w_tile ...
            x1 = x_tile[ty + TILE, kk]
            w0 = w_tile[kk, tx]
            w1 = w_tile[kk, tx + TILE]
            acc00 += x0 * w0                    # ... feed 4 multiply-adds
            acc01 += x0 * w1
            acc10 += x1 * w0
            acc11 += x1 * w1
        cuda.syncthreads()                      # wait until everyone is done with the tiles
                                                # before the next step overwrites them
    store_output(out, b, row0, col0, acc00)
    store_output(out, b, row0, col0 + TILE, acc01)
    store_output(out, b, row0 + TILE, col0, acc10)
    store_output(out, b, row0 + TILE, col0 + TILE, acc11)


KERNELS = {1: projection_kernel_v1, 2: projection_kernel_v2, 3: projection_kernel_v3}


# --- Launchers ---------------------------------------------------------------------------

def launch_shape(rows, d_out):
    """(grid, block) for an output of (rows, d_out): one thread per element, x along columns."""
    return (ceil_div(d_out, TILE), ceil_div(rows, TILE)), BLOCK


def launch_projection(kernel, x, w, b, out):
    """Launch `kernel` on device arrays: x (rows, d_model), w (d_model, d_out), b (d_out,) or
    (0,), out (rows, d_out), all float32. No checks: the launchers below make them."""
    grid, block = launch_shape(out.shape[0], out.shape[1])
    kernel[grid, block](x, w, b, out)


def wide_launch_shape(rows, d_out):
    """(grid, block) of projection_kernel_v3 for an output of (rows, d_out): (TILE, TILE) blocks,
    each covering a (WIDE_TILE, WIDE_TILE) tile of the output, x along columns."""
    return (ceil_div(d_out, WIDE_TILE), ceil_div(rows, WIDE_TILE)), BLOCK


def _bias(b, d_out, name, w_name="w"):
    """b as a float32 (d_out,) array, or an empty (0,) one for no bias."""
    if b is None:
        return np.zeros(0, np.float32)
    b = as_float32(name, b, "(d_out,)", ndim=1)
    require(b.shape == (d_out,), f"{name} must have shape ({d_out},) (the last axis of {w_name}), got {b.shape}")
    return b


def _check_version(version, kernel):
    if kernel is None:
        require(version in KERNELS, f"version must be one of {sorted(KERNELS)}, got {version!r}")
        return KERNELS[version]
    return kernel


def project(x, w, b=None, version=2, kernel=None):
    """x @ w (+ b) on the device.

    x: (..., T, d_model) float; w: (d_model, d_out) float; b: (d_out,) float or None
    -> (..., T, d_out) float32. version 1, 2 or 3 picks the library kernel; `kernel`, if given,
    replaces it (same signature as projection_kernel_v1) and is launched on that version's grid
    (one thread per output for 1 and 2, one per 2 x 2 outputs for 3).
    """
    kernel = _check_version(version, kernel)
    x = as_float32("x", x, "(..., T, d_model)", min_ndim=2)
    w = as_float32("w", w, "(d_model, d_out)", ndim=2)
    *lead, T, d_model = x.shape
    require(w.shape[0] == d_model,
            f"w must have shape ({d_model}, d_out) (d_model = the last axis of x), got {w.shape}")
    d_out = w.shape[1]
    b = _bias(b, d_out, "b")
    rows = x.reshape(-1, d_model)                             # (B * T, d_model): batch axes become rows
    wide = version == 3                                       # v3: a thread per 2 x 2 outputs
    grid, block = (wide_launch_shape if wide else launch_shape)(rows.shape[0], d_out)
    check_grid("project", grid, x="w's d_out in tiles", y="x's rows (batch x T) in tiles")
    # v2 and v3 wait at two barriers per step of TILE along d_model.
    barrier_s = barrier_seconds(grid[0] * grid[1], block[0] * block[1], 2 * ceil_div(d_model, TILE))
    check_simulator_budget("project", grid[0] * grid[1] * block[0] * block[1],
                           barrier_s if version in (2, 3) else 0.0)
    result = cuda.device_array((rows.shape[0], d_out), np.float32)
    args = (cuda.to_device(rows), cuda.to_device(w), cuda.to_device(b), result)
    if wide:
        kernel[grid, block](*args)
    else:
        launch_projection(kernel, *args)
    return result.copy_to_host().reshape(*lead, T, d_out)     # (..., T, d_out)


def project_qkv(x, w_qkv, b_qkv=None, version=2, kernel=None):
    """Q, K and V from one fused matmul, as GPT-2's c_attn: x @ w_qkv (+ b_qkv), split in three.

    x: (..., T, d_model); w_qkv: (d_model, 3 * d) = [W_Q | W_K | W_V] side by side (d = d_model
    in GPT-2); b_qkv: (3 * d,) or None -> (q, k, v), each (..., T, d) float32: views of one
    (..., T, 3 * d) array.
    """
    x = as_float32("x", x, "(..., T, d_model)", min_ndim=2)
    w_qkv = as_float32("w_qkv", w_qkv, "(d_model, 3 * d)", ndim=2)
    require(w_qkv.shape[0] == x.shape[-1] and w_qkv.shape[1] % 3 == 0,
            f"w_qkv must have shape ({x.shape[-1]}, 3 * d) ([W_Q | W_K | W_V], d_model = the last "
            f"axis of x), got {w_qkv.shape}")
    if b_qkv is not None:
        _bias(b_qkv, w_qkv.shape[1], "b_qkv", "w_qkv")
    qkv = project(x, w_qkv, b_qkv, version, kernel)          # (..., T, 3 * d)
    d = w_qkv.shape[1] // 3
    return qkv[..., :d], qkv[..., d:2 * d], qkv[..., 2 * d:]  # each (..., T, d)


# --- Cost --------------------------------------------------------------------------------

def flops(T, d_model, d_out):
    """Floating-point operations of x @ w for x (T, d_model), w (d_model, d_out): one multiply
    and one add per term, d_model terms per output, T * d_out outputs (the bias is not counted)."""
    return 2 * T * d_model * d_out


def global_reads(T, d_out, version):
    """How many times one launch reads each element of x and each element of w from global
    memory: (x_reads, w_reads), the same for every element.

    v1: output (row, col) reads all of row `row` of x and column `col` of w, so each x element
    is read by the d_out threads of its row and each w element by the T threads of its column.
    v2: a block loads each tile once into shared memory, so each x element is read once per
    block across (ceil(d_out / TILE)) and each w element once per block down (ceil(T / TILE)).
    v3: the same with blocks covering WIDE_TILE x WIDE_TILE outputs: ceil(d_out / WIDE_TILE)
    and ceil(T / WIDE_TILE).
    Counted as the sanitizer counts: every request as if it went to memory (no caches).
    """
    require(version in KERNELS, f"version must be one of {sorted(KERNELS)}, got {version!r}")
    if version == 1:
        return d_out, T
    tile = WIDE_TILE if version == 3 else TILE
    return ceil_div(d_out, tile), ceil_div(T, tile)
