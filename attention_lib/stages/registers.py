"""Notebook 10's stage: registers or local memory; and the work a kernel cannot avoid (deep dive 10x).

Unscaled scores out[i, j] = q[i] . k[j], one thread per query row, its row of q kept in a
``cuda.local.array`` so that q is read from main memory once per row instead of once per key.

Where that array lives is the compiler's choice, which the kernel report shows (no GPU needed):
registers have no addresses, so an array can live in registers only if every index into it is
known when the kernel is compiled, which loops over a module-level constant give once the
compiler has unrolled them. Indexed by a bound only the launch knows (``q.shape[1]``), it stays
in local memory: per-thread device memory (DRAM, cached in L1 and L2), one load per use.

- NumPy reference: ``attention_lib.reference.scores(q, k, scale=False)``.
- ``row_scores_kernel_v1``: the loops bounded by ``q.shape[1]``: the array in local memory (the
  kernel report, ptxas for sm_90: a stack frame of 4 D bytes; the exercise's given kernel).
- ``row_scores_kernel_v2``: the loops bounded by D: the array in registers (the kernel report: a
  0-byte stack frame; the warm-up's solution). Each multiply-add still loads its element of k from main memory.
- ``row_scores_kernel_v3``: v2 with k staged through shared memory, a tile of ROWS_PER_BLOCK keys
  a step, so that a block reads each element of k from main memory once instead of once per row
  (the main exercise's solution); q_row stays in registers (the kernel report: a 0-byte stack
  frame, as v2's; tests/test_exercises_10.py holds both).
- ``KERNELS``, ``row_scores_grid``, ``launch_row_scores``, ``row_scores(q, k, version=2)``;
  ``row_scores_traffic``: global loads and stores, as ``sanitizer.count_memory`` counts them.
- ``ideal_work(kernel, s)``: the FLOPs and the ideal bytes (every element of every array read or
  written once) of one launch of the softmax, fused attention or a decode step (deep dive 10x's
  exercise; its check counts the bytes with the sanitizer).
"""

import numpy as np
from numba import cuda, float32

from attention_lib.platform.launch import ceil_div, check_grid, check_simulator_budget, check_version
from attention_lib.platform.validation import as_float32, require

# The head width: a module-level constant, so that a loop over it has a bound the compiler knows
# (ANDREA-120M's d_k on both backends: the rows are short enough for the simulator).
D = 64
# Query rows (threads) per block: one warp.
ROWS_PER_BLOCK = 32


# --- Kernels -----------------------------------------------------------------------------

@cuda.jit
def row_scores_kernel_v1(q, k, out):
    """out[i, j] = q[i] . k[j]; q (T_q, D), k (T_k, D), out (T_q, T_k) float32; thread i = row i."""
    i = cuda.grid(1)
    if i >= q.shape[0]:
        return
    q_row = cuda.local.array(D, float32)
    for c in range(q.shape[1]):
        q_row[c] = q[i, c]
    for j in range(k.shape[0]):
        acc = float32(0.0)
        for c in range(q.shape[1]):
            acc += q_row[c] * k[j, c]
        out[i, j] = acc


@cuda.jit
def row_scores_kernel_v2(q, k, out):
    """out[i, j] = q[i] . k[j]; q (T_q, D), k (T_k, D), out (T_q, T_k) float32; thread i = row i."""
    i = cuda.grid(1)
    if i >= q.shape[0]:
        return
    q_row = cuda.local.array(D, float32)    # this thread's row of q: registers (report: 0 B of stack)
    for c in range(D):                  # a bound the compiler knows: the loop unrolls, indices are constants
        q_row[c] = q[i, c]
    for j in range(k.shape[0]):
        acc = float32(0.0)
        for c in range(D):
            acc += q_row[c] * k[j, c]
        out[i, j] = acc


@cuda.jit
def row_scores_kernel_v3(q, k, out):
    """out[i, j] = q[i] . k[j]; q (T_q, D), k (T_k, D), out (T_q, T_k) float32; thread i = row i."""
    q_row = cuda.local.array(D, float32)                       # this thread's row of q: registers (report: 0 B of stack)
    k_tile = cuda.shared.array((ROWS_PER_BLOCK, D), float32)   # a tile of as many keys as rows: 8 KB
    i = cuda.grid(1)
    for c in range(D):
        q_row[c] = q[i, c] if i < q.shape[0] else float32(0.0)
    for j0 in range(0, k.shape[0], ROWS_PER_BLOCK):
        for e in range(cuda.threadIdx.x, min(ROWS_PER_BLOCK, k.shape[0] - j0) * D, ROWS_PER_BLOCK):
            k_tile[e // D, e % D] = k[j0 + e // D, e % D]       # lanes side by side along a key's row
        cuda.syncthreads()                                     # the tile is full before any row reads it
        for j in range(j0, min(j0 + ROWS_PER_BLOCK, k.shape[0]) if i < q.shape[0] else j0):   # none past T_q
            acc = float32(0.0)
            for c in range(D):
                acc += q_row[c] * k_tile[j - j0, c]            # every lane reads one slot: a broadcast
            out[i, j] = acc
        cuda.syncthreads()                                     # every row is done before the next copy


KERNELS = {1: row_scores_kernel_v1, 2: row_scores_kernel_v2, 3: row_scores_kernel_v3}


# --- Launchers ---------------------------------------------------------------------------

def row_scores_grid(t_q):
    """(grid, block): one thread per query row, ROWS_PER_BLOCK to a block."""
    return ceil_div(t_q, ROWS_PER_BLOCK), ROWS_PER_BLOCK


def launch_row_scores(kernel, q, k, out):
    """One launch on device arrays q (T_q, D), k (T_k, D) -> out (T_q, T_k) float32, written."""
    kernel[row_scores_grid(q.shape[0])](q, k, out)


def row_scores(q, k, version=2, kernel=None):
    """q k^T, unscaled, one thread per query row: q (T_q, D), k (T_k, D) float -> (T_q, T_k)
    float32. The kernels are compiled for D = 64 columns; other widths are refused (a kernel
    looping over D would read past a narrower row). kernel: any with the version's signature."""
    check_version(version, KERNELS)
    q = as_float32("q", q, f"(T_q, {D})", min_ndim=2)
    k = as_float32("k", k, f"(T_k, {D})", min_ndim=2)
    require(q.ndim == 2 and q.shape[1] == D, f"q must have shape (T_q, {D}) (D, the compiled width); got {q.shape}")
    require(k.ndim == 2 and k.shape[1] == D, f"k must have shape (T_k, {D}) (D, the compiled width); got {k.shape}")
    grid, block = row_scores_grid(q.shape[0])
    check_grid("row_scores", (grid,), x="q's T_q in blocks of 32 rows")
    check_simulator_budget("row_scores", grid * block, q.shape[0] * k.shape[0] * D)
    out = cuda.device_array((q.shape[0], k.shape[0]), np.float32)
    launch_row_scores(KERNELS[version] if kernel is None else kernel, cuda.to_device(q), cuda.to_device(k), out)
    return out.copy_to_host()


# --- Costs -------------------------------------------------------------------------------

def row_scores_traffic(t_q, t_k, version=2):
    """Global accesses of a kernel, in float32 elements: {"q": loads, "k": loads, "out": stores}.
    q is read once per row (the local array holds it). In versions 1 and 2 every multiply-add reads
    its element of k, so k is read once per query row, T_q times; version 3 reads it once per block
    of ROWS_PER_BLOCK rows, from its tile in shared memory after that."""
    check_version(version, KERNELS)
    readers = ceil_div(t_q, ROWS_PER_BLOCK) if version == 3 else t_q
    return {"q": t_q * D, "k": readers * t_k * D, "out": t_q * t_k}


def row_scores_flops(t_q, t_k):
    """2 FLOPs per multiply-add."""
    return 2 * t_q * t_k * D



# --- The work a kernel cannot avoid (deep dive 10x's exercise) -------------------------------

def ideal_work(kernel, s):
    """(FLOPs, ideal bytes) of one launch of `kernel` at sizes `s` (B, H, T, d_k; BH = B * H).

    kernel: "softmax" (the rows of BH heads' T x T causally masked scores -> their weights),
    "flash" (causal attention of BH heads: q, k, v (BH, T, d_k) -> out (BH, T, d_k) and the lse
    (BH, T)) or "decode" (one query per head, q (BH, d_k), against caches of T keys and values
    (BH, T, d_k) -> out (BH, d_k)). FLOPs: 2 per multiply-add, 1 per other float operation, so 5 per
    softmax score; a visible (query, key) pair of attention costs two products of d_k multiply-adds
    and the softmax of its score. Ideal bytes: every element of every array the kernel reads or
    writes, once, float32.
    """
    if kernel == "softmax":
        scores = s.BH * s.T * s.T                      # every score of every row, the masked ones too
        return 5 * scores, 4 * (scores + scores)       # 4 bytes a float32: each read once, written once
    if kernel == "flash":
        pairs = s.BH * s.T * (s.T + 1) // 2            # query i sees keys 0 .. i
        rows = s.BH * s.T * s.d_k                      # the elements of one (BH, T, d_k) array
        return (2 * 2 * s.d_k + 5) * pairs, 4 * (4 * rows + s.BH * s.T)     # q, k, v, out; the lse
    if kernel == "decode":
        keys = s.BH * s.T                              # the query of each head sees every cached key
        cached = keys * s.d_k                          # the K cache (the V cache is as large)
        return (2 * 2 * s.d_k + 5) * keys, 4 * (2 * cached + 2 * s.BH * s.d_k)      # both caches; q and out
    raise ValueError(f"kernel must be 'softmax', 'flash' or 'decode', got {kernel!r}")
