"""Grade a class with nbgrader: one assignment per notebook, the check cells as its tests, the points
from the checks' signed verdicts.

    python scripts/grade.py release [--due WHEN] NB...          (make release-assignment NB=00 DUE=...)
    python scripts/grade.py collect NB...                        (make collect NB=00)
    python scripts/grade.py grade [--submitted DIR] [--force] [--due WHEN] NB...  (make grade NB=00 SUBMITTED=DIR)
    python scripts/grade.py feedback NB...                       (make feedback NB=00)

NB is a notebook's number (00). Every step is nbgrader's own (its converters and exchange through
its Python API, configured by the course's nbgrader_config.py; --course sets the course directory,
by default grading/):

- release: the graded source (scripts/student_copies.py: nbgrader's metadata, no reveal cells,
  hidden tests at a seed drawn now), generate_assignment, the due date (--due), release_assignment;
- collect: the submissions from the exchange into submitted/ (a newer one replaces the older);
- grade: the submissions of --submitted copied in (STUDENT/ASSIGNMENT/NOTEBOOK.ipynb, given a
  timestamp.txt from their files' time unless they hold one), then autograde of each submission
  whose timestamp or notebook changed since it was graded (all with --force), on the simulator,
  with a fresh key for the verdicts' signatures; one line per submission as it goes, with
  nbgrader's warnings (late, a locked cell changed or deleted, points edited) and the flags. The
  points are the signed verdicts' (tampered or not_graded gives 0), written into nbgrader's
  gradebook as a manual score wherever nbgrader's own differs, so grades.csv (nbgrader's export),
  the formgrader, the feedback and exercises.csv (one row per student and exercise) say the same;
- feedback: generate_feedback and release_feedback; the students fetch it from the exchange, and
  a submission that came as files has its feedback as an HTML file to send.
"""

import argparse
import collections
import contextlib
import csv
import datetime
import hashlib
import importlib.util
import json
import os
import re
import secrets
import shutil
import sys
import time
import warnings
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import integrity  # noqa: E402 (scripts beside this one)
import student_copies  # noqa: E402

ROOT = student_copies.ROOT


def _record_module():
    """attention_lib/checks/record.py on its own (the grader verifies; it never imports the course)."""
    spec = importlib.util.spec_from_file_location("grading_record", ROOT / "attention_lib" / "checks" / "record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


record = _record_module()
# nbgrader's timestamp.txt format (Exchange.timestamp_format).
TIMESTAMP = "%Y-%m-%d %H:%M:%S.%f %Z"
COLUMNS = ["assignment", "student", "exercise", "points", "max_points", "diagnosis", "hidden", "flag", "reasons",
           "nbgrader_points", "warnings", "same_as_solution"]
EDITED = "its check cell was edited (nbgrader restored it)"
# How the submission_secret.txt of a submission that came as files begins (nbgrader's submit writes
# hex digits only): release_feedback needs a secret, and feedback names these pages to send.
FILES_SECRET = "submitted-as-files-"
# nbgrader's warnings worth an instructor's eye: late, a locked cell changed, deleted or re-pointed.
NBGRADER_WARNING = re.compile(r"seconds late|has changed|Missing grade cell|does not exist in the database|"
                              r"No submitted file|penalty", re.I)


class GradingError(Exception):
    """A step failed; the message names it."""


def nbgrader_api(course):
    """nbgrader's Python API on the course directory `course`, configured by the course's
    nbgrader_config.py."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.apps.baseapp import NbGrader

    # nbgrader 0.9.6's gradebook warns on every autograde under SQLAlchemy 2 that an object it has
    # just made is not yet in the session; the grades it records are right (tests/test_grading.py).
    warnings.filterwarnings("ignore", message=r"Object of type <\w+> not in session")
    # nbgrader runs `alembic` (its gradebook's migrations) from the PATH: this Python's own.
    os.environ["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    loader = NbGrader(config_file_paths=[str(ROOT)])
    loader.load_config_file()
    config = loader.config
    config.CourseDirectory.root = str(course)
    return NbGraderAPI(config=config)


def run(step, result, what):
    """A step's result from NbGraderAPI ({"success", "log", "error"}): GradingError naming the step
    when it failed, after nbgrader's log."""
    if not result or not result.get("success"):
        print((result or {}).get("log", ""), (result or {}).get("error", ""), sep="\n", file=sys.stderr)
        raise GradingError(f"nbgrader {step} {what} failed; its log is above")
    return result


def course_directory(course=None):
    """The course directory: --course, else the one nbgrader_config.py names."""
    if course is not None:
        return Path(course).resolve()
    return Path(os.environ.get("ATTENTION_COURSE_DIR", ROOT / "grading")).resolve()


def assignment_of(prefix, notebooks=None):
    """The assignment of the notebook whose name starts with `prefix` (ValueError naming the
    notebooks when there is none)."""
    (notebook,) = student_copies.course_notebooks([prefix], notebooks)
    return student_copies.assignment_name(notebook)


def generate(api, names, course, notebooks=None, regenerate=False, seed=None):
    """The assignments' graded source from the notebooks, then nbgrader's generate_assignment (its
    gradebook entry and its release/ copy); skipped for an assignment already generated unless
    `regenerate`, so what is graded is what the class got."""
    assignments = []
    for prefix in names:
        assignment = assignment_of(prefix, notebooks)
        if regenerate or not (course / "release" / assignment).is_dir():
            student_copies.write_sources(course, [prefix], seed, notebooks)
            run("generate_assignment", api.generate_assignment(assignment, force=True, create=True), assignment)
        assignments.append(assignment)
    return assignments


def parse_due(due):
    """--due as nbgrader stores it (UTC); ValueError naming the form expected."""
    from nbgrader.utils import parse_utc

    try:
        return parse_utc(due)
    except (ValueError, OverflowError):
        raise ValueError(f"--due must be a date and time such as '2026-12-20 17:00 UTC', got {due!r}") from None


def set_due(api, assignment, due):
    """The assignment's due date in nbgrader's gradebook (nbgrader's lateness and late penalty)."""
    from nbgrader.api import Gradebook

    with Gradebook(api.coursedir.db_url, api.coursedir.course_id) as gradebook:
        gradebook.update_or_create_assignment(assignment, duedate=parse_due(due))


def release(names, course, due=None, seed=None, notebooks=None):
    """Generate each assignment (graded: no reveal cells, hidden tests), set its due date, release
    it into the exchange for the students to fetch."""
    api = nbgrader_api(course)
    for assignment in generate(api, names, course, notebooks, regenerate=True, seed=seed):
        if due:
            set_due(api, assignment, due)
        run("release_assignment", api.release_assignment(assignment), assignment)
        print(f"released {assignment}" + (f", due {parse_due(due)} UTC" if due else ""))


def collect(names, course, notebooks=None):
    """Collect every submission of each assignment from the exchange into submitted/ (a newer
    submission replaces the one collected before)."""
    api = nbgrader_api(course)
    for assignment in (assignment_of(name, notebooks) for name in names):
        run("collect", api.collect(assignment, update=True), assignment)
        print(f"collected {assignment}: {len(list((course / 'submitted').glob(f'*/{assignment}')))} submission(s)")


# --- Submissions that came as files -------------------------------------------------------------

def files_time(folder):
    """The time a folder's newest file was saved, as nbgrader writes timestamps (UTC)."""
    newest = max(p.stat().st_mtime for p in Path(folder).rglob("*") if p.is_file())
    return datetime.datetime.fromtimestamp(newest, datetime.timezone.utc).strftime(TIMESTAMP)


def copy_submissions(submitted, assignments, course):
    """Copy submitted/STUDENT/ASSIGNMENT/ folders of `submitted` into the course's submitted/, each
    with the timestamp.txt nbgrader's collect would have written (its files' time, unless the
    folder holds one) and a submission_secret.txt (release_feedback needs both). Returns the
    (student, assignment) pairs copied."""
    copied = []
    for assignment in assignments:
        for folder in sorted(Path(submitted).glob(f"*/{assignment}")):
            target = course / "submitted" / folder.parent.name / assignment
            stamp = (folder / "timestamp.txt").read_text() if (folder / "timestamp.txt").exists() else files_time(folder)
            shutil.copytree(folder, target, dirs_exist_ok=True)
            (target / "timestamp.txt").write_text(stamp)
            (target / "submission_secret.txt").write_text(FILES_SECRET + secrets.token_hex(16))
            copied.append((folder.parent.name, assignment))
    if not copied:
        raise GradingError(f"--submitted {submitted} holds no STUDENT/ASSIGNMENT folder for {', '.join(assignments)}")
    return copied


# --- What changed since the last grading --------------------------------------------------------

def fingerprint(folder):
    """A submission's timestamp and a hash of its notebooks: what a regrade compares."""
    digest = hashlib.sha256()
    for path in sorted(Path(folder).glob("*.ipynb")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    stamp = folder / "timestamp.txt"
    return {"timestamp": stamp.read_text().strip() if stamp.exists() else "", "notebooks": digest.hexdigest()}


def verdicts_path(course, student, assignment):
    """Where a graded submission's rows are kept (with the fingerprint it was graded at)."""
    return course / "verdicts" / student / f"{assignment}.json"


def stored(course, student, assignment):
    path = verdicts_path(course, student, assignment)
    return json.loads(path.read_text()) if path.exists() else None


# --- Reading a graded notebook ------------------------------------------------------------------

def nbgrader_warnings(log, edited=()):
    """nbgrader's warnings worth reporting, from an autograde's log. A check cell's "checksum has
    changed" is reported only for the cells in `edited`: nbgrader stores a checksum of the cell
    with its hidden tests and compares it with the released cell's, so it says so of every one."""
    lines = [line[len("[WARNING] "):].strip() for line in (log or "").splitlines() if line.startswith("[WARNING]")]
    checksum = re.compile(r"Attribute 'checksum' for cell (\w+) has changed")
    kept = [line for line in lines if NBGRADER_WARNING.search(line)
            and (not checksum.search(line) or checksum.search(line).group(1) in edited)]
    return list(dict.fromkeys(kept))


def _cells_by_id(notebook):
    return {cell.metadata["nbgrader"]["grade_id"]: cell for cell in notebook.cells
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")}


def _test_ids(released):
    return [grade_id for grade_id, cell in _cells_by_id(released).items() if cell.metadata["nbgrader"].get("grade")]


def locked_cell_changes(submitted, released):
    """{exercise: [what the student did to its locked check cell]}: deleted, edited, points changed."""
    mine, given = _cells_by_id(submitted), _cells_by_id(released)
    changes = collections.defaultdict(list)
    for grade_id in _test_ids(released):
        cell = mine.get(grade_id)
        if cell is None or not cell.metadata["nbgrader"].get("grade"):
            changes[grade_id].append("its check cell was deleted (nbgrader added it back)")
            continue
        if cell.source.strip() != given[grade_id].source.strip():
            changes[grade_id].append(EDITED)
        if float(cell.metadata["nbgrader"].get("points", -1)) != float(given[grade_id].metadata["nbgrader"]["points"]):
            changes[grade_id].append(f"its check cell's points were edited to {cell.metadata['nbgrader'].get('points')}")
    return changes


def verdict_records(cell, exercise, key):
    """(visible record or None, hidden record or None, problems) displayed by a graded check cell."""
    found, problems = {False: [], True: []}, []
    for output in cell.get("outputs", []):
        data = output.get("data", {}).get(record.MIME)
        if data is None:
            continue
        if not record.verify(data, key):
            problems.append("its cell shows a verdict no check of this run made")
        elif data.get("exercise_id") != exercise:
            problems.append(f"its cell shows a verdict of {data.get('exercise_id')}")
        else:
            found[bool(data.get("hidden"))].append(data)
    if len(found[False]) > 1 or len(found[True]) > 1:
        problems.append("its cell shows more than one verdict")
    first = lambda records: records[0] if records else None
    return first(found[False]), first(found[True]), problems


def _error(cell):
    return next((o.get("ename") for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)


def exercise_row(exercise, cell, source_cell, key, notebook_findings, cell_changes):
    """One exercise's row from its graded check cell: the points only for a signed ok verdict
    (and ok on the hidden cases, where the source has them), and no flag."""
    visible, hidden, problems = verdict_records(cell, exercise, key) if cell is not None else (None, None, [])
    wants_hidden = "### BEGIN HIDDEN TESTS" in source_cell.source
    diagnosis = visible["diagnosis"] if visible else (f"error:{_error(cell)}" if cell is not None and _error(cell)
                                                      else "no_verdict")
    reasons = cell_changes + problems + notebook_findings
    flag = "tampered" if reasons else ("not_graded" if visible is None else "")
    if visible is None and not reasons:
        reasons = ["the check gave no verdict" + (f" (it raised {_error(cell)})" if cell is not None and _error(cell)
                                                  else "")]
    passed = bool(visible and visible["passed"]) and (not wants_hidden or bool(hidden and hidden["passed"]))
    points = float(source_cell.metadata["nbgrader"]["points"]) if passed and not flag else 0.0
    return {"exercise": exercise, "points": points, "max_points": float(source_cell.metadata["nbgrader"]["points"]),
            "diagnosis": diagnosis, "hidden": (hidden or {}).get("diagnosis", "not_run" if wants_hidden else ""),
            "flag": flag, "reasons": "; ".join(reasons)}


def notebook_rows(notebook_name, course, student, assignment, key):
    """The rows of one notebook of a submission (before nbgrader's own points and warnings)."""
    paths = {kind: course / kind / (student if kind in ("submitted", "autograded") else "") / assignment / notebook_name
             for kind in ("source", "release", "submitted", "autograded")}
    source, released = (nbformat.read(paths[k], as_version=4) for k in ("source", "release"))
    submitted = nbformat.read(paths["submitted"], as_version=4) if paths["submitted"].exists() else None
    graded = _cells_by_id(nbformat.read(paths["autograded"], as_version=4)) if paths["autograded"].exists() else {}
    mine = _cells_by_id(submitted) if submitted is not None else {}
    found = [f"cell {i}: {what}" for i, text in (integrity.student_cells(submitted, released) if submitted else [])
             for what in integrity.findings(text)]
    changes = locked_cell_changes(submitted, released) if submitted is not None else {}
    solutions, rows = _cells_by_id(source), []
    for exercise in _test_ids(released):
        row = exercise_row(exercise, graded.get(exercise), solutions[exercise], key, found, changes.get(exercise, []))
        answer = mine.get(f"{exercise}_answer")
        row["same_as_solution"] = "yes" if answer is not None and integrity.same_as_solution(
            answer.source, solutions[f"{exercise}_answer"].source) else ""
        rows.append(row)
    return rows


def with_nbgrader(rows, gradebook, assignment, student, notebook_id, notes):
    """Each row with nbgrader's own points and the warnings that concern it; where nbgrader's points
    differ from the verdict's, the verdict's become the grade's manual score (one truth)."""
    for row in rows:
        grade = gradebook.find_grade(row["exercise"], notebook_id, assignment, student)
        row["nbgrader_points"] = grade.auto_score
        grade.manual_score = None if grade.auto_score == row["points"] else row["points"]
        grade.needs_manual_grade = False
        mentioned = re.compile(rf"\b{re.escape(row['exercise'])}\b")
        row["warnings"] = "; ".join(n for n in notes if mentioned.search(n) or not re.search(r"\bcell\b", n))
    gradebook.db.commit()
    return rows


# --- Grading --------------------------------------------------------------------------------------

def grade_submission(api, course, assignment, student, key):
    """Autograde one submission, score it from its verdicts, keep its rows; returns the entry kept."""
    from nbgrader.api import Gradebook

    started = time.monotonic()
    result = run("autograde", api.autograde(assignment, student, force=True, create=True), f"{assignment} {student}")
    rows, notes = [], []
    with Gradebook(api.coursedir.db_url, api.coursedir.course_id) as gradebook:
        for path in sorted((course / "release" / assignment).glob("*.ipynb")):
            found = notebook_rows(path.name, course, student, assignment, key)
            edited = {row["exercise"] for row in found if EDITED in row["reasons"]}
            notes += [n for n in nbgrader_warnings(result.get("log"), edited) if n not in notes]
            rows += with_nbgrader(found, gradebook, assignment, student, path.stem, notes)
    for row in rows:
        row.update(assignment=assignment, student=student)
    entry = {"fingerprint": fingerprint(course / "submitted" / student / assignment), "rows": rows,
             "warnings": notes, "seconds": round(time.monotonic() - started, 1)}
    path = verdicts_path(course, student, assignment)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(entry, indent=1))
    return entry


def _points(rows):
    got, most = sum(r["points"] for r in rows), sum(r["max_points"] for r in rows)
    return f"{got:g} of {most:g} points"


def progress(count, total, assignment, student, entry, graded):
    """The line (and its notes) printed for one submission as grading goes."""
    rows = entry["rows"]
    what = f"{_points(rows)}, graded in {entry['seconds']:.1f} s" if graded else f"unchanged, {_points(rows)}"
    lines = [f"[{count:>{len(str(total))}}/{total}] {assignment} {student}: {what}"]
    lines += [f"    {r['exercise']}: {r['flag']} ({r['reasons']})" for r in rows if r["flag"]]
    if graded:
        lines += [f"    nbgrader: {note}" for note in entry["warnings"]]
    print("\n".join(lines), flush=True)


def submissions(course, assignments):
    """{assignment: [students]} of the course's submitted/ folder; GradingError when one has none."""
    found = {a: sorted(p.parent.name for p in (course / "submitted").glob(f"*/{a}")) for a in assignments}
    for assignment, students in found.items():
        if not students:
            raise GradingError(f"no submission of {assignment} in {course / 'submitted'} "
                               "(collect them, or give --submitted DIR laid out as STUDENT/ASSIGNMENT/NOTEBOOK.ipynb)")
    return found


@contextlib.contextmanager
def grading_environment():
    """For the length of the block, the environment of the notebooks a grading run executes: the
    simulator, whatever the machine has, and a fresh key for the verdicts' signatures (record.py
    takes it out before any answer runs); yields the key. The caller's environment comes back
    afterwards (a later kernel of this process signs nothing and may use a GPU)."""
    key = secrets.token_hex(32)
    before = {name: os.environ.get(name) for name in ("ATTENTION_LIB_BACKEND", record.KEY_VARIABLE)}
    os.environ["ATTENTION_LIB_BACKEND"] = "simulator"
    os.environ[record.KEY_VARIABLE] = key
    try:
        yield key
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def write_exercises(course, rows):
    with open(course / "exercises.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS)
        writer.writeheader()
        writer.writerows({k: row.get(k, "") for k in COLUMNS} for row in rows)


def grade(names, course, submitted=None, force=False, notebooks=None, due=None):
    """Autograde what changed (the assignments' due date set first, when `due`), score every
    submission from its verdicts, export nbgrader's grades.csv and write exercises.csv; returns
    exercises.csv's rows."""
    from nbgrader.api import Gradebook
    from nbgrader.plugins import CsvExportPlugin

    assignments = [assignment_of(prefix, notebooks) for prefix in names]
    if submitted is not None:
        copy_submissions(submitted, assignments, course)
    students = submissions(course, assignments)
    api = nbgrader_api(course)
    generate(api, names, course, notebooks)
    for assignment in assignments if due else ():
        set_due(api, assignment, due)
    rows, total = [], sum(map(len, students.values()))
    pairs = [(a, s) for a in assignments for s in students[a]]
    with grading_environment() as key:
        for count, (assignment, student) in enumerate(pairs, 1):
            entry = stored(course, student, assignment)
            changed = force or entry is None or entry["fingerprint"] != fingerprint(
                course / "submitted" / student / assignment)
            if changed:
                entry = grade_submission(api, course, assignment, student, key)
            progress(count, total, assignment, student, entry, changed)
            rows += entry["rows"]
    with Gradebook(api.coursedir.db_url, api.coursedir.course_id) as gradebook:
        CsvExportPlugin(to=str(course / "grades.csv")).export(gradebook)
    write_exercises(course, rows)
    print(f"{course / 'grades.csv'}: points per student and assignment (nbgrader's export, the verdicts' points)")
    print(f"{course / 'exercises.csv'}: points per student and exercise, each check's diagnosis and any flag")
    for line in summary(rows):
        print(line)
    return rows


def summary(rows):
    """Lines for the instructor: per exercise, how many students got it, then the mistakes by count,
    then the flags."""
    by_exercise = collections.defaultdict(list)
    for row in rows:
        by_exercise[row["exercise"]].append(row)
    lines = []
    for exercise, found in by_exercise.items():
        ok = sum(1 for r in found if r["points"] > 0)
        counts = collections.Counter(r["diagnosis"] for r in found if r["diagnosis"] != "ok").most_common()
        mistakes = ", ".join(f"{d} {n}" for d, n in counts) or "none"
        flags = collections.Counter(r["flag"] for r in found if r["flag"]).most_common()
        flagged = "; flagged: " + ", ".join(f"{f} {n}" for f, n in flags) if flags else ""
        lines.append(f"{exercise}: {ok} of {len(found)} ok; mistakes, most frequent first: {mistakes}{flagged}")
    return lines


def feedback(names, course, notebooks=None):
    """nbgrader's generate_feedback and release_feedback for each assignment: the students fetch it
    from the exchange; a submission that came as files gets the HTML file named here to send."""
    api = nbgrader_api(course)
    for assignment in (assignment_of(name, notebooks) for name in names):
        run("generate_feedback", api.generate_feedback(assignment, force=True), assignment)
        run("release_feedback", api.release_feedback(assignment), assignment)
        pages = sorted((course / "feedback").glob(f"*/{assignment}/*.html"))
        print(f"feedback on {assignment}: {len(pages)} page(s), released to the exchange (nbgrader fetch_feedback, "
              "or the Assignments tab)")
        for page in pages:
            secret = page.parent / "submission_secret.txt"
            if secret.exists() and secret.read_text().startswith(FILES_SECRET):
                print(f"    {page}: submitted as files, send it")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=["release", "collect", "grade", "feedback"])
    parser.add_argument("notebooks", nargs="+", metavar="NB", help="a notebook's number (00)")
    parser.add_argument("--course", help="the course directory (default: nbgrader_config.py's, grading/)")
    parser.add_argument("--submitted", help="grade: a folder of submissions, STUDENT/ASSIGNMENT/NOTEBOOK.ipynb")
    parser.add_argument("--force", action="store_true", help="grade: autograde again what was graded already")
    parser.add_argument("--due", help="release, grade: the due date, e.g. '2026-12-20 17:00 UTC' (nbgrader's lateness)")
    parser.add_argument("--hidden-seed", type=int, help="release: the hidden tests' seed (default: drawn)")
    parser.add_argument("--notebooks-folder", help="where the notebooks are (default: notebooks/)")
    options = parser.parse_args(argv)
    course = course_directory(options.course)
    folder = Path(options.notebooks_folder).resolve() if options.notebooks_folder else None
    submitted = Path(options.submitted).resolve() if options.submitted else None
    try:
        if options.step == "release":
            release(options.notebooks, course, options.due, options.hidden_seed, folder)
        elif options.step == "collect":
            collect(options.notebooks, course, folder)
        elif options.step == "grade":
            grade(options.notebooks, course, submitted, options.force, folder, options.due)
        else:
            feedback(options.notebooks, course, folder)
    except (GradingError, ValueError) as error:
        sys.exit(f"grade {options.step}: {error}")


if __name__ == "__main__":
    main()
