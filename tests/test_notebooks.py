"""The notebooks as committed: library code shown verbatim, the course's shape, executed cleanly.

nbval re-executes them (see the Makefile); these tests check what re-execution cannot: that
the kernel a notebook shows is the library's kernel, and that every exercise is wired up.
"""

import re
from pathlib import Path

import nbformat
import pytest
from attention_lib.checks import EXERCISES

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
LIBRARY_MARKER = re.compile(r"^# From (attention_lib/[\w/]+\.py)\n")


def code_cells(path):
    return [c for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def test_the_course_has_notebooks():
    assert [p.name[:2] for p in NOTEBOOKS if p.name[2] == "_"] == [f"{n:02d}" for n in range(12)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_library_code_in_the_notebook_is_the_library_code(path):
    shown = 0
    for cell in code_cells(path):
        marker = LIBRARY_MARKER.match(cell.source)
        if marker:
            library_source = (ROOT / marker.group(1)).read_text()
            # the cell holds one or more top-level definitions, separated by two blank lines as in the file
            for piece in cell.source[marker.end():].strip().split("\n\n\n"):
                assert piece.strip() in library_source, \
                    f"{path.name}: a cell differs from {marker.group(1)}:\n{piece[:300]}"
                shown += 1
    assert shown, f"{path.name} shows no library code"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_opens_with_the_backend_banner(path):
    first = code_cells(path)[0].source
    assert "import attention_lib" in first and "banner()" in first


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_exercise_has_a_solution_and_a_checked_check_cell(path):
    cells = code_cells(path)
    solutions = [i for i, c in enumerate(cells) if "### BEGIN SOLUTION" in c.source]
    assert solutions or path.name[2] == "x", f"{path.name} has no exercise"     # deep dives (NNx_) may have none
    for i in solutions:
        assert "### END SOLUTION" in cells[i].source
        following = cells[i + 1].source
        assert "nbval-check-output" in cells[i + 1].metadata.get("tags", []), \
            f"{path.name}: the check after cell {i} is not compared"
        exercise_id = re.search(r'check\("(\w+)"', following).group(1)
        assert exercise_id in EXERCISES
        assert exercise_id.startswith(path.name[:2])


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_committed_executed_in_order_without_errors(path):
    cells = [c for c in code_cells(path) if c.source.strip()]
    counts = [c.execution_count for c in cells]
    assert counts == list(range(1, len(cells) + 1)), f"{path.name} was not run top to bottom in one clean run"
    errors = [o for c in cells for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{path.name} has error outputs"
    # A verdict is printed (a stream) outside a kernel and displayed (text/plain beside HTML) inside one.
    verdicts = ["".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in c.outputs)
                for c in cells if "nbval-check-output" in c.metadata.get("tags", [])]
    assert (verdicts or path.name[2] == "x") and all(v.startswith("✔") for v in verdicts)
