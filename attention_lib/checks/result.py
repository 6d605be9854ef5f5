"""A check's verdict, and how it is shown: a line in a terminal, the line in colour in Jupyter, and the
record the grader reads (``record``) beside it."""

import html
import sys
from dataclasses import dataclass

from attention_lib.checks import record


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
