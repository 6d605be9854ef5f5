"""Row softmax (notebook 04): turn each row of masked, scaled scores into attention weights.

A[i, j] = exp(s[i, j]) / sum_k exp(s[i, k]), computed as exp(s[i, j] - m_i) / sum_k exp(s[i, k] - m_i)
with m_i the row's maximum: the factor exp(-m_i) cancels, so the value is the same, but no term
exceeds exp(0) = 1 (no overflow) and the largest term is exactly 1 (the sum is never 0). Every row
is independent; the leading axes of s (..., T_q) are flattened into rows.

Fully masked rows (every score -inf, as ``reference.py`` and ``mask.py`` define them) get
all-zero weights: the query attends to nothing, never NaN.

- NumPy reference: ``attention_lib.reference.softmax`` (not repeated here).
- ``online_softmax``: the same weights computed block by block along a row with a running max
  and a running sum, in NumPy; the idea notebook 07's fused attention kernel is built on.
- ``softmax_kernel_v1``: one thread per row, three passes over the row (max, sum, normalise).
- ``strided_*``: the passes of one thread over columns start, start + step, ... of a row, for
  kernel 2.
- ``block_reduce`` (``block_max``, ``block_sum``) + ``softmax_kernel_v2``: one block of
  THREADS_PER_ROW threads per row; the threads stride over the row and combine their partial
  max, then their partial sum, with a tree reduction in shared memory.
- ``block_softmax_kernel``: kernel 2's walks and trees as one kernel, its three passes written out around
  two calls of ``block_reduce`` (notebook 04's main exercise); where kernel 2 leaves early on a fully
  masked row, the whole block together, it computes through to zeros.
- ``merge_stats`` + ``softmax_kernel_v3`` (deep dive 04x's exercise): one warp per row,
  WARPS_PER_BLOCK rows a block; each lane folds its columns into one (max, sum) pair in a single
  pass, and the 32 lanes merge their pairs with warp shuffles (shfl_xor_sync): no shared memory, no
  barrier, two reads per score.
- Launcher ``softmax(s, version=2, kernel=None)``.
"""

import math

import numpy as np
from numba import cuda

from attention_lib.platform.launch import ceil_div, check_grid, check_simulator_budget, check_version
from attention_lib.platform.runtime import SIMULATOR_SHAPES
from attention_lib.platform.validation import as_float32

# v1: one thread per row, rows grouped 32 to a block (one warp).
ROWS_PER_BLOCK = 32
# v2: the threads that share one row; a power of two, as the tree reduction halves it each
# round. On a GPU 128 (4 warps): ANDREA-120M's T = 1024 gives each thread 8 scores, and the
# kernel report (36 registers a thread) lets an H200 SM hold 48 warps of kernel 2, 12 blocks of
# 128 (blocks of 32 would stop at the SM's 32 blocks, 32 warps of its 64; notebook 04x). On
# the simulator 32: each simulated thread costs time to start and to wait at the
# 2 x (2 + log2 32) = 14 barriers of a row, and 32 threads already cover ANDREA-sim's T = 32
# with one score each.
# The constants whose value differs between the simulator's launch and a GPU's: (simulator, GPU). A
# check runs an answer at both (attention_lib.checks.shapes).
SHAPE_CONSTANTS = {"THREADS_PER_ROW": (32, 128)}
THREADS_PER_ROW = SHAPE_CONSTANTS["THREADS_PER_ROW"][0 if SIMULATOR_SHAPES else 1]
# v3: one warp of 32 lanes per row, 4 rows (128 threads) a block. A warp's lanes meet at each
# shuffle; rows are independent, so a block needs no barrier at all.
WARP_SIZE = 32
WARPS_PER_BLOCK = 4
FULL_MASK = 0xFFFFFFFF                     # every lane of the warp takes part in each shuffle


# --- NumPy: the online softmax -----------------------------------------------------------

def online_softmax(s, block=8):
    """Row softmax computed `block` columns at a time with a running max m and running sum l.

    s: (..., T_k) float (-inf allowed) -> (..., T_k) float64, equal to reference.softmax(s).
    After each block, l = sum of exp(s - m) over the columns seen so far; when a block raises
    the max from m_old to m_new, the old sum is rescaled by exp(m_old - m_new).
    """
    s = np.asarray(s, dtype=np.float64)
    m = np.full(s.shape[:-1], -np.inf)                   # running max of each row
    l = np.zeros(s.shape[:-1])                           # running sum of exp(s - m)
    for start in range(0, s.shape[-1], block):
        chunk = s[..., start:start + block]              # (..., <= block)
        m_new = np.maximum(m, chunk.max(axis=-1))
        shift = np.where(np.isneginf(m_new), 0.0, m_new) # nothing but -inf yet: l stays 0
        l = l * np.exp(m - shift) + np.exp(chunk - shift[..., None]).sum(axis=-1)
        m = m_new
    masked = np.isneginf(m)[..., None]                   # fully masked rows: all-zero weights
    shift = np.where(masked, 0.0, m[..., None])
    return np.where(masked, 0.0, np.exp(s - shift) / np.where(masked, 1.0, l[..., None]))


# --- Kernels -----------------------------------------------------------------------------

@cuda.jit
def softmax_kernel_v1(s, out):
    """Naive row softmax: one thread per row, three passes over its T_k scores.

    s: (rows, T_k) float32, -inf for masked scores; out: (rows, T_k) float32, written.
    Thread `row` = cuda.grid(1) owns s[row, :]. A row of -inf gets zeros.
    """
    row = cuda.grid(1)
    if row >= s.shape[0]:                  # the last block may hang past the last row
        return
    row_max = np.float32(-math.inf)        # pass 1: the largest score (float32, as on the GPU)
    for j in range(s.shape[1]):
        row_max = max(row_max, s[row, j])
    if row_max == -math.inf:               # every score masked: the row attends to nothing
        for j in range(s.shape[1]):
            out[row, j] = 0.0
        return
    total = np.float32(0.0)                # pass 2: each term exp(s - max) <= exp(0) = 1
    for j in range(s.shape[1]):
        total += math.exp(s[row, j] - row_max)
    for j in range(s.shape[1]):            # pass 3: the weights
        out[row, j] = math.exp(s[row, j] - row_max) / total


@cuda.jit(device=True)
def strided_max(s, row, start, step):
    """Largest of s[row, start], s[row, start + step], ... (float32); -inf if there are none.

    Kernel 2's thread tid walks every THREADS_PER_ROW-th column from tid: neighbouring threads read
    neighbouring scores.
    """
    largest = np.float32(-math.inf)        # float32 throughout, as on the GPU
    for j in range(start, s.shape[1], step):
        largest = max(largest, s[row, j])
    return largest


@cuda.jit(device=True)
def strided_sum_exp(s, row, start, step, row_max):
    """Sum of exp(s[row, j] - row_max) over the same columns: every term <= exp(0) = 1."""
    partial_sum = np.float32(0.0)
    for j in range(start, s.shape[1], step):
        partial_sum += math.exp(s[row, j] - row_max)
    return partial_sum


@cuda.jit(device=True)
def strided_write(s, out, row, start, step, row_max, inv_total):
    """out[row, j] = exp(s[row, j] - row_max) * inv_total: one division per row, a product per weight."""
    for j in range(start, s.shape[1], step):
        out[row, j] = math.exp(s[row, j] - row_max) * inv_total


@cuda.jit(device=True)
def strided_zeros(out, row, start, step):
    """out[row, j] = 0 over the same columns: a fully masked row attends to nothing."""
    for j in range(start, out.shape[1], step):
        out[row, j] = 0.0


@cuda.jit(device=True)
def block_reduce(partial, value, take_max):
    """The max (take_max) or the sum of `value` over the block's THREADS_PER_ROW threads,
    returned to every thread. partial: (THREADS_PER_ROW,) float32 shared array, overwritten.
    Every thread of the block must call it: it waits at barriers."""
    tid = cuda.threadIdx.x
    partial[tid] = value
    cuda.syncthreads()                     # wait: every thread's value is in `partial`
    stride = THREADS_PER_ROW // 2
    while stride > 0:                      # log2(THREADS_PER_ROW) rounds, halving the active threads
        if tid < stride:                   # slot tid takes in slot tid + stride
            other = partial[tid + stride]
            partial[tid] = max(partial[tid], other) if take_max else partial[tid] + other
        cuda.syncthreads()                 # wait: this round is written before the next reads it
        stride //= 2
    result = partial[0]
    cuda.syncthreads()                     # wait: all have read partial[0] before it is reused
    return result


@cuda.jit(device=True)
def block_max(partial, value):
    """Max of `value` over the block's THREADS_PER_ROW threads, returned to every thread."""
    return block_reduce(partial, value, True)


@cuda.jit(device=True)
def block_sum(partial, value):
    """Sum of `value` over the block's THREADS_PER_ROW threads, returned to every thread."""
    return block_reduce(partial, value, False)


@cuda.jit
def softmax_kernel_v2(s, out):
    """Row softmax with one block of THREADS_PER_ROW threads per row (row = blockIdx.x).

    s: (rows, T_k) float32, -inf for masked scores; out: (rows, T_k) float32, written.
    Thread tid takes columns tid, tid + THREADS_PER_ROW, ...: neighbours read neighbours.
    """
    partial = cuda.shared.array(THREADS_PER_ROW, np.float32)  # one slot per thread, reused
    row, tid = cuda.blockIdx.x, cuda.threadIdx.x
    row_max = block_max(partial, strided_max(s, row, tid, THREADS_PER_ROW))   # pass 1
    if row_max == -math.inf:
        # Every score masked. The test is the same in every thread of the block, so all of
        # them leave here together and none is left waiting at a barrier in block_sum.
        strided_zeros(out, row, tid, THREADS_PER_ROW)
        return
    total = block_sum(partial, strided_sum_exp(s, row, tid, THREADS_PER_ROW, row_max))  # pass 2
    strided_write(s, out, row, tid, THREADS_PER_ROW, row_max, np.float32(1.0) / total)  # pass 3


@cuda.jit
def block_softmax_kernel(s, out):
    """Row softmax with one block of THREADS_PER_ROW threads per row, written as one kernel around
    two calls of block_reduce (notebook 04's main exercise; kernel 2 makes the same walks through the
    strided_* helpers, and leaves early on a fully masked row).

    s: (rows, T_k) float32, -inf for masked scores; out: (rows, T_k) float32, written. Launch on
    softmax_grid(rows, 2): block `row` owns s[row, :], thread tid its columns tid,
    tid + THREADS_PER_ROW, ... A fully masked row gets zeros without leaving early: every thread
    reaches both reductions' barriers.
    """
    partial = cuda.shared.array(THREADS_PER_ROW, np.float32)   # one slot a thread, for both reductions
    row, tid = cuda.blockIdx.x, cuda.threadIdx.x
    largest = np.float32(-math.inf)                            # a thread with no column keeps -inf
    for j in range(tid, s.shape[1], THREADS_PER_ROW):          # a warp reads 32 neighbouring scores
        largest = max(largest, s[row, j])
    row_max = block_reduce(partial, largest, True)             # the row's max, in every thread
    shift = row_max if row_max > -math.inf else np.float32(0.0)    # fully masked: every exp is 0
    total = np.float32(0.0)
    for j in range(tid, s.shape[1], THREADS_PER_ROW):
        total += math.exp(s[row, j] - shift)
    total = block_reduce(partial, total, False)                # the row's sum, in every thread
    inv_total = np.float32(1.0) / total if total > 0 else np.float32(0.0)
    for j in range(tid, s.shape[1], THREADS_PER_ROW):
        out[row, j] = math.exp(s[row, j] - shift) * inv_total


@cuda.jit(device=True)
def merge_stats(m_a, l_a, m_b, l_b):
    """Merge two softmax partials into one: (m, l) with m the larger maximum.

    Each partial is (m, l): m the largest score it has seen, l the sum of exp(s - m) over
    those scores, float32; a single score s is the partial (s, 1). Rescaling each l to the
    common maximum keeps every exponent <= 0. (-inf, 0), a partial that has seen nothing (or
    only masked scores), changes nothing.
    """
    m = max(m_a, m_b)
    if m == -math.inf:                     # both saw only masked scores: -inf - (-inf) is NaN
        return m, np.float32(0.0)
    return m, l_a * math.exp(m_a - m) + l_b * math.exp(m_b - m)


@cuda.jit
def softmax_kernel_v3(s, out):
    """Row softmax with one warp per row: WARPS_PER_BLOCK rows a block of 32 * WARPS_PER_BLOCK.

    s: (rows, T_k) float32, -inf for masked scores; out: (rows, T_k) float32, written.
    Lane `lane` of the row's warp folds columns lane, lane + 32, ... into one pair (m, l) in a
    single pass; the lanes merge their pairs with shuffles, then each writes its columns (zeros in a
    fully masked row, computed through: a warp past the last row is the only one that leaves early).
    """
    row = cuda.blockIdx.x * WARPS_PER_BLOCK + cuda.threadIdx.x // WARP_SIZE
    lane = cuda.threadIdx.x % WARP_SIZE
    if row >= s.shape[0]:
        return                             # the whole warp leaves: no lane waits at a shuffle
    m, l = np.float32(-math.inf), np.float32(0.0)          # the pair that has seen nothing
    for j in range(lane, s.shape[1], WARP_SIZE):           # pass 1: each score read once
        m, l = merge_stats(m, l, s[row, j], np.float32(1.0))
    for step in (16, 8, 4, 2, 1):          # butterfly: lane i merges the pair of lane i ^ step
        m_other = cuda.shfl_xor_sync(FULL_MASK, m, step)
        l_other = cuda.shfl_xor_sync(FULL_MASK, l, step)
        m, l = merge_stats(m, l, m_other, l_other)
    shift = m if m > -math.inf else np.float32(0.0)        # fully masked: every exp is 0, so is l
    inv_total = np.float32(1.0) / l if l > 0 else np.float32(0.0)     # one division a row
    for j in range(lane, s.shape[1], WARP_SIZE):           # pass 2: the weights
        out[row, j] = math.exp(s[row, j] - shift) * inv_total


# --- Launcher ----------------------------------------------------------------------------

KERNELS = {1: softmax_kernel_v1, 2: softmax_kernel_v2, 3: softmax_kernel_v3}


def softmax_grid(rows, version):
    """(grid, block) for `rows` rows: v1 one thread per row, v2 one block per row, v3 one warp
    per row."""
    if version == 1:
        return ceil_div(rows, ROWS_PER_BLOCK), ROWS_PER_BLOCK
    if version == 3:
        return ceil_div(rows, WARPS_PER_BLOCK), WARPS_PER_BLOCK * WARP_SIZE
    return rows, THREADS_PER_ROW


def launch_softmax(kernel, s, out, version):
    """One softmax launch on device arrays: s and out (rows, T_k) float32, out written; `kernel`:
    any with `version`'s signature and thread mapping, launched on softmax_grid."""
    grid, block = softmax_grid(s.shape[0], version)
    kernel[grid, block](s, out)


def softmax(s, version=2, kernel=None):
    """Attention weights: the softmax of each row of s, on the device.

    s: (..., T_q, T_k) float, -inf for masked scores (NaN and +inf are refused)
    -> (..., T_q, T_k) float32; each row >= 0 and summing to 1, or all 0 when fully masked.
    version: 1 (one thread per row), 2 (one block per row) or 3 (one warp per row); kernel: any
    kernel with that version's signature and thread mapping, launched on its grid (a student's,
    for instance).
    """
    check_version(version, KERNELS)
    s = as_float32("s", s, "(..., T_q, T_k)", min_ndim=2, allow_neg_inf=True)
    t_k = s.shape[-1]
    rows = math.prod(s.shape[:-1])
    grid, block = softmax_grid(rows, version)
    check_grid("softmax", grid, x="s's rows")
    check_simulator_budget("softmax", grid * block, 3 * rows * t_k)    # max, exp and sum, divide
    d_s = cuda.to_device(s.reshape(rows, t_k))                # (rows = ... x T_q, T_k)
    d_out = cuda.device_array((rows, t_k), np.float32)
    launch_softmax(KERNELS[version] if kernel is None else kernel, d_s, d_out, version)
    return d_out.copy_to_host().reshape(s.shape)              # (..., T_q, T_k)
