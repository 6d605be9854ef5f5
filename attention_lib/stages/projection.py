"""Q/K/V projection (notebook 01): out = x @ w (+ b), x (rows, d_model), w (d_model, d_out), b (d_out,)
or empty (0,) for none, as matmul kernels (notebook 01 tells v1 and v2, the deep dive 01x v3 and
v4). The file:

- ``projection_kernel_v1``: one thread per output, x and w read from global memory.
- ``tile_matmul`` + ``projection_kernel_v2``: (TILE, TILE) shared-memory tiles (notebook 01's main
  exercise is tile_matmul); ``tile_matmul`` is also weighted_sum's A @ V (one tiled matmul, not two).
- ``load_wide_tiles``, ``multiply_wide_tiles``, ``store_output`` + ``projection_kernel_v3``
  (notebook 01x): 2 x 2 outputs per thread.
- ``load_tiles``, ``store_tiles``, ``load_fragment``, ``multiply_tile``, ``walk_d_model``,
  ``store_micro_tile`` + ``projection_kernel_v4``: CUTLASS-style 128 x 128 tiles, 8 x 8 outputs
  per thread, double-buffered; ``FAST``: its floors for the kernel report.
- ``KERNELS``, ``layer_version`` (the version multihead and kv_cache launch), the grids
  ``projection_grid``, ``projection_grid_v3``, ``projection_grid_v4``, ``projection_grid_of``;
  ``launch_projection`` and ``launch_version`` on device arrays.
- Launchers ``project(x, w, b=None, version=2, kernel=None)`` and ``project_qkv`` (GPT-2's fused
  c_attn: [W_Q | W_K | W_V] in one launch, split after).
- ``flops`` and ``global_reads``: the work and global-memory reads of a launch by formula (the
  sanitizer counts the same); tiles are the same on both backends, so these are the GPU's figures.
"""

import math

import numpy as np
from numba import cuda, float32

from attention_lib.platform.launch import ceil_div, check_grid, check_simulator_budget, check_version
from attention_lib.platform.runtime import SIMULATOR_SHAPES
from attention_lib.platform.validation import as_float32, require

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
    col, row = cuda.grid(2)                     # the grid's x axis runs along the columns of out
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

    x: (rows, K), w: (K, cols) float32 2-D arrays or views (weighted_sum.py passes one head's a[h]
    and v[h]). Returns the float32 sum. Every thread of the block must call it (it waits at
    barriers), also those whose (row, col) lies past the output's edge: they help load and get 0.
    """
    x_tile = cuda.shared.array((TILE, TILE), float32)    # [row in the block, k in this step]
    w_tile = cuda.shared.array((TILE, TILE), float32)    # [k in this step, column in the block]
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    acc = float32(0.0)
    for start in range(0, x.shape[1], TILE):    # walk along K one tile at a time
        k = start + tx                          # x's column this thread copies
        x_tile[ty, tx] = x[row, k] if row < x.shape[0] and k < x.shape[1] else float32(0.0)
        k = start + ty                          # w's row this thread copies
        w_tile[ty, tx] = w[k, col] if k < w.shape[0] and col < w.shape[1] else float32(0.0)
        cuda.syncthreads()                      # wait until both tiles are loaded
        for j in range(TILE):                   # past an edge the tiles hold 0: adds nothing
            acc += x_tile[ty, j] * w_tile[j, tx]
        cuda.syncthreads()                      # wait until all have read them: the next step overwrites
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


@cuda.jit(device=True)
def load_wide_tiles(x, w, x_tile, w_tile, start, row0, col0):
    """Thread (tx, ty) copies 2 elements of x's tile and 2 of w's for the step at `start`, 0 past
    the edges. Neighbouring tx read neighbouring k of x and columns of w: coalesced."""
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
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


@cuda.jit(device=True)
def multiply_wide_tiles(x_tile, w_tile, acc00, acc01, acc10, acc11):
    """The four sums of thread (tx, ty) (rows ty, ty + TILE by columns tx, tx + TILE of the tiles)
    plus this step's products: per k, 2 loads from each tile feed 4 multiply-adds (v2: 2 for 1)."""
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    for kk in range(TILE):
        x0 = x_tile[ty, kk]
        x1 = x_tile[ty + TILE, kk]
        w0 = w_tile[kk, tx]
        w1 = w_tile[kk, tx + TILE]
        acc00 += x0 * w0
        acc01 += x0 * w1
        acc10 += x1 * w0
        acc11 += x1 * w1
    return acc00, acc01, acc10, acc11


@cuda.jit
def projection_kernel_v3(x, w, b, out):
    """v1's product (same shapes), 2 x 2 outputs per thread, four sums in registers. Launch with
    (TILE, TILE) blocks on projection_grid_v3: block (bx, by) computes the (WIDE_TILE, WIDE_TILE) tile
    of out at rows by * WIDE_TILE, columns bx * WIDE_TILE."""
    x_tile = cuda.shared.array((WIDE_TILE, TILE), float32)   # [row in the block's tile, k in step]
    w_tile = cuda.shared.array((TILE, WIDE_TILE), float32)   # [k in step, column in the block's tile]
    row0 = cuda.blockIdx.y * WIDE_TILE + cuda.threadIdx.y    # this thread's first row; then row0 + TILE
    col0 = cuda.blockIdx.x * WIDE_TILE + cuda.threadIdx.x    # its first column; then col0 + TILE
    acc00 = acc01 = acc10 = acc11 = float32(0.0)             # (row0, col0), (row0, col0 + TILE), ...
    for start in range(0, x.shape[1], TILE):                 # walk along d_model one tile at a time
        load_wide_tiles(x, w, x_tile, w_tile, start, row0, col0)
        cuda.syncthreads()                                   # wait until both tiles are loaded
        acc00, acc01, acc10, acc11 = multiply_wide_tiles(x_tile, w_tile, acc00, acc01, acc10, acc11)
        cuda.syncthreads()                                   # all done with them before the next loads
    store_output(out, b, row0, col0, acc00)
    store_output(out, b, row0, col0 + TILE, acc01)
    store_output(out, b, row0 + TILE, col0, acc10)
    store_output(out, b, row0 + TILE, col0 + TILE, acc11)


# projection_kernel_v4: the structure of a CUTLASS-style SGEMM. A block of THREADS_V4 = 256
# threads computes a (BM, BN) = 128 x 128 tile of out, walking d_model BK = 8 at a time. Each
# thread owns an 8 x 8 micro-tile (64 sums in registers), split 4 + 4 in both directions: rows
# ty*4 .. ty*4+3 and 64 + ty*4 .. 64 + ty*4+3 of the block's tile, the same for columns with tx,
# for the 16 x 16 threads (tx, ty). A fragment of four neighbours is then one 16-byte shared load;
# such a load is served 8 threads (a quarter-warp) at a time, and 8 neighbouring tx read 8
# neighbouring pieces of w's row, 128 bytes, each bank once, while their x fragment is one piece
# (a broadcast): no bank conflict. All indices are uint32 (U): signed ones add negative-index
# wraparound code to every access. Numba widens uint32 arithmetic to uint64, and compares uint64
# with int64 in float64, so shapes are taken as U(shape) before a comparison.
BIG_TILE = 128               # rows and columns of out per block
BIG_STEP = 8                 # step along d_model: one (128, 8) tile of x, one (8, 128) of w
X_PAD = 4                    # x's tile is stored transposed, (8, 128 + X_PAD): see store_tiles
XS_WIDTH = BIG_TILE + X_PAD
U = np.uint32                # the same sizes as uint32, for index arithmetic
BM = U(BIG_TILE)
BN = U(BIG_TILE)
BK = U(BIG_STEP)
THREADS_V4 = 256
MICRO_V4 = 8                 # a thread's micro-tile is MICRO_V4 x MICRO_V4
HALF_MICRO = U(4)            # ... made of 4 x 4 quarters, one fragment load each
HALF_TILE = U(64)            # the second quarter starts 64 rows (columns) further
THREADS_ACROSS = U(16)       # threads (tx, ty) form a 16 x 16 square: tx = tid % 16
LOADS_V4 = 4                 # elements of each tile a thread copies: 128 * 8 / 256
# 16-byte alignment lets the compiler merge a fragment's four loads into one (LDS.128).
SHARED_ALIGNMENT = 16
# Floors the kernel report checks: no local memory, and FFMA at least 60 % of the hot loop.
FAST = {"projection_kernel_v4": {"max_stack_bytes": 0, "min_ffma_fraction": 0.6}}


@cuda.jit(device=True)
def load_tiles(x, w, row0, col0, k0, tid, x_regs, w_regs):
    """Copy the block's next tiles from global memory into registers, 0 past the edges.

    x_regs[i] = x[row0 + tid // 8 + 32 i, k0 + tid % 8]: 8 neighbouring threads read the 8
    neighbouring floats (32 bytes) of a row of x. w_regs[i] = w[k0 + tid // 32, col0 + tid % 32
    + 32 i]: a warp reads 32 neighbouring floats of a row of w. x, w float32 2-D; the rest uint32.
    """
    k = k0 + tid % BK
    for i in range(LOADS_V4):
        row = row0 + tid // BK + U(i) * U(32)
        x_regs[i] = x[row, k] if row < U(x.shape[0]) and k < U(x.shape[1]) else float32(0.0)
    k = k0 + tid // U(32)
    for i in range(LOADS_V4):
        col = col0 + tid % U(32) + U(i) * U(32)
        w_regs[i] = w[k, col] if k < U(w.shape[0]) and col < U(w.shape[1]) else float32(0.0)


@cuda.jit(device=True)
def store_tiles(xs, ws, buf, tid, x_regs, w_regs):
    """Registers to shared buffer `buf`: xs[buf] (BK, BM + X_PAD) holds x's tile transposed,
    ws[buf] (BK, BN) w's tile as it is. Transposed, a thread's rows of x are neighbours in
    memory (one fragment load); the X_PAD columns shift each k row by 4 banks, so the 32 stores
    of a warp (4 rows x 8 k) land in 32 different banks; unpadded, in 4 (an 8-way conflict)."""
    for i in range(LOADS_V4):
        xs[buf, tid % BK, tid // BK + U(i) * U(32)] = x_regs[i]
        ws[buf, tid // U(32), tid % U(32) + U(i) * U(32)] = w_regs[i]


@cuda.jit(device=True)
def load_fragment(tile, buf, k, first, frag):
    """frag[0:4] = tile[buf, k, first : first + 4], frag[4:8] = the 4 at first + 64: two 16-byte
    shared loads. tile: a shared (2, BK, width) float32 buffer pair; frag: a local (8,) array."""
    for i in range(HALF_MICRO):
        frag[i] = tile[buf, k, first + U(i)]
        frag[HALF_MICRO + i] = tile[buf, k, first + HALF_TILE + U(i)]


@cuda.jit(device=True)
def multiply_tile(xs, ws, buf, tx, ty, a, bw, acc):
    """acc += the (BM, BK) x (BK, BN) product of shared buffer `buf`, this thread's 8 x 8 part:
    per k, 8 + 8 numbers from shared memory feed 64 multiply-adds (v3: 4 for 4)."""
    for k in range(BK):
        load_fragment(xs, buf, U(k), ty * HALF_MICRO, a)
        load_fragment(ws, buf, U(k), tx * HALF_MICRO, bw)
        for i in range(MICRO_V4):                 # constant bounds: unrolled, so acc is registers
                                                  # (ptxas: no stack frame)
            for j in range(MICRO_V4):
                acc[i, j] += a[i] * bw[j]


@cuda.jit(device=True)
def store_micro_tile(out, b, row0, col0, acc):
    """out[rows, cols] = acc (+ b[cols]) for the micro-tile's rows row0 + (0..3, 64..67) and
    columns col0 + (0..3, 64..67), skipping those past the edge of out (the epilogue)."""
    for i in range(MICRO_V4):
        row = row0 + U(i // 4) * HALF_TILE + U(i % 4)
        for j in range(MICRO_V4):
            col = col0 + U(j // 4) * HALF_TILE + U(j % 4)
            if row < U(out.shape[0]) and col < U(out.shape[1]):
                out[row, col] = acc[i, j] + b[col] if b.shape[0] > 0 else acc[i, j]


@cuda.jit(device=True)
def walk_d_model(x, w, xs, ws, row0, col0, tid, x_regs, w_regs, a, bw, acc):
    """The main loop, double-buffered: buffer `step % 2` holds this step's tiles (stored and
    waited for before), the next ones come from global memory into registers meanwhile and go
    to the other buffer afterwards, so one barrier per step suffices. Called by every thread."""
    n_steps = (U(x.shape[1]) + BK - U(1)) // BK
    for step in range(n_steps):
        buf = U(step) % U(2)
        more = U(step) + U(1) < n_steps           # the same for every thread: no divergent barrier
        if more:
            load_tiles(x, w, row0, col0, (U(step) + U(1)) * BK, tid, x_regs, w_regs)
        multiply_tile(xs, ws, buf, tid % THREADS_ACROSS, tid // THREADS_ACROSS, a, bw, acc)
        if more:
            store_tiles(xs, ws, U(1) - buf, tid, x_regs, w_regs)
        cuda.syncthreads()                        # wait until the next tiles are stored, and
                                                  # everyone is done reading this buffer


@cuda.jit(launch_bounds=(THREADS_V4, 2))     # 2 blocks of 256 threads per SM: <= 128 registers
def projection_kernel_v4(x, w, b, out):
    """v1's product (same shapes), 128 x 128 outputs per block, 8 x 8 per thread. Launch with THREADS_V4
    threads on projection_grid_v4: block (bx, by) computes out[by*BM : (by+1)*BM, bx*BN : (bx+1)*BN]."""
    xs = cuda.shared.array((2, BIG_STEP, XS_WIDTH), float32, alignment=SHARED_ALIGNMENT)  # x^T
    ws = cuda.shared.array((2, BIG_STEP, BIG_TILE), float32, alignment=SHARED_ALIGNMENT)  # w
    x_regs, w_regs = cuda.local.array(LOADS_V4, float32), cuda.local.array(LOADS_V4, float32)  # in flight
    a, bw = cuda.local.array(MICRO_V4, float32), cuda.local.array(MICRO_V4, float32)  # this k's fragments
    acc = cuda.local.array((MICRO_V4, MICRO_V4), float32)
    acc[:, :] = float32(0.0)
    tid = U(cuda.threadIdx.x)
    row0, col0 = U(cuda.blockIdx.y) * BM, U(cuda.blockIdx.x) * BN
    load_tiles(x, w, row0, col0, U(0), tid, x_regs, w_regs)
    store_tiles(xs, ws, U(0), tid, x_regs, w_regs)
    cuda.syncthreads()                            # wait until the first tiles are in buffer 0
    walk_d_model(x, w, xs, ws, row0, col0, tid, x_regs, w_regs, a, bw, acc)
    store_micro_tile(out, b, row0 + tid // THREADS_ACROSS * HALF_MICRO,
                     col0 + tid % THREADS_ACROSS * HALF_MICRO, acc)


KERNELS = {1: projection_kernel_v1, 2: projection_kernel_v2, 3: projection_kernel_v3,
           4: projection_kernel_v4}

# The projection the layers of notebooks 06 and 08 (multihead, kv_cache) launch. On a GPU v4, the
# fastest. On the simulator v1: a decoding step projects one row, which v1 covers with d_out
# threads and v4 with 256 per 128 columns. Measured on the simulator (2-core machine, threads as
# greenlets) for ANDREA-sim's fused QKV of a whole sequence, (64, 64) @ (64, 192): v1 2.0 s,
# v2 2.0 s, v3 0.9 s, v4 2.0 s.
LAYER_VERSION_GPU = 4
LAYER_VERSION_SIMULATOR = 1


def layer_version(gpu=None):
    """The projection version of the layers: the current configuration's (gpu None; the GPU's
    on a GPU or with ATTENTION_LIB_SHAPES=gpu), or the GPU's (gpu True) or the simulator's
    (False) whatever the backend, for figures at ANDREA-120M."""
    if gpu is None:
        gpu = not SIMULATOR_SHAPES
    return LAYER_VERSION_GPU if gpu else LAYER_VERSION_SIMULATOR


# --- Launchers ---------------------------------------------------------------------------

def projection_grid(rows, d_out):
    """(grid, block) for an output of (rows, d_out): one thread per element, the grid's x axis along the columns."""
    return (ceil_div(d_out, TILE), ceil_div(rows, TILE)), BLOCK


def launch_projection(kernel, x, w, b, out):
    """Launch `kernel` on device arrays: x (rows, d_model), w (d_model, d_out), b (d_out,) or
    (0,), out (rows, d_out), all float32. No checks: the launchers below make them."""
    grid, block = projection_grid(out.shape[0], out.shape[1])
    kernel[grid, block](x, w, b, out)


def projection_grid_v3(rows, d_out):
    """(grid, block) of projection_kernel_v3 for an output of (rows, d_out): (TILE, TILE) blocks,
    each covering a (WIDE_TILE, WIDE_TILE) tile of the output, the grid's x axis along the columns."""
    return (ceil_div(d_out, WIDE_TILE), ceil_div(rows, WIDE_TILE)), BLOCK


def projection_grid_v4(rows, d_out):
    """(grid, block) of projection_kernel_v4 for an output of (rows, d_out): 1-D blocks of
    THREADS_V4 threads, each covering a (128, 128) tile of the output, the grid's x axis along the columns."""
    return (ceil_div(d_out, BIG_TILE), ceil_div(rows, BIG_TILE)), (THREADS_V4,)


def projection_grid_of(version, rows, d_out):
    """(grid, block) of the library's kernel `version` for an output of (rows, d_out)."""
    if version == 4:
        return projection_grid_v4(rows, d_out)
    return (projection_grid_v3 if version == 3 else projection_grid)(rows, d_out)


def launch_version(version, x, w, b, out):
    """Launch the library's kernel `version` on its own grid, on device arrays (shapes as in
    launch_projection). The composites (multihead, kv_cache) call it with their chosen version."""
    grid, block = projection_grid_of(version, out.shape[0], out.shape[1])
    KERNELS[version][grid, block](x, w, b, out)


def _bias(b, d_out, name, w_name="w"):
    """b as a float32 (d_out,) array, or an empty (0,) one for no bias."""
    if b is None:
        return np.zeros(0, np.float32)
    b = as_float32(name, b, "(d_out,)", ndim=1)
    require(b.shape == (d_out,), f"{name} must have shape ({d_out},) (the last axis of {w_name}), got {b.shape}")
    return b


def _check_version(version, kernel):
    if kernel is None:
        check_version(version, KERNELS)
        return KERNELS[version]
    return kernel


def project(x, w, b=None, version=2, kernel=None):
    """x @ w (+ b) on the device.

    x: (..., T, d_model) float; w: (d_model, d_out) float; b: (d_out,) float or None
    -> (..., T, d_out) float32. version 1 to 4 picks the library kernel; `kernel`, if given,
    replaces it (same signature as projection_kernel_v1) and is launched on that version's grid
    (one thread per output for 1 and 2, per 2 x 2 outputs for 3, per 8 x 8 for 4).
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
    grid, block = projection_grid_of(version, rows.shape[0], d_out)
    check_grid("project", grid, x="w's d_out in tiles", y="x's rows (batch x T) in tiles")
    check_simulator_budget("project", math.prod(grid) * math.prod(block), rows.shape[0] * d_model * d_out)
    result = cuda.device_array((rows.shape[0], d_out), np.float32)
    kernel[grid, block](cuda.to_device(rows), cuda.to_device(w), cuda.to_device(b), result)
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
    and ceil(T / WIDE_TILE). v4: blocks of BIG_TILE x BIG_TILE outputs, ceil(d_out / 128) and
    ceil(T / 128); its edge threads store 0 instead of reading past x or w.
    Counted as the sanitizer counts: every request as if it went to memory (no caches).
    """
    check_version(version, KERNELS)
    if version == 1:
        return d_out, T
    tile = {2: TILE, 3: WIDE_TILE, 4: BIG_TILE}[version]
    return ceil_div(d_out, tile), ceil_div(T, tile)
