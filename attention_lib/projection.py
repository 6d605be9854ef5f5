"""Q/K/V projection (notebook 01): three learned linear maps of the same input, as matmul kernels.

Q = x @ W_Q (+ b_Q), K = x @ W_K (+ b_K), V = x @ W_V (+ b_V). All three are one operation,
``out = x @ w (+ b)`` with x: (rows, d_model), w: (d_model, d_out), b: (d_out,), so the
kernels below compute that, and the launchers flatten any leading batch axes into rows.
The NumPy reference is ``attention_lib.reference.project``.

- ``projection_kernel_v1``: one thread per output element; each thread reads a row of x and a
  column of w straight from global memory (x is read d_out times, w T times, per element).
- ``projection_kernel_v2``: the same thread-to-output mapping, but each block loads
  (TILE, TILE) tiles of x and w into shared memory once and every thread of the block reuses
  them (x is read ceil(d_out / TILE) times, w ceil(T / TILE) times, per element).
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

from attention_lib.launch import ceil_div, check_simulator_budget
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


@cuda.jit
def projection_kernel_v2(x, w, b, out):
    """The same product as v1, tiled: each block stages (TILE, TILE) tiles in shared memory.

    x: (rows, d_model), w: (d_model, d_out), b: (d_out,) or (0,) for no bias,
    out: (rows, d_out), all float32. Launch with (TILE, TILE) blocks.
    """
    x_tile = cuda.shared.array((TILE, TILE), float32)
    w_tile = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col, row = cuda.grid(2)
    acc = float32(0.0)
    for start in range(0, x.shape[1], TILE):    # walk along d_model one tile at a time
        # Each thread loads one element of each tile. Past the edge of x or w it stores 0,
        # which adds nothing to the sum, so any size works; threads outside `out` still load,
        # because their neighbours need the tile and every thread must reach the barriers.
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
    if row < out.shape[0] and col < out.shape[1]:
        if b.shape[0] > 0:
            acc += b[col]
        out[row, col] = acc


KERNELS = {1: projection_kernel_v1, 2: projection_kernel_v2}


# --- Launchers ---------------------------------------------------------------------------

def launch_shape(rows, d_out):
    """(grid, block) for an output of (rows, d_out): one thread per element, x along columns."""
    return (ceil_div(d_out, TILE), ceil_div(rows, TILE)), BLOCK


def launch_projection(kernel, x, w, b, out):
    """Launch `kernel` on device arrays: x (rows, d_model), w (d_model, d_out), b (d_out,) or
    (0,), out (rows, d_out), all float32. No checks: the launchers below make them."""
    grid, block = launch_shape(out.shape[0], out.shape[1])
    kernel[grid, block](x, w, b, out)


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
    -> (..., T, d_out) float32. version 1 or 2 picks the library kernel; `kernel`, if given,
    replaces it (same signature as projection_kernel_v1) and is launched the same way.
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
    grid, block = launch_shape(rows.shape[0], d_out)
    check_simulator_budget("project", grid[0] * grid[1] * block[0] * block[1])
    result = cuda.device_array((rows.shape[0], d_out), np.float32)
    launch_projection(kernel, cuda.to_device(rows), cuda.to_device(w), cuda.to_device(b), result)
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
    Counted as the sanitizer counts: every request as if it went to memory (no caches).
    """
    require(version in KERNELS, f"version must be one of {sorted(KERNELS)}, got {version!r}")
    if version == 1:
        return d_out, T
    return ceil_div(d_out, TILE), ceil_div(T, TILE)
