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
from attention_lib.checks.engine import Exercise, assert_guard_intact, guarded_output, launch, register


class Case(NamedTuple):
    """One size tried: x (B, T, n_head * d_k) split into n_head heads of width d_k."""

    B: int
    T: int
    n_head: int
    d_k: int

    def __str__(self):
        return f"(B {self.B}, T {self.T}, n_head {self.n_head}, d_k {self.d_k})"


def _run_split(kernel, case, rng):
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
    full, flat = guarded_output(x.size, ty * (d_k + 1) + tx)
    out = flat.reshape(B, n_head, T, d_k)                          # NaN until written
    grid, block = multihead.head_grid(B * n_head, T, d_k)
    launch(kernel, grid, block, d_x, out)
    assert_guard_intact(full, x.size)
    return out.copy_to_host(), reference.split_heads(x, n_head), x, n_head


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
