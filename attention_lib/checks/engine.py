"""The checking engine: the registry of exercises and the one pipeline that judges an answer.

``check(exercise_id, answer)`` reads the answer's code before it runs (a stub, not a kernel, the
library's own solution: ``given_code``); runs every case of the exercise on seeded random data, in
each configuration it declares (``shapes``), each GPU launch traced (``launch``); takes the first
wrong value or broken limit (``result``, ``limits``); then compiles the answer for sm_90
(``session``); all within a CPU budget (``budget``). It shows a one-line verdict and returns a
``CheckResult``. The engine's own diagnosis codes, and each exercise's, are tabled in
INSTRUCTORS.md. ``hint`` gives an exercise's hints in levels; ``reveal`` its library version once
its check has passed (never in a graded class). Exercises live in ``checks/exNN_<id>.py``, each an
``Exercise`` declaration added by ``register``.
"""

import ast
import inspect
import os
import textwrap
import warnings
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from attention_lib.checks import budget, given_code, session, shapes
from attention_lib.checks.launch import plain_launch, race_finding_launch
from attention_lib.checks.result import CheckResult, compiled_verdict, error_verdict, limits_verdict, show, values_verdict

SEED = 2024
# The diagnoses the engine itself gives, for any exercise (INSTRUCTORS.md says what each means);
# each exercise adds its own (Exercise.diagnoses) and its limits'.
ENGINE_CODES = ("ok", "not_implemented", "not_a_kernel", "calls_given_code", "out_of_bounds", "race",
                "divergent_barrier", "stale_tile", "raised_error", "wrong_shape", "wrong_values", "timeout",
                "not_gpu_code", "float64_arithmetic")


class Kind(Enum):
    """What an answer is: a ``@cuda.jit`` kernel, a device function (``@cuda.jit(device=True)``, run
    inside a kernel the check builds around it) or a plain Python function; the first two are GPU code."""

    KERNEL = "kernel"
    DEVICE_FUNCTION = "device function"
    FUNCTION = "function"


@dataclass
class Exercise:
    """One exercise: how to run an answer on one case, and what to tell the student.

    run(answer, case, rng, launch) -> (got, expected, *inputs), got and expected NumPy arrays.
    launch(kernel, griddim, blockdim, *args) is how run launches the student's kernel: the judge
    passes plain_launch, or race_finding_launch on the cases it race-checks (a run that launches
    nothing ignores it). Entries of got that hold UNWRITTEN (output_array) were never written.
    `cases` are the sizes tried, in order, smallest and most awkward first. Differences are accepted within
    |got - expected| <= atol + rtol * |expected|.
    """

    exercise_id: str
    kind: "Kind"                      # a Kind, or its value ("kernel", "device function", "function")
    run: object
    cases: list
    hint: str
    rtol: float = 1e-5
    atol: float = 1e-5
    describe_case: object = field(default=str)
    # Optional: diagnose(got, expected, *inputs) -> (code, message) or None, asked when the values
    # are wrong; `inputs` are whatever `run` returned after (got, expected), so a typical mistake
    # (a missing scale, a mask on the wrong side) can be named instead of a bare wrong_values.
    diagnose: object = None
    # The codes `diagnose` can name, beyond the engine's own: listed in INSTRUCTORS.md, and each
    # planted in a test.
    diagnoses: tuple = ()
    # Further hints, shown by hint(exercise_id, 2), 3, ...: the step where students go wrong.
    more_hints: tuple = ()
    # The library's code the solution is (a function, kernel or device function, or a tuple of
    # them): reveal(exercise_id) prints it, and the notebook's solution is held equal to it.
    solution: object = None
    # Library code that would answer the exercise without writing it (the stage's kernel, its
    # launcher, a helper doing the work): an answer that calls any of it, or the solution itself,
    # is refused with ``calls_given_code``.
    forbidden: tuple = ()
    # Whether the answer is code a GPU runs (compiled for one by the check); by default a kernel's
    # or a device function's is, a NumPy function's is not.
    gpu_code: bool = None
    # Whether the cases also run with a GPU's launch sizes and constants (shapes.SHAPE_CONSTANTS of
    # the stages) besides the simulator's: for an exercise whose launch depends on them.
    both_shapes: bool = False
    # The limits the kernel must meet besides right values (limits.MostLoads, ...), measured once a
    # case's values are right, in this order; the first broken is the verdict.
    limits: tuple = ()
    # CPU seconds the whole check may take before it is stopped as a loop that never ends.
    seconds: float = budget.DEFAULT_SECONDS

    def __post_init__(self):
        self.kind = Kind(self.kind)
        if self.gpu_code is None:
            self.gpu_code = self.kind is not Kind.FUNCTION

    def cases_for(self, configuration):
        """The cases tried in a configuration (shapes.SIMULATOR or shapes.GPU): `cases`, or what
        it returns for the configuration when it is a function (sizes around its tiles)."""
        return list(self.cases(configuration)) if callable(self.cases) else list(self.cases)

    @property
    def given_code(self) -> tuple:
        """The library objects an answer may not use: the solution's and the forbidden ones."""
        solution = self.solution if isinstance(self.solution, tuple) else (self.solution,)
        return tuple(o for o in solution + tuple(self.forbidden) if o is not None)

    @property
    def hints(self) -> tuple:
        """Every hint, first (the idea) to last."""
        return (self.hint,) + tuple(self.more_hints)


def _is_kernel(answer):
    return hasattr(answer, "py_func") or type(answer).__name__ in ("FakeCUDAKernel", "CUDADispatcher")


# Filled by the exercise modules (attention_lib/checks/ex*.py) through register().
EXERCISES = {}


def register(exercise):
    """Add an exercise to the registry; ids are unique."""
    if exercise.exercise_id in EXERCISES:
        raise ValueError(f"exercise id {exercise.exercise_id!r} is registered twice")
    EXERCISES[exercise.exercise_id] = exercise
    return exercise


def _still_a_stub(answer):
    """True when the answer's code still raises NotImplementedError as a statement of a function's
    body (a student copy's stub), not in a branch of it: an input guard such as
    `if x.ndim != 2: raise NotImplementedError(...)` belongs to an answer that is judged by what it
    computes. A real GPU ignores a `raise` inside a kernel, so a stub kernel would just write
    nothing; reading the source tells "not started" from "started but wrong" on every backend. An
    answer made of several functions (a tuple) is a stub when any of them is.
    """
    if isinstance(answer, tuple):
        return any(_still_a_stub(part) for part in answer)
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(getattr(answer, "py_func", answer))))
    except (OSError, TypeError, SyntaxError):  # no source (built in, or typed at a prompt that keeps none)
        return False
    return any(isinstance(statement, ast.Raise) and "NotImplementedError" in ast.unparse(statement.exc or ast.Pass())
               for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
               for statement in node.body)


def _first_hint(exercise):
    """Where the hints are, not what they say: a student who runs the notebook before answering meets
    this verdict first, and the design is theirs to make before they ask for the idea."""
    more = f", hint({exercise.exercise_id!r}, 2) the plan" if exercise.more_hints else ""
    return f"hint({exercise.exercise_id!r}) gives the idea{more}"


def _static_verdict(exercise, answer):
    """A verdict read from the answer before anything runs: not written yet, not a kernel, or
    reaching the given code; None when it may run."""
    if answer is None or _still_a_stub(answer):
        return "not_implemented", f"not implemented yet. Hint: {_first_hint(exercise)}"
    if exercise.kind is Kind.KERNEL and not _is_kernel(answer):
        return "not_a_kernel", f"expected a @cuda.jit kernel, got {type(answer).__name__}; decorate it with @cuda.jit"
    used, how = given_code.given_code_used(answer, exercise.given_code)
    if used is not None:
        name = getattr(getattr(used, "py_func", used), "__qualname__", repr(used))
        module = getattr(getattr(used, "py_func", used), "__module__", "")
        return "calls_given_code", (f"the answer uses the library's {name} ({module}), which already does what "
                                    "the exercise asks: write that part yourself")
    if how:
        return "calls_given_code", (f"the answer uses {how}, which can reach the library's own code without "
                                    "naming it: a kernel needs none of it; name what you use")
    return None


def _run_case(exercise, answer, case, rng, where, judging):
    """The verdict of one case, or None when it is right within every limit."""
    judging.traces = []
    launch = race_finding_launch if exercise.gpu_code else plain_launch          # GPU code: traced
    try:
        got, expected, *inputs = exercise.run(answer, case, rng, launch)
    except Exception as error:  # the student's code may raise anything: each kind has its verdict
        return error_verdict(error, where)
    return (values_verdict(exercise, where, got, expected, inputs, judging.traces)
            or limits_verdict(exercise, where, case, judging.traces))


def _run_cases(exercise, answer, judging, seed):
    """The first verdict a case gives, in every configuration the exercise runs, or None."""
    for configuration in shapes.configurations(exercise):
        judging.simulate = configuration != shapes.native()
        suffix = f", with {shapes.describe(configuration)}" if judging.simulate else ""
        rng = np.random.default_rng(seed)
        with shapes.configured(configuration, answer):
            for case in exercise.cases_for(configuration):
                judging.where = exercise.describe_case(case) + suffix
                verdict = _run_case(exercise, answer, case, rng, judging.where, judging)
                if verdict is not None:
                    return verdict
    return None


def _judge(exercise, answer, seed=None):
    """The verdict on an answer, (diagnosis, message): what its code shows before it runs; else the
    first case (in each configuration) that is wrong or breaks a limit, or runs out of time; else
    what the GPU compiler makes of it; else ok. seed: the random data's (SEED by default)."""
    static = _static_verdict(exercise, answer)
    if static is not None:
        return static
    with session.Session(gpu_code=exercise.gpu_code, compile_first=graded()) as judging:
        judging.where = "the start"
        try:
            # A wrong answer's overflows warn in every simulated thread, in its run and in the diagnoses'
            # reruns: the verdict says it once.
            with budget.limited(exercise.seconds), warnings.catch_warnings():
                warnings.simplefilter("ignore")
                verdict = _run_cases(exercise, answer, judging, SEED if seed is None else seed)
        except budget.OutOfTime as stopped:
            verdict = "timeout", (f"at {judging.where}: {stopped}, where a right answer takes a few seconds: "
                                  "a loop that never ends? (its bound, or a step that never advances)")
        if verdict is not None:
            if verdict[0] == "not_implemented":
                return "not_implemented", f"not implemented yet. Hint: {_first_hint(exercise)}"
            return verdict
        compiled = compiled_verdict(exercise, answer, judging.compiled())
    if compiled is not None and compiled[0] != "note":
        return compiled
    return "ok", _ok_message(exercise) + (f" {compiled[1]}" if compiled else "")


def _ok_message(exercise):
    sizes = ", ".join(str(case) for case in exercise.cases_for(shapes.native()))
    if not exercise.gpu_code:
        return f"correct on every case tried ({sizes})"
    launches = " with the simulator's launch sizes and a GPU's" if exercise.both_shapes else ""
    return f"correct at every size tried ({sizes}) on random data{launches}"


def _exercise(exercise_id):
    if exercise_id not in EXERCISES:
        raise ValueError(f"exercise_id must be one of {sorted(EXERCISES)}, got {exercise_id!r}")
    return EXERCISES[exercise_id]


def hint(exercise_id, level=1):
    """Print hint number `level` (1: the idea; 2 and on: the step where students go wrong)."""
    hints = _exercise(exercise_id).hints
    if not 1 <= level <= len(hints):
        raise ValueError(f"level must be in 1..{len(hints)} for {exercise_id}, got {level!r}")
    print(f"{exercise_id}, hint {level} of {len(hints)}: {hints[level - 1]}")


# The exercises whose check passed in this process: reveal shows their library version.
_passed = set()
# Set (to 1) where a class is graded (each grading sandbox; a hub started with CLASSROOM_GRADED=1).
GRADED_VARIABLE = "ATTENTION_LIB_GRADED"


def graded():
    """Whether this process runs a graded class's checks (GRADED_VARIABLE set, as a grading sandbox
    and a hub's graded profile set it): no solution revealed, every answer compiled before it runs."""
    return os.environ.get(GRADED_VARIABLE, "") not in ("", "0")


def reveal(exercise_id, give_up=False):
    """Print the library's version of an exercise's solution, its source as the library has it,
    once check(exercise_id, ...) has passed in this kernel, or when you give up (give_up=True);
    otherwise one line says how to see it."""
    exercise = _exercise(exercise_id)
    parts = exercise.solution if isinstance(exercise.solution, tuple) else (exercise.solution,)
    if parts == (None,):
        raise ValueError(f"exercise_id {exercise_id!r} has no library version to reveal")
    if graded():
        print(f"The library's version of {exercise_id} is not shown in a graded class.")
        return
    if exercise_id not in _passed and not give_up:
        print(f"The library's version of {exercise_id} is shown once your check passes; to see it now, "
              f"reveal({exercise_id!r}, give_up=True).")
        return
    for part in parts:
        function = getattr(part, "py_func", part)
        path = inspect.getsourcefile(function)
        where = path[path.rindex("attention_lib"):] if "attention_lib" in path else path
        print(f"# The library's version, from {where}")
        print(inspect.getsource(function).rstrip())
        print()


def check(exercise_id, answer, verbose=True, seed=None):
    """Check `answer` for exercise `exercise_id`; show the verdict (unless not verbose) and return it.

    In a Jupyter kernel the verdict is displayed (plain text, and HTML in colour); elsewhere printed.
    seed: the random data's seed (the check's own, SEED, by default; a grading run's hidden test
    runs the same cases on another seed)."""
    exercise = _exercise(exercise_id)
    diagnosis, message = _judge(exercise, answer, seed)
    result = CheckResult(exercise_id, diagnosis == "ok", diagnosis, message)
    if result.passed:
        _passed.add(exercise_id)
    if verbose:
        show(result)
    return result
