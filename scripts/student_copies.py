"""The student copies of the notebooks, and nbgrader's source version of each: one source of truth.

    python scripts/student_copies.py [OUT_DIR]             every copy, overwritten (make student: release/)
    python scripts/student_copies.py --keep FOLDER          only the copies FOLDER lacks (make lab)
    python scripts/student_copies.py --fresh NB FOLDER      NB's copy rebuilt, the old one kept in
                                                            FOLDER/backups/ (make fresh-copy NB=03)
    python scripts/student_copies.py --source COURSE [NB ...]
                                                            nbgrader's COURSE/source/<assignment>/

The notebooks carry no nbgrader metadata; it is made here from the markers the course already
uses. An exercise is a code cell holding `### BEGIN SOLUTION` (the autograded answer cell); its
check is the next code cell, tagged `nbval-check-output` (nbval compares its verdict) and calling
`check("<exercise_id>", answer)` (the autograder test cell: read-only, POINTS points, full points
only when the verdict is ok). The source version is the notebook with that metadata; a student
copy is what nbgrader's generate_assignment makes of it, by nbgrader's own preprocessors (locked
cells, solutions cut to `raise NotImplementedError()`, outputs cleared, checksums), without its
database, so nbgrader's Validate and autograde work on every copy.
"""

import argparse
import copy
import re
import sys
import time
from pathlib import Path
from typing import NamedTuple

import nbformat
from nbgrader.preprocessors import (CheckCellMetadata, ClearHiddenTests, ClearMarkScheme, ClearOutput,
                                    ClearSolutions, ComputeChecksums, LockCells)

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
# The course's core notebooks, 00_... to 11_...; the optional deep dives (NNx_...) get no copy.
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

# Appended to each check cell of the source version. nbgrader gives a test cell no points when it
# leaves an error or anything on stderr; an exception would also stop Run All at the first open
# exercise, so a verdict that is not ok writes one line to stderr instead.
GRADED = """

# Graded by nbgrader: {points} for the verdict ok. Another verdict writes a line to
# stderr, which nbgrader scores 0 (an exception would stop Run All at this cell).
import sys
if not {name}.passed:
    print(f"{exercise_id}: 0 of {points}, verdict {{{name}.diagnosis}}", file=sys.stderr)
"""


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


def _points(n):
    return "1 point" if n == 1 else f"{n} points"


def source_notebook(notebook, name="notebook"):
    """nbgrader's source version of a course notebook (a new NotebookNode): each answer cell an
    autograded answer, each check cell a read-only autograder test worth POINTS."""
    notebook = copy.deepcopy(notebook)
    for exercise in exercises(notebook, name):
        answer, test = notebook.cells[exercise.answer_cell], notebook.cells[exercise.check_cell]
        answer.metadata["nbgrader"] = {"grade": False, "solution": True, "locked": False, "task": False,
                                       "grade_id": f"{exercise.exercise_id}_answer", "schema_version": 3}
        result_name = exercise.result_name
        if result_name is None:                  # a bare check(...): keep the verdict under a name
            result_name = "_verdict"
            test.source = CHECK_CALL.sub(lambda m: f"{result_name} = {m.group(0)}", test.source, count=1)
        test.source = test.source.rstrip() + GRADED.format(points=_points(POINTS), name=result_name,
                                                           exercise_id=exercise.exercise_id).rstrip()
        test.metadata["nbgrader"] = {"grade": True, "solution": False, "locked": True, "task": False,
                                     "points": POINTS, "grade_id": exercise.exercise_id, "schema_version": 3}
    return notebook


def student_copy(notebook, name="notebook"):
    """The student version of one notebook (a new NotebookNode): what nbgrader's generate_assignment
    makes of its source version."""
    notebook, resources = source_notebook(notebook, name), {}
    for preprocessor in RELEASE:
        notebook, resources = preprocessor().preprocess(notebook, resources)
    return notebook


def course_notebooks(prefixes=()):
    """The course's notebooks, or those whose names start with one of `prefixes` (e.g. "03")."""
    found = sorted(NOTEBOOKS.glob(PATTERN))
    if not prefixes:
        return found
    number = lambda path: path.name.split("_", 1)[0]            # "01", or "01x" for a deep dive
    chosen = [p for p in found if number(p) in prefixes]
    missing = [x for x in prefixes if not any(number(p) == x for p in found)]
    if missing:
        raise ValueError(f"no notebook is numbered {missing[0]!r}; the notebooks are {[number(p) for p in found]}")
    return chosen


def _write_copy(source, target):
    nbformat.write(student_copy(nbformat.read(source, as_version=4), source.name), target)
    return target


def build(out_dir):
    """Write a student copy of every course notebook into out_dir, overwriting; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return [_write_copy(source, out_dir / source.name) for source in course_notebooks()]


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


def write_sources(course_dir, prefixes=()):
    """nbgrader's source folder: course_dir/source/<assignment>/<notebook> for each notebook chosen
    (all by default), with the nbgrader metadata; returns the assignment names."""
    names = []
    for source in course_notebooks(prefixes):
        target = Path(course_dir) / "source" / assignment_name(source) / source.name
        target.parent.mkdir(parents=True, exist_ok=True)
        nbformat.write(source_notebook(nbformat.read(source, as_version=4), source.name), target)
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
            for path in build(options.folder):
                print(_shown(path))
    except ValueError as error:
        sys.exit(f"student_copies: {error}")


if __name__ == "__main__":
    main()
