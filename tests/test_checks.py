"""The exercise checker's engine: the verdicts every exercise shares, hints, the launch each
case gets, the output conventions. Each notebook's exercises are tested in test_exercises_NN.py."""

import math

import numpy as np
import pytest
from attention_lib.stages import basics
from attention_lib.checks import EXERCISES, check, hint, launch
from numba import cuda


def test_an_unknown_exercise_is_named():
    with pytest.raises(ValueError, match="exercise_id must be one of"):
        check("99_nothing", basics.scale_add_kernel)


def _sizes(case):
    """The integer sizes of a case (an int or a tuple of fields); flags such as bias=True are not sizes."""
    fields = case if isinstance(case, tuple) else (case,)
    return [f for f in fields if isinstance(f, (int, np.integer)) and not isinstance(f, (bool, np.bool_))]


def test_every_exercise_tries_awkward_sizes():
    from attention_lib.checks import shapes
    for exercise in EXERCISES.values():
        if not exercise.gpu_code:
            continue                              # a NumPy function's or a prediction's cases are not sizes
        cases = exercise.cases_for(shapes.native())
        sizes = [_sizes(case) for case in cases]
        assert len(cases) >= 3, exercise.exercise_id
        assert any(1 in s for s in sizes), f"{exercise.exercise_id} never tries a size of 1"
        assert any(n > 1 and n % 2 for s in sizes for n in s), f"{exercise.exercise_id} tries no odd size"




def test_every_exercises_hints_come_in_levels_and_never_give_a_line_away(capsys):
    """The first hint names the idea, the second the plan; no hint holds code."""
    for exercise_id, exercise in EXERCISES.items():
        assert len(exercise.hints) >= 2, exercise_id
        hint(exercise_id, 2)
        assert capsys.readouterr().out.startswith(f"{exercise_id}, hint 2 of {len(exercise.hints)}: "), exercise_id
        for text in exercise.hints:    # no code: no assignment, no indexing, no call of the API
            assert not any(token in text for token in ("=", "[", "cuda.", "syncthreads")), (exercise_id, text)
    with pytest.raises(ValueError, match="level must be in 1..3 for 01_tiled_matmul, got 4"):
        hint("01_tiled_matmul", 4)


def test_a_stub_is_told_where_the_next_hint_is():
    def stub(rows, cols, block):
        raise NotImplementedError()
    result = check("00_transpose", (None, stub), verbose=False)
    assert result.diagnosis == "not_implemented"
    assert "Hint: hint('00_transpose') gives the idea, hint('00_transpose', 2) the plan" in result.message
    assert EXERCISES['00_transpose'].hint not in result.message          # the idea is the student's to ask for


def test_an_input_guard_raising_not_implemented_is_not_a_stub():
    @cuda.jit
    def guarded(alpha, x, y, out):
        if x.ndim != 1:
            raise NotImplementedError("only 1-D arrays")
        i = cuda.grid(1)
        if i < out.shape[0]:
            out[i] = alpha * x[i] + y[i]
    assert check("00_scale_add", guarded, verbose=False).diagnosis == "ok"

    @cuda.jit
    def started(alpha, x, y, out):
        i = cuda.grid(1)
        raise NotImplementedError()
    assert check("00_scale_add", started, verbose=False).diagnosis == "not_implemented"


# --- The engine: the launch it hands each case, and the one prefill convention ----------------

@cuda.jit
def writes_nan(alpha, x, y, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = x[i] * (math.inf - math.inf)           # inf - inf: a NaN the kernel computed


def test_unwritten_is_a_nan_no_arithmetic_makes():
    assert np.isnan(launch.UNWRITTEN)
    with np.errstate(invalid="ignore"):
        computed = np.float32(np.inf) - np.float32(np.inf)   # inf - inf, the default NaN
    values = np.array([launch.UNWRITTEN, computed, np.nan, 0.0, -1.0], np.float32)
    assert launch.unwritten(values).tolist() == [True, False, False, False, False]
    # A float64 copy of the marker still reads as UNWRITTEN; an integer array never does.
    assert launch.unwritten(values.astype(np.float64)).tolist() == [True, False, False, False, False]
    assert not launch.unwritten(np.zeros(3, np.int32)).any()


def test_output_array_prefills_out_and_guard_and_read_output_checks_the_guard():
    full, out = launch.output_array((2, 3), guard=4)
    assert out.shape == (2, 3) and full.shape == (10,)
    assert launch.unwritten(full.copy_to_host()).all()
    out.copy_to_device(np.ones((2, 3), np.float32))
    assert np.array_equal(launch.read_output(full, out), np.ones((2, 3)))
    full[7:8].copy_to_device(np.zeros(1, np.float32))    # a write past the end, into the guard zone
    with pytest.raises(launch.OutOfBoundsWrite, match=r"out\[7\] was written but out has only 6 elements"):
        launch.read_output(full, out)
    assert launch.unwritten(launch.host_output((3, 1))).all()


def test_a_computed_nan_is_a_wrong_value_not_an_unwritten_entry():
    result = check("00_scale_add", writes_nan, verbose=False)
    assert result.diagnosis == "wrong_values"
    assert "never written" not in result.message and "got nan" in result.message


def test_the_judge_hands_each_case_its_launch():
    """No module state is switched: a kernel's run receives race_finding_launch on every case (a
    missing barrier shows once threads share a tile, two blocks writing one element once there are
    two blocks); a function's run receives plain_launch."""
    from attention_lib.checks import engine
    library = EXERCISES["00_scale_add"]
    given = []

    def recording_run(answer, case, rng, launch):
        given.append(launch)
        return library.run(answer, case, rng, launch)

    exercise = engine.Exercise("test_recording", "kernel", recording_run,
                               library.cases, library.hint)
    assert engine._judge(exercise, basics.scale_add_kernel)[0] == "ok"
    assert given == [launch.race_finding_launch] * len(library.cases)
    function = engine.Exercise("test_function", "function", recording_run,
                               library.cases, library.hint)
    given.clear()
    engine._judge(function, basics.scale_add_kernel)
    assert given == [launch.plain_launch] * len(library.cases)
    assert not hasattr(engine, "_race_checking")


@cuda.jit
def scale_add_by_the_library(alpha, x, y, out):
    basics.scale_add_kernel(alpha, x, y, out)             # the library's kernel does the work


def test_an_answer_that_calls_the_given_code_is_refused(monkeypatch):
    monkeypatch.setattr(EXERCISES["00_scale_add"], "solution", basics.scale_add_kernel)
    result = check("00_scale_add", scale_add_by_the_library, verbose=False)
    assert result.diagnosis == "calls_given_code" and "scale_add_kernel" in result.message, result
    assert check("00_scale_add", basics.scale_add_kernel, verbose=False).diagnosis == "calls_given_code"
    # A module attribute and an alias are found too; the student's own kernel is not refused.
    alias = basics.scale_add_kernel
    assert engine_uses(lambda: basics.scale_add_kernel) and engine_uses(lambda: alias)
    assert check("00_scale_add", no_bounds_guard_free_kernel, verbose=False).diagnosis == "ok"


def engine_uses(function):
    from attention_lib.checks import given_code
    return given_code.given_code_used(function, (basics.scale_add_kernel,))[0] is basics.scale_add_kernel


@cuda.jit
def no_bounds_guard_free_kernel(alpha, x, y, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = alpha * x[i] + y[i]


def test_reveal_prints_the_librarys_version(monkeypatch, capsys):
    from attention_lib.checks import reveal
    monkeypatch.setattr(EXERCISES["00_scale_add"], "solution", basics.scale_add_kernel)
    reveal("00_scale_add", give_up=True)
    shown = capsys.readouterr().out
    assert shown.startswith("# The library's version, from attention_lib/stages/basics.py\n@cuda.jit")
    assert "def scale_add_kernel(alpha, x, y, out):" in shown
    monkeypatch.setattr(EXERCISES["00_scale_add"], "solution", None)
    with pytest.raises(ValueError, match="'00_scale_add' has no library version to reveal"):
        reveal("00_scale_add")


@cuda.jit
def every_block_writes_the_first_element(alpha, x, y, out):
    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = alpha * x[i] + y[i]
    if cuda.threadIdx.x == 0 and cuda.blockIdx.x > 0:
        out[0] = alpha * x[0] + y[0]                    # each later block's thread 0, unordered with block 0


def test_a_race_between_blocks_is_not_blamed_on_a_missing_barrier():
    result = check("00_scale_add", every_block_writes_the_first_element, verbose=False)
    assert result.diagnosis == "race" and "blocks never wait for each other" in result.message, result
    assert "syncthreads" not in result.message
