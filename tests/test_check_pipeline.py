"""The pipeline every check shares: compiled for a GPU, at both launches, within a time limit, held to
the exercise's limits, a garbage tile slot named, locations a student can find, the solution revealed
only after the check passes. Each exercise's own verdicts are in test_exercises_NN.py."""

import inspect
import math

import numpy as np
import pytest
from numba import cuda, float32

from attention_lib.checks import EXERCISES, budget, check, engine, limits, mutation, result, reveal, shapes
from attention_lib.checks.launch import output_array, read_output
from attention_lib.measure import compiler
from attention_lib.platform import where
from attention_lib.stages import softmax
from attention_lib.stages.softmax import THREADS_PER_ROW


def exercise(run, cases=(1, 7), **options):
    """A small exercise of this file's own (not registered)."""
    return engine.Exercise("99_pipeline", options.pop("kind", "kernel"), run, list(cases),
                           "the idea", **options)


# --- Compiled for a GPU -------------------------------------------------------------------------

@cuda.jit
def row_softmax_in_float64(s, out):
    row = cuda.grid(1)
    if row >= s.shape[0]:
        return
    row_max = -math.inf
    for j in range(s.shape[1]):
        row_max = max(row_max, s[row, j])
    if row_max == -math.inf:
        for j in range(s.shape[1]):
            out[row, j] = 0.0
        return
    total = 0.0
    for j in range(s.shape[1]):
        total += math.exp(s[row, j] - row_max)
    for j in range(s.shape[1]):
        out[row, j] = math.exp(s[row, j] - row_max) / total


def test_python_floats_are_float64_arithmetic_named_at_their_lines():
    result = check("04_row_softmax", row_softmax_in_float64, verbose=False)
    assert result.diagnosis == "float64_arithmetic", result
    lines, first = inspect.getsourcelines(row_softmax_in_float64.py_func)
    at = {line.strip(): first + i for i, line in enumerate(lines)}
    assert (f"line {at['row_max = -math.inf']}: row_max = -math.inf; line {at['total = 0.0']}: total = 0.0"
            in result.message), result.message
    assert "test_check_pipeline.py" in result.message


def twice(x):
    return x + x


@cuda.jit
def copies_through_a_python_function(alpha, x, y, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = twice(alpha * x[i] * np.float32(0.5)) + y[i] * np.float32(1.0)


def test_code_the_simulator_runs_and_no_gpu_compiles_is_not_gpu_code():
    result = check("00_scale_add", copies_through_a_python_function, verbose=False)
    assert result.diagnosis == "not_gpu_code", result
    assert "Untyped global name 'twice'" in result.message


def test_without_a_compiler_the_check_says_so_once(monkeypatch):
    class Unavailable:
        def result(self):
            return compiler.Compiled(unavailable="no NVVM here")
    monkeypatch.setattr(compiler, "submit", lambda *a, **k: Unavailable())
    monkeypatch.setattr(result, "_said_unavailable", [])
    answer = EXERCISES["00_scale_add"]
    first, second = (check("00_scale_add", kernel_of_scale_add, verbose=False) for _ in range(2))
    assert first.diagnosis == second.diagnosis == "ok"
    assert "(Not compiled for a GPU here: no NVVM here.)" in first.message
    assert "Not compiled" not in second.message and answer.exercise_id == "00_scale_add"


@cuda.jit
def kernel_of_scale_add(alpha, x, y, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = alpha * x[i] + y[i]


def test_a_checked_answer_is_not_compiled_again(monkeypatch):
    assert check("00_scale_add", kernel_of_scale_add, verbose=False).passed
    monkeypatch.setattr(compiler._Worker, "send", lambda *a: pytest.fail("compiled again"))
    assert check("00_scale_add", kernel_of_scale_add, verbose=False).passed


# --- Both launches ------------------------------------------------------------------------------

def _run_one_row(kernel, case, rng, launch):
    """One block of softmax.THREADS_PER_ROW threads (the configuration's), each writing its index."""
    threads = softmax.THREADS_PER_ROW
    full, out = output_array(threads, guard=0)
    launch(kernel, 1, threads, out)
    return read_output(full, out), np.arange(threads, dtype=np.float64)


@cuda.jit
def each_thread_its_index(out):
    tid = cuda.threadIdx.x
    if tid < THREADS_PER_ROW:
        out[tid] = tid


@cuda.jit
def the_simulators_block_hard_coded(out):
    tid = cuda.threadIdx.x
    if tid < 32:
        out[tid] = tid


def test_both_launches_catch_the_simulators_block_size_written_as_a_number():
    both = exercise(_run_one_row, both_shapes=True)
    assert engine._judge(both, each_thread_its_index)[0] == "ok"
    diagnosis, message = engine._judge(both, the_simulators_block_hard_coded)
    assert diagnosis == "wrong_values" and "with a GPU's launch" in message and "softmax.THREADS_PER_ROW 128" in message
    assert engine._judge(exercise(_run_one_row), the_simulators_block_hard_coded)[0] == "ok"   # one launch only
    assert softmax.THREADS_PER_ROW == THREADS_PER_ROW == 32, "the constants were not put back"


def test_the_other_configuration_changes_the_library_and_the_answer_and_puts_them_back():
    other = shapes.GPU if shapes.native() == shapes.SIMULATOR else shapes.SIMULATOR
    values = softmax.SHAPE_CONSTANTS["THREADS_PER_ROW"]
    with shapes.configured(other, each_thread_its_index):
        assert softmax.THREADS_PER_ROW == values[1] and globals()["THREADS_PER_ROW"] == values[1]
    assert softmax.THREADS_PER_ROW == THREADS_PER_ROW == values[0]


# --- The time limit -----------------------------------------------------------------------------

@cuda.jit
def never_ends(out):
    i = cuda.threadIdx.x
    while i >= 0:
        i += 1


def test_a_loop_that_never_ends_is_stopped_and_named():
    diagnosis, message = engine._judge(exercise(_run_one_row, seconds=1.0), never_ends)
    assert diagnosis == "timeout" and "at 1: still running after 1 s of CPU time" in message, message


def test_the_limit_counts_cpu_time_not_the_clock():
    import time
    with budget.limited(0.5):
        time.sleep(1.0)                      # sleeping spends no CPU time: no OutOfTime
    with pytest.raises(budget.OutOfTime):
        with budget.limited(0.3):
            while True:
                pass


# --- A slot no thread wrote, and the limits -----------------------------------------------------

def _run_copy(kernel, case, rng, launch):
    """out = x through a shared tile, one block of 32 threads."""
    x = rng.standard_normal(32).astype(np.float32)
    full, out = output_array(32, guard=0)
    launch(kernel, 1, 32, cuda.to_device(x), out)
    return read_output(full, out), x.astype(np.float64)


@cuda.jit
def half_the_tile_written(x, out):
    tile = cuda.shared.array(32, float32)
    tid = cuda.threadIdx.x
    if tid < 16:
        tile[tid] = x[tid]
    cuda.syncthreads()
    out[tid] = tile[tid] * float32(0.0) + x[tid]       # times 0: still NaN when the slot holds garbage


@cuda.jit
def through_the_tile(x, out):
    tile = cuda.shared.array(32, float32)
    tid = cuda.threadIdx.x
    tile[tid] = x[tid]
    cuda.syncthreads()
    out[tid] = tile[tid]


@cuda.jit
def column_reads(x, out):
    tid = cuda.threadIdx.x
    total = float32(0.0)
    for j in range(32):                               # every thread reads all of x, one by one
        total += x[j] * float32(0.0)
    out[tid] = x[(tid * 8) % 32] * float32(0.0) + x[tid] + total


def _run_rows(kernel, case, rng, launch):
    """out[t] = the sum of row t of a symmetric x (32, 32), which is its column t: one block of 32 threads."""
    x = rng.standard_normal((32, 32)).astype(np.float32)
    x = x + x.T
    full, out = output_array(32, guard=0)
    launch(kernel, 1, 32, cuda.to_device(x), out)
    return read_output(full, out), x.astype(np.float64).sum(axis=0)


@cuda.jit
def sums_across_a_row(x, out):
    tid = cuda.threadIdx.x
    total = float32(0.0)
    for j in range(32):
        total += x[j, tid]                           # a warp reads one row: neighbours, one segment
    out[tid] = total


@cuda.jit
def sums_down_a_column(x, out):
    tid = cuda.threadIdx.x
    total = float32(0.0)
    for j in range(32):
        total += x[tid, j]                           # a warp reads one column: 32 segments
    out[tid] = total


def test_a_slot_no_thread_wrote_holds_garbage_and_is_named():
    diagnosis, message = engine._judge(exercise(_run_copy), half_the_tile_written)
    assert diagnosis == "stale_tile", message
    assert "read tile[16] at test_check_pipeline.py" in message and "out[tid] = tile[tid]" in message
    assert "which no thread of its block had written" in message


def test_each_limit_is_measured_and_named_with_its_figures():
    assert engine._judge(exercise(_run_copy, limits=(limits.MostLoads("x", 1),)), through_the_tile)[0] == "ok"
    reuse = engine._judge(exercise(_run_copy, limits=(limits.MostLoads("x", 2),)), column_reads)
    assert reuse[0] == "no_reuse" and "read up to 41 times from global memory, where the limit is 2" in reuse[1]
    coalesced = exercise(_run_rows, limits=(limits.Coalesced("x", 2),))
    assert engine._judge(coalesced, sums_across_a_row)[0] == "ok"
    spread = engine._judge(coalesced, sums_down_a_column)
    assert spread[0] == "uncoalesced" and "touched 32.0 segments of 128 bytes" in spread[1], spread
    assert "total += x[tid, j]" in spread[1]
    serial = engine._judge(exercise(_run_copy, limits=(limits.SharedLoadsPerThread(0),)), through_the_tile)
    assert serial[0] == "serial_reduction" and "read shared memory 1 times, where the limit is 0" in serial[1]


def test_local_memory_is_read_from_the_compilers_stack_frame():
    broken = limits.NoLocalMemory().broken([], None, compiler.Compiled(stack_bytes=256, registers=40))
    assert "256-byte stack frame (40 registers)" in broken
    assert limits.NoLocalMemory().broken([], None, compiler.Compiled(stack_bytes=0, registers=40)) is None


# --- What a student reads -----------------------------------------------------------------------

def test_a_cells_file_is_named_by_its_prompt(monkeypatch):
    monkeypatch.setattr(where, "_cell_number", lambda filename: 12 if filename.endswith("1101779405.py") else None)
    assert where.describe("/tmp/ipykernel_7/1101779405.py", 15) == "your cell In [12], line 15"
    assert where.describe("/x/attention_lib/stages/flash.py", 3) == "attention_lib/stages/flash.py:3"


def test_the_solution_is_revealed_once_the_check_passes(monkeypatch, capsys):
    from attention_lib.checks import mutation
    monkeypatch.setattr(engine, "_passed", set())
    reveal("04_row_softmax")
    assert "once your check passes" in capsys.readouterr().out
    assert check("04_row_softmax", mutation.solution_copy(EXERCISES["04_row_softmax"]), verbose=False).passed
    reveal("04_row_softmax")
    assert "def softmax_kernel_v1(s, out):" in capsys.readouterr().out


@cuda.jit
def reaches_the_library_by_a_computed_name(alpha, x, y, out):
    getattr(engine, "scale" + "_add")(alpha, x, y, out)


def test_a_computed_name_cannot_reach_the_given_code():
    result = check("00_scale_add", reaches_the_library_by_a_computed_name, verbose=False)
    assert result.diagnosis == "calls_given_code" and "getattr" in result.message


def test_warnings_inside_a_check_do_not_reach_stderr(capsys):
    check("04_row_softmax", row_softmax_in_float64, verbose=False)
    assert capsys.readouterr().err == ""


TENTH = "def tenth(x, out):\n    i = cuda.grid(1)\n    if i < x.size:\n        out[i] = x[i] * 0.1\n"


def test_the_same_code_typed_in_two_places_is_compiled_once_and_placed_in_each(tmp_path, monkeypatch):
    """A notebook cell's file is named after its kernel's process: the store's key is the code, so a
    restarted kernel or another student's finds it; the float64 lines are given in each one's file."""
    import linecache
    monkeypatch.setattr(compiler, "_store", lambda: tmp_path)
    monkeypatch.setattr(compiler, "_remembered", {})
    placed = []
    for name in ("/tmp/ipykernel_1/cell.py", "/tmp/ipykernel_2/cell.py"):
        linecache.cache[name] = (len(TENTH), None, TENTH.splitlines(keepends=True), name)
        namespace = {"cuda": cuda}
        exec(compile(TENTH, name, "exec"), namespace)
        x = np.zeros(4, np.float32)
        placed.append(compiler.submit(cuda.jit(namespace["tenth"]), [x, x]).result())
    assert len(list(tmp_path.glob("*.json"))) == 1                  # the second was read from the store
    assert [{f.filename for f in c.float64} for c in placed] == [{"/tmp/ipykernel_1/cell.py"},
                                                                 {"/tmp/ipykernel_2/cell.py"}]
    assert all(f.line == 4 for c in placed for f in c.float64)


def test_a_device_functions_float64_is_named_at_its_own_line_never_at_the_checks():
    """The float64 of a device function's result shows in the PTX at the line of the check's kernel
    that stores it: the verdict names the answer's Python float and no line of the library's."""
    answer = mutation.variant(EXERCISES["04_block_reduction"], ("    result = partial[0]\n",
                                                               "    result = partial[0] * 1.0\n"))
    result = check("04_block_reduction", answer, verbose=False)
    assert result.diagnosis == "float64_arithmetic", result
    assert "it returns a float64" in result.message and "line 15: result = partial[0] * 1.0" in result.message
    assert "attention_lib" not in result.message, result.message


def test_values_that_differ_in_the_last_bits_print_until_they_differ():
    said = result.got_and_expected(np.float32(-0.9579261), -0.95792603)
    assert said.startswith("got -0.957926095, expected -0.95792603") and "last bits: 1.08 units" in said
    assert result.got_and_expected(1.5, 2.0) == "got 1.5, expected 2"


SEEN_BY_THE_KERNEL = []


@cuda.jit
def scale_add_reaching_python(a, x, y, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        SEEN_BY_THE_KERNEL.append(i)                  # a Python object: the simulator runs it, a GPU cannot
        out[i] = a * x[i] + y[i]


@cuda.jit
def scale_add_typing_a_string(a, x, y, out):
    i = cuda.grid(1)
    if i < out.shape[0] and len(str(i)) > 0:       # nopython mode has no str(): the compiler refuses it
        out[i] = a * x[i] + y[i]


def test_a_graded_check_compiles_an_answer_before_it_runs_it(monkeypatch):
    """In class the simulator runs any Python and the compile comes once the cases are right; in a
    graded class the answer is compiled for sm_90 first, so code a GPU cannot run never runs."""
    SEEN_BY_THE_KERNEL.clear()
    assert check("00_scale_add", scale_add_typing_a_string, verbose=False).diagnosis == "not_gpu_code"
    check("00_scale_add", scale_add_reaching_python, verbose=False)
    assert SEEN_BY_THE_KERNEL, "in class the simulator runs it"
    monkeypatch.setenv(engine.GRADED_VARIABLE, "1")
    SEEN_BY_THE_KERNEL.clear()
    for answer, says in ((scale_add_reaching_python, "cannot be given this code"),
                         (scale_add_typing_a_string, "refuses it, so it was not run")):
        result = check("00_scale_add", answer, verbose=False)
        assert result.diagnosis == "not_gpu_code" and says in result.message and result.message.startswith("at n = 1")
    assert SEEN_BY_THE_KERNEL == []
    assert check("00_scale_add", mutation.solution_copy(EXERCISES["00_scale_add"]), verbose=False).passed


@cuda.jit
def scale_add_float_index(a, x, y, out):
    i = cuda.grid(1)
    j = i / 1                                          # a float: `/` between two integers
    if i < out.shape[0]:
        out[i] = a * x[j] + y[i]


def test_a_float_index_is_named_with_its_line_not_numpys_raw_refusal():
    result = check("00_scale_add", scale_add_float_index, verbose=False)
    assert result.diagnosis == "raised_error", result
    assert "indexed with a float at test_check_pipeline.py:" in result.message and "out[i] = a * x[j] + y[i]" in result.message
    assert "use `//`" in result.message and "only integers" not in result.message
