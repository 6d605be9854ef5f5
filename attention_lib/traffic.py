"""Main-memory traffic: what each kernel requests, counted by the sanitizer and predicted by formula.

Counted traffic is every global load and store a launch requests, as if there were no cache
(``sanitizer.count_memory``): a naive kernel requests far more than the compulsory traffic, and
on a GPU the caches absorb part of the difference (only a time can say how much).

For the bench (``attention_lib.bench``): ``BENCH_FORMULAS`` predicts the counts of each entry
from the stage modules' own cost formulas; ``count_entry`` totals the counted launches of one
entry and compares them with its formula; ``formula_results`` extrapolates to sizes the
simulator cannot run (ANDREA-120M), with the GPU's tile sizes whatever the backend.
"""

import datetime
from contextlib import contextmanager
from dataclasses import asdict

from attention_lib.launch import ceil_div

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


def _weighted_sum(version):
    def formula(m, s):
        # A @ V is notebook 01's product with A as x and V as w (weighted_sum.py reuses it).
        from attention_lib.stages import projection
        a_reads, v_reads = projection.global_reads(s.T, s.d_k, version)
        return s.BH * (s.T * s.T * a_reads + s.T * s.d_k * v_reads), s.BH * s.T * s.d_k
    return formula


def _flash(version, gpu=False):
    def formula(m, s):
        options = {"block_q": m.BLOCK_Q_GPU} if gpu and version == 2 else {}
        per_head = m.flash_traffic(s.T, s.T, s.d_k, causal=True, version=version, **options)
        return s.BH * (per_head["q"] + per_head["k"] + per_head["v"]), s.BH * per_head["out"]
    return formula


def _decode(version, gpu=False):
    def formula(m, s):
        chunk = getattr(m, "KEYS_PER_CHUNK_GPU", None) if gpu else None
        if gpu and version == 2 and chunk is None:
            raise AttributeError("kv_cache has no KEYS_PER_CHUNK_GPU: the GPU's chunk of keys is unknown")
        with _constant(m, "KEYS_PER_CHUNK", chunk):
            traffic = m.decode_traffic(s.T, s.BH, s.d_k, version)
        loads = sum(l for arrays in traffic.values() for l, _ in arrays.values())
        stores = sum(st for arrays in traffic.values() for _, st in arrays.values())
        return loads, stores
    return formula


# Entry name -> formula(stage module, BenchSizes) -> (global loads, global stores), in elements.
BENCH_FORMULAS = {
    **{f"projection v{v}": _projection(v) for v in (1, 2, 3)},
    **{f"scores v{v}": _scores(v) for v in (1, 2)},
    **{f"mask v{v}": _mask(v) for v in (1, 2)},
    **{f"softmax v{v}": _softmax for v in (1, 2)},
    **{f"weighted_sum v{v}": _weighted_sum(v) for v in (1, 2)},
    **{f"flash v{v}": _flash(v) for v in (1, 2)},
    **{f"decode v{v}": _decode(v) for v in (1, 2)},
}
# The same at the GPU's configuration where a tile size differs between the backends.
GPU_FORMULAS = {**BENCH_FORMULAS, "flash v2": _flash(2, gpu=True), "decode v2": _decode(2, gpu=True)}


@contextmanager
def _constant(module, name, value):
    """module.<name> = value for the length of the block (value None: left as it is)."""
    if value is None:
        yield
        return
    before = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, before)


def _formula(formulas, entry, module, sizes, result):
    formula = formulas.get(entry.name)
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
    formula = _formula(BENCH_FORMULAS, entry, module, sizes, result)
    if formula is not None:
        result["formula_matches"] = (formula["global_loads"] == counted["global_loads"]
                                     and formula["global_stores"] == counted["global_stores"])


def formula_results(sizes=None, only=None):
    """What can be known without running anything, at `sizes` (default ANDREA-120M): FLOPs, ideal
    bytes, intensity and, where an entry has a traffic formula, the loads and stores count_memory
    would count, with the GPU's tile sizes on either backend. A results dict (backend "formula")
    that plotting.plot_bench_roofline draws. The formulas are checked against count_memory at
    small sizes (tests/test_bench.py, notebook 09)."""
    import importlib

    from attention_lib import bench, runtime
    sizes = bench.BenchSizes.of(runtime.ANDREA_120M) if sizes is None else sizes
    kernels, skipped = [], []
    for entry in bench.select(only):
        missing = entry.missing()
        if missing:
            skipped.append({"name": entry.name, "reason": missing})
            continue
        module = importlib.import_module(f"attention_lib.stages.{entry.module}")
        result = bench.new_result(entry)
        flops, ideal = int(entry.flops(sizes)), int(entry.ideal_bytes(sizes))
        result.update({"flops": flops, "ideal_bytes": ideal, "intensity": flops / ideal if ideal else None})
        formula = _formula(GPU_FORMULAS, entry, module, sizes, result)
        if formula is not None:
            moved = BYTES * (formula["global_loads"] + formula["global_stores"])
            result["counted"] = {**formula, "global_bytes": moved, "intensity": flops / moved if moved else None}
        kernels.append(result)
    return {"schema": bench.SCHEMA, "backend": "formula", "gpu": None, "limits": None,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "versions": bench.versions(), "sizes": {**asdict(sizes), "d_model": sizes.d_model},
            "timing": None, "kernels": kernels, "skipped": skipped, "failed": [],
            "targets": bench.targets(kernels, sizes, None), "notes": ["by formula, nothing was run"]}
