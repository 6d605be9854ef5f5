"""Performance (notebook 10): time every kernel version on a GPU, check its result, report it.

    python -m attention_lib.measure.bench                       # or: make bench
    python -m attention_lib.measure.bench --only flash projection --repeats 50 --out bench-results

For every entry of ``REGISTRY`` (one stage's launcher at one version: "projection v3",
"flash v2", ...) the harness builds random float32 inputs at the bench sizes (``BenchSizes``:
ANDREA-120M on a GPU, ANDREA-sim on the simulator), calls the library's own launcher once
inside ``recording_launches`` (which notes every kernel launch it makes), and then:

1. checks the output against ``attention_lib.reference`` (float64) at that size: an entry
   whose result is wrong is listed under "failed" and never timed;
2. on a GPU replays only the recorded launches (no host copies, no input checks), ``inner``
   of them back to back between one pair of CUDA events, so that the tens of microseconds
   Python spends on each launch hide behind the GPU's work; the time of one launch between
   its own events is kept beside it (``single_s``), and the gap is the launch overhead;
3. times PyTorch (and CuPy) doing the same work the same way, with PyTorch's
   scaled_dot_product_attention pinned to a backend: ``EFFICIENT_ATTENTION`` (a CUTLASS
   kernel that in float32 runs 3xTF32 on tensor cores whatever the TF32 flags say) and
   ``MATH`` (cuBLAS SGEMM plus a softmax: FP32 without tensor cores, the peer of our SIMT
   kernels); the CUDA kernels each runs are recorded once with torch.profiler, and each
   baseline's output is checked like ours;
4. on the simulator, where CUDA events record no time, counts every launch's threads and
   memory traffic instead (``attention_lib.measure.traffic``, which holds the formulas too);
5. writes ``bench-<backend>.json`` and ``roofline-<backend>.png`` into ``out_dir``, and, as
   the sweep goes, ``bench-<backend>.jsonl``: a first line with the sizes and versions, then one
   line per entry as soon as it is done, flushed, so that a sweep stopped half way (a time
   budget) leaves every entry it finished.

FLOPs, ideal bytes and intensities are bench_cases' formulas. Nothing here imports PyTorch or
CuPy until a GPU run asks for them.
"""

import argparse
import datetime
import importlib
import importlib.metadata
import json
import math
import os
import platform
import subprocess
import sys
from dataclasses import asdict, astuple
from pathlib import Path

import numpy as np
from numba import cuda

from attention_lib.measure import traffic
from attention_lib.measure.bench_cases import (REGISTRY, TARGETS, BenchSizes, Inputs, baseline_libraries,  # noqa: F401
                                               cuda_kernel_names, notebook_sizes, to_numpy)
from attention_lib.measure.gpus import REFERENCE_GPU, GpuLimits, device_name, gpu_limits  # noqa: F401
from attention_lib.platform import runtime
from attention_lib.measure.recording import dim3, recording_launches, replay  # noqa: F401

DEFAULT_OUT = "bench-results"
SCHEMA = "attention_lib.bench/2"
# Each timed sample runs the work back to back until it spans about this long (at most MAX_INNER
# times): long enough that one launch's Python overhead is a small part of it.
SAMPLE_SECONDS = 5e-3
MAX_INNER = 200
TF32_NOTE = ("EFFICIENT_ATTENTION in float32 runs 3xTF32 on tensor cores whatever the TF32 flags say; "
             "MATH is cuBLAS SGEMM, element-wise scale and mask kernels and a softmax, with TF32 off "
             "(FP32, no tensor cores, like our kernels)")
# What one launch costs the host, for lower_bound's launch term: a public benchmark in
# NVIDIA/numba-cuda pull request #288 gave about 6.6 us for an empty kernel and 3.5 to 4 us more
# per array argument; about 20 us for a kernel of four arrays is an estimate, not measured here. Launched back to back, kernels start no faster than Python queues them.
LAUNCH_S = 20e-6
REGIMES = ("compute", "memory", "launch")


# --- Timing ------------------------------------------------------------------------------

class TimingUnavailable(RuntimeError):
    """Times were asked for where none can be measured (the simulator)."""


SIMULATOR_NO_TIMES = ("times need a GPU: on the simulator CUDA events record no time "
                      "(elapsed_time returns -1) and kernels run as Python code on the CPU")


class EventClock:
    """start() / stop() around GPU work with two CUDA events (begin, end; elapsed_ms(begin, end)
    reads them); stop() returns seconds. Recorded in the GPU's stream, between the launches, they
    time the GPU's work, not the Python calls that queue it (a launch returns before it has run)."""

    def __init__(self, begin, end, elapsed_ms):
        self.begin, self.end, self.elapsed_ms = begin, end, elapsed_ms

    def start(self):
        self.begin.record()

    def stop(self):
        self.end.record()
        self.end.synchronize()              # wait until the GPU has reached the end event
        return self.elapsed_ms(self.begin, self.end) / 1e3


class NumbaClock(EventClock):
    """An EventClock on Numba's CUDA events; it refuses on the simulator, whose events record
    no time (elapsed_time returns -1)."""

    def __init__(self):
        if runtime.ON_SIMULATOR:
            raise TimingUnavailable(SIMULATOR_NO_TIMES)
        super().__init__(cuda.event(), cuda.event(), self.elapsed_ms)

    @staticmethod
    def elapsed_ms(begin, end):
        ms = begin.elapsed_time(end)
        if ms < 0:
            raise TimingUnavailable(SIMULATOR_NO_TIMES)
        return ms


def library_clock(key, library):
    """An EventClock for PyTorch ("torch...", its current stream) or CuPy."""
    if key.startswith("torch"):
        event = lambda: library.cuda.Event(enable_timing=True)                   # noqa: E731
        return EventClock(event(), event(), lambda b, e: b.elapsed_time(e))
    return EventClock(library.cuda.Event(), library.cuda.Event(), library.cuda.get_elapsed_time)


def sample(work, clock, inner):
    """Seconds per run of `work`: `inner` runs back to back between one start() and stop()."""
    clock.start()
    for _ in range(inner):                  # queued back to back: the GPU never waits for Python
        work()
    return clock.stop() / inner


def spread(times):
    """Median, quartiles, IQR (75th minus 25th percentile), min, max and count of `times`."""
    q1, median, q3 = np.percentile(times, [25, 50, 75])
    return {"median_s": float(median), "q1_s": float(q1), "q3_s": float(q3), "iqr_s": float(q3 - q1),
            "min_s": float(min(times)), "max_s": float(max(times)), "runs": len(times)}


def measure(work, clock, warmup=3, repeats=20, max_seconds=2.0, inner=None):
    """Time `work()` with `clock` -> spread() of the seconds per run, `inner` and `single_s`.

    Warm-up runs first; then one run alone (single_s, Python's launch cost included); then
    samples of `inner` runs back to back (None: enough to last about SAMPLE_SECONDS), until
    `repeats` samples or `max_seconds` measured (at least 5 samples).
    """
    for _ in range(warmup):                 # compile, fill caches, let the clocks rise
        sample(work, clock, 1)
    single = sample(work, clock, 1)
    if inner is None:
        inner = max(1, min(MAX_INNER, math.ceil(SAMPLE_SECONDS / single))) if single > 0 else MAX_INNER
    times = []
    while len(times) < repeats and (len(times) < 5 or sum(times) * inner < max_seconds):
        times.append(sample(work, clock, inner))
    return {**spread(times), "inner": inner, "single_s": float(single)}


def time_launches(launches, warmup=3, repeats=20, max_seconds=2.0, clock=None, inner=None):
    """measure() of the recorded launches replayed; TimingUnavailable on the simulator
    (unless a `clock` is given: tests use a fake one)."""
    clock = NumbaClock() if clock is None else clock
    work = replay(launches)
    cuda.synchronize()
    return measure(work, clock, warmup, repeats, max_seconds, inner)


# --- Predicting: the least time the roofs allow ------------------------------------------

def lower_bound(flops, nbytes, launches, gpu, launch_s=LAUNCH_S):
    """The least time a piece of work can take on `gpu` (a gpus.GpuLimits): (seconds, regime).

    flops: its floating-point operations; nbytes: the bytes it moves to and from main memory;
    launches: the kernel launches it takes; launch_s: what one launch costs the host. The GPU
    computes while it loads, and Python queues the next launch while the GPU runs, so the three
    overlap: the slowest sets the pace. regime: "compute", "memory" or "launch", whichever it is.
    """
    times = {"compute": flops / gpu.fp32_flop_per_s,    # every FLOP at the FP32 peak (Numba has no tensor cores)
             "memory": nbytes / gpu.bytes_per_s,       # every byte at the full bandwidth
             "launch": launches * launch_s}            # one launch after another from the host
    regime = max(times, key=times.get)
    return times[regime], regime


def predictions(results, launched, gpu=REFERENCE_GPU, launch_s=LAUNCH_S, measured=None):
    """lower_bound of every kernel of `results` (formula_results, or a run's), twice: with its ideal
    bytes (every input read once: what caches and tiling could reach) and with its counted bytes
    (every request to main memory: no cache). launched: a run's results (run_bench), whose
    recorded launches give each entry's launch count (the same at any size). measured: results
    timed on a GPU (its median per kernel), or None. -> [{"name", "flops", "ideal_bytes",
    "counted_bytes", "launches", "ideal": (s, regime), "counted": (s, regime) or None, "measured_s"}]."""
    launches = {k["name"]: len(k["launches"]) for k in launched["kernels"]}
    times = {k["name"]: k["time"]["median_s"] for k in (measured or {}).get("kernels", []) if k.get("time")}
    rows = []
    for k in results["kernels"]:
        if k["name"] not in launches:
            continue
        n, counted = launches[k["name"]], (k["counted"] or {}).get("global_bytes")
        rows.append({"name": k["name"], "flops": k["flops"], "ideal_bytes": k["ideal_bytes"], "counted_bytes": counted,
                     "launches": n, "ideal": lower_bound(k["flops"], k["ideal_bytes"], n, gpu, launch_s),
                     "counted": None if counted is None else lower_bound(k["flops"], counted, n, gpu, launch_s),
                     "measured_s": times.get(k["name"])})
    return rows


def format_predictions(rows):
    """predictions' rows as a text table, times in microseconds."""
    def bound(pair):
        return "-" if pair is None else f"{pair[0] * 1e6:,.1f} {pair[1]}"
    lines = [f"{'kernel':<20}{'launches':>9}{'FLOPs':>17}{'ideal B':>15}{'counted B':>17}"
             f"{'bound, ideal B (us)':>24}{'bound, counted B (us)':>26}{'measured (us)':>15}"]
    for r in rows:
        lines.append(f"{r['name']:<20}{r['launches']:>9}{r['flops']:>17,}{r['ideal_bytes']:>15,}"
                     f"{_number(r['counted_bytes'], ','):>17}{bound(r['ideal']):>24}{bound(r['counted']):>26}"
                     f"{_number(r['measured_s'] and r['measured_s'] * 1e6, ',.1f'):>15}")
    return "\n".join(lines)


# --- Checking results --------------------------------------------------------------------

# Elements compared per pass: a pass's float64 temporaries are 8 MB and NumPy reuses their memory,
# where whole temporaries of a (B*H, T, T) result are 800 MB of fresh pages each at ANDREA-120M.
COMPARE_STEP = 1 << 20


def compare(got, want, tol):
    """{"ok", "max_abs_error", "tolerance"}: got within tol * (1 + |want|) of want everywhere.
    Mismatched shapes or NaN never pass. Computed COMPARE_STEP elements at a time."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return {"ok": False, "max_abs_error": None, "tolerance": tol,
                "error": f"shape {got.shape}, expected {want.shape}"}
    got, want = got.reshape(-1), want.reshape(-1)
    ok, worst = True, -np.inf
    for start in range(0, got.size, COMPARE_STEP):
        g = got[start:start + COMPARE_STEP].astype(np.float64)
        w = want[start:start + COMPARE_STEP].astype(np.float64, copy=False)
        error, bound = _error_and_bound(g, w, tol)
        ok = ok and bool(np.all(error <= bound))     # NaN is never <= : a NaN in got fails here
        worst = np.fmax(worst, np.fmax.reduce(error))  # the largest error, NaN left out
    # The largest error; infinity when it is not finite, or when every error is NaN.
    return {"ok": ok, "max_abs_error": float(worst) if np.isfinite(worst) else float("inf"), "tolerance": tol}


def _error_and_bound(g, w, tol):
    """|g - w| and tol * (1 + |w|), element by element (float64). Where w is infinite the bound
    is 0: only the same infinity in g passes (error 0); inf - inf would be NaN."""
    with np.errstate(invalid="ignore"):             # inf - inf: NaN, replaced below
        error = np.abs(g - w)
    bound = np.abs(w)
    bound += 1
    bound *= tol
    if not np.isfinite(bound).all():                # rare: a masked score, -inf
        infinite = np.isinf(w)
        error[infinite & (g == w)] = 0.0
        bound[infinite] = 0.0
    return error, bound


# --- Baselines: PyTorch and CuPy ---------------------------------------------------------

def time_baseline(key, make, library, arrays, sizes, want, tol, timing):
    """One baseline (key "torch", "torch_math", "cupy", ...) -> its result dict: its output
    checked against `want`, its time measured as ours was, the ratio baseline / ours (> 1:
    ours is faster) and, for PyTorch, the CUDA kernels it ran."""
    work = make(library, arrays, sizes)
    out = {"check": compare(to_numpy(work()), want, tol)}
    clock = library_clock(key, library)
    out.update(measure(work, clock, timing["warmup"], timing["repeats"], timing["max_seconds"]))
    out["ratio"] = out["median_s"] / timing["ours_s"]
    if key.startswith("torch"):
        try:
            out["cuda_kernels"] = cuda_kernel_names(library, work)
        except Exception as error:  # the profiler is an extra; its failure loses no time
            out["cuda_kernels"] = None
            out["profiler_error"] = _one_line(error)
    return out


# --- Running it --------------------------------------------------------------------------

def versions(libraries=()):
    found = {"python": platform.python_version(), "numpy": np.__version__}
    for package in ("numba", "numba-cuda", "torch", "cupy", "cupy-cuda12x", "cupy-cuda13x"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    if "torch" in libraries:
        found["torch_cuda"] = libraries["torch"].version.cuda
    return found


def _one_line(error):
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def new_result(entry):
    return {"name": entry.name, "module": entry.module, "notebook": entry.notebook, "what": entry.what,
            "launches": [], "blocks": None, "threads": None, "flops": None, "ideal_bytes": None,
            "intensity": None, "check": None, "time": None, "flop_per_s": None, "bytes_per_s": None,
            "counted": None, "formula": None, "formula_matches": None, "baselines": {}, "notes": []}


class WrongResult(AssertionError):
    """An entry's output differs from the reference: its times would mean nothing."""


def bench_entry(entry, sizes, inputs, count, clock=None, libraries=None, warmup=3, repeats=20,
                max_seconds=2.0):
    """Bench one registry entry -> its result dict (see run_bench). Raises WrongResult when its
    output differs from the reference, and whatever the launcher raises."""
    module = importlib.import_module(f"attention_lib.stages.{entry.module}")
    run, arrays = entry.prepare(module, sizes, inputs)
    with recording_launches(count=count) as launches:
        got = run()
    result = new_result(entry)
    result.update({
        "launches": [{"kernel": l.name, "grid": list(dim3(l.griddim)), "block": list(dim3(l.blockdim)),
                      "dynamic_shared_bytes": l.sharedmem} for l in launches],
        "blocks": sum(l.blocks for l in launches), "threads": sum(l.threads for l in launches)})
    flops, ideal = int(entry.flops(sizes)), int(entry.ideal_bytes(sizes))
    result.update({"flops": flops, "ideal_bytes": ideal, "intensity": flops / ideal if ideal else None})
    want, tol = inputs.reference(entry, arrays), entry.tolerance(sizes)
    result["check"] = compare(got, want, tol)
    if not result["check"]["ok"]:
        raise WrongResult(f"output differs from the reference: max error {result['check']['max_abs_error']}"
                          f" > {tol:g} x (1 + |reference|) {result['check'].get('error', '')}".rstrip())
    if count:
        traffic.count_entry(entry, module, sizes, launches, result)
    if clock is None:
        result["notes"].append(SIMULATOR_NO_TIMES if runtime.ON_SIMULATOR else "not timed")
        return result
    timing = time_launches(launches, warmup, repeats, max_seconds, clock=clock)
    result["time"] = timing
    result["flop_per_s"] = flops / timing["median_s"] if timing["median_s"] > 0 else None
    result["bytes_per_s"] = ideal / timing["median_s"] if timing["median_s"] > 0 else None
    settings = {"warmup": warmup, "repeats": repeats, "max_seconds": max_seconds, "ours_s": timing["median_s"]}
    for key, make in entry.baselines.items():
        library = (libraries or {}).get(key.split("_")[0])
        if library is None:
            continue
        try:
            result["baselines"][key] = time_baseline(key, make, library, arrays, sizes, want, tol, settings)
        except Exception as error:  # a baseline that fails must not stop the sweep
            result["notes"].append(f"{key} baseline failed: {_one_line(error)}")
    return result


def select(only):
    """The registry entries whose name contains one of the words of `only` (all when None)."""
    if not only:
        return list(REGISTRY)
    chosen = [e for e in REGISTRY if any(word in e.name for word in only)]
    if not chosen:
        raise ValueError(f"only must name registry entries (a part of a name is enough), got {only}; "
                         f"entries: {', '.join(e.name for e in REGISTRY)}")
    return chosen


def targets(kernels, sizes, limits):
    """The course's targets: the best measured ratio of our entries, whether met, at which sizes."""
    by_name, found = {k["name"]: k for k in kernels}, {}
    for key, what, ours, baseline, target in TARGETS:
        ratios = []
        for name in ours:
            k = by_name.get(name)
            if k is None or k.get("time") is None and not k.get("baselines"):
                continue
            if baseline in k.get("baselines", {}):
                ratios.append(k["baselines"][baseline]["ratio"])
            elif baseline in by_name and by_name[baseline].get("time") and k.get("time"):
                ratios.append(by_name[baseline]["time"]["median_s"] / k["time"]["median_s"])
        ratio = max(ratios) if ratios else None
        found[key] = {"what": what, "kernels": ours, "baseline": baseline, "target": target, "ratio": ratio,
                      "met": None if ratio is None or target is None else ratio >= target,
                      "at_course_sizes": sizes == BenchSizes.of(runtime.ANDREA_120M),
                      "gpu": limits.name if limits else None}
    return found


def formula_results(sizes=None, only=None):
    """What can be known without running anything, at `sizes` (default ANDREA-120M): FLOPs, ideal
    bytes, intensity and, where an entry has a traffic formula, the loads and stores count_memory
    would count, with the GPU's tile sizes whatever the backend (on the simulator it asks a fresh
    Python with ATTENTION_LIB_SHAPES=gpu). A results dict (backend "formula") that
    plotting.plot_bench_roofline draws. The formulas are checked against count_memory at small
    sizes (tests/test_bench.py, notebook 10)."""
    sizes = BenchSizes.of(runtime.ANDREA_120M) if sizes is None else sizes
    if runtime.SIMULATOR_SHAPES:                # the stage modules hold the simulator's tile sizes
        ask = (f"import json, attention_lib; from attention_lib.measure import bench; print(json.dumps("
               f"bench.formula_results(bench.BenchSizes(*{list(asdict(sizes).values())}), {only!r})))")
        done = subprocess.run([sys.executable, "-c", ask], capture_output=True, text=True, check=True,
                              env={**os.environ, "ATTENTION_LIB_SHAPES": runtime.GPU})
        return json.loads(done.stdout.strip().splitlines()[-1])
    kernels, skipped = [], []
    for entry in select(only):
        missing = entry.missing()
        if missing:
            skipped.append({"name": entry.name, "reason": missing})
            continue
        module = importlib.import_module(f"attention_lib.stages.{entry.module}")
        result = new_result(entry)
        flops, ideal = int(entry.flops(sizes)), int(entry.ideal_bytes(sizes))
        result.update({"flops": flops, "ideal_bytes": ideal, "intensity": flops / ideal if ideal else None})
        formula = traffic.entry_formula(entry, module, sizes, result)
        if formula is not None:
            moved = traffic.BYTES * (formula["global_loads"] + formula["global_stores"])
            result["counted"] = {**formula, "global_bytes": moved, "intensity": flops / moved if moved else None}
        kernels.append(result)
    return {"schema": SCHEMA, "backend": "formula", "gpu": None, "limits": None,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "versions": versions(), "sizes": {**asdict(sizes), "d_model": sizes.d_model},
            "timing": None, "kernels": kernels, "skipped": skipped, "failed": [],
            "targets": targets(kernels, sizes, None), "notes": ["by formula, with the GPU's tile sizes"]}


def run_bench(sizes=None, only=None, out_dir=DEFAULT_OUT, warmup=3, repeats=20, max_seconds=2.0,
              baselines=True, count=None, timed=None, clock=None, libraries=None, seed=0, write=True,
              verbose=True):
    """Bench the registry's entries; returns the results dict (also written as JSON, with a plot).

    sizes: BenchSizes (default attention_lib.SIZES); only: parts of names to keep; count: count
    traffic under the sanitizer (default: on the simulator); timed: measure times (default: on a
    GPU); clock: a start()/stop() timer (default CUDA events; tests pass a fake one); libraries:
    {"torch": ..., "cupy": ...} to compare with (default: those importable, on a GPU, when
    `baselines`). An entry whose module or version is missing is skipped, one that raises or
    computes a wrong result is listed under "failed", and the sweep goes on.
    """
    sizes = BenchSizes.of(runtime.SIZES) if sizes is None else sizes
    count = runtime.ON_SIMULATOR if count is None else count
    timed = (not runtime.ON_SIMULATOR or clock is not None) if timed is None else timed
    clock = (clock or NumbaClock()) if timed else None      # NumbaClock refuses on the simulator
    name = device_name()
    limits = gpu_limits(name)
    if libraries is None:
        libraries = baseline_libraries() if baselines and clock is not None and not runtime.ON_SIMULATOR else {}
    entries = select(only)
    if verbose:
        print(f"Benching {len(entries)} entr{'y' if len(entries) == 1 else 'ies'} on {name or 'the simulator'}"
              f" at {sizes}")
    inputs = Inputs(sizes, seed)
    results = {
        "schema": SCHEMA, "backend": runtime.BACKEND, "gpu": name,
        "limits": None if limits is None else {**asdict(limits), "ridge_flop_per_byte": limits.ridge},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": versions(libraries), "sizes": {**asdict(sizes), "d_model": sizes.d_model},
        "timing": None if clock is None else {
            "method": "CUDA events around `inner` back-to-back replays of the recorded launches (no host copies)",
            "warmup": warmup, "repeats": repeats, "max_seconds": max_seconds, "sdpa_backends": TF32_NOTE},
    }
    progress = ProgressFile(out_dir, runtime.BACKEND, results) if write else None
    kernels, skipped, failed = [], [], []
    for i, entry in enumerate(entries, 1):
        head = f"[{i}/{len(entries)}] {entry.name:<20}"
        missing = entry.missing()
        if missing:
            skipped.append({"name": entry.name, "reason": missing})
            if verbose:
                print(f"{head} skipped: {missing}")
            if progress:
                progress.add("skipped", skipped[-1])
            continue
        try:
            result = bench_entry(entry, sizes, inputs, count, clock, libraries, warmup, repeats, max_seconds)
        except Exception as error:  # one broken launcher must not lose a long GPU sweep
            failed.append({"name": entry.name, "error": _one_line(error)})
            if verbose:
                print(f"{head} FAILED: {failed[-1]['error']}")
            if progress:
                progress.add("failed", failed[-1])
            continue
        if limits and result["flop_per_s"] is not None:
            result["fraction_of_fp32_peak"] = result["flop_per_s"] / limits.fp32_flop_per_s
            result["fraction_of_bandwidth"] = result["bytes_per_s"] / limits.bytes_per_s
        kernels.append(result)
        if verbose:
            print(progress_line(head, result))
        if progress:
            progress.add("kernel", result)
    results.update({"kernels": kernels, "skipped": skipped, "failed": failed,
                    "targets": targets(kernels, sizes, limits),
                    "notes": [SIMULATOR_NO_TIMES] if clock is None else []})
    if verbose:
        print(format_targets(results))
    if write:
        results["files"] = {**write_results(results, out_dir), "jsonl": str(progress.path)}
        progress.add("end", {"targets": results["targets"], "files": results["files"]})
        if verbose:
            print("wrote", ", ".join(results["files"].values()))
    return results


class ProgressFile:
    """out_dir/bench-<backend>.jsonl, written as the sweep goes: a "start" line (the results'
    header: sizes, versions, timing settings), then one line per entry ("kernel", "skipped" or
    "failed"), then "end"; each line flushed as it is written, so a stopped sweep keeps its lines."""

    def __init__(self, out_dir, backend, header):
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        self.path = out / f"bench-{backend}.jsonl"
        self.path.write_text("")                  # a new sweep, not the lines of the last one
        self.add("start", header)

    def add(self, kind, record):
        with self.path.open("a") as file:         # appended and closed: on disk whatever stops us next
            file.write(json.dumps({"kind": kind, **record}) + "\n")


# --- Reporting ---------------------------------------------------------------------------

def _number(value, spec):
    return "-" if value is None else format(value, spec)


def progress_line(head, result):
    """One line per entry while the sweep runs."""
    line = f"{head} {len(result['launches'])} launch(es), {result['threads']:,} threads, result checked"
    if result["time"] is not None:
        t = result["time"]
        line = (f"{head} {t['median_s'] * 1e3:9.3f} ms (IQR {t['iqr_s'] * 1e3:.3f}, {t['runs']} x {t['inner']} "
                f"launches; one alone {t['single_s'] * 1e3:.3f} ms)")
        for key, base in result["baselines"].items():
            line += f"  {key} {base['median_s'] * 1e3:.3f} ms ({base['ratio']:.2f}x)"
    elif result["counted"] is not None:
        c = result["counted"]
        line += f", {c['global_loads']:,} loads, {c['global_stores']:,} stores"
        if result["formula_matches"] is not None:
            line += ", = formula" if result["formula_matches"] else ", FORMULA DIFFERS"
    return line


def format_targets(results):
    """The course's targets in words, with the measured ratios (or why there are none)."""
    lines = ["Targets (ANDREA-120M on an H200; ratio = their time / ours, higher is better):"]
    for target in results["targets"].values():
        goal = "reported" if target["target"] is None else f"target >= {target['target']:g}x"
        if target["ratio"] is None:
            why = (SIMULATOR_NO_TIMES if results["backend"] == runtime.SIMULATOR else
                   f"not measured: no time of {target['baseline']} beside {' or '.join(target['kernels'])}")
            lines.append(f"  {target['what']}: {goal}; {why}")
            continue
        met = "" if target["met"] is None else (": met" if target["met"] else ": NOT met")
        where = "" if target["at_course_sizes"] else " (not at the course sizes)"
        if target["gpu"] and "H200" not in target["gpu"]:
            where += f" (on an {target['gpu']}, not an H200)"
        lines.append(f"  {target['what']}: {target['ratio']:.2f}x, {goal}{met}{where}")
    return "\n".join(lines)


def format_table(results):
    """The results as a text table: times, rates and ratios on a GPU; on the simulator (or by
    formula) launches, threads, FLOPs, ideal and counted bytes, and whether counts equal formulas."""
    kernels, lines = results["kernels"], []
    if any(k["time"] is not None for k in kernels):
        keys = sorted({key for k in kernels for key in k["baselines"]})
        lines.append(f"{'kernel':<20}{'median ms':>11}{'IQR ms':>9}{'1 launch':>10}{'TFLOP/s':>9}{'GB/s':>9}"
                     + "".join(f"{'vs ' + key:>18}" for key in keys))
        for k in kernels:
            t = k["time"]
            ratios = [k["baselines"].get(key, {}).get("ratio") for key in keys]
            lines.append(f"{k['name']:<20}{t['median_s'] * 1e3:>11.3f}{t['iqr_s'] * 1e3:>9.3f}"
                         f"{t['single_s'] * 1e3:>10.3f}{_number(k['flop_per_s'] and k['flop_per_s'] / 1e12, '.2f'):>9}"
                         f"{_number(k['bytes_per_s'] and k['bytes_per_s'] / 1e9, '.0f'):>9}"
                         + "".join(f"{_number(r, '.2f'):>18}" for r in ratios))
        kernels_run = {key: base["cuda_kernels"] for k in kernels for key, base in k["baselines"].items()
                       if base.get("cuda_kernels") and key.startswith("torch_")}
        lines += [f"  {key} ran: {', '.join(names)}" for key, names in sorted(kernels_run.items())]
    else:
        ran = results["backend"] != "formula"
        lines.append(f"{'kernel':<20}" + (f"{'launches':>9}{'threads':>10}" if ran else "")
                     + f"{'FLOPs':>16}{'ideal B':>15}{'FLOP/B':>8}{'counted B':>16}{'FLOP/B':>8}"
                     + (f"{'formula':>9}" if ran else ""))
        for k in kernels:
            c = k["counted"] or {}
            formula = {True: "equal", False: "DIFFERS", None: "-"}[k["formula_matches"]]
            lines.append(f"{k['name']:<20}" + (f"{len(k['launches']):>9}{k['threads']:>10,}" if ran else "")
                         + f"{k['flops']:>16,}{k['ideal_bytes']:>15,}{_number(k['intensity'], '.2f'):>8}"
                         + f"{_number(c.get('global_bytes'), ','):>16}{_number(c.get('intensity'), '.2f'):>8}"
                         + (f"{formula:>9}" if ran else ""))
    lines += [f"{s['name']:<20} skipped: {s['reason']}" for s in results["skipped"]]
    lines += [f"{f['name']:<20} FAILED: {f['error']}" for f in results.get("failed", [])]
    return "\n".join(lines)


def write_results(results, out_dir=DEFAULT_OUT):
    """Save results as out_dir/bench-<backend>.json and its roofline as roofline-<backend>.png."""
    import matplotlib
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")                   # no display needed for a file
    import matplotlib.pyplot as plt

    from attention_lib.plotting import plot_bench_roofline
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / f"bench-{results['backend']}.json", out / f"roofline-{results['backend']}.png"
    fig, ax = plt.subplots(figsize=(10, 6))
    plot_bench_roofline(results, ax=ax)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    files = {"json": str(json_path), "png": str(png_path)}
    json_path.write_text(json.dumps({**results, "files": files}, indent=1) + "\n")
    return files


def load_results(path):
    """A results dict written by run_bench (bench-gpu.json)."""
    results = json.loads(Path(path).read_text())
    if results.get("schema") != SCHEMA:
        raise ValueError(f"{path} is not a bench results file ({SCHEMA}), schema {results.get('schema')!r}")
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m attention_lib.measure.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="folder for the JSON and the PNG (default %(default)s)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="entries whose name contains one of these")
    parser.add_argument("--repeats", type=int, default=20, help="timed samples per kernel, at most (default 20)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs first (default 3)")
    parser.add_argument("--max-seconds", type=float, default=2.0, help="measured time per kernel, at most")
    parser.add_argument("--no-baselines", action="store_true", help="do not time PyTorch and CuPy")
    for name, default in zip(("batch", "heads", "T", "d-k"), astuple(BenchSizes.of(runtime.SIZES))):
        parser.add_argument(f"--{name}", type=int, default=default, help=f"default {default} ({runtime.SIZES.name})")
    parser.add_argument("--list", action="store_true", help="list the registry and stop")
    args = parser.parse_args(argv)
    if args.list:
        for e in REGISTRY:
            print(f"{e.name:<20} notebook {e.notebook}  {e.what}")
        return 0
    print(runtime.banner())
    results = run_bench(BenchSizes(args.batch, args.heads, args.T, args.d_k), args.only, args.out, args.warmup,
                        args.repeats, args.max_seconds, baselines=not args.no_baselines)
    print(format_table(results))
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
