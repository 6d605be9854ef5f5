"""Notebook 10's exercises: a local array kept in registers (warm-up), and the least time a kernel can
take (main).

``10_registers`` (warm-up): a kernel ``(q, k, out)`` computing out[i, j] = q[i] . k[j] for q (T_q, D),
k (T_k, D), one thread per query row holding its row of q in a ``cuda.local.array``, written so that
the array lives in registers (``registers.row_scores_kernel_v2``; the notebook gives
``row_scores_kernel_v1``, whose array sits in local memory). It is judged on values (random data,
awkward sizes) and then by its row of the kernel report for sm_90 (``compiled_report``: a stack
frame of 0 bytes, float32 multiply-adds in the hot loop). Diagnoses: ``still_local_memory`` (a
stack frame left: an index the compiler cannot know), ``float64_arithmetic`` (an accumulator typed
float64), ``not_compiled`` (no compiler here, or the kernel does not compile for a GPU), besides
the engine's.

``10_lower_bound`` (main): a function ``lower_bound(flops, nbytes, launches, gpu, launch_s)`` ->
``(seconds, regime)``, the least time that work can take on ``gpu`` (a ``gpus.GpuLimits``): the
largest of the time at the FP32 peak, the time at full bandwidth and the launches' time, with
the regime ("compute", "memory" or "launch") that sets it (``bench.lower_bound``). The cases are
registry entries of the bench (FLOPs and ideal bytes by ``bench_cases``' formulas, their launches) at
ANDREA-120M and ANDREA-sim on several GPUs, at two launch costs. Besides the engine's diagnoses:
``times_added`` (the three times summed: they overlap), ``min_instead_of_max``,
``tensor_core_peak`` (the tensor-core peak, which Numba's FP32 arithmetic cannot use),
``launch_overhead_missing``, ``launch_not_per_launch`` (one launch's cost for the whole entry),
``wrong_regime`` (the right time, the wrong or an unknown regime).
"""

from typing import NamedTuple

import numpy as np
from numba import cuda

from attention_lib import reference
from attention_lib.checks.engine import Exercise, output_array, read_output, register
from attention_lib.measure import bench, gpus
from attention_lib.measure.bench_cases import REGISTRY, BenchSizes
from attention_lib.platform import runtime
from attention_lib.stages import registers

# --- The warm-up: keep a local array in registers ------------------------------------------

D = registers.D
ROWS_PER_BLOCK = registers.ROWS_PER_BLOCK
# The sizes tried, (T_q, T_k), then what the compiler makes of the kernel for an H100 / H200.
ROW_CASES = [(1, 1), (7, 19), (33, 5)]
COMPILED = "the kernel report for sm_90"
ARGUMENT_TYPES = ["array(float32, 2d, C)"] * 3          # q, k, out


def compiled_report(kernel):
    """The kernel report's row for a (q, k, out) kernel at sm_90, or {"error": one line} when it
    cannot be made here (no compiler installed, or a kernel that does not compile for a GPU)."""
    from attention_lib.measure import kernel_report
    try:
        return kernel_report.report_kernel(kernel, ARGUMENT_TYPES, ROWS_PER_BLOCK, arch="sm_90")
    except Exception as error:  # the compiler's own error, whatever its class
        lines = str(error).strip().splitlines() or [type(error).__name__]
        return {"error": f"{type(error).__name__}: {lines[-1]}"}


def launch_row_scores(kernel, q, k, launch):
    """Run a kernel with the signature (q, k, out), one thread per query row, on registers'
    grid, through `launch` (the judge's): q (T_q, D), k (T_k, D) float32 device arrays -> out
    (T_q, T_k) float32 NumPy array (the engine's UNWRITTEN where never written)."""
    if q.shape[1] != D or k.shape[1] != D:
        raise ValueError(f"q and k must be (T, {D}) float32, got {q.shape} and {k.shape}")
    full, out = output_array((q.shape[0], k.shape[0]), guard=0)
    launch(kernel, *registers.row_scores_grid(q.shape[0]), q, k, out)
    return read_output(full, out)


def _run_rows(kernel, case, rng, launch):
    if case == COMPILED:
        report = compiled_report(kernel)
        if "error" in report:
            return np.array([np.inf, np.inf]), np.zeros(2), report
        float64 = report["hot_loop"]["ffma"] == 0          # double-precision multiply-adds instead
        return np.array([report["stack_bytes"], float(float64)]), np.zeros(2), report
    t_q, t_k = case
    q = rng.standard_normal((t_q, D)).astype(np.float32)
    k = rng.standard_normal((t_k, D)).astype(np.float32)
    got = launch_row_scores(kernel, cuda.to_device(q), cuda.to_device(k), launch)
    return got, reference.scores(q, k, scale=False), None


def _diagnose_rows(got, expected, report):
    if report is None:                           # a case of values: the engine's diagnosis
        return None
    if "error" in report:
        return "not_compiled", f"the compiler's report is unavailable: {report['error']}"
    if report["stack_bytes"] > 0:
        return "still_local_memory", (
            f"correct values, but the kernel report says {report['stack_bytes']} bytes of stack frame "
            f"(local memory, in device DRAM) and {report['registers']} registers: some index into the "
            "local array is still unknown when the kernel is compiled")
    return "float64_arithmetic", (
        f"no local memory left ({report['registers']} registers), but the hot loop has no float32 "
        f"multiply-add (FFMA) among its {report['hot_loop']['total']} instructions: a number typed as "
        "float64 (a plain 0.0) makes every multiply-add double precision, far slower on most GPUs; "
        "keep the arithmetic float32")


register(Exercise(
    exercise_id="10_registers",
    title="a row-scores kernel whose local array lives in registers (stack frame 0 bytes)",
    kind="kernel",
    run=_run_rows,
    cases=ROW_CASES + [COMPILED],
    describe_case=lambda c: c if c == COMPILED else f"T_q = {c[0]}, T_k = {c[1]}, D = {D}",
    hint=("a thread's local array becomes registers only when every index into it is a constant the compiler "
          "knows once it has unrolled the loops: which of the kernel's loop bounds does the compiler know, and "
          "which only the launch?"),
    more_hints=("where answers go wrong: changing one of the two loops over the row and not the other (both "
                "index the local array), and an accumulator started from a plain zero, which Python types "
                "as a float64",),
    # float32 sums of 64 products of standard normals (values up to about 25) against float64.
    rtol=1e-5,
    atol=1e-4,
    diagnose=_diagnose_rows,
    diagnoses=("still_local_memory", "not_compiled"),
    solution=registers.row_scores_kernel_v2,
    forbidden=(registers.row_scores, registers.launch_row_scores),
))


# --- The main exercise: the least time a kernel can take -----------------------------------

class Case(NamedTuple):
    """One piece of work: a registry entry at a model's sizes, its launches, on a GPU, at a launch cost."""

    entry: str
    model: str           # "ANDREA-120M" or "ANDREA-sim"
    launches: int        # the launches one run of the entry makes
    gpu: str             # a name of gpus.KNOWN_GPUS
    launch_s: float

    def work(self):
        """(flops, ideal bytes, launches) of the entry at the model's sizes (bench_cases' formulas)."""
        entry = next(e for e in REGISTRY if e.name == self.entry)
        sizes = BenchSizes.of(runtime.ANDREA_120M if self.model == "ANDREA-120M" else runtime.ANDREA_SIMULATOR)
        return int(entry.flops(sizes)), int(entry.ideal_bytes(sizes)), self.launches

    def limits(self):
        return next(limits for _, limits in gpus.KNOWN_GPUS if limits.name == self.gpu)

    def __str__(self):
        return f"({self.entry}, {self.model}, {self.gpu.removeprefix('NVIDIA ')}, launches of {self.launch_s * 1e6:g} us)"

    def describe(self):
        """The case with its figures, for a verdict that names it."""
        flops, nbytes, launches = self.work()
        return (f"{self.entry} at {self.model} on an {self.gpu}, launches of {self.launch_s * 1e6:g} us "
                f"({flops:,} FLOPs, {nbytes:,} bytes, {launches} launch{'es' if launches > 1 else ''})")


def _run_bound(answer, case, rng, _launch):           # plain Python: no kernel to launch
    flops, nbytes, launches = case.work()
    gpu = case.limits()
    result = answer(flops, nbytes, launches, gpu, case.launch_s)
    if not isinstance(result, tuple) or len(result) != 2:
        got = f"a tuple of {len(result)}" if isinstance(result, tuple) else type(result).__name__
        raise TypeError(f"lower_bound must return the tuple (seconds, regime), got {got}")
    seconds, regime = result
    want_seconds, want_regime = bench.lower_bound(flops, nbytes, launches, gpu, case.launch_s)
    code = bench.REGIMES.index(regime) if regime in bench.REGIMES else -1
    return (np.array([float(seconds), code]), np.array([want_seconds, bench.REGIMES.index(want_regime)]),
            flops, nbytes, launches, gpu, case.launch_s, regime)


def _diagnose_bound(got, expected, flops, nbytes, launches, gpu, launch_s, regime):
    """Name the slip when the time equals a known wrong formula, or only the regime is wrong."""
    compute, memory, launch = flops / gpu.fp32_flop_per_s, nbytes / gpu.bytes_per_s, launches * launch_s
    wrong = [("times_added", compute + memory + launch,
              "the three times were added: the GPU computes while it loads, and the host queues the next "
              "launch while the GPU runs, so they overlap and the slowest one alone sets the pace"),
             ("min_instead_of_max", min(compute, memory, launch),
              "the smallest of the three times was taken: the work cannot finish before the slowest of them")]
    if gpu.tensor_flop_per_s:
        wrong.append(("tensor_core_peak", max(flops / gpu.tensor_flop_per_s, memory, launch),
                      f"the arithmetic was timed at the tensor-core peak ({gpu.tensor_flop_per_s / 1e12:g} "
                      f"TFLOP/s): Numba's kernels compute in FP32 without tensor cores, "
                      f"{gpu.fp32_flop_per_s / 1e12:g} TFLOP/s on an {gpu.name}"))
    wrong += [("launch_overhead_missing", max(compute, memory),
               f"the launches were left out: {launches} launch(es) of {launch_s * 1e6:g} us each take "
               f"{launch * 1e6:g} us, longer here than the GPU's work"),
              ("launch_not_per_launch", max(compute, memory, launch_s),
               f"one launch's cost was counted for all {launches} launches: each launch costs the host launch_s")]
    for code, seconds, message in wrong:
        if not np.isclose(seconds, expected[0], rtol=1e-9) and np.isclose(got[0], seconds, rtol=1e-6):
            return code, message
    if np.isclose(got[0], expected[0], rtol=1e-6):
        want = bench.REGIMES[int(expected[1])]
        if got[1] < 0:
            return "wrong_regime", (f"the time is right but the regime {regime!r} is none of "
                                    f"{', '.join(repr(r) for r in bench.REGIMES)}: here it is {want!r}")
        return "wrong_regime", (f"the time is right but the regime is {regime!r}: the largest of the three "
                                f"times sets it, here {want!r}")
    return None


register(Exercise(
    exercise_id="10_lower_bound",
    title="lower_bound(flops, nbytes, launches, gpu, launch_s): the least time a piece of work can take",
    kind="function",
    run=_run_bound,
    describe_case=Case.describe,
    # Compute-bound first (the QKV projection at its ideal bytes), memory-bound (a softmax, and the
    # in-place mask with no arithmetic at all), launch-bound (decoding: the split-K kernel and its
    # merge; ANDREA-sim's three-launch pipeline), the pipeline again at launches of 5 us, then a T4
    # (no tensor-core peak listed) with ANDREA-120M's fused attention.
    cases=[Case("projection v1", "ANDREA-120M", 1, "NVIDIA H200", 20e-6),
           Case("softmax v1", "ANDREA-120M", 1, "NVIDIA H200", 20e-6),
           Case("mask v1", "ANDREA-120M", 1, "NVIDIA H100 SXM", 20e-6),
           Case("decode v2", "ANDREA-120M", 2, "NVIDIA H200", 20e-6),
           Case("attention pipeline", "ANDREA-sim", 3, "NVIDIA A100 40GB", 20e-6),
           Case("attention pipeline", "ANDREA-sim", 3, "NVIDIA A100 40GB", 5e-6),
           Case("flash v2", "ANDREA-120M", 1, "NVIDIA T4", 20e-6)],
    hint=("three clocks run at once: the arithmetic at the FP32 peak, the bytes at the memory bandwidth, and "
          "the host starting one launch after another; the work takes at least as long as the slowest, "
          "and that one names the regime"),
    more_hints=("where answers go wrong: adding the three times (they overlap), timing the arithmetic at the "
                "tensor-core peak (Numba cannot use tensor cores), and counting the launch cost once for an "
                "entry that launches many kernels",),
    # Three divisions and a product of floats: the reference differs from a right answer by rounding.
    rtol=1e-9,
    atol=0.0,
    diagnose=_diagnose_bound,
    diagnoses=("times_added", "min_instead_of_max", "tensor_core_peak", "launch_overhead_missing",
               "launch_not_per_launch", "wrong_regime"),
    solution=bench.lower_bound,
    forbidden=(bench.predictions,),
))
