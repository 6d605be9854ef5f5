"""The graded notebook of a submission, rebuilt from the course's own cells; read, never run.

- ``read(path) -> (notebook or None, problem)``: the submitted file as a notebook, or why not;
- ``structure(submitted, source) -> {exercise: [reasons]}``: what the student did to the cells the
  course owns (a check cell deleted, edited or duplicated, its points edited, a grade_id changed);
- ``rebuild(source, released, submitted) -> Rebuilt``: the source's cells in order (every cell the
  course wrote, check cells with their hidden tests), each answer cell's source where it parses
  against the allowlist (scripts/grader/allowlist.py), else the released stub; the student's other
  cells are left out. ``Rebuilt.not_gradable`` holds {exercise: ["line N: construct", ...]}.
  The grader adds no code of its own: an answer is a stub by the check's own rule (a function whose
  body, not a branch of it, raises NotImplementedError), the same in class and in grading.
"""

import copy
import json
from dataclasses import dataclass, field

import nbformat

from . import allowlist

HIDDEN = "### BEGIN HIDDEN TESTS"



def grade_id(cell):
    return cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")


def exercise_of(identifier):
    return identifier[: -len("_answer")] if identifier.endswith("_answer") else identifier


def read(path):
    """(notebook, "") or (None, why it cannot be graded): not JSON, not a notebook."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        return None, f"the notebook cannot be read ({type(error).__name__})"
    try:
        data = json.loads(text)
    except ValueError as error:
        return None, f"the notebook is not valid JSON (line {getattr(error, 'lineno', '?')})"
    try:
        notebook = nbformat.from_dict(data)
        if not isinstance(notebook.get("cells"), list) or any(not isinstance(c, dict) for c in notebook.cells):
            raise ValueError("no list of cells")
        for cell in notebook.cells:
            if not isinstance(cell.get("source", ""), str):
                cell["source"] = "".join(cell["source"]) if isinstance(cell["source"], list) else ""
            cell.setdefault("metadata", {})
            if not isinstance(cell.metadata, dict) or not isinstance(cell.metadata.get("nbgrader", {}), dict):
                cell["metadata"] = {}
    except (ValueError, TypeError, AttributeError) as error:
        return None, f"the file is not a notebook ({error})"
    return notebook, ""


def _points(value):
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def structure(submitted, source):
    """{exercise: [reasons]} for the cells the course owns, compared with the source."""
    reasons = {}
    given = {grade_id(c): c for c in source.cells if grade_id(c)}
    counts = {}
    for cell in submitted.cells:
        if grade_id(cell):
            counts[grade_id(cell)] = counts.get(grade_id(cell), 0) + 1
    mine = {grade_id(c): c for c in submitted.cells if grade_id(c)}
    for identifier, cell in given.items():
        exercise = exercise_of(identifier)
        found = reasons.setdefault(exercise, [])
        if counts.get(identifier, 0) > 1:
            found.append(f"its cell {identifier} appears {counts[identifier]} times")
        theirs = mine.get(identifier)
        if not cell.metadata["nbgrader"].get("grade"):
            if theirs is None:
                found.append(f"its answer cell {identifier} was deleted or its grade_id changed")
            continue
        if theirs is None or not theirs.metadata["nbgrader"].get("grade"):
            found.append("its check cell was deleted or its grade_id changed")
            continue
        released = cell.source.split(HIDDEN)[0].strip()
        if theirs.source.strip() != released:
            found.append("its check cell was edited")
        points = theirs.metadata["nbgrader"].get("points")
        if _points(points) != _points(cell.metadata["nbgrader"].get("points")):
            found.append(f"its check cell's points were edited to {points!r}"[:120])
    unknown = sorted(set(counts) - set(given))
    for identifier in unknown:
        for found in reasons.values():
            found.append(f"a cell carries the grade_id {identifier!r}, which the course does not have"[:160])
    return {e: r for e, r in reasons.items() if r}


@dataclass
class Rebuilt:
    notebook: object
    not_gradable: dict = field(default_factory=dict)
    answers: dict = field(default_factory=dict)         # exercise -> the answer's source as run


def rebuild(source, released, submitted):
    """The graded notebook (see the module's docstring)."""
    stubs = {grade_id(c): c.source for c in released.cells if grade_id(c)}
    mine = {}
    for cell in submitted.cells if submitted is not None else ():
        if grade_id(cell) and cell.get("cell_type") == "code":
            mine.setdefault(grade_id(cell), []).append(cell)
    cells, given_sources, defined = [], [], set()
    result = Rebuilt(None)
    for cell in source.cells:
        cell = copy.deepcopy(cell)
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
        identifier = grade_id(cell)
        if cell.cell_type != "code" or not (identifier and cell.metadata["nbgrader"].get("solution")):
            if cell.cell_type == "code":
                given_sources.append(cell.source)
            cells.append(cell)
            continue
        exercise = exercise_of(identifier)
        stub = stubs.get(identifier, "")
        theirs = mine.get(identifier, [])
        text = theirs[0].source if len(theirs) == 1 else stub
        own = allowlist.parse(stub, allowlist.given_names(given_sources)).names
        parsed = allowlist.parse(text, allowlist.given_names(given_sources), defined, own)
        if parsed.problems:
            result.not_gradable[exercise] = [f"line {line}: {what}" for line, what in parsed.problems]
            text = stub
            parsed = allowlist.parse(text, allowlist.given_names(given_sources), defined, own)
        defined |= parsed.names
        cell.source = text
        result.answers[exercise] = text
        cells.append(cell)
    notebook = copy.deepcopy(source)
    notebook.cells = cells
    result.notebook = notebook
    return result

