"""Notebook 06's exercise: the head-split kernel, out[b, h, t, c] = x[b, t, h*d_k + c].

The answer has split_heads_kernel's signature ``(x, out)``, x (B, T, d_model) and out
(B, n_head, T, d_k) float32, and is launched on the library's grid (``multihead.head_grid``:
x along c, y along t, z along b * n_head + h). A split is a copy, so the values must be exact.
Besides the engine's diagnoses:

- ``heads_interleaved``: head h got columns h, h + n_head, h + 2 n_head, ... instead of the
  block h*d_k .. (h+1)*d_k - 1, the result of reshaping the model axis to (d_k, n_head) instead
  of (n_head, d_k) (``x.reshape(T, d_k, n_head)`` in NumPy, ``x[b, t, c * n_head + h]`` in a kernel).
"""

from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.stages import multihead
from attention_lib.checks.engine import Exercise, output_array, read_output, register


class Case(NamedTuple):
    """One size tried: x (B, T, n_head * d_k) split into n_head heads of width d_k."""

    B: int
    T: int
    n_head: int
    d_k: int

    def __str__(self):
        return f"(B {self.B}, T {self.T}, n_head {self.n_head}, d_k {self.d_k})"


def _run_split(kernel, case, rng, launch):
    B, T, n_head, d_k = case
    d_model = n_head * d_k
    x = rng.standard_normal((B, T, d_model)).astype(np.float32)
    tx, ty = multihead.BLOCK
    # Guard zones behind the input and the output: an unguarded thread of the last block reaches
    # fewer than ty rows (of d_model in x, of d_k in out) plus tx columns past the end. On a GPU
    # the reads stay inside the allocation and the writes are caught; on the simulator the index
    # is caught first.
    d_x_full = cuda.to_device(np.concatenate([x.ravel(), np.zeros(ty * (d_model + 1) + tx, np.float32)]))
    d_x = d_x_full[:x.size].reshape(B, T, d_model)                # (B, T, d_model) view
    full, out = output_array((B, n_head, T, d_k), guard=ty * (d_k + 1) + tx)
    grid, block = multihead.head_grid(B * n_head, T, d_k)
    launch(kernel, grid, block, d_x, out)
    return read_output(full, out), reference.split_heads(x, n_head), x, n_head


def _diagnose(got, expected, x, n_head):
    """Name the interleaved split; None for any other mistake (the engine shows where)."""
    B, T, d_model = x.shape
    d_k = d_model // n_head
    interleaved = x.reshape(B, T, d_k, n_head).transpose(0, 3, 1, 2)   # head h: columns h, h + n_head, ...
    if np.array_equal(got, interleaved):
        return "heads_interleaved", (
            f"head h got columns h, h + {n_head}, h + {2 * n_head}, ... (every n_head-th column); "
            f"a head is a contiguous block: head h holds columns h*d_k .. h*d_k + d_k - 1, "
            f"so read x[b, t, h * d_k + c] (the model axis is (n_head, d_k), not (d_k, n_head))")
    return None


register(Exercise(
    exercise_id="06_split_heads",
    title="out[b, h, t, c] = x[b, t, h*d_k + c], one thread per element, all heads in one launch",
    kind="kernel",
    run=_run_split,
    # One element; 3 heads of 5 over 7 positions (less than a block, d_k not a power of two);
    # a batch of 2 with T 17 (a partly used second block down); d_k 20 (a second block across).
    # Every case after the first has several heads, so an interleaved split differs from the right one.
    cases=[Case(1, 1, 1, 1), Case(1, 7, 3, 5), Case(2, 17, 4, 6), Case(1, 5, 2, 20)],
    hint=("one thread per output element: the grid's x and y cover a head's components and positions, its "
          "z axis every (sequence, head) pair; head h owns the h-th block of d_k columns of x"),
    more_hints=("where answers go wrong: taking a head's columns one every n_head (the wrong reshape order), "
                "splitting the z index into sequence and head the wrong way round, and threads of the edge "
                "blocks that fall outside the output",),
    rtol=0.0,   # a split moves values, it computes none: every entry must be exact
    atol=0.0,
    diagnose=_diagnose,
    diagnoses=('heads_interleaved',),
))


# --- The main exercise: the three splits of the fused projection in one launch -------------------
# launch_layer splits Q, K and V out of the fused projection's (B, T, 3 * d_model) result with
# three launches of split_heads_kernel on strided views. The answer does all three at once:
# signature ``(qkv, out)``, qkv (B, T, 3 * d_model) = [Q | K | V] along the last axis, out
# (3, B, n_head, T, d_k), out[p, b, h, t, c] = qkv[b, t, p * d_model + h * d_k + c] (p = 0, 1, 2
# for Q, K, V), launched on head_grid(3 * B * n_head, T, d_k): grid layer z = (p * B + b) * n_head + h.
# Besides the engine's diagnoses:
#
# - ``heads_interleaved``: within each part, head h took every n_head-th column;
# - ``parts_not_offset``: the part p was not used to offset the column (Q three times);
# - ``qkv_per_head_layout``: read the per-head layout [q_h | k_h | v_h] (column h * 3 d_k + p * d_k + c)
#   that some checkpoints use, not the [Q | K | V] layout of the fused projection.

def _expected_qkv(qkv, n_head, column):
    """out (3, B, n_head, T, d_k) with out[p, b, h, t, c] = qkv[b, t, column(p, h, c)]."""
    B, T, width = qkv.shape
    d_k = width // (3 * n_head)
    p, h, c = np.meshgrid(np.arange(3), np.arange(n_head), np.arange(d_k), indexing="ij")
    picked = qkv[:, :, column(p, h, c, d_k, n_head)]                  # (B, T, 3, n_head, d_k)
    return picked.transpose(2, 0, 3, 1, 4)


def _fused_layout(p, h, c, d_k, n_head):
    return p * n_head * d_k + h * d_k + c


def _run_split_qkv(kernel, case, rng, launch):
    B, T, n_head, d_k = case
    d_model = n_head * d_k
    qkv = rng.standard_normal((B, T, 3 * d_model)).astype(np.float32)
    tx, ty = multihead.BLOCK
    # Guard zones as for the plain split: an unguarded thread reaches fewer than ty rows plus tx
    # columns past the end of either array.
    d_in_full = cuda.to_device(np.concatenate([qkv.ravel(), np.zeros(ty * (3 * d_model + 1) + tx, np.float32)]))
    d_in = d_in_full[:qkv.size].reshape(B, T, 3 * d_model)
    full, out = output_array((3, B, n_head, T, d_k), guard=ty * (d_k + 1) + tx)
    grid, block = multihead.head_grid(3 * B * n_head, T, d_k)
    launch(kernel, grid, block, d_in, out)
    return read_output(full, out), _expected_qkv(qkv, n_head, _fused_layout), qkv, n_head


def _diagnose_split_qkv(got, expected, qkv, n_head):
    alternatives = [
        ("heads_interleaved", lambda p, h, c, d_k, n: p * n * d_k + c * n + h,
         "within Q, K and V head h got every n_head-th column; head h is the contiguous block of d_k "
         "columns that starts at h * d_k inside its part"),
        ("parts_not_offset", lambda p, h, c, d_k, n: h * d_k + c,
         "the three parts all came from the first d_model columns (Q): part p starts p * d_model columns "
         "further along the last axis"),
        ("qkv_per_head_layout", lambda p, h, c, d_k, n: h * 3 * d_k + p * d_k + c,
         "the columns were read as [q_h | k_h | v_h] head by head; the fused projection's layout is "
         "[Q | K | V], each part d_model wide and holding every head"),
    ]
    for code, column, message in alternatives:
        if np.array_equal(got, _expected_qkv(qkv, n_head, column)):
            return code, message
    return None


register(Exercise(
    exercise_id="06_split_qkv",
    title="out[p, b, h, t, c] = qkv[b, t, p*d_model + h*d_k + c]: Q, K and V split in one launch",
    kind="kernel",
    run=_run_split_qkv,
    # One element of each part first; then sizes that are no multiple of the 16 x 16 block, a
    # batch of 2 (the grid's z then mixes part, sequence and head), and a head two blocks wide.
    cases=[Case(1, 1, 1, 1), Case(1, 7, 3, 5), Case(2, 17, 4, 6), Case(1, 5, 2, 20)],
    describe_case=str,
    hint=("one thread per output element, as in the plain split; the grid's z axis now carries three "
          "things, the part (Q, K or V), the sequence and the head, and the column of the fused result "
          "adds one offset per thing"),
    more_hints=("where answers go wrong: recovering part, sequence and head from the grid layer in a "
                "different order than the launch built it, forgetting the part's offset of d_model columns, "
                "and threads of the edge blocks that fall outside the output",),
    rtol=0.0,   # a split moves values, it computes none: every entry must be exact
    atol=0.0,
    diagnose=_diagnose_split_qkv,
    diagnoses=("heads_interleaved", "parts_not_offset", "qkv_per_head_layout"),
))
