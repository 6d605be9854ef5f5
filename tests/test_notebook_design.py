"""The one shape every notebook follows (COURSE.md, "Exercise first"), read from the notebooks.

- A core notebook fits a 90-minute session: at most WORDS words of markdown and CELLS code cells;
  deep dives (NNx_topic) are optional and unbounded in length. Every notebook's code cells, deep
  dives' too, are at most LINES lines.
- The student writes each stage's kernel before the library's is shown: no kernel of the stage's
  module is shown in a core notebook before its first exercise, and no cell but the exercise holds
  a line of its solution (the library's version is printed by ``reveal`` after the check, so a
  student copy, whose outputs are cleared, shows it only once the student runs that cell).
- The exercise comes first, the library's split follows it. The solution is the library's code (its
  lines stand, in order, in the exercise's ``solution``), but it need not be a piece of the fastest
  kernel: a teaching kernel of the stage module serves, tested against the references like every
  kernel, shown by ``reveal`` and compared with the fast version after it.
- Every exercise refuses an answer that uses its given code (``calls_given_code``).
"""

import re
import textwrap
from pathlib import Path

import nbformat
import pytest
from attention_lib.checks import EXERCISES, check, given_code
from attention_lib.checks.engine import Kind
from numba import cuda  # noqa: F401  (the answers built below are kernels)

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
CORE = [p for p in NOTEBOOKS if re.match(r"\d\d_", p.name)]
WORDS, CELLS, LINES = 2500, 40, 20
# A solution line this long (stripped, comment removed) is the student's own work: it appears in
# no other cell. Shorter lines (`i = cuda.grid(1)`, `cuda.syncthreads()`) are every kernel's.
SUBSTANTIVE = 30


def cells(path):
    return nbformat.read(path, as_version=4).cells


def solutions(path):
    """[(cell index, exercise_id, solution lines)] of a notebook, in order."""
    found, notebook = [], cells(path)
    for i, cell in enumerate(notebook):
        if cell.cell_type == "code" and "### BEGIN SOLUTION" in cell.source:
            body = cell.source.split("### BEGIN SOLUTION", 1)[1].split("### END SOLUTION", 1)[0]
            check_cell = next(c.source for c in notebook[i + 1:] if c.cell_type == "code")
            exercise_id = re.search(r'check\("(\w+)"', check_cell).group(1)
            found.append((i, exercise_id, textwrap.dedent(body.split("\n", 1)[1]).rstrip("\n").splitlines()))
    return found


def substantive(line):
    code = line.split("#", 1)[0].strip()
    return code if len(code) >= SUBSTANTIVE else None


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.name)
def test_a_core_notebook_fits_a_session(path):
    notebook = cells(path)
    words = sum(len(c.source.split()) for c in notebook if c.cell_type == "markdown")
    code = [c for c in notebook if c.cell_type == "code"]
    assert words <= WORDS and len(code) <= CELLS, f"{path.name}: {words} words, {len(code)} code cells"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_code_cell_is_short(path):
    """Deep dives too: a long kernel is shown as its device functions, a cell each."""
    notebook = cells(path)
    long = [i for i, c in enumerate(notebook) if c.cell_type == "code" and len(c.source.splitlines()) > LINES]
    assert not long, f"{path.name}: code cells over {LINES} lines (split at device functions): {long}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_cell_but_the_exercise_holds_a_line_of_its_solution(path):
    notebook = cells(path)
    for at, exercise_id, lines in solutions(path):
        for line in filter(None, map(substantive, lines)):
            elsewhere = [i for i, c in enumerate(notebook) if i != at and line in c.source]
            assert not elsewhere, f"{path.name}: {exercise_id}'s line {line!r} also stands in cells {elsewhere}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_each_solution_is_the_librarys_code(path):
    import inspect
    for _, exercise_id, lines in solutions(path):
        solution = EXERCISES[exercise_id].solution
        assert solution is not None, f"{exercise_id} names no library solution"
        parts = solution if isinstance(solution, tuple) else (solution,)
        library = "\n".join(textwrap.dedent(inspect.getsource(getattr(p, "py_func", p))) for p in parts)
        stripped = [line.strip() for line in library.splitlines()]
        wanted = [line.strip() for line in lines if line.strip()]
        starts = [i for i, line in enumerate(stripped) if line == wanted[0]]
        assert any(stripped[i:i + len(wanted)] == wanted for i in starts), \
            f"{path.name}: {exercise_id}'s solution is not the library's code of {solution}"


@pytest.mark.parametrize("path", CORE, ids=lambda p: p.name)
def test_no_kernel_of_the_stage_is_shown_before_the_first_exercise(path):
    notebook = cells(path)
    first = solutions(path)[0][0] if solutions(path) else len(notebook)
    shown = [i for i, c in enumerate(notebook[:first]) if c.cell_type == "code"
             and c.source.startswith("# From attention_lib/stages/") and re.search(r"^@cuda\.jit(\(\*\*\w+\)|\(launch|$)", c.source, re.M)]
    assert not shown, f"{path.name}: library kernels shown before the first exercise, cells {shown}"


@pytest.mark.parametrize("exercise_id", sorted(EXERCISES))
def test_every_exercise_refuses_its_given_code(exercise_id):
    exercise = EXERCISES[exercise_id]
    given = exercise.given_code
    assert given, f"{exercise_id} names no solution or forbidden code"
    for thing in given:
        namespace = {"thing": thing}
        exec("def answer(*args):\n    return thing(*args)\n", namespace)
        answer = namespace["answer"]
        if exercise.kind is Kind.KERNEL:
            answer = cuda.jit(answer)
        assert given_code.given_code_used(answer, given)[0] is thing
        assert check(exercise_id, answer, verbose=False).diagnosis == "calls_given_code"


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if p not in CORE], ids=lambda p: p.name)
def test_every_deep_dive_has_checked_exercises_of_its_own(path):
    exercises = [exercise_id for _, exercise_id, _ in solutions(path)]
    assert exercises and all(e.startswith(path.name[:3]) for e in exercises), (path.name, exercises)
    assert all(EXERCISES[e].solution is not None for e in exercises)
