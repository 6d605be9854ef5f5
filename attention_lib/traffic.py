"""Main-memory traffic of attention, counted: the stage-by-stage pipeline against the fused kernel.

The formulas of the fused kernel's own traffic (``flash.flash_traffic``) and of its causal tile
skipping (``flash.flash_tile_counts``) live beside the kernels in ``stages/flash.py``. This module
holds what needs the unfused pipeline or the sanitizer:

- ``pipeline_traffic``: the pipeline's accesses, stage by stage, as a formula.
- ``count_pipeline``: the pipeline's kernels run one by one under ``sanitizer.count_memory``.
- ``count_fused``: the fused kernel run once under ``sanitizer.count_memory``.

tests/test_flash.py checks that every formula equals its count.
"""

import numpy as np

from attention_lib import sanitizer
from attention_lib.launch import ceil_div
from attention_lib.stages import flash, mask, scores, softmax, weighted_sum


def pipeline_traffic(t_q, t_k, d_k, d_v=None, causal=True):
    """Global-memory accesses of one head in ``attention.attention``'s pipeline, as count_memory
    counts them: {stage: (loads, stores)} in elements (4 bytes each).

    scores: the tiled scores kernel (mask_kernel_v2 when causal: tiles wholly above the diagonal
    load nothing); a tile reads its rows of q and of k once; every score is written. softmax:
    every score read three times (max, sum, normalise; once for a row that sees no key), every
    weight written once. weighted_sum: the tiled product reads each weight once per tile of
    columns of v, each element of v once per tile of queries, and writes the output.
    """
    d_v = d_k if d_v is None else d_v
    tile, ws_tile = scores.TILE, weighted_sum.TILE
    q_loads = k_loads = 0
    for _, rows, tiles in flash.block_key_tiles(t_q, t_k, causal, tile, tile):
        q_loads += tiles * rows * d_k                       # the row block's q, once per tile
        k_loads += min(t_k, tiles * tile) * d_k             # whole key tiles, the last one short
    seeing = sum(flash.visible_count(i, t_q, t_k, causal) > 0 for i in range(t_q))   # rows with a key
    return {
        "scores": (q_loads + k_loads, t_q * t_k),
        "softmax": ((3 * seeing + (t_q - seeing)) * t_k, t_q * t_k),
        "weighted_sum": (t_q * t_k * ceil_div(d_v, ws_tile) + t_k * d_v * ceil_div(t_q, ws_tile),
                         t_q * d_v),
    }


def count_pipeline(q, k, v, causal=True):
    """Run the pipeline of ``attention.launch_attention`` kernel by kernel under count_memory.

    q: (BH, T_q, d_k), k: (BH, T_k, d_k), v: (BH, T_k, d_v) float32 NumPy arrays
    -> ({stage: MemoryReport}, out (BH, T_q, d_v)). The same kernels, grids and order as
    attention.launch_attention, except that the softmax is always version 1: both versions
    read every score three times and write every weight once (tests/test_softmax.py), and
    version 1 has no barriers, so it is far cheaper to simulate on a GPU machine, where the
    pipeline itself uses version 2. The scores and weights are ordinary arrays here, so every
    access to them is counted.
    """
    (bh, t_q, d_k), (t_k, d_v) = q.shape, v.shape[1:]
    s = np.empty((bh, t_q, t_k), np.float32)
    a = np.empty((bh, t_q, t_k), np.float32)
    out = np.empty((bh, t_q, d_v), np.float32)
    score_kernel = mask.mask_kernel_v2 if causal else scores.scores_kernel_v2
    reports = {
        "scores": sanitizer.count_memory(score_kernel, *scores.score_grid(bh, t_q, t_k), q, k,
                                         scores.scale_factor(d_k), s),
        "softmax": sanitizer.count_memory(softmax.softmax_kernel_v1, *softmax.softmax_grid(bh * t_q, 1),
                                          s.reshape(bh * t_q, t_k), a.reshape(bh * t_q, t_k)),
        "weighted_sum": sanitizer.count_memory(weighted_sum.weighted_sum_kernel_v2,
                                               *weighted_sum.weighted_sum_grid(bh, t_q, d_v), a, v, out),
    }
    return reports, out


def count_fused(q, k, v, causal=True, version=2):
    """Run the fused kernel once under count_memory: q (BH, T_q, d_k), k (BH, T_k, d_k),
    v (BH, T_k, d_v) float32 NumPy arrays -> (MemoryReport, out (BH, T_q, d_v)); the report
    also counts the log-sum-exp `lse` (BH, T_q) the kernel writes."""
    (bh, t_q, d_k), d_v = q.shape, v.shape[2]
    out = np.empty((bh, t_q, d_v), np.float32)
    lse = np.empty((bh, t_q), np.float32)
    kernel = flash.make_flash_v3(d_k) if version == 3 else flash.KERNELS[version]
    report = sanitizer.count_memory(kernel, *flash.flash_grid(bh, t_q, version, d_k), q, k, v,
                                    flash.flash_scale(version, d_k), bool(causal), out, lse)
    return report, out
