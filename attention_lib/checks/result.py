"""A check's verdict: how it is made from what a case did (an error raised, wrong values, a limit
broken, what the GPU compiler made of the answer), each as (code, message), and how it is shown (a
line in a terminal, the line in colour in Jupyter, and the record the grader reads beside it)."""

import html
import linecache
import os
import re
import sys
import traceback
from dataclasses import dataclass

import numpy as np

from attention_lib.checks import answer_code, record, session
from attention_lib.checks.launch import RaceFound, unwritten
from attention_lib.platform.where import describe_file, describe_with_code


@dataclass
class CheckResult:
    """The verdict on one answer: passed or not, a diagnosis code and a message for the student."""

    exercise_id: str
    passed: bool
    diagnosis: str
    message: str

    def __post_init__(self):
        self._just_shown = False

    def __str__(self):
        mark = "✔" if self.passed else "✘"
        return f"{mark} {self.exercise_id} [{self.diagnosis}]: {self.message}"

    def _repr_html_(self):
        """The verdict for front ends that render HTML (JupyterLab): the mark, id and diagnosis in
        green or red, the message as it is; the text/plain beside it stays the plain line."""
        colour = "#1a7f37" if self.passed else "#cf222e"
        head = html.escape(str(self).split(": ", 1)[0])
        return (f'<div class="attention-lib-verdict"><span style="color: {colour}; font-weight: bold">{head}</span>: '
                f'{html.escape(self.message)}</div>')

    def _repr_mimebundle_(self, include=None, exclude=None):
        """The verdict as a front end gets it: the plain line, the coloured HTML, and the record the
        grader reads (checks.record)."""
        return {"text/plain": str(self), "text/html": self._repr_html_(),
                record.MIME: record.record(self.exercise_id, self.diagnosis, self.passed)}

    def _ipython_display_(self):
        """IPython's display of the verdict, once: check() shows it as it returns it, so a check cell
        whose last line is check(...) shows it once, not twice."""
        if self._just_shown:
            self._just_shown = False
            return
        from IPython.display import display
        display(self._repr_mimebundle_(), raw=True)


def show(result):
    """Display a verdict in a Jupyter kernel (text/plain and coloured HTML, so a front end picks
    what it can render); print it anywhere else (a terminal, a script, pytest)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if getattr(shell, "kernel", None) is not None:
        result._ipython_display_()
        result._just_shown = True            # the cell's own display of the returned value is skipped,

        def forget(*_):                      # and only that one: shown again when asked in a later cell
            result._just_shown = False
            shell.events.unregister("post_run_cell", forget)
        shell.events.register("post_run_cell", forget)
    else:
        print(result)


class Diagnosed(Exception):
    """Raised by an exercise's run to name a mistake the values alone do not show."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code
        self.message = message


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


def _one_line(error):
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"


def _first_difference(got, expected, rtol, atol):
    bad = ~np.isclose(got, expected, rtol=rtol, atol=atol, equal_nan=False)
    where = tuple(int(i) for i in np.argwhere(bad)[0])
    index = where[0] if len(where) == 1 else where
    return index, got[where], expected[where], int(bad.sum())


def got_and_expected(value, want):
    """"got X, expected Y" with as many digits as it takes for X and Y to differ, and the float32 ulps
    between them when they differ only in the last bits."""
    for digits in (6, 9, 17):
        shown = f"got {value:.{digits}g}, expected {want:.{digits}g}"
        if f"{value:.{digits}g}" != f"{want:.{digits}g}":
            break
    if digits == 6 or not (np.isfinite(value) and np.isfinite(want)):
        return shown
    ulps = abs(float(value) - float(want)) / float(np.spacing(np.float32(abs(want))))
    return f"{shown} (they differ in the last bits: {ulps:.3g} units of float32's last place)"


def _where_in(mask):
    """Where the True entries of a bool array lie, in words: 'everywhere', 'in rows 16-31',
    'in rows 0-7, columns 16-20' (the last two axes; leading ones when they are the only ones)."""
    if mask.ndim == 0 or mask.size == 1:
        return "at the one entry"
    if mask.all():
        return "everywhere"
    ranges = []
    names = ["rows", "columns"] if mask.ndim >= 2 else ["entries"]
    for name, axis in zip(names, range(mask.ndim - len(names), mask.ndim)):
        others = tuple(a for a in range(mask.ndim) if a != axis)
        hit = np.flatnonzero(mask.any(axis=others))
        if hit.size and hit.size < mask.shape[axis]:
            ranges.append(f"{name[:-1]} {hit[0]}" if hit[0] == hit[-1] else f"{name} {hit[0]}-{hit[-1]}")
    return "in " + ", ".join(ranges) if ranges else "spread over the whole output"


def _float_index(error):
    """NumPy's refusal of a float index, said as the slip it is, at the answer's line where the traceback
    shows one (its last frame outside the library and the packages)."""
    frames = [f for f in traceback.extract_tb(error.__traceback__)
              if "site-packages" not in f.filename and f"{os.sep}attention_lib{os.sep}" not in f.filename]
    at = f" at {describe_with_code(frames[-1].filename, frames[-1].lineno)}" if frames else ""
    return (f"an array was indexed with a float{at}: in Python `/` gives a float even between two integers, "
            "and an index must be an integer; use `//`")


def error_verdict(error, where):
    """(diagnosis, message) for what a case raised."""
    if isinstance(error, NotImplementedError):
        return "not_implemented", "not implemented yet"
    if isinstance(error, Diagnosed):
        return error.code, f"at {where}: {error.message}"
    if isinstance(error, session.RefusedByCompiler):
        return "not_gpu_code", f"at {where}: {error}"
    if isinstance(error, RaceFound):
        return "race", f"at {where}: {error}. {error.advice()}"
    if isinstance(error, IndexError) and "only integers" in str(error):
        return "raised_error", f"at {where}: {_float_index(error)}"
    if isinstance(error, IndexError):
        return "out_of_bounds", f"at {where}: {str(error).splitlines()[0].rstrip(': ')}"
    if _barrier_error(error):
        return "divergent_barrier", f"at {where}: {_without_thread_prefix(error)}. {DIVERGENT_BARRIER}."
    return "raised_error", f"at {where}: the answer raised {_one_line(error)}"


def values_verdict(exercise, where, got, expected, inputs, traces):
    """(diagnosis, message) when the values are wrong, else None."""
    got = np.asarray(got)
    if got.shape != expected.shape:
        return "wrong_shape", f"at {where}: the result has shape {got.shape}, expected {expected.shape}"
    never = unwritten(got) & ~np.isnan(expected)
    if never.any():
        return "wrong_values", (f"at {where}: {int(never.sum())} of {got.size} entries were never written "
                                f"(first at index {tuple(int(i) for i in np.argwhere(never)[0])}; "
                                f"they lie {_where_in(never)})")
    if np.allclose(got, expected, rtol=exercise.rtol, atol=exercise.atol):
        return None
    garbage = next((read for read in (t.unwritten_read() for t in traces) if read is not None), None)
    if garbage is not None:
        return "stale_tile", (f"at {where}: {garbage}: on a GPU it holds whatever the memory held (the check "
                              "fills it with NaN). Every slot that is read must be written first, a 0 where "
                              "the element lies past an edge")
    named = exercise.diagnose and exercise.diagnose(got, expected, *inputs)
    if named:
        return named[0], f"at {where}: {named[1]}"
    index, value, want, count = _first_difference(got, expected, exercise.rtol, exercise.atol)
    if got.size == 1:
        return "wrong_values", f"at {where}: {got_and_expected(value, want)}"
    bad = ~np.isclose(got, expected, rtol=exercise.rtol, atol=exercise.atol)
    return "wrong_values", (f"at {where}: {count} of {got.size} entries differ, "
                            f"{_where_in(bad)}; "
                            f"first at [{index}]: {got_and_expected(value, want)}")


def limits_verdict(exercise, where, case, traces, compiled=None, compiled_limits=False):
    """(code, message) of the first declared limit the case broke, or None."""
    for limit in exercise.limits:
        if getattr(limit, "compiled_limit", False) != compiled_limits:
            continue
        broken = limit.broken(traces, case, compiled)
        if broken:                       # a message, or (code, message) from a limit naming one of several
            code, message = broken if isinstance(broken, tuple) else (limit.code, broken)
            return code, f"at {where}: {message}" if where else message
    return None


_said_unavailable = []


def _float64_message(instructions, answer):
    """What float64 instructions in the PTX say: the answer's own lines that hold them, with their code
    (never the check's or the library's lines), then the answer's Python floats (their likely cause)."""
    own = {f.__code__.co_filename for f in answer_code.functions_reached(answer)}
    lines = sorted({(f.filename, f.line) for f in instructions if f.line > 0 and f.filename in own})
    if lines:
        shown = "; ".join(f"line {line}: {linecache.getline(name, line).strip()}" for name, line in lines[:3])
        at = f"in {describe_file(lines[0][0])}, at {shown}{'; ...' if len(lines) > 3 else ''}"
    else:                                 # a device function's float64 result, converted where the check stores it
        at = "where the check's kernel uses what your function returns: it returns a float64"
    floats = answer_code.python_floats(answer)
    causes = "; ".join(f"line {line}: {code}" for _, line, code in floats[:3])
    suspects = f" Python floats, each a float64, at {causes}." if causes else ""
    return (f"the compiled kernel computes in float64 ({len(instructions)} instructions, {at}).{suspects} "
            "A GPU computes float64 at a fraction of its float32 speed: make every number float32 "
            "(np.float32(...))")


# Numba's refusal of an array whose shape it cannot read as a constant ends before it says why.
_ARRAY_SHAPE = re.compile(r"No implementation of function Function\(<function (shared|local)\.array")


def _explained(error):
    """The compiler's one-line refusal, said plainly where Numba's own line stops short."""
    found = _ARRAY_SHAPE.search(error)
    if found:
        return (f"cuda.{found.group(1)}.array's shape must be a constant the compiler knows: an int, or a tuple "
                "of ints and module-level int constants, not an expression such as TILE + 1 (give it a "
                "constant of its own)")
    return error


def compiled_verdict(exercise, answer, compiled):
    """(code, message) from what the GPU compiler made of an answer whose cases are all right: code
    that no GPU runs, float64 arithmetic, a compiled limit broken; ("note", ...) once in a process
    where nothing can be compiled; None when the compiler has nothing to say."""
    for result in compiled:
        if isinstance(result, str):
            return "not_gpu_code", f"the GPU compiler cannot be given this code: {result}"
        if result.unavailable:
            if not _said_unavailable:
                _said_unavailable.append(result.unavailable)
                return "note", f"(Not compiled for a GPU here: {result.unavailable}.)"
            return None
        if result.error:
            return "not_gpu_code", (f"the simulator ran it, but a GPU's compiler refuses it: {_explained(result.error)}. "
                                    "The simulator runs any Python; a GPU kernel is limited to what Numba compiles")
        if result.float64:
            return "float64_arithmetic", _float64_message(result.float64, answer)
    for result in compiled:
        named = limits_verdict(exercise, "", None, [], result, compiled_limits=True)
        if named:
            return named
    return None
