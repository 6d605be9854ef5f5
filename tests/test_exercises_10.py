"""Notebook 10's exercises: each solution gets ok, each typical mistake its own diagnosis, in one line;
and what the notebook builds on them: the registers kernels' report rows, the launch counts and the
lower bounds of the bench's entries.

The solutions below are the library's code (the notebook's solution cells), copied: the library's
own code would be refused as given code.
"""

import inspect
import re
import textwrap
from pathlib import Path

import nbformat
import pytest
from numba import cuda, float32

from attention_lib.checks import EXERCISES, check
from attention_lib.checks.ex10_performance import compiled_report
from attention_lib.measure import bench, gpus
from attention_lib.stages import registers
from attention_lib.stages.registers import D

NOTEBOOK = Path(__file__).resolve().parent.parent / "notebooks" / "10_performance.ipynb"


def verdict(exercise_id, answer):
    result = check(exercise_id, answer, verbose=False)
    assert "\n" not in str(result)
    return result


# --- 10_registers (warm-up): a local array kept in registers ------------------------------------

def planted_kernels():
    """The solution and the typical mistakes. Defined inside a function, as a notebook's would be
    by a cell, so that the kernel report recompiles them from their source."""
    @cuda.jit
    def rows_in_local_memory(q, k, out):                 # the kernel the student starts from
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
    def rows_in_registers(q, k, out):                    # the solution
        i = cuda.grid(1)
        if i >= q.shape[0]:
            return
        q_row = cuda.local.array(D, float32)
        for c in range(D):
            q_row[c] = q[i, c]
        for j in range(k.shape[0]):
            acc = float32(0.0)
            for c in range(D):
                acc += q_row[c] * k[j, c]
            out[i, j] = acc

    @cuda.jit
    def rows_one_loop_changed(q, k, out):                # the copy unrolled, the dot product not
        i = cuda.grid(1)
        if i >= q.shape[0]:
            return
        q_row = cuda.local.array(D, float32)
        for c in range(D):
            q_row[c] = q[i, c]
        for j in range(k.shape[0]):
            acc = float32(0.0)
            for c in range(q.shape[1]):
                acc += q_row[c] * k[j, c]
            out[i, j] = acc

    @cuda.jit
    def rows_in_float64(q, k, out):                      # registers, but a float64 accumulator
        i = cuda.grid(1)
        if i >= q.shape[0]:
            return
        q_row = cuda.local.array(D, float32)
        for c in range(D):
            q_row[c] = q[i, c]
        for j in range(k.shape[0]):
            acc = 0.0
            for c in range(D):
                acc += q_row[c] * k[j, c]
            out[i, j] = acc

    @cuda.jit
    def rows_half_loaded(q, k, out):                     # registers, but half of q's row copied
        i = cuda.grid(1)
        if i >= q.shape[0]:
            return
        q_row = cuda.local.array(D, float32)
        for c in range(D):
            q_row[c] = q[i, c] if c < D // 2 else float32(0.0)
        for j in range(k.shape[0]):
            acc = float32(0.0)
            for c in range(D):
                acc += q_row[c] * k[j, c]
            out[i, j] = acc

    @cuda.jit
    def rows_unguarded(q, k, out):                       # no bounds guard: the last block overruns
        i = cuda.grid(1)
        q_row = cuda.local.array(D, float32)
        for c in range(D):
            q_row[c] = q[i, c]
        for j in range(k.shape[0]):
            acc = float32(0.0)
            for c in range(D):
                acc += q_row[c] * k[j, c]
            out[i, j] = acc

    @cuda.jit
    def rows_not_written(q, k, out):
        raise NotImplementedError()

    return {f.py_func.__name__: f for f in (rows_in_local_memory, rows_in_registers, rows_one_loop_changed,
                                            rows_in_float64, rows_half_loaded, rows_unguarded, rows_not_written)}


PLANTED = planted_kernels()


def test_the_kernel_report_tells_local_memory_from_registers():
    spilled, kept = compiled_report(PLANTED["rows_in_local_memory"]), compiled_report(PLANTED["rows_in_registers"])
    assert spilled["stack_bytes"] == 4 * D and kept["stack_bytes"] == 0      # the whole q_row, or nothing
    assert spilled["hot_loop"]["local"] > 0 and kept["hot_loop"]["local"] == 0
    assert kept["registers"] > D and kept["hot_loop"]["ffma"] == D           # the inner loop, unrolled


def test_the_library_rows_are_the_notebooks_story():
    """What notebook 10 prints from the report: v1 keeps q_row in a stack frame; v2 none, more
    registers and fewer warps per SM, and a global load of k beside each of its D multiply-adds."""
    from attention_lib.measure import kernel_report
    rows = kernel_report.report(names=["registers.row_scores_kernel_v1", "registers.row_scores_kernel_v2"])["kernels"]
    v1, v2 = rows["registers.row_scores_kernel_v1"], rows["registers.row_scores_kernel_v2"]
    assert v1["stack_bytes"] == 4 * D and v2["stack_bytes"] == 0
    assert v2["registers"] > D > v1["registers"] and v2["warps_per_sm"] < v1["warps_per_sm"]
    assert v2["hot_loop"]["ffma"] == v2["hot_loop"]["ldg"] == D and v2["hot_loop"]["local"] == 0


def test_the_notebooks_given_kernel_is_the_librarys_v1():
    """The kernel the warm-up starts from, typed in the notebook, is row_scores_kernel_v1."""
    cells = [c.source for c in nbformat.read(NOTEBOOK, as_version=4).cells if c.cell_type == "code"]
    given = next(c for c in cells if "def row_scores_local(" in c)
    body = textwrap.dedent(given[given.index("@cuda.jit"):]).strip().replace("row_scores_local", "row_scores_kernel_v1")
    library = inspect.getsource(registers.row_scores_kernel_v1.py_func).strip()
    strip = lambda text: [re.sub(r"\s+#.*$", "", line) for line in text.splitlines() if line.strip()]  # noqa: E731
    assert strip(body) == strip(library)


def test_the_registers_solution_passes():
    result = verdict("10_registers", PLANTED["rows_in_registers"])
    assert result.passed and result.diagnosis == "ok", result.message


@pytest.mark.parametrize("name, diagnosis, says", [
    ("rows_in_local_memory", "still_local_memory", f"{4 * D} bytes of stack frame"),
    ("rows_one_loop_changed", "still_local_memory", "bytes of stack frame"),
    ("rows_in_float64", "float64_arithmetic", "no float32 multiply-add (FFMA)"),
    ("rows_half_loaded", "wrong_values", "at T_q = 1, T_k = 1, D = 64: 1 of 1 entries differ"),
    ("rows_unguarded", "out_of_bounds", "out-of-bounds "),
    ("rows_not_written", "not_implemented", "not implemented yet"),
])
def test_planted_mistakes_of_the_registers_exercise_get_their_diagnosis(name, diagnosis, says):
    result = verdict("10_registers", PLANTED[name])
    assert (result.passed, result.diagnosis) == (False, diagnosis) and says in result.message, result.message


def test_a_plain_function_is_not_a_kernel():
    result = verdict("10_registers", PLANTED["rows_in_registers"].py_func)
    assert result.diagnosis == "not_a_kernel" and "decorate it with @cuda.jit" in result.message


def test_no_compiler_is_said_in_one_line(monkeypatch):
    from attention_lib.measure import kernel_report

    def no_ptxas(*args, **kwargs):
        raise FileNotFoundError("ptxas is not installed: install the course's compile extra")
    monkeypatch.setattr(kernel_report, "report_kernel", no_ptxas)
    result = verdict("10_registers", PLANTED["rows_in_registers"])
    assert result.diagnosis == "not_compiled" and "install the course's compile extra" in result.message


def test_the_library_kernels_are_refused_as_given_code():
    assert verdict("10_registers", registers.row_scores_kernel_v2).diagnosis == "calls_given_code"


# --- 10_lower_bound (main): the least time a piece of work can take ------------------------------

def lower_bound(flops, nbytes, launches, gpu, launch_s):               # the solution
    times = {"compute": flops / gpu.fp32_flop_per_s,
             "memory": nbytes / gpu.bytes_per_s,
             "launch": launches * launch_s}
    regime = max(times, key=times.get)
    return times[regime], regime


def times_of(flops, nbytes, launches, gpu, launch_s):
    return flops / gpu.fp32_flop_per_s, nbytes / gpu.bytes_per_s, launches * launch_s


def added(*args):
    return sum(times_of(*args)), "compute"


def smallest(*args):
    times = dict(zip(("compute", "memory", "launch"), times_of(*args)))
    regime = min(times, key=times.get)
    return times[regime], regime


def tensor_cores(flops, nbytes, launches, gpu, launch_s):
    times = {"compute": flops / gpu.tensor_flop_per_s, "memory": nbytes / gpu.bytes_per_s, "launch": launches * launch_s}
    regime = max(times, key=times.get)
    return times[regime], regime


def no_launches(flops, nbytes, launches, gpu, launch_s):
    compute, memory, _ = times_of(flops, nbytes, launches, gpu, launch_s)
    return max(compute, memory), "compute" if compute >= memory else "memory"


def one_launch(flops, nbytes, launches, gpu, launch_s):
    times = {"compute": flops / gpu.fp32_flop_per_s, "memory": nbytes / gpu.bytes_per_s, "launch": launch_s}
    regime = max(times, key=times.get)
    return times[regime], regime


def regime_always_memory(*args):
    return lower_bound(*args)[0], "memory"


def regime_misspelt(*args):
    return lower_bound(*args)[0], lower_bound(*args)[1].upper()


def bytes_as_elements(flops, nbytes, launches, gpu, launch_s):
    return lower_bound(flops, 4 * nbytes, launches, gpu, launch_s)


def returns_seconds_only(*args):
    return lower_bound(*args)[0]


def not_written(flops, nbytes, launches, gpu, launch_s):
    raise NotImplementedError()


def test_the_lower_bound_solution_passes():
    result = verdict("10_lower_bound", lower_bound)
    assert result.passed and result.diagnosis == "ok", result


@pytest.mark.parametrize("answer, diagnosis, says", [
    (added, "times_added", "they overlap"),
    (smallest, "min_instead_of_max", "the smallest of the three"),
    (tensor_cores, "tensor_core_peak", "without tensor cores"),
    (no_launches, "launch_overhead_missing", "launches were left out"),
    (one_launch, "launch_not_per_launch", "for all 2 launches"),
    (regime_always_memory, "wrong_regime", "the regime is 'memory'"),
    (regime_misspelt, "wrong_regime", "none of 'compute', 'memory', 'launch'"),
    (bytes_as_elements, "wrong_values", "softmax v1 at ANDREA-120M"),
    (returns_seconds_only, "raised_error", "must return the tuple (seconds, regime)"),
    (not_written, "not_implemented", "not implemented yet"),
])
def test_lower_bound_mistakes_get_their_diagnosis(answer, diagnosis, says):
    result = verdict("10_lower_bound", answer)
    assert (result.passed, result.diagnosis) == (False, diagnosis) and says in result.message, result.message


def test_the_library_lower_bound_is_refused_as_given_code():
    assert verdict("10_lower_bound", bench.lower_bound).diagnosis == "calls_given_code"


def test_the_predictions_at_andrea_120m():
    """Notebook 10's table: each kernel's bound from its own figures, its launches those a run
    records; the regimes the text names."""
    run = bench.run_bench(bench.BenchSizes(B=1, H=2, T=7, d_k=5), count=False, timed=False, write=False, verbose=False)
    rows = {r["name"]: r for r in bench.predictions(bench.formula_results(), run)}
    assert set(rows) == {k["name"] for k in run["kernels"]}
    h200, recorded = gpus.REFERENCE_GPU, {k["name"]: len(k["launches"]) for k in run["kernels"]}
    for r in rows.values():
        assert r["launches"] == recorded[r["name"]]
        assert r["ideal"] == bench.lower_bound(r["flops"], r["ideal_bytes"], r["launches"], h200)
        assert r["measured_s"] is None
    assert rows["projection v1"]["ideal"][1] == "compute" and rows["projection v1"]["counted"][1] == "memory"
    assert rows["projection v4"]["counted"][1] == "compute"                 # right of the ridge even uncached
    assert rows["softmax v2"]["ideal"][1] == "memory"
    assert rows["decode v1"]["ideal"][1] == rows["decode v2"]["ideal"][1] == "launch"
    assert rows["attention pipeline"]["launches"] == 3
    assert "projection v4" in bench.format_predictions(list(rows.values()))
    assert EXERCISES["10_lower_bound"].solution is bench.lower_bound
