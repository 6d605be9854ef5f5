"""Grade a class with nbgrader: one assignment per notebook, the check cells as its tests, the points
from the verdicts of the course's own checks, run where no student code can reach them.

    python scripts/grade.py release [--due WHEN] NB...          (make release-assignment NB=00 DUE=...)
    python scripts/grade.py collect NB...                        (make collect NB=00)
    python scripts/grade.py grade [--submitted DIR] [--force] [--due WHEN] [--check-seconds S]
                                  [--cell-seconds S] [--memory-mb M] [--jobs N] NB...
                                                                 (make grade NB=00 SUBMITTED=DIR)
    python scripts/grade.py feedback NB...                       (make feedback NB=00)

NB is a notebook's number (00). nbgrader's own steps run through its Python API, configured by the
course's nbgrader_config.py; --course sets the course directory, by default grading/:

- release: the graded source (scripts/student_copies.py: nbgrader's metadata, no reveal cells,
  hidden tests at a seed drawn now), generate_assignment, the due date (--due), release_assignment;
- collect: the submissions from the exchange into submitted/ (a newer one replaces the older);
- grade: the submissions of --submitted copied in (STUDENT/ASSIGNMENT/NOTEBOOK.ipynb, given a
  timestamp.txt from their files' time unless they hold one); then each submission whose timestamp
  or notebook changed since it was graded (all with --force) is read as JSON, never run: its cells
  compared with the course's (a check cell deleted, edited or duplicated, points edited: tampered),
  its graded notebook rebuilt from the source's own cells and the answer cells that parse against
  the allowlist (scripts/grader/: the others not_gradable, naming the line and construct), run in a
  sandbox of its own (bubblewrap, as nobody, on the simulator, --check-seconds a check cell and
  --cell-seconds any other of wall-clock time, --memory-mb of data, --jobs sandboxes at a time); the verdicts are read
  from that run's check cells. nbgrader's autograde then records the notebook the sandbox ran
  (gradebook, lateness, feedback) without running anything; the verdicts' points (0 for a flag)
  become the grade's manual score wherever nbgrader's own differs, so grades.csv (nbgrader's
  export), the formgrader, the feedback and exercises.csv (one row per student and exercise) say the
  same. One line per submission as it goes, with its flags and what the static read of the
  student's other cells found (a report, never a reason for 0). A submission that cannot be read
  or run is that student's not_graded; the class goes on;
- feedback: generate_feedback and release_feedback; the students fetch it from the exchange, and
  a submission that came as files has its feedback as an HTML file to send.
"""

import argparse
import collections
import concurrent.futures
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
from grader import rebuild, sandbox  # noqa: E402

ROOT = student_copies.ROOT


def _record_module():
    """attention_lib/checks/record.py on its own (the verdicts' record type)."""
    spec = importlib.util.spec_from_file_location("grading_record", ROOT / "attention_lib" / "checks" / "record.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


record = _record_module()
# nbgrader's timestamp.txt format (Exchange.timestamp_format).
TIMESTAMP = "%Y-%m-%d %H:%M:%S.%f %Z"
COLUMNS = ["assignment", "student", "exercise", "points", "max_points", "diagnosis", "hidden", "flag", "reasons",
           "nbgrader_points", "warnings", "same_as_solution", "report"]
# How the submission_secret.txt of a submission that came as files begins (nbgrader's submit writes
# hex digits only): release_feedback needs a secret, and feedback names these pages to send.
FILES_SECRET = "submitted-as-files-"
# nbgrader's warnings worth an instructor's eye: lateness (it records the notebooks the sandboxes
# ran, so what a student did to the course's cells is grade.py's own finding).
NBGRADER_WARNING = re.compile(r"seconds late|penalty", re.I)


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

def nbgrader_warnings(log):
    """nbgrader's warnings worth reporting (lateness), from an autograde's log."""
    lines = [line[len("[WARNING] "):].strip() for line in (log or "").splitlines() if line.startswith("[WARNING]")]
    return list(dict.fromkeys(line for line in lines if NBGRADER_WARNING.search(line)))


def _cells_by_id(notebook):
    return {cell.metadata["nbgrader"]["grade_id"]: cell for cell in notebook.cells
            if cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")}


def _test_ids(released):
    return [grade_id for grade_id, cell in _cells_by_id(released).items() if cell.metadata["nbgrader"].get("grade")]


def verdict_records(cell, exercise):
    """(visible record or None, hidden record or None, problems) displayed by a check cell of the
    notebook the sandbox ran: the verdicts of the course's own check, read from its outputs."""
    found, problems = {False: [], True: []}, []
    for output in cell.get("outputs", []):
        data = output.get("data", {}).get(record.MIME)
        if not isinstance(data, dict):
            continue
        if data.get("exercise_id") != exercise:
            problems.append(f"its cell shows a verdict of {data.get('exercise_id')}")
        else:
            found[bool(data.get("hidden"))].append(data)
    if len(found[False]) > 1 or len(found[True]) > 1:
        problems.append("its cell shows more than one verdict")
    first = lambda records: records[0] if records else None
    return first(found[False]), first(found[True]), problems


def _error(cell):
    return next((o.get("ename") for o in cell.get("outputs", []) if o.get("output_type") == "error"), None)


FLAGS = ("tampered", "not_gradable", "not_graded")


def exercise_row(exercise, cell, source_cell, changes=(), not_gradable=(), missing=""):
    """One exercise's row: the points only for an ok verdict of the course's check (and ok on the
    hidden cases, where the source has them) with no flag. `cell`: the check cell as the sandbox
    ran it (None when it did not run); `changes`: what the student did to the course's cells
    (tampered); `not_gradable`: why the answer could not run (its line and construct); `missing`:
    why nothing ran (not_graded)."""
    most = float(source_cell.metadata["nbgrader"]["points"])
    wants_hidden = "### BEGIN HIDDEN TESTS" in source_cell.source
    visible, hidden, problems = verdict_records(cell, exercise) if cell is not None else (None, None, [])
    timeout = cell is not None and cell.get("metadata", {}).get("grading_timeout")
    if not_gradable:
        diagnosis = "not_gradable"
    elif visible:
        diagnosis = visible["diagnosis"]
    elif timeout:
        diagnosis = "timeout"
    else:
        diagnosis = f"error:{_error(cell)}" if cell is not None and _error(cell) else "no_verdict"
    reasons = list(changes) + problems
    if not_gradable:
        reasons.append("its answer was not run: " + "; ".join(not_gradable))
    if visible is None and not not_gradable:
        why = (missing or (f"its check ran past its wall-clock limit of {timeout:g} s" if timeout else "")
               or f"the check gave no verdict" + (f" (it raised {_error(cell)})" if cell is not None and _error(cell)
                                                  else ""))
        reasons.append(why)
    flag = ("tampered" if changes or problems else "not_gradable" if not_gradable
            else "not_graded" if visible is None else "")
    passed = bool(visible and visible["passed"]) and (not wants_hidden or bool(hidden and hidden["passed"]))
    return {"exercise": exercise, "points": most if passed and not flag else 0.0, "max_points": most,
            "diagnosis": diagnosis, "hidden": (hidden or {}).get("diagnosis", "not_run" if wants_hidden else ""),
            "flag": flag, "reasons": "; ".join(reasons)}


def scan_report(submitted, released):
    """What the static read of the student's own cells found: a report, never a reason for 0."""
    if submitted is None:
        return ""
    found = [f"cell {i}: {what}" for i, text in integrity.student_cells(submitted, released)
             for what in integrity.findings(text)]
    return "; ".join(found)


class Limits:
    """The wall-clock limits of a grading run: each check cell, each other cell, the sandbox."""

    def __init__(self, check_seconds=90.0, cell_seconds=60.0, memory_mb=sandbox.MEMORY_MB):
        self.check, self.cell, self.memory_mb = float(check_seconds), float(cell_seconds), int(memory_mb)

    def total(self, notebook):
        checks = sum(1 for c in notebook.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade"))
        others = sum(1 for c in notebook.cells if c.cell_type == "code") - checks
        # A kernel's start, every check to its limit, and two other cells to theirs.
        return 60 + self.check * checks + self.cell * min(others, 2)


def grade_notebook(notebook_name, course, student, assignment, limits, hidden):
    """(rows, executed notebook or None) of one notebook of a submission: read, checked against the
    course's cells, rebuilt from them and the answers that parse, run in a sandbox of its own."""
    paths = {kind: course / kind / (student if kind == "submitted" else "") / assignment / notebook_name
             for kind in ("source", "release", "submitted")}
    source, released = (nbformat.read(paths[k], as_version=4) for k in ("source", "release"))
    missing = "" if paths["submitted"].exists() else f"no {notebook_name} was submitted"
    submitted, problem = rebuild.read(paths["submitted"]) if not missing else (None, missing)
    changes, built, executed, note = {}, rebuild.rebuild(source, released, None), None, problem
    if submitted is not None:
        try:
            changes = rebuild.structure(submitted, source)
            built = rebuild.rebuild(source, released, submitted)
        except Exception as error:  # noqa: BLE001 (one bad notebook is one student's problem)
            submitted, note = None, f"the notebook could not be read: {type(error).__name__}: {error}"[:300]
    if submitted is not None:
        text, note = sandbox.run(nbformat.writes(built.notebook), limits.check, limits.cell,
                                 limits.total(built.notebook), hidden, limits.memory_mb)
        if text is not None:
            executed = nbformat.reads(text, as_version=4)
            if executed.metadata.get("grading_kernel_died"):
                note = "the notebook's kernel died before this check ran"
    ran = _cells_by_id(executed) if executed is not None else {}
    solutions, mine = _cells_by_id(source), _cells_by_id(submitted) if submitted is not None else {}
    report, rows = scan_report(submitted, released), []
    for exercise in _test_ids(released):
        row = exercise_row(exercise, ran.get(exercise), solutions[exercise], changes.get(exercise, []),
                           built.not_gradable.get(exercise, []) if submitted is not None else [],
                           note or "")
        answer = mine.get(f"{exercise}_answer")
        row["same_as_solution"] = "yes" if answer is not None and integrity.same_as_solution(
            answer.source, solutions[f"{exercise}_answer"].source) else ""
        row["report"] = report
        rows.append(row)
    return rows, executed if executed is not None else built.notebook


def with_nbgrader(rows, gradebook, assignment, student, notebook_id, notes):
    """Each row with nbgrader's own points and the warnings that concern it; where nbgrader's points
    differ from the verdict's, the verdict's become the grade's manual score (one truth)."""
    for row in rows:
        try:
            grade = gradebook.find_grade(row["exercise"], notebook_id, assignment, student)
        except Exception:  # noqa: BLE001 (nbgrader has no grade for it: the row stands alone)
            row["nbgrader_points"], row["warnings"] = "", "; ".join(notes)
            continue
        row["nbgrader_points"] = grade.auto_score
        grade.manual_score = None if grade.auto_score == row["points"] else row["points"]
        grade.needs_manual_grade = False
        row["warnings"] = "; ".join(notes)
    gradebook.db.commit()
    return rows


# --- Grading --------------------------------------------------------------------------------------

# Where the notebooks the sandboxes ran wait for nbgrader (as its submitted/ folder would).
SANDBOXED = "sandboxed"


def nbgrader_record(course, assignment, student):
    """nbgrader's autograde of the notebooks the sandbox ran (never of the submission): its
    gradebook, lateness and autograded/ copy (the feedback's), without executing anything.
    Returns its log."""
    from nbgrader.apps import NbGraderAPI
    from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, LimitOutput,
                                        OverwriteKernelspec, SaveAutoGrades)

    api = nbgrader_api(course)
    config = api.config
    config.CourseDirectory.submitted_directory = SANDBOXED
    config.Autograde.sanitize_preprocessors = [OverwriteKernelspec, CheckCellMetadata]
    config.Autograde.autograde_preprocessors = [LimitOutput, SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
    result = NbGraderAPI(config=config).autograde(assignment, student, force=True, create=True)
    if not result or not result.get("success"):
        last = ((result or {}).get("error") or "no message").strip().splitlines()[-1:] or ["no message"]
        raise GradingError(f"nbgrader autograde {assignment} {student} failed: {last[0]}")
    return result.get("log", "")


def sandboxed(course, assignment, student, limits, hidden=()):
    """Grade one submission, each notebook in a sandbox of its own: ({notebook path: rows},
    seconds); the notebooks the sandboxes ran wait in SANDBOXED/ for nbgrader. Nothing a submission
    does stops the class: what fails is this student's not_graded, with the reason."""
    started = time.monotonic()
    folder = course / SANDBOXED / student / assignment
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    # nbgrader's lateness and its feedback's release need the submission's timestamp and secret.
    for name in ("timestamp.txt", "submission_secret.txt"):
        if (course / "submitted" / student / assignment / name).is_file():
            shutil.copy(course / "submitted" / student / assignment / name, folder / name)
    found = {}
    for path in sorted((course / "release" / assignment).glob("*.ipynb")):
        try:
            found[path], executed = grade_notebook(path.name, course, student, assignment, limits, hidden)
            nbformat.write(executed, folder / path.name)
        except Exception as error:  # noqa: BLE001 (one bad notebook is one student's problem)
            source = nbformat.read(course / "source" / assignment / path.name, as_version=4)
            why = f"grading failed: {type(error).__name__}: {error}"[:300]
            found[path] = [dict(exercise_row(e, None, _cells_by_id(source)[e], missing=why), same_as_solution="",
                                report="") for e in _test_ids(source)]
    return found, time.monotonic() - started


def recorded(course, assignment, student, found, seconds):
    """One graded submission recorded: nbgrader's autograde of what its sandboxes ran (its gradebook,
    lateness, feedback), the verdicts' points over nbgrader's where they differ, the rows kept with
    the fingerprint they were graded at; returns the entry kept."""
    from nbgrader.api import Gradebook

    started, rows = time.monotonic(), []
    try:
        notes = nbgrader_warnings(nbgrader_record(course, assignment, student))
    except Exception as error:  # noqa: BLE001 (the rows stand without nbgrader's gradebook)
        notes = [f"nbgrader could not record it: {error}"[:300]]
    coursedir = nbgrader_api(course).coursedir
    with Gradebook(coursedir.db_url, coursedir.course_id) as gradebook:
        for path, found_rows in found.items():
            rows += with_nbgrader(found_rows, gradebook, assignment, student, path.stem, notes)
    for row in rows:
        row.update(assignment=assignment, student=student)
    entry = {"fingerprint": fingerprint(course / "submitted" / student / assignment), "rows": rows,
             "warnings": notes, "seconds": round(seconds + time.monotonic() - started, 1)}
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
    reports = list(dict.fromkeys(r.get("report", "") for r in rows if r.get("report")))
    lines += [f"    read, not run: {report}" for report in reports]
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


def write_exercises(course, rows):
    with open(course / "exercises.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS)
        writer.writeheader()
        writer.writerows({k: row.get(k, "") for k in COLUMNS} for row in rows)


def grade(names, course, submitted=None, force=False, notebooks=None, due=None, limits=None, jobs=1):
    """Grade what changed (the assignments' due date set first, when `due`), each submission in its
    own sandbox, export nbgrader's grades.csv and write exercises.csv; returns exercises.csv's rows."""
    from nbgrader.api import Gradebook
    from nbgrader.plugins import CsvExportPlugin

    missing = sandbox.available()
    if missing:
        raise GradingError(missing)
    limits = limits or Limits()
    assignments = [assignment_of(prefix, notebooks) for prefix in names]
    if submitted is not None:
        copy_submissions(submitted, assignments, course)
    students = submissions(course, assignments)
    api = nbgrader_api(course)
    generate(api, names, course, notebooks)
    for assignment in assignments if due else ():
        set_due(api, assignment, due)
    exchange = api.config.Exchange.root if "root" in api.config.Exchange else ""
    hidden = [course] + ([Path(exchange)] if exchange else [])
    rows, total = [], sum(map(len, students.values()))
    pairs = [(a, s) for a in assignments for s in students[a]]
    kept = {pair: stored(course, pair[1], pair[0]) for pair in pairs}
    changed = {pair for pair, entry in kept.items() if force or entry is None or entry["fingerprint"] != fingerprint(
        course / "submitted" / pair[1] / pair[0])}
    # The sandboxes run `jobs` at a time; nbgrader's gradebook records them one by one, in order.
    with concurrent.futures.ThreadPoolExecutor(max(1, jobs)) as pool:
        running = {pair: pool.submit(sandboxed, course, *pair, limits, hidden) for pair in pairs if pair in changed}
        for count, (assignment, student) in enumerate(pairs, 1):
            entry = kept[assignment, student]
            if (assignment, student) in changed:
                entry = recorded(course, assignment, student, *running[assignment, student].result())
            progress(count, total, assignment, student, entry, (assignment, student) in changed)
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


def _seconds(text):
    """A positive number of seconds (argparse's type); the error names what was expected."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"expected seconds between 0 and 3600, got {text!r}")
    return value


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=["release", "collect", "grade", "feedback"])
    parser.add_argument("notebooks", nargs="+", metavar="NB", help="a notebook's number (00)")
    parser.add_argument("--course", help="the course directory (default: nbgrader_config.py's, grading/)")
    parser.add_argument("--submitted", help="grade: a folder of submissions, STUDENT/ASSIGNMENT/NOTEBOOK.ipynb")
    parser.add_argument("--force", action="store_true", help="grade: autograde again what was graded already")
    parser.add_argument("--due", help="release, grade: the due date, e.g. '2026-12-20 17:00 UTC' (nbgrader's lateness)")
    parser.add_argument("--check-seconds", type=_seconds, default=90.0,
                        help="grade: the wall-clock limit of each check cell, in seconds (default 90)")
    parser.add_argument("--cell-seconds", type=_seconds, default=60.0,
                        help="grade: the wall-clock limit of each other cell, in seconds (default 60)")
    parser.add_argument("--memory-mb", type=int, default=sandbox.MEMORY_MB, metavar="M",
                        help=f"grade: the data one submission's sandbox may hold, in MB (default {sandbox.MEMORY_MB})")
    parser.add_argument("--jobs", type=int, default=1, choices=range(1, 17), metavar="N",
                        help="grade: how many sandboxes run at once (default 1; one a core at most)")
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
            grade(options.notebooks, course, submitted, options.force, folder, options.due,
                  Limits(options.check_seconds, options.cell_seconds, options.memory_mb), options.jobs)
        else:
            feedback(options.notebooks, course, folder)
    except (GradingError, ValueError) as error:
        sys.exit(f"grade {options.step}: {error}")


if __name__ == "__main__":
    main()
