"""The student copies of the notebooks, and nbgrader's source version of each: one source of truth.

    python scripts/student_copies.py [--graded] [OUT_DIR]   every copy, overwritten (make student: release/;
                                                            --graded: without the reveal cells)
    python scripts/student_copies.py --keep FOLDER          only the copies FOLDER lacks (make lab)
    python scripts/student_copies.py --fresh NB FOLDER      NB's copy rebuilt, the old one kept in
                                                            FOLDER/backups/ (make fresh-copy NB=03)
    python scripts/student_copies.py --source COURSE [NB ...]
                                                            nbgrader's COURSE/source/<assignment>/

The notebooks carry no nbgrader metadata; it is made here from the markers the course already
uses. An exercise is a code cell holding `### BEGIN SOLUTION` (the autograded answer cell); its
check is the next code cell, tagged `nbval-check-output` (nbval compares its verdict) and calling
`check("<exercise_id>", answer)` (the autograder test cell: read-only, POINTS points). In the
copies the check cell imports `check` itself (an answer cell that redefines it changes nothing) and
hands the verdict to `record.graded`, which writes one line to stderr unless it is ok, so nbgrader's
Validate names the exercises still open; a grading run scores it from the verdict's signed record
(scripts/grade.py). The source version for grading also holds nbgrader's hidden tests: the same
check on other random data (`record.hidden_check`, at a seed the copies never show). A graded copy
(the one an assignment releases) leaves out the cells that only call `reveal(...)`.

The source version is the notebook with that metadata; a student copy is what nbgrader's
generate_assignment makes of it, by nbgrader's own preprocessors (locked cells, solutions cut to
`raise NotImplementedError()`, hidden tests and outputs cleared, checksums), without its database,
so nbgrader's Validate and autograde work on every copy.
"""

import argparse
import ast
import copy
import re
import secrets
import sys
import time
from pathlib import Path
from typing import NamedTuple

import nbformat
from nbgrader.preprocessors import (CheckCellMetadata, ClearHiddenTests, ClearMarkScheme, ClearOutput,
                                    ClearSolutions, ComputeChecksums, LockCells)

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
PATTERN = "[0-9][0-9]*_*.ipynb"            # the core notebooks and the optional deep dives (NNx_)
POINTS = 1
SOLUTION_MARKER = "### BEGIN SOLUTION"
CHECK_TAG = "nbval-check-output"
# `result = check("03_tile_skip", answer)`: the name the verdict is kept under (if any), the exercise id.
CHECK_CALL = re.compile(r"""^(?:(\w+)\s*=\s*)?check\(\s*["'](\w+)["']""", re.M)

# What generate_assignment runs, less what needs its database (SaveCells) or its course layout
# (IncludeHeaderFooter) and what the course does not use (InstantiateTests), in its order: hidden
# tests are cleared after the first checksums, which are computed again afterwards.
RELEASE = [LockCells, ClearSolutions, ClearOutput, CheckCellMetadata, ComputeChecksums,
           ClearHiddenTests, ClearMarkScheme, ComputeChecksums, CheckCellMetadata]

# The first line of every check cell in the copies: the course's own check, whatever an answer
# cell defined under that name (the cell is locked, and nbgrader restores it when grading).
GRADED_IMPORT = "from attention_lib.checks import check, record   # locked: graded as released"
# The hidden part of a check cell in the source version for grading (nbgrader cuts it from copies).
HIDDEN = """### BEGIN HIDDEN TESTS
from attention_lib.checks import engine
record.graded(record.hidden_check(engine, "{exercise_id}", {answer}, seed={seed}))
### END HIDDEN TESTS"""


class Exercise(NamedTuple):
    exercise_id: str
    answer_cell: int       # index in notebook.cells
    check_cell: int
    result_name: str       # the name the check cell keeps the verdict under, or None


def exercises(notebook, name="notebook"):
    """The exercises of a notebook, in order, read from its markers (see the module's docstring)."""
    cells = notebook.cells
    found = []
    for i, cell in enumerate(cells):
        if cell.cell_type != "code" or SOLUTION_MARKER not in cell.source:
            continue
        following = next((j for j in range(i + 1, len(cells)) if cells[j].cell_type == "code"), None)
        call = (following is not None and CHECK_TAG in cells[following].metadata.get("tags", [])
                and CHECK_CALL.search(cells[following].source))
        if not call:
            raise ValueError(f"{name}: the solution in cell {i} has no check cell after it (the next code cell "
                             f"must be tagged {CHECK_TAG!r} and call check(\"<exercise_id>\", answer))")
        found.append(Exercise(call.group(2), i, following, call.group(1)))
    return found


def _check_call(source, exercise_id, name):
    """The text of the cell's `check("<exercise_id>", answer)` call and of its answer argument."""
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "check"
                and len(node.args) >= 2 and isinstance(node.args[0], ast.Constant)
                and node.args[0].value == exercise_id):
            return ast.get_source_segment(source, node), ast.get_source_segment(source, node.args[1])
    raise ValueError(f"{name}: the check cell of {exercise_id} has no call check(\"{exercise_id}\", answer)")


def graded_check_cell(source, exercise_id, hidden_seed=None, name="notebook"):
    """A check cell as the copies hold it: the course's check imported, its verdict handed to
    record.graded; with `hidden_seed`, nbgrader's hidden tests: the check on that seed's data."""
    call, answer = _check_call(source, exercise_id, name)
    lines = [GRADED_IMPORT, source.strip().replace(call, f"record.graded({call})", 1)]
    if hidden_seed is not None:
        lines.append(HIDDEN.format(exercise_id=exercise_id, answer=answer, seed=int(hidden_seed)))
    return "\n".join(lines)


def is_reveal_cell(cell):
    """Whether a cell only calls reveal(...) (a graded copy leaves it out)."""
    if cell.cell_type != "code":
        return False
    try:
        body = ast.parse(cell.source).body
    except SyntaxError:
        return False
    return bool(body) and all(isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
                              and isinstance(s.value.func, ast.Name) and s.value.func.id == "reveal" for s in body)


def source_notebook(notebook, name="notebook", graded=False, hidden_seed=None):
    """nbgrader's source version of a course notebook (a new NotebookNode): each answer cell an
    autograded answer, each check cell a read-only autograder test worth POINTS; `graded`: without
    the reveal cells; `hidden_seed`: each check cell's hidden test on that seed's data."""
    notebook = copy.deepcopy(notebook)
    for exercise in exercises(notebook, name):
        answer, test = notebook.cells[exercise.answer_cell], notebook.cells[exercise.check_cell]
        answer.metadata["nbgrader"] = {"grade": False, "solution": True, "locked": False, "task": False,
                                       "grade_id": f"{exercise.exercise_id}_answer", "schema_version": 3}
        test.source = graded_check_cell(test.source, exercise.exercise_id, hidden_seed, name)
        test.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "task": False,
                                     "points": POINTS, "grade_id": exercise.exercise_id, "schema_version": 3}
    if graded:
        notebook.cells = [cell for cell in notebook.cells if not is_reveal_cell(cell)]
    return notebook


def student_copy(notebook, name="notebook", graded=False):
    """The student version of one notebook (a new NotebookNode): what nbgrader's generate_assignment
    makes of its source version; `graded`: the copy an assignment releases, without reveal cells."""
    notebook, resources = source_notebook(notebook, name, graded), {}
    for preprocessor in RELEASE:
        notebook, resources = preprocessor().preprocess(notebook, resources)
    return notebook


def course_notebooks(prefixes=(), folder=None):
    """The course's notebooks (in `folder`, notebooks/ by default), or those whose names start with
    one of `prefixes` (e.g. "03")."""
    found = sorted(Path(folder or NOTEBOOKS).glob(PATTERN))
    if not prefixes:
        return found
    number = lambda path: path.name.split("_", 1)[0]            # "01", or "01x" for a deep dive
    chosen = [p for p in found if number(p) in prefixes]
    missing = [x for x in prefixes if not any(number(p) == x for p in found)]
    if missing:
        raise ValueError(f"no notebook is numbered {missing[0]!r}; the notebooks are {[number(p) for p in found]}")
    return chosen


def _write_copy(source, target, graded=False):
    nbformat.write(student_copy(nbformat.read(source, as_version=4), source.name, graded), target)
    return target


def build(out_dir, graded=False):
    """Write a student copy of every course notebook into out_dir, overwriting; returns their paths.
    `graded`: the copies a graded class gets, without the reveal cells."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [_write_copy(source, out_dir / source.name, graded) for source in course_notebooks()]


def keep(folder):
    """A student's working folder: write the copy of every course notebook the folder lacks (the
    first run, or a notebook added by an update) and never touch one it has, so answers survive.
    Returns (created, kept) lists of paths."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    created, kept = [], []
    for source in course_notebooks():
        target = folder / source.name
        if target.exists():
            kept.append(target)
        else:
            created.append(_write_copy(source, target))
    return created, kept


def fresh(folder, prefix):
    """Rebuild one notebook's copy in a working folder; the old copy, if any, moves to
    folder/backups/<name>-<time>.ipynb. Returns (new copy, backup or None)."""
    (source,) = course_notebooks([prefix])
    folder = Path(folder)
    target, backup = folder / source.name, None
    if target.exists():
        backup = folder / "backups" / f"{source.stem}-{time.strftime('%Y%m%d-%H%M%S')}.ipynb"
        backup.parent.mkdir(parents=True, exist_ok=True)
        target.rename(backup)
    folder.mkdir(parents=True, exist_ok=True)
    return _write_copy(source, target), backup


def assignment_name(notebook_path):
    """One nbgrader assignment per notebook, named after it: 00_gpu_basics."""
    return Path(notebook_path).stem


def hidden_seed():
    """A seed for the hidden tests: drawn when an assignment is generated, kept in its source."""
    return secrets.randbelow(2**31)


def write_sources(course_dir, prefixes=(), seed=None, folder=None):
    """nbgrader's source folder: course_dir/source/<assignment>/<notebook> for each notebook chosen
    (all by default, from `folder`, notebooks/ by default), graded (no reveal cells), with the
    nbgrader metadata and hidden tests at `seed` (drawn when None); returns the assignment names."""
    names = []
    for source in course_notebooks(prefixes, folder):
        target = Path(course_dir) / "source" / assignment_name(source) / source.name
        target.parent.mkdir(parents=True, exist_ok=True)
        notebook = source_notebook(nbformat.read(source, as_version=4), source.name, graded=True,
                                   hidden_seed=hidden_seed() if seed is None else seed)
        nbformat.write(notebook, target)
        names.append(assignment_name(source))
    return names


def _shown(path):
    path = Path(path).resolve()
    return path.relative_to(ROOT) if path.is_relative_to(ROOT) else path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder", nargs="?", default=str(ROOT / "release"))
    parser.add_argument("notebooks", nargs="*", metavar="NB", help="--source: the notebooks (default all)")
    parser.add_argument("--keep", action="store_true", help="write only the copies the folder lacks")
    parser.add_argument("--fresh", metavar="NB", help="rebuild the copy of the notebook starting with NB")
    parser.add_argument("--source", action="store_true",
                        help="write nbgrader's source/ under the folder (a course directory)")
    parser.add_argument("--graded", action="store_true", help="copies for a graded class: no reveal cells")
    options = parser.parse_args(argv)
    try:
        if options.source:
            for name in write_sources(options.folder, options.notebooks):
                print(f"{_shown(Path(options.folder) / 'source' / name)}")
        elif options.fresh:
            target, backup = fresh(options.folder, options.fresh)
            print(f"{_shown(target)}: a fresh copy" + (f"; your previous one is {_shown(backup)}" if backup else ""))
        elif options.keep:
            created, kept = keep(options.folder)
            print(f"{_shown(options.folder)}/: your copies of the notebooks ({len(created)} new, "
                  f"{len(kept)} kept as you left them)")
        else:
            for path in build(options.folder, options.graded):
                print(_shown(path))
    except ValueError as error:
        sys.exit(f"student_copies: {error}")


if __name__ == "__main__":
    main()
