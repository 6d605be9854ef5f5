"""Main-memory traffic of attention, counted: the stage-by-stage pipeline against the fused kernel.

The formulas of the fused kernel's own traffic (``flash.flash_traffic``) and of its causal tile
skipping (``flash.flash_tile_counts``) live beside the kernels in ``stages/flash.py``. This module
holds what needs the unfused pipeline or the sanitizer:

- ``pipeline_traffic``: the pipeline's accesses, stage by stage, as a formula.
- ``count_pipeline``: the pipeline's kernels run one by one under ``sanitizer.count_memory``.
- ``count_fused``: the fused kernel run once under ``sanitizer.count_memory``.
- ``count_backward_naive``, ``count_backward_fused``: the two backwards' launches, counted the same
  way (notebook 11).

tests/test_flash.py checks that every formula equals its count.

For the bench (``attention_lib.measure.bench``), where counted traffic is every global load and store a
launch requests as if there were no cache (on a GPU the caches absorb part of it; only a time can
say how much): ``BENCH_FORMULAS`` predicts the counts of each entry from the stage modules' own
cost formulas; ``count_entry`` totals the counted launches of one entry and compares them with
its formula (``bench.formula_results`` uses the same formulas at sizes the simulator cannot run).
tests/test_bench.py checks those.
"""

import numpy as np

from attention_lib.measure import sanitizer
from attention_lib.platform.launch import ceil_div
from attention_lib.stages import backward, flash, mask, scores, softmax, weighted_sum


def pipeline_traffic(t_q, t_k, d_k, d_v=None, causal=True):
    """Global-memory accesses of one head in ``attention.attention``'s pipeline, as count_memory
    counts them: {stage: (loads, stores)} in elements (4 bytes each).

    scores: the tiled scores kernel (causal_scores_kernel when causal: tiles wholly above the diagonal
    load nothing); a tile reads its rows of q and of k once; every score is written. softmax:
    every score read three times (max, sum, normalise; once for a row that sees no key), every
    weight written once. weighted_sum: the tiled product reads each weight once per tile of
    columns of v, each element of v once per tile of queries, and writes the output.
    """
    d_v = d_k if d_v is None else d_v
    tile, ws_tile = scores.TILE, weighted_sum.TILE
    q_loads = k_loads = 0
    for _, rows, tiles in mask.block_key_tiles(t_q, t_k, causal, tile, tile):
        q_loads += tiles * rows * d_k                       # the row block's q, once per tile
        k_loads += min(t_k, tiles * tile) * d_k             # whole key tiles, the last one short
    seeing = sum(mask.visible_count(i, t_q, t_k, causal) > 0 for i in range(t_q))   # rows with a key
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
    attention.launch_attention, except that the softmax is always version 1: it and version 2
    read every score three times and write every weight once (tests/test_softmax.py), and
    version 1 has no barriers, so it is far cheaper to simulate on a GPU machine, where the
    pipeline itself uses version 2. The scores and weights are ordinary arrays here, so every
    access to them is counted.
    """
    (bh, t_q, d_k), (t_k, d_v) = q.shape, v.shape[1:]
    s = np.empty((bh, t_q, t_k), np.float32)
    a = np.empty((bh, t_q, t_k), np.float32)
    out = np.empty((bh, t_q, d_v), np.float32)
    score_kernel = mask.causal_scores_kernel if causal else scores.scores_kernel_v2
    reports = {
        "scores": sanitizer.count_memory(score_kernel, *scores.score_grid(bh, t_q, t_k), q, k,
                                         scores.scale_factor(d_k), s),
        "softmax": sanitizer.count_memory(softmax.softmax_kernel_v1, *softmax.softmax_grid(bh * t_q, 1),
                                          s.reshape(bh * t_q, t_k), a.reshape(bh * t_q, t_k)),
        "weighted_sum": sanitizer.count_memory(weighted_sum.weighted_sum_kernel_v2,
                                               *weighted_sum.weighted_sum_grid(bh, t_q, d_v), a, v, out),
    }
    return reports, out


def count_fused(q, k, v, causal=True, version=2, window=None):
    """Run the fused kernel once under count_memory: q (BH, T_q, d_k), k (BH_kv, T_k, d_k),
    v (BH_kv, T_k, d_v) float32 NumPy arrays, BH_kv = BH or a divisor (grouped-query attention),
    window a sliding window or None -> (MemoryReport, out (BH, T_q, d_v)); the report also
    counts the log-sum-exp `lse` (BH, T_q) the kernel writes."""
    (bh, t_q, d_k), d_v = q.shape, v.shape[2]
    group = bh // k.shape[0]
    out = np.empty((bh, t_q, d_v), np.float32)
    lse = np.empty((bh, t_q), np.float32)
    kernel = flash.fused_kernel(version, t_q, group, d_k)
    grid, block, nbytes = flash.launch_config(kernel, version, bh, t_q, d_k, group)
    report = sanitizer.count_memory(kernel, grid, block, q, k, v, flash.flash_scale(version, d_k), bool(causal),
                                    np.int32(window or 0), np.int32(group), out, lse, sharedmem=nbytes)
    return report, out


# --- The bench's entries: formulas and counts --------------------------------------------

BYTES = 4                                   # float32


def _projection(version):
    def formula(m, s):
        d_out = 3 * s.d_model
        x_reads, w_reads = m.global_reads(s.rows, d_out, version)
        return s.rows * s.d_model * x_reads + s.d_model * d_out * w_reads, s.rows * d_out
    return formula


def _scores(version):
    def formula(m, s):
        if version == 1:                                # every score reads a row of q and of k
            return 2 * s.BH * s.T * s.T * s.d_k, s.BH * s.T * s.T
        return 2 * s.BH * s.T * s.d_k * ceil_div(s.T, m.TILE), s.BH * s.T * s.T   # once per tile
    return formula


def _mask(version):
    def formula(m, s):
        if version == 1:                                # writes the future, reads nothing
            return 0, s.BH * (s.T * s.T - s.T * (s.T + 1) // 2)
        loads = 0
        for r0 in range(0, s.T, m.TILE):                # tiles wholly in the future load nothing
            rows = min(m.TILE, s.T - r0)
            for c0 in range(0, s.T, m.TILE):
                if c0 <= r0 + rows - 1:
                    loads += (rows + min(m.TILE, s.T - c0)) * s.d_k
        return s.BH * loads, s.BH * s.T * s.T
    return formula


def _softmax(m, s):                                     # max, sum, normalise: 3 reads per score
    return 3 * s.BH * s.T * s.T, s.BH * s.T * s.T


def _softmax_one_pass(m, s):                            # (max, sum) in one pass, then normalise: 2 reads
    return 2 * s.BH * s.T * s.T, s.BH * s.T * s.T


def _weighted_sum(version):
    def formula(m, s):
        # A @ V is notebook 01's product with A as x and V as w (weighted_sum.py reuses it).
        from attention_lib.stages import projection
        a_reads, v_reads = projection.global_reads(s.T, s.d_k, version)
        return s.BH * (s.T * s.T * a_reads + s.T * s.d_k * v_reads), s.BH * s.T * s.d_k
    return formula


def _flash(version):
    def formula(m, s):
        per_head = m.flash_traffic(s.T, s.T, s.d_k, causal=True, version=version)
        return s.BH * (per_head["q"] + per_head["k"] + per_head["v"]), s.BH * (per_head["out"] + per_head["lse"])
    return formula


def _decode(version):
    def formula(m, s):
        traffic = m.decode_traffic(s.T, s.BH, s.d_k, version)
        loads = sum(l for arrays in traffic.values() for l, _ in arrays.values())
        stores = sum(st for arrays in traffic.values() for _, st in arrays.values())
        return loads, stores
    return formula


# Entry name -> formula(stage module, BenchSizes) -> (global loads, global stores), in elements.
BENCH_FORMULAS = {
    **{f"projection v{v}": _projection(v) for v in (1, 2, 3, 4)},
    **{f"scores v{v}": _scores(v) for v in (1, 2)},
    **{f"mask v{v}": _mask(v) for v in (1, 2)},
    **{f"softmax v{v}": _softmax for v in (1, 2)},
    "softmax v3": _softmax_one_pass,
    **{f"weighted_sum v{v}": _weighted_sum(v) for v in (1, 2)},
    **{f"flash v{v}": _flash(v) for v in (1, 2, 3)},
    **{f"decode v{v}": _decode(v) for v in (1, 2)},
}


def entry_formula(entry, module, sizes, result):
    """The entry's formula counts into result["formula"] ({global_loads, global_stores}, in
    elements), also returned; None when the entry has no formula or its module changed shape."""
    formula = BENCH_FORMULAS.get(entry.name)
    if formula is None:
        return None
    try:
        loads, stores = formula(module, sizes)
    except (AttributeError, TypeError, KeyError) as error:   # the module changed shape
        result["notes"].append(f"no traffic formula: {type(error).__name__}: {error}")
        return None
    result["formula"] = {"global_loads": int(loads), "global_stores": int(stores)}
    return result["formula"]


def count_entry(entry, module, sizes, launches, result):
    """Total the count_memory reports of one entry's launches into result["counted"], and
    compare them with the entry's formula (result["formula_matches"])."""
    reports = [launch.report for launch in launches]
    counted = {
        "global_loads": sum(r.total("loads", space="global") for r in reports),
        "global_stores": sum(r.total("stores", space="global") for r in reports),
        "global_atomics": sum(r.total("atomics", space="global") for r in reports),
        "global_bytes": sum(r.global_bytes for r in reports),
        "shared_loads": sum(r.total("loads", space="shared") for r in reports),
        "shared_stores": sum(r.total("stores", space="shared") for r in reports),
    }
    counted["intensity"] = result["flops"] / counted["global_bytes"] if counted["global_bytes"] else None
    result["counted"] = counted
    formula = entry_formula(entry, module, sizes, result)
    if formula is not None:
        result["formula_matches"] = (formula["global_loads"] == counted["global_loads"]
                                     and formula["global_stores"] == counted["global_stores"])


# --- The backward: the naive one from stage kernels, the fused one ---------------------------

def count_backward_naive(q, k, v, d_out, causal=True, window=None):
    """Main-memory traffic of the naive backward's launches under count_memory, on NumPy arrays
    q (BH, T_q, d_k), k, v (BH, T_k, d), d_out (BH, T_q, d_v), window a sliding window or None
    -> ({launch: MemoryReport}, (dq, dk, dv)). The same kernels and grids as
    backward.launch_naive_backward, except the softmax, version 1 on every backend
    (attention.SOFTMAX_VERSION on the simulator: no barriers)."""
    (bh, t_q, d_k), (t_k, d_v) = q.shape, v.shape[1:]
    s, p, dp, d_raw = (np.empty((bh, t_q, t_k), np.float32) for _ in range(4))
    p_t, d_raw_t = np.empty((bh, t_k, t_q), np.float32), np.empty((bh, t_k, t_q), np.float32)
    out, d_rows = np.empty(d_out.shape, np.float32), np.empty((bh, t_q), np.float32)
    dq, dk, dv = (np.empty(a.shape, np.float32) for a in (q, k, v))
    grid, scale = scores.score_grid(bh, t_q, t_k), scores.scale_factor(d_k)
    count, ws, ws_grid = sanitizer.count_memory, weighted_sum.weighted_sum_kernel_v2, weighted_sum.weighted_sum_grid
    reports = {"S": count(mask.causal_scores_kernel if causal else scores.scores_kernel_v2, *grid, q, k, scale, s)}
    if window:                                  # the keys older than the window, masked in place
        reports["window"] = count(mask.mask_kernel, *grid, s, np.int32(window))
    return {
        **reports,
        "P": count(softmax.softmax_kernel_v1, *softmax.softmax_grid(bh * t_q, 1),
                   s.reshape(bh * t_q, t_k), p.reshape(bh * t_q, t_k)),
        "O": count(ws, *ws_grid(bh, t_q, d_v), p, v, out),
        "row sums": count(backward.row_dot_kernel, *backward.row_grid(bh, t_q), d_out, out, d_rows),
        "P^T": count(backward.transpose_kernel, *grid, p, p_t),
        "dV": count(ws, *ws_grid(bh, t_k, d_v), p_t, d_out, dv),
        "dP": count(scores.scores_kernel_v2, *grid, d_out, v, np.float32(1.0), dp),
        "dS": count(backward.score_grad_kernel, *grid, p, dp, d_rows, scale, d_raw),
        "dQ": count(ws, *ws_grid(bh, t_q, d_k), d_raw, k, dq),
        "dS^T": count(backward.transpose_kernel, *grid, d_raw, d_raw_t),
        "dK": count(ws, *ws_grid(bh, t_k, d_k), d_raw_t, q, dk),
    }, (dq, dk, dv)


def count_backward_fused(q, k, v, out, lse, d_out, causal=True, window=None):
    """Main-memory traffic of the fused backward's three launches under count_memory, on NumPy
    arrays (shapes as the kernels'; window a sliding window or None) -> ({launch: MemoryReport},
    (dq, dk, dv))."""
    (bh, t_q, d_k), t_k = q.shape, k.shape[1]
    d_rows = np.empty((bh, t_q), np.float32)
    dq, dk, dv = (np.empty(a.shape, np.float32) for a in (q, k, v))
    grids, scale = backward.fused_grids(bh, t_q, t_k, k.shape[0]), scores.scale_factor(d_k)
    count, window = sanitizer.count_memory, np.int32(window or 0)
    reports = {
        "row sums": count(backward.row_dot_kernel, *backward.row_grid(bh, t_q), d_out, out, d_rows),
        "dK, dV": count(backward.flash_backward_dkdv_kernel, *grids["dkdv"], q, k, v, d_out, lse, d_rows,
                        scale, bool(causal), window, dk, dv),
        "dQ": count(backward.flash_backward_dq_kernel, *grids["dq"], q, k, v, d_out, lse, d_rows, scale,
                    bool(causal), window, dq),
    }
    return reports, (dq, dk, dv)
