"""Student copies (scripts/student_copies.py, `make student`) run top to bottom without a solution.

Each copy is built with nbgrader's preprocessors and executed: no cell may fail, every exercise
cell must have become a stub, and every check cell must report "not implemented yet" instead
of a traceback. Later cells use the library, never the student's answer, so nothing else breaks.
"""

import importlib.util
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

spec = importlib.util.spec_from_file_location("student_copies", ROOT / "scripts" / "student_copies.py")
student_copies = importlib.util.module_from_spec(spec)
spec.loader.exec_module(student_copies)


def test_make_student_builds_a_copy_of_every_notebook(tmp_path):
    written = student_copies.build(tmp_path)
    assert [p.name for p in written] == [p.name for p in NOTEBOOKS]


@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda p: p.name)
def test_student_copy_runs_and_reports_not_implemented(source):
    copy = student_copies.student_copy(nbformat.read(source, as_version=4))
    code = [c for c in copy.cells if c.cell_type == "code"]
    stubs = [c for c in code if "raise NotImplementedError()" in c.source and "# YOUR CODE HERE" in c.source]
    assert stubs, f"{source.name}: no exercise became a stub"
    assert not any("### BEGIN SOLUTION" in c.source for c in code), "a solution survived"
    assert not any(c.get("outputs") for c in code), "outputs were not cleared"

    # Run where the real notebook runs, so relative paths resolve the same way.
    NotebookClient(copy, timeout=600, kernel_name="python3",
                   resources={"metadata": {"path": str(source.parent)}}).execute()

    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{source.name}: {errors[0].ename}: {errors[0].evalue}"
    verdicts = [o.text for c in code if "# NBVAL_CHECK_OUTPUT" in c.source for o in c.outputs if "text" in o]
    assert len(verdicts) == len(stubs)
    assert all("[not_implemented]" in v and "Hint:" in v for v in verdicts), verdicts
