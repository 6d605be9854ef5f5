"""A verdict as the grader reads it: a record displayed with the verdict.

nbgrader scores a test cell from what the cell leaves behind (no error, nothing on stderr). So a
check cell also displays its verdict as data of its own type (``MIME``): the exercise, the
diagnosis and whether it passed. A grading run (scripts/grade.py) reads it from the check cells of
a notebook it rebuilt from the course's own cells and the answers that parse against its allowlist,
and ran in a sandbox of the submission's own: no code of the student's can reach the checker that
makes the record, so the record carries no signature (a key in that process would prove nothing
that the rebuilt notebook does not).

A graded check cell (scripts/student_copies.py writes it) imports ``check`` itself, so a ``check``
redefined in an answer cell is not the one that runs, and passes the verdict to ``graded``; its
hidden part (nbgrader's hidden tests, in the graded version only) runs ``hidden_check``: the same
cases on other random data, so an answer tuned to the visible check's data still loses the point.

- ``record(exercise_id, diagnosis, passed, hidden=False) -> dict``;
- ``graded(result) -> result``: one line on stderr when the verdict is not ok (nbgrader's Validate
  names the exercise, and nbgrader's own score agrees with the verdict);
- ``hidden_check(engine, exercise_id, answer, seed) -> HiddenResult``: the check of the exercise's hidden
  cases at another seed, displayed
  with a record marked hidden; not run when this exercise's graded check did not pass.
"""

import sys

MIME = "application/vnd.attention-lib.verdict+json"
# The verdict each exercise's graded check cell gave in this process: hidden_check runs after a pass.
_graded = {}


def record(exercise_id, diagnosis, passed, hidden=False):
    """The record of one verdict."""
    data = {"exercise_id": exercise_id, "diagnosis": diagnosis, "passed": bool(passed)}
    if hidden:
        data["hidden"] = True
    return data


def _points(n):
    return "1 point" if n == 1 else f"{n} points"


def graded(result, points=1):
    """A graded check cell's verdict: kept for hidden_check, and one line on stderr unless it is ok
    (nbgrader's Validate lists the exercise; an exception would stop Run All here). Returns it."""
    hidden = getattr(result, "hidden", False)
    if not hidden:
        _graded[result.exercise_id] = result
    if not result.passed and result.diagnosis != "not_run":
        cases = ", hidden cases" if hidden else ""
        print(f"{result.exercise_id}: 0 of {_points(points)}{cases}, verdict {result.diagnosis}", file=sys.stderr)
    return result


def _display(result):
    """Show a hidden verdict: its line, and its record marked hidden (printed outside a kernel)."""
    mark = "✔" if result.passed else "✘"
    line = f"{mark} {result.exercise_id}, hidden cases [{result.diagnosis}]: {result.message}"
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    if getattr(shell, "kernel", None) is None:
        print(line)
        return
    from IPython.display import display
    display({"text/plain": line, MIME: record(result.exercise_id, result.diagnosis, result.passed, hidden=True)},
            raw=True)


class HiddenResult:
    """The verdict on an exercise's hidden cases: shown once by hidden_check, not again as a cell's value."""

    hidden = True

    def __init__(self, exercise_id, passed, diagnosis, message):
        self.exercise_id, self.passed, self.diagnosis, self.message = exercise_id, passed, diagnosis, message

    def __repr__(self):
        return f"HiddenResult({self.exercise_id!r}, {self.diagnosis!r})"

    def _ipython_display_(self):
        """Nothing: hidden_check displayed the verdict with its record."""


def hidden_check(engine, exercise_id, answer, seed):
    """The exercise's cases on the random data of `seed` instead of the check's own (a grading run's hidden test), judged by `engine` (checks.engine,
    handed in: it imports this module), displayed and returned; `not_run` unless this exercise's
    graded check passed."""
    visible = _graded.get(exercise_id)
    if visible is None or not visible.passed:
        result = HiddenResult(exercise_id, False, "not_run", "not run: the check above did not pass")
    else:
        found = engine.check(exercise_id, answer, verbose=False, seed=seed)
        message = "right on other random data too" if found.passed else found.message
        result = HiddenResult(exercise_id, found.passed, found.diagnosis, message)
    _display(result)
    return result
