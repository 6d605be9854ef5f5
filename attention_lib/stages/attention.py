"""Scaled dot-product attention (notebook 05), softmax(mask(q k^T / sqrt(d_k))) v, assembled from the stage
kernels in three launches, the scores and weights kept on the device between them. The file:

- ``SOFTMAX_VERSION``: the pipeline's softmax kernel (2 on a GPU, 1 on the simulator).
- On device arrays: ``share_kv_heads`` (grouped-query attention: each key/value head copied for
  the query heads of its group, as the stage kernels read one head per grid layer; the pipeline
  saves no reads by GQA, the fused kernel and the cache do), ``launch_masked_scores`` (scores,
  or the causal scores of ``mask.causal_scores_kernel``), ``launch_row_softmax``,
  ``launch_weights`` and ``launch_attention`` (the weighted sum, ``weighted_sum_causal_kernel``
  when causal), each through its stage's ``launch_*``.
- Launchers ``attention(q, k, v, causal=True)`` and ``attention_weights(q, k, causal=True)``,
  NumPy in and out; ``pipeline_madds``, the simulator budget's work.

Layout as PyTorch's ``scaled_dot_product_attention``: q (..., T_q, d_k), k (..., T_k, d_k),
v (..., T_k, d_v); under GQA H query heads and H_kv key/value heads on axis -3, query head h
reading h // (H // H_kv) (``enable_gqa``). Causal with T_q != T_k: the queries are the last T_q
positions (``reference.causal_mask``); a query that sees no key gets zeros, never NaN.
"""

import math

import numpy as np
from numba import cuda

from attention_lib.stages import mask, scores, softmax, weighted_sum
from attention_lib.platform.launch import check_simulator_budget
from attention_lib.platform.runtime import SIMULATOR_SHAPES
from attention_lib.platform.validation import attention_inputs, require, require_finite_result

# Softmax kernel of the pipeline. On a GPU version 2 (a block per row, coalesced reads). On the
# simulator version 1 (a thread per row): version 2 starts 32 threads per row and waits at 14
# barriers, 0.55 s for ANDREA-sim's 4 x 32 rows against 0.02 s (measured on the simulator, 2-core
# machine). Both give the same weights to float32 rounding (tests/test_attention.py runs the
# pipeline with each).
SOFTMAX_VERSION = 1 if SIMULATOR_SHAPES else 2


# --- The pipeline on device arrays -------------------------------------------------------

def share_kv_heads(kv, bh):
    """Device array kv (BH_kv, T_k, d) -> (bh, T_k, d), head h a copy of kv[h // (bh / BH_kv)]:
    the stage kernels read one head per grid layer, so under grouped-query attention each key
    or value head is copied for the query heads of its group (device-to-device, never through
    the host). kv itself when BH_kv = bh. The fused kernel reads the shared head instead."""
    group = bh // kv.shape[0]
    if group == 1:
        return kv
    shared = cuda.device_array((bh, *kv.shape[1:]), np.float32)
    for h in range(bh):
        shared[h].copy_to_device(kv[h // group])
    return shared


def launch_masked_scores(q, k, causal):
    """mask(q k^T / sqrt(d_k)) on device arrays: q (BH, T_q, d_k), k (BH, T_k, d_k) float32
    -> a new device array (BH, T_q, T_k) float32, -inf above the diagonal when causal."""
    (bh, t_q, d_k), t_k = q.shape, k.shape[1]
    s = cuda.device_array((bh, t_q, t_k), np.float32)            # scores, never copied back
    score_kernel = mask.causal_scores_kernel if causal else scores.scores_kernel_v2
    scores.launch_scores(score_kernel, q, k, scores.scale_factor(d_k), s)
    return s


def launch_row_softmax(s):
    """The softmax of every row of the device array s (BH, T_q, T_k) float32 -> a new one, same shape."""
    bh, t_q, t_k = s.shape
    a = cuda.device_array((bh, t_q, t_k), np.float32)
    # The softmax kernels see rows: (BH * T_q, T_k) views of the same memory, no copy.
    softmax.launch_softmax(softmax.KERNELS[SOFTMAX_VERSION], s.reshape(bh * t_q, t_k),
                           a.reshape(bh * t_q, t_k), SOFTMAX_VERSION)
    return a


def launch_weights(q, k, causal):
    """softmax(mask(q k^T / sqrt(d_k))) on device arrays: q (BH, T_q, d_k), k (BH, T_k, d_k)
    float32 -> a new device array (BH, T_q, T_k) float32. No checks: ``attention`` makes them."""
    return launch_row_softmax(launch_masked_scores(q, k, causal))


def launch_attention(q, k, v, causal):
    """The whole pipeline on device arrays: q (BH, T_q, d_k), k (BH, T_k, d_k), v (BH, T_k, d_v)
    float32 -> a new device array (BH, T_q, d_v) float32."""
    a = launch_weights(q, k, causal)                             # (BH, T_q, T_k), on the device
    out = cuda.device_array((q.shape[0], q.shape[1], v.shape[2]), np.float32)
    weighted_sum.launch_weighted_sum(a, v, out, causal=causal)   # (BH, T_q, T_k) @ (BH, T_k, d_v)
    return out


# --- Launchers ---------------------------------------------------------------------------

def _flatten(q, k, v, causal, what, share_kv=False):
    """Validate the inputs; returns (q3, k3, v3, leading shape), each (BH or BH_kv, T, ...) float32.

    share_kv: accept grouped-query shapes, k and v with fewer heads than q on axis -3 (then
    k3 and v3 have BH_kv heads); otherwise their leading axes must equal q's.
    """
    require(isinstance(causal, (bool, np.bool_)), f"causal must be True or False, got {causal!r}")
    q3, k3, v3, lead, group = attention_inputs(q, k, v)          # checks q, k and v, shapes and values
    require(share_kv or group == 1, f"k must have the leading axes of q {lead}; got shape {np.shape(k)}")
    (bh, t_q, d_k), t_k = q3.shape, k3.shape[1]
    scores.check_score_launch(what, bh, t_q, t_k, d_k)
    if v3 is None:                                               # attention_weights: no values
        return q3, k3, None, lead
    d_v = v3.shape[2]
    # The three launches together: scores and softmax over (BH, T_q, T_k), the weighted sum.
    threads = (math.prod(scores.score_grid(bh, t_q, t_k)[0]) * scores.TILE ** 2
               + math.prod(softmax.softmax_grid(bh * t_q, SOFTMAX_VERSION))
               + math.prod(weighted_sum.weighted_sum_grid(bh, t_q, d_v)[0]) * weighted_sum.TILE ** 2)
    check_simulator_budget(what, threads, pipeline_madds(bh, t_q, t_k, d_k, d_v))
    return q3, k3, v3, lead


def pipeline_madds(bh, t_q, t_k, d_k, d_v):
    """Multiply-adds of launch_attention, for the simulator's budget: the scores, the softmax's
    three passes over each row and the weighted sum."""
    return bh * t_q * t_k * (d_k + 3 + d_v)


def attention_weights(q, k, causal=True):
    """The attention weights softmax(mask(q k^T / sqrt(d_k))) of ``attention``'s pipeline.

    q: (..., T_q, d_k) float; k: (..., T_k, d_k) float, the same leading axes (or fewer heads on
    axis -3, as in ``attention``) -> (..., T_q, T_k) float32: each row >= 0 and summing to 1
    (0 for a query that sees no key).
    """
    q3, k3, _, lead = _flatten(q, k, None, causal, "attention_weights", share_kv=True)
    k_shared = share_kv_heads(cuda.to_device(k3), q3.shape[0])           # (BH, T_k, d_k)
    a = launch_weights(cuda.to_device(q3), k_shared, causal)
    a = a.copy_to_host().reshape(*lead, q3.shape[1], k3.shape[1])       # (..., T_q, T_k)
    return require_finite_result("attention_weights", a, "q or k")


def attention(q, k, v, causal=True):
    """Scaled dot-product attention of one or many heads, on the device.

    q: (..., T_q, d_k) float; k: (..., T_k, d_k) float; v: (..., T_k, d_v) float, the same
    leading axes (batch, heads), except that k and v may have H_kv heads on axis -3 where q has
    H, H a multiple of H_kv (grouped-query attention) -> (..., T_q, d_v) float32. causal: query i sees only keys
    j <= i + (T_k - T_q) (the queries are the last T_q positions); False for an encoder, where
    every query sees every key.
    """
    q3, k3, v3, lead = _flatten(q, k, v, causal, "attention", share_kv=True)
    k_shared, v_shared = (share_kv_heads(cuda.to_device(a), q3.shape[0]) for a in (k3, v3))   # (BH, T_k, d)
    out = launch_attention(cuda.to_device(q3), k_shared, v_shared, causal)
    out = out.copy_to_host().reshape(*lead, q3.shape[1], v3.shape[2])   # (..., T_q, d_v)
    return require_finite_result("attention", out, "q, k or v")
