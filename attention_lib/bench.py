"""Performance (notebook 09): time every kernel version on a GPU; count its threads and memory traffic on the simulator.

    python -m attention_lib.bench                       # or: make bench
    python -m attention_lib.bench --only flash projection --repeats 50 --out bench-results

For every entry of ``REGISTRY`` (one stage's launcher at one version: "projection v3",
"flash v2", ...) the harness

1. builds random float32 inputs at the bench sizes (``BenchSizes``; by default
   ``attention_lib.SIZES``: ANDREA-120M on a GPU, B 8, H 12, T 1024, d_k 64, d_model 768;
   ANDREA-sim on the simulator, B 2, H 4, T 32, d_k 16, d_model 64);
2. calls the library's own launcher once inside ``recording_launches``, which records every
   kernel launch the launcher makes (kernel, grid, block, the device arrays it was given), so
   the bench times exactly what the library runs, and keeps up when a launcher changes;
3. on a GPU replays only those launches between two CUDA events (host-device copies and
   input checks left out): ``warmup`` untimed runs (the first compiles), then up to
   ``repeats`` timed ones; reports the median and the interquartile range (IQR), FLOP/s and
   bytes/s against the GPU's limits (``gpu_limits``), and the time of PyTorch
   (``torch.matmul``, ``scaled_dot_product_attention``, float32 with TF32 off) and CuPy doing
   the same work, where they are installed;
4. on the simulator, where CUDA events record no time (``elapsed_time`` returns -1), runs each
   recorded launch under ``sanitizer.count_memory`` instead: threads, blocks, global loads,
   stores and bytes, shared-memory loads; and checks the counts against the entry's formula;
5. writes ``bench-<backend>.json`` and ``roofline-<backend>.png`` into ``out_dir``
   (default ``bench-results/``, ignored by git) and prints a table.

Entries whose module does not exist (yet) are skipped with a printed note. On the simulator
the whole registry at ANDREA-sim takes about two minutes (every thread simulated and counted).

On a GPU one command measures everything, the course's two targets included, printed as ratios
at the end: at ANDREA-120M on an H200, fused attention (flash v2) at least as fast as PyTorch's
fp32 scaled_dot_product_attention, and the tiled projection (v2 or v3) at least half as fast as
fp32 torch.matmul. To show the figures in notebook 09, commit them:

    make bench && cp bench-results/bench-gpu.json notebooks/gpu_results.json

``formula_results(sizes)`` reports what needs no run at all (FLOPs, bytes, intensities, at
ANDREA-120M by default); ``notebook_sizes()`` gives the sizes notebook 09 benches at.

Two byte counts, on purpose:
- ``ideal_bytes``: the compulsory traffic of the operation, every input read once and every
  output written once (4 bytes per float32). FLOPs / ideal bytes is the arithmetic intensity
  that places a kernel on the roofline, and ideal bytes / time its effective bandwidth.
- counted bytes (simulator): every global load and store a launch requests, as if no cache
  existed. A naive kernel requests far more than the ideal; on a GPU the caches absorb part
  of the difference, and times show how much.

FLOPs: a multiply-add is 2; the scale of the scores is 1 per score; a softmax is counted as 5
per score (max, subtract, exp, add, multiply; exp as one); attention as 4 * d_k per visible
(query, key) pair (its two matrix products), as FlashAttention's benchmarks count it, so that
causal attention does half the work of full attention.
"""

import argparse
import datetime
import importlib
import importlib.metadata
import json
import math
import platform
import re
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, astuple, dataclass, field
from pathlib import Path

import numpy as np
from numba import cuda

from attention_lib import runtime, sanitizer
from attention_lib.runtime import ANDREA_120M

DEFAULT_OUT = "bench-results"
# GPU figures for notebook 09, when someone has measured them: `make bench` on a GPU writes
# bench-results/bench-gpu.json; copied here and committed, the notebook shows them.
COMMITTED_RESULTS = Path(__file__).resolve().parent.parent / "notebooks" / "gpu_results.json"
SCHEMA = "attention_lib.bench/1"
BYTES = 4                                   # float32


# --- The GPU's limits --------------------------------------------------------------------

@dataclass(frozen=True)
class GpuLimits:
    """What one GPU can do at most: FP32 arithmetic without tensor cores (Numba cannot use
    them) and main-memory bandwidth, from the vendor's data sheets, rounded."""

    name: str
    fp32_flop_per_s: float
    bytes_per_s: float

    @property
    def ridge(self) -> float:
        """FLOP per byte at which the two roofs meet: below it memory limits, above it arithmetic."""
        return self.fp32_flop_per_s / self.bytes_per_s

    def attainable(self, intensity):
        """The roofline: the most FLOP/s a kernel of `intensity` FLOP/byte can reach."""
        return min(self.fp32_flop_per_s, self.bytes_per_s * intensity)


# Matched in order against the lowercased device name that Numba reports
# ("NVIDIA H200", "NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-40GB", "Tesla T4", "NVIDIA L4").
KNOWN_GPUS = [
    (r"h200", GpuLimits("NVIDIA H200", 67e12, 4.8e12)),
    (r"h100.*pcie", GpuLimits("NVIDIA H100 PCIe", 51e12, 2.0e12)),
    (r"h100", GpuLimits("NVIDIA H100 SXM", 67e12, 3.35e12)),
    (r"a100.*80\s*gb", GpuLimits("NVIDIA A100 80GB", 19.5e12, 2.0e12)),
    (r"a100", GpuLimits("NVIDIA A100 40GB", 19.5e12, 1.56e12)),
    (r"\bl4\b", GpuLimits("NVIDIA L4", 30e12, 0.3e12)),
    (r"\bt4\b", GpuLimits("NVIDIA T4", 8.1e12, 0.32e12)),
]
# The roofs drawn when there is no GPU to ask: the course's GPU.
REFERENCE_GPU = KNOWN_GPUS[0][1]


def gpu_limits(device_name):
    """GpuLimits for a device name as Numba reports it, or None for a GPU not in KNOWN_GPUS."""
    if not device_name:
        return None
    name = device_name.lower()
    for pattern, limits in KNOWN_GPUS:
        if re.search(pattern, name):
            return limits
    return None


def device_name():
    """The GPU's name as Numba reports it; None on the simulator."""
    if runtime.ON_SIMULATOR:
        return None
    name = cuda.get_current_device().name
    return name.decode() if isinstance(name, bytes) else str(name)


# --- Sizes -------------------------------------------------------------------------------

@dataclass(frozen=True)
class BenchSizes:
    """The sizes every entry is benched at: batch B, heads H, positions T, head width d_k."""

    B: int
    H: int
    T: int
    d_k: int

    @property
    def d_model(self):
        return self.H * self.d_k

    @property
    def BH(self):
        """Heads of all sequences: the leading axis of the per-head kernels."""
        return self.B * self.H

    @property
    def rows(self):
        """Positions of all sequences: the rows of the projections."""
        return self.B * self.T

    @classmethod
    def of(cls, model):
        """The sizes of a runtime.ModelSizes (ANDREA-120M, ANDREA-sim)."""
        return cls(model.batch, model.n_head, model.T, model.d_k)

    def __str__(self):
        return f"B {self.B}, H {self.H}, T {self.T}, d_k {self.d_k}, d_model {self.d_model}"


# --- Recording the launches a launcher makes ---------------------------------------------

@dataclass
class Launch:
    """One kernel launch as a launcher made it: kernel[griddim, blockdim](*args)."""

    kernel: object
    griddim: tuple
    blockdim: tuple
    args: tuple
    report: object = None          # sanitizer.MemoryReport when it ran under count_memory

    @property
    def name(self):
        return self.kernel.py_func.__name__

    @property
    def blocks(self):
        return math.prod(_dim3(self.griddim))

    @property
    def threads(self):
        return self.blocks * math.prod(_dim3(self.blockdim))


def _dim3(dims):
    return (int(dims),) if isinstance(dims, (int, np.integer)) else tuple(int(d) for d in dims)


def _kernel_class():
    """The class of a @cuda.jit kernel on this backend (CUDADispatcher, or FakeCUDAKernel)."""
    from attention_lib.stages.basics import add_kernel
    return type(add_kernel)


@contextmanager
def recording_launches(count=False):
    """Record every `kernel[griddim, blockdim](*args)` made inside the block; yields the list.

    Each launch still runs, so the launcher gets its result: normally, or, when `count`, under
    sanitizer.count_memory (the report lands in Launch.report). It works by replacing the
    kernel class's ``__getitem__`` (the ``[griddim, blockdim]`` of a launch) for the length of
    the block; the sanitizer's own launch passes straight through.
    """
    cls = _kernel_class()
    original = cls.__getitem__
    launches = []
    inside_sanitizer = []

    def configure(kernel, config):
        configured = original(kernel, config)
        if inside_sanitizer:
            return configured

        def launch(*args):
            record = Launch(kernel, config[0], config[1], args)
            if count:
                inside_sanitizer.append(True)
                try:
                    sharedmem = config[3] if len(config) == 4 else 0
                    record.report = sanitizer.count_memory(kernel, config[0], config[1], *args,
                                                           sharedmem=sharedmem)
                finally:
                    inside_sanitizer.pop()
            else:
                configured(*args)
            launches.append(record)
        return launch

    cls.__getitem__ = configure
    try:
        yield launches
    finally:
        cls.__getitem__ = original


# --- Timing ------------------------------------------------------------------------------

class TimingUnavailable(RuntimeError):
    """Times were asked for where none can be measured (the simulator)."""


SIMULATOR_NO_TIMES = ("times need a GPU: on the simulator CUDA events record no time "
                      "(elapsed_time returns -1) and kernels run as Python threads")


class NumbaClock:
    """start() / stop() around GPU work with two CUDA events (Numba's); stop() returns seconds.

    The events are recorded in the GPU's stream, between the launches, so they time the GPU's
    work, not the Python calls that queue it (a launch returns before its kernel has run).
    """

    def __init__(self):
        if runtime.ON_SIMULATOR:
            raise TimingUnavailable(SIMULATOR_NO_TIMES)
        self.begin, self.end = cuda.event(), cuda.event()   # timing is on by default

    def start(self):
        self.begin.record()

    def stop(self):
        self.end.record()
        self.end.synchronize()              # wait until the GPU has reached the end event
        ms = self.begin.elapsed_time(self.end)
        if ms < 0:
            raise TimingUnavailable(SIMULATOR_NO_TIMES)
        return ms / 1e3


class TorchClock:
    """The same with PyTorch's CUDA events, for PyTorch's work on PyTorch's stream."""

    def __init__(self, torch):
        self.begin = torch.cuda.Event(enable_timing=True)
        self.end = torch.cuda.Event(enable_timing=True)

    def start(self):
        self.begin.record()

    def stop(self):
        self.end.record()
        self.end.synchronize()
        return self.begin.elapsed_time(self.end) / 1e3


class CupyClock:
    """The same with CuPy's CUDA events."""

    def __init__(self, cupy):
        self.cupy = cupy
        self.begin, self.end = cupy.cuda.Event(), cupy.cuda.Event()

    def start(self):
        self.begin.record()

    def stop(self):
        self.end.record()
        self.end.synchronize()
        return self.cupy.cuda.get_elapsed_time(self.begin, self.end) / 1e3


def measure(work, clock, warmup=3, repeats=20, max_seconds=2.0):
    """Time `work()` with `clock`: `warmup` untimed runs, then timed ones -> dict of seconds.

    Stops after `repeats` timed runs, or earlier once `max_seconds` of measured time have
    passed (at least 5 runs). The median is the figure to quote: unlike the mean it ignores
    the odd slow run (another process, a clock change); the IQR (75th minus 25th percentile)
    says how much the middle half of the runs spread.
    """
    for _ in range(warmup):                 # compile, fill caches, let the clocks rise
        clock.start()
        work()
        clock.stop()
    times = []
    while len(times) < repeats and (len(times) < 5 or sum(times) < max_seconds):
        clock.start()
        work()
        times.append(clock.stop())
    q1, median, q3 = np.percentile(times, [25, 50, 75])
    return {"median_s": float(median), "q1_s": float(q1), "q3_s": float(q3), "iqr_s": float(q3 - q1),
            "min_s": float(min(times)), "max_s": float(max(times)), "runs": len(times)}


def replay(launches):
    """A function that runs the recorded launches again, in order, on the same device arrays."""
    ready = []
    for launch in launches:
        # A host array given to a kernel would be copied to the GPU and back at every launch:
        # copy it once, so that only the kernels are timed.
        args = tuple(cuda.to_device(a) if isinstance(a, np.ndarray) and a.ndim > 0 else a
                     for a in launch.args)
        ready.append((launch.kernel[launch.griddim, launch.blockdim], args))

    def work():
        for configured, args in ready:
            configured(*args)
    return work


def time_launches(launches, warmup=3, repeats=20, max_seconds=2.0, clock=None):
    """Median and spread of the recorded launches run again, timed with CUDA events.

    Raises TimingUnavailable on the simulator (unless a `clock` is given: tests use a fake one).
    """
    clock = NumbaClock() if clock is None else clock
    work = replay(launches)
    cuda.synchronize()
    return measure(work, clock, warmup, repeats, max_seconds)


# --- The registry ------------------------------------------------------------------------

def _visible_pairs(T):
    """(query, key) pairs a causal mask lets through in one head of T positions: T (T + 1) / 2."""
    return T * (T + 1) // 2


def attention_flops(s):
    """Causal attention of every head: 4 d_k FLOPs per visible pair (q . k and a . v)."""
    return 4 * s.d_k * s.BH * _visible_pairs(s.T)


def _ceil_div(n, d):
    return -(-n // d)


@dataclass(frozen=True)
class Entry:
    """One thing to bench: a stage's launcher at one version.

    prepare(module, sizes, inputs) -> (run, arrays): run() calls the library's launcher once on
    arrays taken from `inputs` (an Inputs); arrays is a dict of them, which the baselines get.
    flops(sizes), ideal_bytes(sizes): the work and the compulsory traffic, by formula.
    counted(module, sizes) -> (global loads, global stores) as count_memory counts them, in
    elements; None when the entry has no formula. baselines: {"torch" or "cupy":
    make(lib, inputs, sizes) -> a function doing the same work with that library}.
    """

    name: str
    module: str
    notebook: str
    what: str
    prepare: object
    flops: object
    ideal_bytes: object
    counted: object = None
    baselines: dict = field(default_factory=dict)


class Inputs:
    """Random float32 inputs at `sizes`, made once and shared by the entries that need them
    (at ANDREA-120M the (B*H, T, T) scores alone are 400 MB). Weights are scaled by
    1/sqrt(fan-in), so values stay of order 1."""

    def __init__(self, sizes, seed=0):
        self.s, self.rng, self._made = sizes, np.random.default_rng(seed), {}

    def _random(self, *shape, scale=1.0):
        a = self.rng.standard_normal(shape, dtype=np.float32)
        return a if scale == 1.0 else a * np.float32(scale)

    def get(self, name):
        """One input by name (see the methods below); made on first use."""
        if name not in self._made:
            self._made[name] = getattr(self, "_make_" + name)()
        return self._made[name]

    def _make_x(self):                                   # projection input, (B * T, d_model)
        return self._random(self.s.rows, self.s.d_model)

    def _make_w(self):                                   # fused W_qkv, (d_model, 3 d_model)
        return self._random(self.s.d_model, 3 * self.s.d_model, scale=self.s.d_model ** -0.5)

    def _make_q(self):                                   # q, k, v: (B * H, T, d_k) each
        return self._random(self.s.BH, self.s.T, self.s.d_k)

    _make_k = _make_v = _make_q

    def _make_s(self):                                   # random scores, (B * H, T, T)
        return self._random(self.s.BH, self.s.T, self.s.T)

    def _make_masked(self):
        """Causal scores q k^T / sqrt(d_k), -inf above the diagonal, (B * H, T, T), in float32."""
        q, k = self.get("q"), self.get("k")
        scores = np.matmul(q, k.transpose(0, 2, 1)) * np.float32(self.s.d_k ** -0.5)
        scores[:, np.triu(np.ones((self.s.T, self.s.T), bool), 1)] = -np.inf
        return scores

    def _make_a(self):
        """Causal attention weights, the softmax of the masked scores, (B * H, T, T)."""
        e = np.exp(self.get("masked") - self.get("masked").max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    def _make_x3(self):                                  # a layer's input, (B, T, d_model)
        return self.get("x").reshape(self.s.B, self.s.T, self.s.d_model)

    def _make_w_o(self):                                 # W_O, (d_model, d_model); W_Q, W_K, W_V
        return self._random(self.s.d_model, self.s.d_model, scale=self.s.d_model ** -0.5)

    _make_w_q = _make_w_k = _make_w_v = _make_w_o

    def _make_q1(self):                                  # one new query per head, (B * H, d_k)
        return self._random(self.s.BH, self.s.d_k)


def _pick(inputs, *names):
    return {name: inputs.get(name) for name in names}


def _prepare_projection(version):
    def prepare(m, s, inputs):
        i = _pick(inputs, "x", "w")                     # fused QKV: x (B*T, d_model) @ W_qkv
        return (lambda: m.project(i["x"], i["w"], version=version)), i
    return prepare


def _counted_projection(version):
    def counted(m, s):
        d_out = 3 * s.d_model
        x_reads, w_reads = m.global_reads(s.rows, d_out, version)
        return s.rows * s.d_model * x_reads + s.d_model * d_out * w_reads, s.rows * d_out
    return counted


def _prepare_scores(version):
    def prepare(m, s, inputs):
        i = _pick(inputs, "q", "k")
        return (lambda: m.scores(i["q"], i["k"], version=version)), i
    return prepare


def _counted_scores(version):
    def counted(m, s):
        if version == 1:                                # every score reads a row of q and of k
            loads = 2 * s.BH * s.T * s.T * s.d_k
        else:                                           # once per tile of scores that needs it
            loads = 2 * s.BH * s.T * s.d_k * _ceil_div(s.T, m.TILE)
        return loads, s.BH * s.T * s.T
    return counted


def _prepare_mask(version):
    def prepare(m, s, inputs):
        if version == 1:
            i = _pick(inputs, "s")
            return (lambda: m.apply_causal_mask(i["s"])), i
        i = _pick(inputs, "q", "k")
        return (lambda: m.causal_scores(i["q"], i["k"])), i
    return prepare


def _counted_mask(version):
    def counted(m, s):
        if version == 1:                                # writes the future, reads nothing
            return 0, s.BH * (s.T * s.T - _visible_pairs(s.T))
        tile, loads = m.TILE, 0
        for r0 in range(0, s.T, tile):                  # tiles wholly in the future load nothing
            rows = min(tile, s.T - r0)
            for c0 in range(0, s.T, tile):
                if c0 <= r0 + rows - 1:
                    loads += (rows + min(tile, s.T - c0)) * s.d_k
        return s.BH * loads, s.BH * s.T * s.T
    return counted


def _prepare_softmax(version):
    def prepare(m, s, inputs):
        i = {"s": inputs.get("masked")}                 # masked scores, -inf above the diagonal
        return (lambda: m.softmax(i["s"], version=version)), i
    return prepare


def _prepare_weighted_sum(version):
    def prepare(m, s, inputs):
        i = _pick(inputs, "a", "v")
        return (lambda: m.weighted_sum(i["a"], i["v"], version=version)), i
    return prepare


def _counted_weighted_sum(version):
    def counted(m, s):
        # A @ V is notebook 01's product with A as x and V as w (weighted_sum.py reuses it).
        from attention_lib.stages import projection
        a_reads, v_reads = projection.global_reads(s.T, s.d_k, version)
        return s.BH * (s.T * s.T * a_reads + s.T * s.d_k * v_reads), s.BH * s.T * s.d_k
    return counted


def _prepare_attention(m, s, inputs):
    i = _pick(inputs, "q", "k", "v")
    return (lambda: m.attention(i["q"], i["k"], i["v"], causal=True)), i


def _prepare_flash(version):
    def prepare(m, s, inputs):
        i = _pick(inputs, "q", "k", "v")
        return (lambda: m.flash_attention(i["q"], i["k"], i["v"], causal=True, version=version)), i
    return prepare


def _counted_flash(version):
    def counted(m, s):
        per_head = m.flash_traffic(s.T, s.T, s.d_k, causal=True, version=version)
        return s.BH * (per_head["q"] + per_head["k"] + per_head["v"]), s.BH * per_head["out"]
    return counted


def _prepare_layer(m, s, inputs):
    i = _pick(inputs, "x3", "w_q", "w_k", "w_v", "w_o")
    return (lambda: m.multi_head_attention(i["x3"], i["w_q"], i["w_k"], i["w_v"], i["w_o"],
                                           s.H, causal=True)), i


def _prepare_decode(version):
    def prepare(m, s, inputs):
        # One new token per sequence against a cache of T positions; the batch folded into the
        # heads (n_head = B * H), as kv_cache.KVCache suggests for sequences of one length.
        i = _pick(inputs, "q1", "k", "v")
        cache = m.KVCache(s.BH, s.T, s.d_k)
        cache.append(i["k"], i["v"])
        return (lambda: m.decode_step(i["q1"], cache, version=version)), i
    return prepare


def _counted_decode(version):
    def counted(m, s):
        traffic = m.decode_traffic(s.T, s.BH, s.d_k, version)
        loads = sum(l for arrays in traffic.values() for l, _ in arrays.values())
        stores = sum(st for arrays in traffic.values() for _, st in arrays.values())
        return loads, stores
    return counted


# Baselines: the same work done by PyTorch (float32, TF32 off) or CuPy, on the same inputs.

def _torch_matmul(a_name, b_name, transpose_b=False, scale=False):
    def make(torch, i, s):
        a, b = torch.from_numpy(i[a_name]).cuda(), torch.from_numpy(i[b_name]).cuda()
        b = b.transpose(-1, -2) if transpose_b else b
        factor = 1.0 / math.sqrt(s.d_k)
        return (lambda: torch.matmul(a, b) * factor) if scale else (lambda: torch.matmul(a, b))
    return make


def _cupy_matmul(a_name, b_name, transpose_b=False, scale=False):
    def make(cupy, i, s):
        a, b = cupy.asarray(i[a_name]), cupy.asarray(i[b_name])
        b = b.swapaxes(-1, -2) if transpose_b else b
        factor = np.float32(1.0 / math.sqrt(s.d_k))
        return (lambda: cupy.matmul(a, b) * factor) if scale else (lambda: cupy.matmul(a, b))
    return make


def _torch_future(torch, s):
    return torch.triu(torch.ones(s.T, s.T, device="cuda"), diagonal=1).bool()   # True: masked


def _torch_mask(version):
    def make(torch, i, s):
        future = _torch_future(torch, s)
        if version == 1:
            scores = torch.from_numpy(i["s"]).cuda()
            return lambda: scores.masked_fill(future, -math.inf)
        q, k = torch.from_numpy(i["q"]).cuda(), torch.from_numpy(i["k"]).cuda()
        factor = 1.0 / math.sqrt(s.d_k)
        return lambda: (torch.matmul(q, k.transpose(-1, -2)) * factor).masked_fill(future, -math.inf)
    return make


def _torch_softmax(torch, i, s):
    scores = torch.from_numpy(i["s"]).cuda()
    return lambda: torch.softmax(scores, dim=-1)


def _torch_sdpa(torch, i, s):
    q, k, v = (torch.from_numpy(i[n]).cuda().reshape(s.B, s.H, s.T, s.d_k) for n in "qkv")
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return lambda: sdpa(q, k, v, is_causal=True)


def _torch_decode(torch, i, s):
    q = torch.from_numpy(i["q1"]).cuda().reshape(s.BH, 1, s.d_k)    # one query per head
    k, v = torch.from_numpy(i["k"]).cuda(), torch.from_numpy(i["v"]).cuda()
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return lambda: sdpa(q, k, v)                                     # it sees every cached key


def _torch_layer(torch, i, s):
    x = torch.from_numpy(i["x3"]).cuda()                             # (B, T, d_model)
    w_qkv = torch.from_numpy(np.concatenate([i["w_q"], i["w_k"], i["w_v"]], axis=1)).cuda()
    w_o = torch.from_numpy(i["w_o"]).cuda()
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def layer():
        qkv = torch.matmul(x, w_qkv).reshape(s.B, s.T, 3, s.H, s.d_k)  # (B, T, 3, H, d_k)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)                           # each (B, H, T, d_k)
        heads = sdpa(q, k, v, is_causal=True)                          # (B, H, T, d_k)
        return torch.matmul(heads.transpose(1, 2).reshape(s.B, s.T, s.d_model), w_o)
    return layer


def _projection_ideal(s):
    return BYTES * (s.rows * s.d_model + s.d_model * 3 * s.d_model + s.rows * 3 * s.d_model)


def _qkv_ideal(s):                                   # q, k, v read once, out written once
    return BYTES * 4 * s.BH * s.T * s.d_k


def _scores_ideal(s):                                # q and k read once, every score written
    return BYTES * (2 * s.BH * s.T * s.d_k + s.BH * s.T * s.T)


def _build_registry():
    matmul = {"torch": _torch_matmul("x", "w"), "cupy": _cupy_matmul("x", "w")}
    scores_base = {"torch": _torch_matmul("q", "k", transpose_b=True, scale=True),
                   "cupy": _cupy_matmul("q", "k", transpose_b=True, scale=True)}
    av = {"torch": _torch_matmul("a", "v"), "cupy": _cupy_matmul("a", "v")}
    entries = []
    for v, how in [(1, "one thread per output"), (2, "shared-memory tiles"), (3, "2 x 2 outputs per thread")]:
        entries.append(Entry(
            f"projection v{v}", "projection", "01",
            f"fused QKV x (B*T, d_model) @ W_qkv (d_model, 3 d_model), {how}",
            _prepare_projection(v), lambda s: 2 * s.rows * s.d_model * 3 * s.d_model,
            _projection_ideal, _counted_projection(v), matmul))
    for v, how in [(1, "one thread per score"), (2, "tiled")]:
        entries.append(Entry(
            f"scores v{v}", "scores", "02", f"q k^T / sqrt(d_k) for B*H heads, {how}",
            _prepare_scores(v), lambda s: s.BH * s.T * s.T * (2 * s.d_k + 1),
            _scores_ideal, _counted_scores(v), scores_base))
    entries.append(Entry(
        "mask v1", "mask", "03", "causal mask in place on (B*H, T, T) scores",
        _prepare_mask(1), lambda s: 0,
        lambda s: BYTES * s.BH * (s.T * s.T - _visible_pairs(s.T)), _counted_mask(1),
        {"torch": _torch_mask(1)}))
    entries.append(Entry(
        "mask v2", "mask", "03", "causal scores, mask fused, future tiles skipped",
        _prepare_mask(2), lambda s: s.BH * _visible_pairs(s.T) * (2 * s.d_k + 1),
        _scores_ideal, _counted_mask(2), {"torch": _torch_mask(2)}))
    for v, how in [(1, "one thread per row"), (2, "one block per row")]:
        entries.append(Entry(
            f"softmax v{v}", "softmax", "04", f"row softmax of (B*H*T, T) masked scores, {how}",
            _prepare_softmax(v), lambda s: 5 * s.BH * s.T * s.T,
            lambda s: BYTES * 2 * s.BH * s.T * s.T,
            lambda m, s: (3 * s.BH * s.T * s.T, s.BH * s.T * s.T), {"torch": _torch_softmax}))
    for v, how in [(1, "one launch per head"), (2, "tiled, all heads in one launch")]:
        entries.append(Entry(
            f"weighted_sum v{v}", "weighted_sum", "05", f"A (B*H, T, T) @ V (B*H, T, d_k), {how}",
            _prepare_weighted_sum(v), lambda s: 2 * s.BH * s.T * s.T * s.d_k,
            lambda s: BYTES * (s.BH * s.T * s.T + 2 * s.BH * s.T * s.d_k),
            _counted_weighted_sum(v), av))
    entries.append(Entry(
        "attention pipeline", "attention", "05",
        "causal attention of B*H heads: scores, softmax, weighted sum (3 launches)",
        _prepare_attention, attention_flops, _qkv_ideal, None, {"torch": _torch_sdpa}))
    entries.append(Entry(
        "multihead layer", "multihead", "06",
        "a whole layer: fused QKV, split, attention, merge, W_O",
        _prepare_layer,
        lambda s: 2 * s.rows * s.d_model * 4 * s.d_model + attention_flops(s),
        lambda s: BYTES * (2 * s.rows * s.d_model + 4 * s.d_model * s.d_model),
        None, {"torch": _torch_layer}))
    for v, how in [(1, "one thread per query"), (2, "tiled, online softmax in shared memory")]:
        entries.append(Entry(
            f"flash v{v}", "flash", "07", f"fused causal attention of B*H heads, {how}",
            _prepare_flash(v), attention_flops, _qkv_ideal, _counted_flash(v),
            {"torch": _torch_sdpa}))
    for v, how in [(1, "one thread per head"), (2, "split over the cache, then merged")]:
        entries.append(Entry(
            f"decode v{v}", "kv_cache", "08",
            f"one new query per head against T cached keys and values, {how}",
            _prepare_decode(v), lambda s: 4 * s.BH * s.T * s.d_k,
            lambda s: BYTES * (2 * s.BH * s.T * s.d_k + 2 * s.BH * s.d_k),
            _counted_decode(v), {"torch": _torch_decode}))
    return entries


REGISTRY = _build_registry()

# The course's two performance targets at ANDREA-120M on an H200: (key, our entries (the best
# of them counts), baseline entry's library, ratio = baseline time / our time that meets it).
TARGETS = [
    ("flash_vs_sdpa", "fused attention vs PyTorch fp32 scaled_dot_product_attention",
     ["flash v2"], "torch", 1.0),
    ("projection_vs_matmul", "tiled projection vs PyTorch fp32 torch.matmul",
     ["projection v2", "projection v3"], "torch", 0.5),
]


# --- Running it --------------------------------------------------------------------------

def _versions():
    found = {"python": platform.python_version(), "numpy": np.__version__}
    for package in ("numba", "numba-cuda", "torch", "cupy", "cupy-cuda12x", "cupy-cuda13x"):
        try:
            found[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def _baseline_libraries():
    """{"torch": module, "cupy": module} for those importable with a GPU, TF32 switched off."""
    libraries = {}
    try:
        import torch
        if torch.cuda.is_available():
            # Full float32 matmuls: TF32 (tensor cores, 10-bit mantissa) would not be the same
            # arithmetic as our kernels'.
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            torch.set_float32_matmul_precision("highest")
            libraries["torch"] = torch
    except Exception as error:  # not installed, or built without CUDA: compare with nothing
        print(f"note: no PyTorch comparison ({type(error).__name__}: {error})".splitlines()[0])
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
        libraries["cupy"] = cupy
    except Exception as error:
        print(f"note: no CuPy comparison ({type(error).__name__}: {error})".splitlines()[0])
    return libraries


def _clock_for(name, library):
    return TorchClock(library) if name == "torch" else CupyClock(library)


def _one_line(error):
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def _counts(launches):
    """Totals of the count_memory reports of an entry's launches."""
    reports = [launch.report for launch in launches]
    total = {
        "global_loads": sum(r.total("loads", space="global") for r in reports),
        "global_stores": sum(r.total("stores", space="global") for r in reports),
        "global_atomics": sum(r.total("atomics", space="global") for r in reports),
        "global_bytes": sum(r.global_bytes for r in reports),
        "shared_loads": sum(r.total("loads", space="shared") for r in reports),
        "shared_stores": sum(r.total("stores", space="shared") for r in reports),
    }
    return total


def _formula(entry, module, sizes, result):
    """Fill result's flops, ideal bytes, intensity and, where the entry has one, its traffic formula."""
    flops, ideal = int(entry.flops(sizes)), int(entry.ideal_bytes(sizes))
    result.update({"flops": flops, "ideal_bytes": ideal, "intensity": flops / ideal if ideal else None})
    if entry.counted is None:
        return
    try:
        loads, stores = entry.counted(module, sizes)
    except (AttributeError, TypeError, KeyError) as error:   # the module changed shape
        result["notes"].append(f"no traffic formula: {_one_line(error)}")
    else:
        result["formula"] = {"global_loads": int(loads), "global_stores": int(stores)}


def _new_result(entry):
    return {"name": entry.name, "module": entry.module, "notebook": entry.notebook, "what": entry.what,
            "launches": [], "blocks": None, "threads": None,
            "flops": None, "ideal_bytes": None, "intensity": None,
            "time": None, "flop_per_s": None, "bytes_per_s": None, "counted": None,
            "formula": None, "formula_matches": None, "baselines": {}, "notes": []}


def bench_entry(entry, sizes, inputs, count, clock=None, libraries=None, warmup=3, repeats=20,
                max_seconds=2.0):
    """Bench one registry entry -> its result dict (see run_bench); raises what the launcher raises.

    inputs: an Inputs at `sizes`; count: run the launches under count_memory (the simulator);
    clock: None for no times.
    """
    module = importlib.import_module(f"attention_lib.stages.{entry.module}")
    run, arrays = entry.prepare(module, sizes, inputs)
    with recording_launches(count=count) as launches:
        run()
    result = _new_result(entry)
    result.update({
        "launches": [{"kernel": l.name, "grid": list(_dim3(l.griddim)), "block": list(_dim3(l.blockdim))}
                     for l in launches],
        "blocks": sum(l.blocks for l in launches), "threads": sum(l.threads for l in launches)})
    _formula(entry, module, sizes, result)
    flops, ideal = result["flops"], result["ideal_bytes"]
    if count:
        counted = _counts(launches)
        counted["intensity"] = flops / counted["global_bytes"] if counted["global_bytes"] else None
        result["counted"] = counted
        if result["formula"] is not None:
            result["formula_matches"] = (result["formula"]["global_loads"] == counted["global_loads"]
                                         and result["formula"]["global_stores"] == counted["global_stores"])
    if clock is None:
        result["notes"].append(SIMULATOR_NO_TIMES if runtime.ON_SIMULATOR else "not timed")
        return result
    timing = time_launches(launches, warmup, repeats, max_seconds, clock=clock)
    result["time"] = timing
    result["flop_per_s"] = flops / timing["median_s"] if timing["median_s"] > 0 else None
    result["bytes_per_s"] = ideal / timing["median_s"] if timing["median_s"] > 0 else None
    for name, make in entry.baselines.items():
        if name not in (libraries or {}):
            continue
        library = libraries[name]
        try:
            theirs = measure(make(library, arrays, sizes), _clock_for(name, library),
                             warmup, repeats, max_seconds)
        except Exception as error:  # a baseline that fails must not stop the sweep
            result["notes"].append(f"{name} baseline failed: {_one_line(error)}")
            continue
        theirs["ratio"] = theirs["median_s"] / timing["median_s"]   # > 1: ours is faster
        result["baselines"][name] = theirs
    return result


def _select(only):
    if not only:
        return list(REGISTRY)
    chosen = [e for e in REGISTRY if any(word in e.name for word in only)]
    if not chosen:
        raise ValueError(f"only must name registry entries (a part of a name is enough), got {only}; "
                         f"entries: {', '.join(e.name for e in REGISTRY)}")
    return chosen


def _targets(kernels, sizes, limits):
    """The course's two targets: measured ratio, whether met, and at which sizes."""
    by_name = {k["name"]: k for k in kernels}
    found = {}
    for key, what, ours, library, target in TARGETS:
        ratios = [by_name[n]["baselines"][library]["ratio"] for n in ours
                  if n in by_name and library in by_name[n].get("baselines", {})]
        ratio = max(ratios) if ratios else None
        found[key] = {"what": what, "kernels": ours, "target": target, "ratio": ratio,
                      "met": None if ratio is None else ratio >= target,
                      "at_course_sizes": sizes == BenchSizes.of(ANDREA_120M),
                      "gpu": limits.name if limits else None}
    return found


def _progress(head, result, seconds):
    """One line per entry while the sweep runs."""
    if result["time"] is not None:
        t = result["time"]
        rates = "" if result["flop_per_s"] is None else (
            f"  {result['flop_per_s'] / 1e12:6.2f} TFLOP/s  {result['bytes_per_s'] / 1e9:8.1f} GB/s")
        line = f"{head} {t['median_s'] * 1e3:9.3f} ms (IQR {t['iqr_s'] * 1e3:.3f} ms, {t['runs']} runs){rates}"
        for name, base in result["baselines"].items():
            line += f"  {name} {base['median_s'] * 1e3:.3f} ms (ours {base['ratio']:.2f}x its speed)"
        return line
    line = f"{head} {len(result['launches'])} launch(es), {result['threads']:,} threads"
    if result["counted"] is not None:
        c = result["counted"]
        line += f", {c['global_loads']:,} loads, {c['global_stores']:,} stores, {c['global_bytes']:,} B"
        if result["formula_matches"] is not None:
            line += ", = formula" if result["formula_matches"] else ", FORMULA DIFFERS"
    return line + f"  [{seconds:.1f} s]"


def run_bench(sizes=None, only=None, out_dir=DEFAULT_OUT, warmup=3, repeats=20, max_seconds=2.0,
              baselines=True, count=None, timed=None, clock=None, seed=0, write=True, verbose=True):
    """Bench the registry's entries; returns the results dict (also written as JSON, with a plot).

    sizes: BenchSizes (default attention_lib.SIZES); only: names or parts of names to keep
    (["flash", "projection v3"]); count: run the launches under sanitizer.count_memory
    (default: on the simulator; on a GPU it simulates the kernels on the CPU, small sizes only);
    timed: measure times (default: on a GPU; the simulator has none); clock: a start()/stop()
    timer (default: CUDA events, NumbaClock; tests pass a fake one); baselines: compare with PyTorch and
    CuPy where importable (GPU only). write: save bench-<backend>.json and roofline-<backend>.png
    into out_dir. An entry whose module is missing is skipped, one whose launcher raises is
    listed under "failed"; both with a printed note, and the sweep goes on.
    """
    sizes = BenchSizes.of(runtime.SIZES) if sizes is None else sizes
    count = runtime.ON_SIMULATOR if count is None else count
    timed = (not runtime.ON_SIMULATOR or clock is not None) if timed is None else timed
    if not timed:
        clock = None
    elif clock is None:
        clock = NumbaClock()                # refuses on the simulator: TimingUnavailable
    name = device_name()
    limits = gpu_limits(name)
    libraries = _baseline_libraries() if (baselines and clock is not None and not runtime.ON_SIMULATOR) else {}
    entries = _select(only)
    if verbose:
        print(f"Benching {len(entries)} {'entry' if len(entries) == 1 else 'entries'} on "
              f"{name or 'the simulator'} at {sizes}"
              + ("" if limits or runtime.ON_SIMULATOR else "; unknown GPU: no limits to compare with"))
    inputs = Inputs(sizes, seed)
    kernels, skipped, failed = [], [], []
    for i, entry in enumerate(entries, 1):
        started, head = time.perf_counter(), f"[{i}/{len(entries)}] {entry.name:<20}"
        try:
            result = bench_entry(entry, sizes, inputs, count, clock, libraries, warmup, repeats, max_seconds)
        except ModuleNotFoundError as error:
            if error.name != f"attention_lib.stages.{entry.module}":
                raise
            skipped.append({"name": entry.name, "reason": f"attention_lib.{entry.module} does not exist"})
            if verbose:
                print(f"{head} skipped: {skipped[-1]['reason']}")
            continue
        except Exception as error:  # one broken launcher must not lose a long GPU sweep
            failed.append({"name": entry.name, "error": _one_line(error)})
            if verbose:
                print(f"{head} FAILED: {failed[-1]['error']}")
            continue
        if limits and result["flop_per_s"] is not None:
            result["fraction_of_fp32_peak"] = result["flop_per_s"] / limits.fp32_flop_per_s
            result["fraction_of_bandwidth"] = result["bytes_per_s"] / limits.bytes_per_s
            if result["intensity"]:
                result["fraction_of_roof"] = result["flop_per_s"] / limits.attainable(result["intensity"])
        kernels.append(result)
        if verbose:
            print(_progress(head, result, time.perf_counter() - started))
    results = {
        "schema": SCHEMA,
        "backend": runtime.BACKEND,
        "gpu": name,
        "limits": None if limits is None else {**asdict(limits), "ridge_flop_per_byte": limits.ridge},
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": _versions(),
        "sizes": {**asdict(sizes), "d_model": sizes.d_model},
        "timing": None if clock is None else {
            "method": "CUDA events around the recorded launches, replayed (no host copies)",
            "warmup": warmup, "repeats": repeats, "max_seconds": max_seconds},
        "kernels": kernels,
        "skipped": skipped,
        "failed": failed,
        "targets": _targets(kernels, sizes, limits),
        "notes": [SIMULATOR_NO_TIMES] if clock is None else [],
    }
    if verbose:
        print(format_targets(results))
    if write:
        results["files"] = write_results(results, out_dir)
        if verbose:
            print("wrote", ", ".join(results["files"].values()))
    return results


def formula_results(sizes=None, only=None):
    """What can be known without running anything: FLOPs, ideal bytes, intensity and, where an
    entry has a traffic formula, the global loads and stores count_memory would count, at
    `sizes` (default ANDREA-120M). A results dict (backend "formula") that plot_results draws.

    The formulas are checked against count_memory at small sizes (run_bench on the simulator,
    tests/test_bench.py); here they extrapolate to sizes the simulator cannot run. Tile sizes
    are this backend's (some differ between the GPU and the simulator).
    """
    sizes = BenchSizes.of(ANDREA_120M) if sizes is None else sizes
    kernels, skipped = [], []
    for entry in _select(only):
        try:
            module = importlib.import_module(f"attention_lib.stages.{entry.module}")
        except ModuleNotFoundError as error:
            if error.name != f"attention_lib.stages.{entry.module}":
                raise
            skipped.append({"name": entry.name, "reason": f"attention_lib.{entry.module} does not exist"})
            continue
        result = _new_result(entry)
        _formula(entry, module, sizes, result)
        if result["formula"] is not None:
            loads, stores = result["formula"]["global_loads"], result["formula"]["global_stores"]
            moved = BYTES * (loads + stores)
            result["counted"] = {"global_loads": loads, "global_stores": stores, "global_bytes": moved,
                                 "intensity": result["flops"] / moved if moved else None}
        kernels.append(result)
    return {"schema": SCHEMA, "backend": "formula", "gpu": None, "limits": None,
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "versions": _versions(), "sizes": {**asdict(sizes), "d_model": sizes.d_model},
            "timing": None, "kernels": kernels, "skipped": skipped, "failed": [],
            "targets": _targets(kernels, sizes, None), "notes": ["by formula, nothing was run"]}


def notebook_sizes():
    """The sizes notebook 09 benches at: the course's sizes on a GPU (ANDREA-120M); on the
    simulator a quarter of ANDREA-sim (one sequence, half the heads, T and d_k halved: B 1,
    H 2, T 16, d_k 8), so that counting every entry's traffic takes seconds, not minutes."""
    s = BenchSizes.of(runtime.SIZES)
    if not runtime.ON_SIMULATOR:
        return s
    return BenchSizes(1, max(1, s.H // 2), max(1, s.T // 2), max(1, s.d_k // 2))


def format_targets(results):
    """The course's two targets, in words, with the measured ratios (or why there are none)."""
    lines = ["Targets (ANDREA-120M on an H200; ratio = PyTorch's time / ours, higher is better):"]
    for target in results["targets"].values():
        if target["ratio"] is None:
            if results["backend"] == runtime.GPU:
                why = (f"not measured: no PyTorch time for {' or '.join(target['kernels'])} (were they "
                       "run, and is PyTorch with CUDA importable in this Python?)")
            elif results["backend"] == runtime.SIMULATOR:
                why = SIMULATOR_NO_TIMES
            else:
                why = "times need a GPU"
            lines.append(f"  {target['what']}: target >= {target['target']:g}x; {why}")
        else:
            met = "met" if target["met"] else "NOT met"
            where = "" if target["at_course_sizes"] else " (not at the course sizes)"
            if target["gpu"] and "H200" not in target["gpu"]:
                where += f" (on an {target['gpu']}, not an H200)"
            lines.append(f"  {target['what']}: {target['ratio']:.2f}x, target >= {target['target']:g}x: "
                         f"{met}{where}")
    return "\n".join(lines)


def _number(value, spec):
    return "-" if value is None else format(value, spec)


def format_table(results):
    """The results as a text table: times and rates on a GPU; counts on the simulator (launches,
    threads, FLOPs, ideal and counted bytes and intensities, whether the counts equal the
    formula); the same without launches for formula_results."""
    kernels = results["kernels"]
    if any(k["time"] is not None for k in kernels):
        lines = [f"{'kernel':<20}{'median ms':>11}{'IQR ms':>9}{'TFLOP/s':>9}{'GB/s':>9}{'FLOP/B':>8}"
                 f"{'vs torch':>10}"]
        for k in kernels:
            t, torch_ratio = k["time"], k["baselines"].get("torch", {}).get("ratio")
            tflops = None if k["flop_per_s"] is None else k["flop_per_s"] / 1e12
            gbs = None if k["bytes_per_s"] is None else k["bytes_per_s"] / 1e9
            lines.append(f"{k['name']:<20}{t['median_s'] * 1e3:>11.3f}{t['iqr_s'] * 1e3:>9.3f}"
                         f"{_number(tflops, '.2f'):>9}{_number(gbs, '.1f'):>9}"
                         f"{_number(k['intensity'], '.2f'):>8}"
                         f"{'-' if torch_ratio is None else f'{torch_ratio:.2f}x':>10}")
    else:
        ran = results["backend"] != "formula"
        lines = [f"{'kernel':<20}" + (f"{'launches':>9}{'threads':>10}" if ran else "")
                 + f"{'FLOPs':>16}{'ideal B':>15}{'FLOP/B':>8}{'counted B':>16}{'FLOP/B':>8}"
                 + (f"{'formula':>9}" if ran else "")]
        for k in kernels:
            c = k["counted"] or {}
            formula = {True: "equal", False: "DIFFERS", None: "-"}[k["formula_matches"]]
            lines.append(f"{k['name']:<20}" + (f"{len(k['launches']):>9}{k['threads']:>10,}" if ran else "")
                         + f"{k['flops']:>16,}{k['ideal_bytes']:>15,}{_number(k['intensity'], '.2f'):>8}"
                         + f"{_number(c.get('global_bytes'), ','):>16}{_number(c.get('intensity'), '.2f'):>8}"
                         + (f"{formula:>9}" if ran else ""))
    for s in results["skipped"]:
        lines.append(f"{s['name']:<20} skipped: {s['reason']}")
    for f in results.get("failed", []):
        lines.append(f"{f['name']:<20} FAILED: {f['error']}")
    return "\n".join(lines)


STAGE_COLOURS = {"projection": "tab:blue", "scores": "tab:orange", "mask": "tab:olive",
                 "softmax": "tab:green", "weighted_sum": "tab:red", "attention": "tab:purple",
                 "multihead": "tab:brown", "flash": "tab:pink", "kv_cache": "tab:cyan"}
VERSION_MARKERS = {"v1": "o", "v2": "s", "v3": "^"}


def roofline_points(results, counted=True):
    """Points for plotting.plot_roofline: colour by stage, marker by version.

    With times (a GPU): each kernel at its ideal intensity and measured FLOP/s, and the PyTorch
    baselines of the projection and of fused attention as crosses. Without (the simulator):
    each kernel hollow on the roof at its counted intensity (every request to main memory),
    and each stage's ideal intensity as a filled star: the most caches and tiling could give.
    Kernels without arithmetic (the in-place mask) have no intensity and are left out.
    """
    points, stars = [], {}
    measured = any(k["flop_per_s"] for k in results["kernels"])
    for k in results["kernels"]:
        if not k["intensity"]:
            continue
        colour = STAGE_COLOURS.get(k["module"], "grey")
        marker = VERSION_MARKERS.get(k["name"].rsplit(" ", 1)[-1], "D")
        if measured and k["flop_per_s"]:
            points.append({"label": k["name"], "intensity": k["intensity"], "flop_per_s": k["flop_per_s"],
                           "colour": colour, "marker": marker})
            torch_base = k["baselines"].get("torch")
            if torch_base and k["module"] in ("projection", "flash") and k["module"] not in stars:
                stars[k["module"]] = {"label": f"PyTorch ({k['module']})", "intensity": k["intensity"],
                                      "flop_per_s": k["flops"] / torch_base["median_s"],
                                      "colour": colour, "marker": "X"}
        elif not measured:
            if counted and k["counted"] and k["counted"].get("intensity"):
                points.append({"label": f"{k['name']} (counted)", "intensity": k["counted"]["intensity"],
                               "flop_per_s": None, "colour": colour, "marker": marker})
            stars.setdefault(k["module"], {"label": f"{k['module']} (ideal)", "intensity": k["intensity"],
                                           "flop_per_s": None, "hollow": False, "colour": colour,
                                           "marker": "*"})
    return points + list(stars.values())


def plot_results(results, ax=None, counted=True, only=None, title=None):
    """The roofline of a results dict (run_bench's, formula_results', or one from load_results).

    With times: measured points under the measuring GPU's roofs. Without (the simulator, or
    formulas): the reference GPU's roofs (REFERENCE_GPU, the H200) and the points of
    roofline_points. only: names or parts of names of the kernels to draw (default all).
    """
    if only:
        results = {**results, "kernels": [k for k in results["kernels"] if any(w in k["name"] for w in only)]}
    from attention_lib.plotting import plot_roofline

    limits = None if results["limits"] is None else GpuLimits(
        results["limits"]["name"], results["limits"]["fp32_flop_per_s"], results["limits"]["bytes_per_s"])
    reference = limits is None
    limits = REFERENCE_GPU if reference else limits
    if title is not None:
        pass
    elif any(k["flop_per_s"] for k in results["kernels"]):
        title = f"Measured on {results['gpu'] or 'a GPU'}, {results['date'][:10]}"
    elif results["backend"] == "formula":
        sizes = BenchSizes(*(results["sizes"][key] for key in ("B", "H", "T", "d_k")))
        title = f"By formula at {sizes}: no times, each kernel on the {limits.name}'s roof"
    else:
        title = f"No times on the simulator: each kernel on the {limits.name}'s roof"
    return plot_roofline(roofline_points(results, counted), limits.fp32_flop_per_s, limits.bytes_per_s,
                         roof_label=limits.name + (" (reference)" if reference else ""), ax=ax, title=title)


def write_results(results, out_dir=DEFAULT_OUT):
    """Save results as out_dir/bench-<backend>.json and its roofline as roofline-<backend>.png."""
    import matplotlib
    if "matplotlib.pyplot" not in sys.modules:
        matplotlib.use("Agg")                   # no display needed for a file
    import matplotlib.pyplot as plt

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    backend = results["backend"]
    json_path, png_path = out / f"bench-{backend}.json", out / f"roofline-{backend}.png"
    fig, ax = plt.subplots(figsize=(10, 6))
    plot_results(results, ax=ax)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    plt.close(fig)
    files = {"json": str(json_path), "png": str(png_path)}
    json_path.write_text(json.dumps({**results, "files": files}, indent=1) + "\n")
    return files


def load_results(path):
    """A results dict written by run_bench (bench-gpu.json, or notebooks/gpu_results.json)."""
    results = json.loads(Path(path).read_text())
    if results.get("schema") != SCHEMA:
        raise ValueError(f"{path} is not a bench results file ({SCHEMA}), schema {results.get('schema')!r}")
    return results


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m attention_lib.bench", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=DEFAULT_OUT, help="folder for the JSON and the PNG (default %(default)s)")
    parser.add_argument("--only", nargs="+", metavar="NAME", help="entries whose name contains one of these")
    parser.add_argument("--repeats", type=int, default=20, help="timed runs per kernel, at most (default 20)")
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
    sizes = BenchSizes(args.batch, args.heads, args.T, args.d_k)
    run_bench(sizes, args.only, args.out, args.warmup, args.repeats, args.max_seconds,
              baselines=not args.no_baselines)
    return 0


if __name__ == "__main__":
    sys.exit(main())
