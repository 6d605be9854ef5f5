"""The checking engine: run a student's answer against the reference and say, in a line, what is wrong.

``check(exercise_id, answer)`` tries the answer (a ``@cuda.jit`` kernel with the library
kernel's signature, or a NumPy function, as the exercise says) on random data at several
sizes, awkward ones included (1, 7, sizes that leave the last block partly used), shows a
short verdict (displayed in colour in a Jupyter kernel, printed elsewhere) and returns a
``CheckResult`` with ``passed``, ``diagnosis`` and ``message``.

Diagnosis codes:
- ``ok``: right at every size tried;
- ``not_implemented``: the answer still raises NotImplementedError (or is None);
- ``not_a_kernel``: a kernel was expected (decorate it with ``@cuda.jit``);
- ``out_of_bounds``: a thread read or wrote past the end of an array (a missing bounds guard);
- ``race``: two threads touched the same element with no barrier between them (found by the
  sanitizer's race finder, whatever order the threads happened to run in);
- ``divergent_barrier``: a ``cuda.syncthreads()`` that not every thread of the block reaches
  (threads at different barriers, or some returned while others wait), or a warp primitive
  whose mask names a lane that never reaches it: undefined on a GPU, reported by the simulator;
- ``raised_error``: the answer raised something else (its one-line error is shown);
- ``wrong_shape``: the result has the wrong shape;
- ``wrong_values``: the values differ from the reference (the first differing entry is shown);
  entries that the answer never wrote are reported as such;
- ``calls_given_code``: the answer uses the library's own code for what the exercise asks to
  write (its solution, or code listed as ``forbidden``), read from the answer's code before it runs.
An exercise names its own typical mistakes beyond these (``transposed``, ``no_reuse``, ...):
its ``diagnose`` compares wrong values with the usual wrong formulas, and its ``run`` may raise
``Diagnosed(code, message)`` for what values cannot show (reads counted, tiles skipped).

Hints come in levels: ``hint(exercise_id)`` names the idea, ``hint(exercise_id, 2)`` the step
where students usually go wrong. No hint gives a line of the solution.

Each exercise is defined in a module ``checks/exNN_<topic>.py`` beside this one and registered
in ``EXERCISES`` under its id, such as ``"00_scale_add"``. Its ``run`` launches the answer with
the launch function the judge hands it (``plain_launch``, or ``race_finding_launch`` on the cases
that are race-checked): no module state is switched. Every output a kernel must write comes
from ``output_array`` (or ``host_output`` for a launch on NumPy arrays), prefilled with
``UNWRITTEN``; the judge reports entries still holding it as never written.
"""

import html
import dis
import inspect
import re
import sys
from dataclasses import dataclass, field

import numpy as np
from numba import cuda

from attention_lib.platform import runtime
from attention_lib.measure import sanitizer


SEED = 2024


@dataclass
class CheckResult:
    """The verdict on one answer: passed or not, a diagnosis code and a message for the student."""

    exercise_id: str
    passed: bool
    diagnosis: str
    message: str

    def __str__(self):
        mark = "✔" if self.passed else "✘"
        return f"{mark} {self.exercise_id} [{self.diagnosis}]: {self.message}"

    def _repr_pretty_(self, printer, cycle):
        """IPython's text/plain: the verdict line, exactly as print shows it."""
        printer.text(str(self))

    def _repr_html_(self):
        """The verdict for front ends that render HTML (JupyterLab): the mark, id and diagnosis in
        green or red, the message as it is; the text/plain beside it stays the plain line."""
        colour = "#1a7f37" if self.passed else "#cf222e"
        head = html.escape(str(self).split(": ", 1)[0])
        return (f'<div class="attention-lib-verdict"><span style="color: {colour}; font-weight: bold">{head}</span>: '
                f'{html.escape(self.message)}</div>')


def _show(result):
    """Display a verdict in a Jupyter kernel (text/plain and coloured HTML, so a front end picks
    what it can render); print it anywhere else (a terminal, a script, pytest)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if getattr(shell, "kernel", None) is not None:
        from IPython.display import display
        display(result)
    else:
        print(result)


class Diagnosed(Exception):
    """Raised by an exercise's run to name a mistake the values alone do not show."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


class OutOfBoundsWrite(IndexError):
    """A kernel wrote into the guard zone past the end of an output array."""


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
    title: str
    kind: str                         # "kernel" or "function"
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


class RaceFound(Exception):
    """The race finder saw two threads touch the same element without a barrier between them.
    ``race``: the first sanitizer.Race, its message the exception's."""

    def __init__(self, race):
        super().__init__(str(race))
        self.race = race

    def advice(self):
        """What to do about it, in one sentence: blocks never wait for each other, threads of a
        block wait at a barrier."""
        race = self.race
        if getattr(race, "block_a", None) is not None and race.block_a != race.block_b:
            return ("Two blocks touch one element of global memory, and blocks never wait for each other: no "
                    "barrier orders them. Give each block its own elements to write (or combine with atomics).")
        return ("A missing cuda.syncthreads()? Every thread must finish writing shared memory before any reads "
                "it, and finish reading before it is overwritten.")


def plain_launch(kernel, griddim, blockdim, *args):
    """Launch a student's kernel as the library would, with out-of-bounds indices caught.

    On the simulator every index is checked by the sanitizer, which names the thread, the array
    and the index in one line; on a GPU the kernel runs for real (outputs made with
    output_array catch writes past the end there).
    """
    if runtime.ON_SIMULATOR:
        sanitizer.run(kernel, griddim, blockdim, *args)
    else:
        kernel[griddim, blockdim](*args)


def race_finding_launch(kernel, griddim, blockdim, *args):
    """Launch a student's kernel under the sanitizer's race finder (on either backend); RaceFound
    with the first race, in one line. Out-of-bounds indices raise IndexError, as in plain_launch."""
    races = sanitizer.find_races(kernel, griddim, blockdim, *args)
    if races:
        raise RaceFound(races[0])


class Traced:
    """One launch on the simulator with every access recorded: its races, reads and warp requests.

    One traced run answers the three questions a tiled exercise asks (is there a race, how
    often is each element read, how many memory segments does a warp's load touch), where
    find_races, count_memory and a third run would each launch the kernel again.
    """

    def __init__(self, kernel, griddim, blockdim, *args):
        self.launch = sanitizer._launch(kernel, griddim, blockdim, args, sanitizer._TRACE)

    def races(self):
        """The races found, as sanitizer.Race objects (empty when none)."""
        return sanitizer._races(self.launch)

    def loads(self, name):
        """Loads of each element of array `name`, an int array of its shape."""
        target = self.launch.targets[name]
        elements = [element for element, kind, *_ in target.trace if kind == sanitizer.LOAD]
        size = int(np.prod(target.shape))
        return np.bincount(np.asarray(elements, dtype=np.int64), minlength=size).reshape(target.shape)

    def warp_segments(self, name, segment_bytes=128):
        """Mean number of `segment_bytes` segments of array `name` that one warp's load touches.

        The loads of one warp (32 consecutive threads, x fastest) from one source line in one
        barrier interval are taken as one instruction; on a GPU each segment it touches is a
        separate memory transaction. 32 float32 side by side: 1 segment; one per row: up to 32.
        """
        target = self.launch.targets[name]
        requests = {}
        for element, kind, (block, thread), interval, site, _ in target.trace:
            if kind == sanitizer.LOAD:
                warp = self.launch.global_id(block, thread) // 32
                requests.setdefault((warp, interval, site), set()).add(
                    element * target.dtype.itemsize // segment_bytes)
        return float(np.mean([len(s) for s in requests.values()])) if requests else 0.0


def traced_launch(kernel, griddim, blockdim, *args):
    """Run a student's kernel once on the simulator, recording every access; RaceFound on a race.

    args: NumPy arrays (outputs are written in place) and scalars. An out-of-bounds index
    raises the sanitizer's IndexError, as in launch().
    """
    traced = Traced(kernel, griddim, blockdim, *args)
    races = traced.races()
    if races:
        raise RaceFound(races[0])
    return traced


# The convention for an output the kernel must write: output_array prefills it, and its guard zone,
# with UNWRITTEN, a NaN of its own (the payload 0xFFEE). Arithmetic on numbers never makes it: 0 / 0
# and inf - inf give the default NaN, whose payload is another; only a kernel that reads the
# unwritten entry itself can pass it on. So after the launch an entry still holding UNWRITTEN was
# never written, any other NaN was computed, and the judge tells the two apart (unwritten) without
# the exercise converting anything.
UNWRITTEN = np.array(0x7FC0FFEE, np.uint32).view(np.float32)[()]


def output_array(shape, guard):
    """(full, out): a device float32 vector of prod(shape) + guard entries, all UNWRITTEN, and out,
    the view of its first prod(shape) entries as `shape` (an int or a tuple).

    The guard zone behind out catches writes past its end on a real GPU, where they would
    otherwise land silently; read_output checks it.
    """
    n = int(np.prod(shape))
    full = cuda.to_device(np.full(n + guard, UNWRITTEN, np.float32))
    return full, full[:n].reshape(shape)


def host_output(shape):
    """A NumPy float32 array of `shape`, all UNWRITTEN: output_array's convention for a launch on
    NumPy arrays (a traced launch; or one whose arrays the launch copies back), without a guard
    zone: the simulator's sanitizer checks every index."""
    return np.full(shape, UNWRITTEN, np.float32)


def unwritten(values):
    """Where `values` (any float array) still hold UNWRITTEN, bit for bit: a bool array of its shape."""
    values = np.asarray(values)
    if values.dtype.kind != "f":
        return np.zeros(values.shape, bool)
    with np.errstate(over="ignore"):        # float64 beyond float32's range: inf, not UNWRITTEN
        return np.asarray(values, np.float32).view(np.uint32) == UNWRITTEN.view(np.uint32)


def read_output(full, out):
    """The host copy of out (output_array's view), once the guard zone behind it is found intact:
    OutOfBoundsWrite names the first entry written past the end."""
    n = out.size
    tail = full.copy_to_host()[n:]
    if not unwritten(tail).all():
        first = n + int(np.argmax(~unwritten(tail)))
        raise OutOfBoundsWrite(f"out[{first}] was written but out has only {n} elements")
    return out.copy_to_host()


# Filled by the exercise modules (attention_lib/checks/ex*.py) through register().
EXERCISES = {}


def register(exercise):
    """Add an exercise to the registry; ids are unique."""
    if exercise.exercise_id in EXERCISES:
        raise ValueError(f"exercise id {exercise.exercise_id!r} is registered twice")
    EXERCISES[exercise.exercise_id] = exercise
    return exercise


def _still_a_stub(answer):
    """True when the answer's code still raises NotImplementedError (a student copy's stub).

    A real GPU ignores a `raise` inside a kernel, so a stub kernel would just write nothing;
    reading the source tells "not started" from "started but wrong" on every backend. An
    answer made of several functions (a tuple) is a stub when any of them is.
    """
    if isinstance(answer, tuple):
        return any(_still_a_stub(part) for part in answer)
    function = getattr(answer, "py_func", answer)
    try:
        return "raise NotImplementedError" in inspect.getsource(function)
    except (OSError, TypeError):  # no source (built in, or typed at a prompt that keeps none)
        return False


# What a divergent barrier does on a GPU, after the simulator's one-line account of it.
DIVERGENT_BARRIER = "On a GPU that hangs the block, or lets it run on with wrong values"


def _barrier_error(error):
    """Whether `error` is the simulator's BarrierError. The simulator is imported only where kernels
    are simulated; where it never was, nothing could have raised one."""
    simulator = sys.modules.get("attention_lib.platform.simulator")
    return simulator is not None and isinstance(error, simulator.BarrierError)


def _without_thread_prefix(error):
    """The error's message without the "tid=[..] ctaid=[..]: " a simulated thread's error carries."""
    return re.sub(r"^tid=\[[^]]*\] ctaid=\[[^]]*\]: ", "", str(error).strip())


def _function(obj):
    """The Python function behind a kernel, device function or plain function (None otherwise)."""
    function = getattr(obj, "py_func", obj)
    return function if callable(function) and hasattr(function, "__code__") else None


def _given_code_used(answer, given):
    """The first of `given` (library objects) that the answer uses, through any function it calls
    or any module attribute it names; None when it uses none of them."""
    given_functions = {id(_function(o)): o for o in given if _function(o) is not None}
    given_objects = {id(o): o for o in given}
    seen = set()

    def visit(obj):
        function = _function(obj)
        if function is None or id(function) in seen:
            return None
        seen.add(id(function))
        values = list(_names_used(function))
        values += [cell.cell_contents for cell in function.__closure__ or () if _has_contents(cell)]
        for value in values:
            hit = given_objects.get(id(value)) or given_functions.get(id(_function(value)))
            if hit is not None:
                return hit
            module = getattr(_function(value), "__module__", None) or ""
            if _function(value) is not None and not module.startswith(("numba", "numpy")):
                found = visit(value)                          # what it calls, in turn
                if found is not None:
                    return found
        return None

    for part in answer if isinstance(answer, tuple) else (answer,):
        if given_objects.get(id(part)) or given_functions.get(id(_function(part))):
            return given_objects.get(id(part)) or given_functions.get(id(_function(part)))
        found = visit(part)
        if found is not None:
            return found
    return None


def _names_used(function):
    """The objects a function's code reads: its globals, and the attributes it reads of a module
    among them (``softmax.block_reduce``), nested functions and lambdas included."""
    codes = [function.__code__]
    codes += [c for c in function.__code__.co_consts if hasattr(c, "co_code")]
    for code in codes:
        last = None                                           # the value the previous load put on the stack
        for instruction in dis.get_instructions(code):
            name = instruction.argval if isinstance(instruction.argval, str) else None
            if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME") and name in function.__globals__:
                last = function.__globals__[name]
                yield last
            elif instruction.opname in ("LOAD_ATTR", "LOAD_METHOD") and isinstance(last, type(sys)):
                last = getattr(last, name, None)
                if last is not None:
                    yield last
            else:
                last = None


def _has_contents(cell):
    try:
        cell.cell_contents
    except ValueError:                                        # an empty closure cell
        return False
    return True


def _one_line(error):
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def _first_difference(got, expected, rtol, atol):
    bad = ~np.isclose(got, expected, rtol=rtol, atol=atol, equal_nan=False)
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    index = where[0] if len(where) == 1 else where
    return index, got[where], expected[where], int(bad.sum())


def _first_hint(exercise):
    """The first hint, and where the next one is when there is one."""
    more = f" (more: hint({exercise.exercise_id!r}, 2))" if exercise.more_hints else ""
    return exercise.hint + more


def _judge(exercise, answer):
    """Run every case; return (diagnosis, message)."""
    if answer is None:
        return "not_implemented", f"not implemented yet. Hint: {_first_hint(exercise)}"
    if _still_a_stub(answer):
        return "not_implemented", f"not implemented yet. Hint: {_first_hint(exercise)}"
    if exercise.kind == "kernel" and not _is_kernel(answer):
        return "not_a_kernel", f"expected a @cuda.jit kernel, got {type(answer).__name__}; decorate it with @cuda.jit"
    used = _given_code_used(answer, exercise.given_code)
    if used is not None:
        name = getattr(_function(used), "__qualname__", repr(used))
        return "calls_given_code", (f"the answer uses the library's {name} ({getattr(_function(used), '__module__', '')}), "
                                    "which already does what the exercise asks: write that part yourself")
    rng = np.random.default_rng(SEED)
    # A kernel is race-checked on every case: a missing barrier may only show once several threads
    # share a tile, two blocks writing one element only once there are two blocks.
    for case in exercise.cases:
        where = exercise.describe_case(case)
        try:
            launch = race_finding_launch if "kernel" in exercise.kind else plain_launch
            got, expected, *inputs = exercise.run(answer, case, rng, launch)
        except NotImplementedError:
            return "not_implemented", f"not implemented yet. Hint: {_first_hint(exercise)}"
        except Diagnosed as named:
            return named.code, f"at {where}: {named.message}"
        except RaceFound as race:
            return "race", f"at {where}: {race}. {race.advice()}"
        except IndexError as error:
            return "out_of_bounds", (f"at {where}: {str(error).splitlines()[0].rstrip(': ')}. "
                                     "Guard the index: threads of the last block may have no element.")
        except Exception as error:  # the student's code may raise anything; report it in one line
            if _barrier_error(error):
                return "divergent_barrier", f"at {where}: {_without_thread_prefix(error)}. {DIVERGENT_BARRIER}."
            return "raised_error", f"at {where}: the answer raised {_one_line(error)}"
        got = np.asarray(got)
        if got.shape != expected.shape:
            return "wrong_shape", f"at {where}: the result has shape {got.shape}, expected {expected.shape}"
        never = unwritten(got) & ~np.isnan(expected)
        if never.any():
            return "wrong_values", (f"at {where}: {int(never.sum())} of {got.size} entries were never written "
                                    f"(first at index {tuple(int(i) for i in np.argwhere(never)[0])}). "
                                    "Does every element get a thread?")
        if not np.allclose(got, expected, rtol=exercise.rtol, atol=exercise.atol):
            named = exercise.diagnose and exercise.diagnose(got, expected, *inputs)
            if named:
                return named[0], f"at {where}: {named[1]}"
            index, value, want, count = _first_difference(got, expected, exercise.rtol, exercise.atol)
            return "wrong_values", (f"at {where}: {count} of {got.size} entries differ; "
                                    f"first at [{index}]: got {value:.6g}, expected {want:.6g}. Hint: {exercise.hint}")
    sizes = ", ".join(str(case) for case in exercise.cases)
    return "ok", f"correct at every size tried ({sizes}) on random data"


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


def reveal(exercise_id):
    """Print the library's version of an exercise's solution, its source as the library has it
    (run it after your check passes: a student copy shows it only here)."""
    exercise = _exercise(exercise_id)
    parts = exercise.solution if isinstance(exercise.solution, tuple) else (exercise.solution,)
    if parts == (None,):
        raise ValueError(f"exercise_id {exercise_id!r} has no library version to reveal")
    for part in parts:
        function = _function(part)
        path = inspect.getsourcefile(function)
        where = path[path.rindex("attention_lib"):] if "attention_lib" in path else path
        print(f"# The library's version, from {where}")
        print(inspect.getsource(function).rstrip())
        print()


def check(exercise_id, answer, verbose=True):
    """Check `answer` for exercise `exercise_id`; show the verdict (unless not verbose) and return it.

    In a Jupyter kernel the verdict is displayed (plain text, and HTML in colour); elsewhere printed."""
    exercise = _exercise(exercise_id)
    diagnosis, message = _judge(exercise, answer)
    result = CheckResult(exercise_id, diagnosis == "ok", diagnosis, message)
    if verbose:
        _show(result)
    return result
