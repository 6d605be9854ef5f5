"""Grade a class with nbgrader: one assignment per notebook, the check cells as its tests.

    python scripts/grade.py release NB...                  (make release-assignment NB=00)
    python scripts/grade.py collect NB...                  (make collect NB=00)
    python scripts/grade.py grade [--submitted DIR] NB...  (make grade NB=00 SUBMITTED=DIR)

NB is a notebook's number (00) or name. Every step is nbgrader's own: its converters and exchange
through its Python API (NbGraderAPI, what its formgrader runs; one process instead of one per
command), configured by the course's nbgrader_config.py (--course sets the course directory, by
default the config's: grading/):

- release: the assignment's source (scripts/student_copies.py: the notebook with nbgrader's
  metadata), generate_assignment, then release_assignment into the exchange;
- collect: collect, the submissions from the exchange into submitted/;
- grade: generate_assignment (unless the assignment was generated already: what the class got
  is what is graded), the submissions of --submitted copied in (laid out as nbgrader's
  submitted/: STUDENT/ASSIGNMENT/NOTEBOOK.ipynb), autograde of each submission not graded yet
  (all of them with --force), nbgrader's CSV export (grades.csv: points per student and
  assignment), then exercises.csv: points per student and exercise, with the diagnosis code each
  check printed in the autograded notebook, and a summary of each exercise's mistakes, most
  frequent first.
"""

import argparse
import collections
import csv
import os
import re
import shutil
import sys
import warnings
from pathlib import Path

import nbformat

sys.path.insert(0, str(Path(__file__).resolve().parent))
import student_copies  # noqa: E402 (a script beside this one)

ROOT = student_copies.ROOT
# The verdict line check() prints or displays: "✘ 00_scale_add [out_of_bounds]: at n = 65: ...".
VERDICT = re.compile(r"^[✔✘] (\w+) \[(\w+)\]", re.M)


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


def assignment_of(prefix):
    """The assignment of the notebook whose name starts with `prefix` (ValueError naming the
    notebooks when there is none)."""
    (notebook,) = student_copies.course_notebooks([prefix])
    return student_copies.assignment_name(notebook)


def generate(api, names, course, regenerate=False):
    """The assignments' source from notebooks/, then nbgrader's generate_assignment (its gradebook
    entry and its release/ copy); skipped for an assignment already generated unless `regenerate`."""
    assignments = []
    for prefix in names:
        assignment = assignment_of(prefix)
        if regenerate or not (course / "release" / assignment).is_dir():
            student_copies.write_sources(course, [prefix])
            run("generate_assignment", api.generate_assignment(assignment, force=True, create=True), assignment)
        assignments.append(assignment)
    return assignments


def release(names, course):
    """Generate each assignment and release it into the exchange, for the students to fetch."""
    api = nbgrader_api(course)
    for assignment in generate(api, names, course, regenerate=True):
        run("release_assignment", api.release_assignment(assignment), assignment)
        print(f"released {assignment}")


def collect(names, course):
    """Collect every submission of each assignment from the exchange into submitted/."""
    api = nbgrader_api(course)
    for assignment in map(assignment_of, names):
        run("collect", api.collect(assignment, update=True), assignment)
        print(f"collected {assignment}: {len(list((course / 'submitted').glob(f'*/{assignment}')))} submission(s)")


def copy_submissions(submitted, assignments, course):
    """Copy submitted/STUDENT/ASSIGNMENT/ folders of `submitted` into the course's submitted/."""
    found = 0
    for assignment in assignments:
        for folder in sorted(Path(submitted).glob(f"*/{assignment}")):
            target = course / "submitted" / folder.parent.name / assignment
            shutil.copytree(folder, target, dirs_exist_ok=True)
            found += 1
    if not found:
        raise GradingError(f"--submitted {submitted} holds no STUDENT/ASSIGNMENT folder for {', '.join(assignments)}")


def diagnoses(notebook_path):
    """{grade_id: diagnosis} read from an autograded notebook's test cells: the verdict's code, or
    the exception's name when the cell raised before printing one."""
    found = {}
    for cell in nbformat.read(notebook_path, as_version=4).cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if cell.cell_type != "code" or not cell.get("metadata", {}).get("nbgrader", {}).get("grade"):
            continue
        text = "".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in cell.outputs)
        verdict = VERDICT.search(text)
        error = next((o.ename for o in cell.outputs if o.output_type == "error"), None)
        found[grade_id] = verdict.group(2) if verdict else (f"error:{error}" if error else "no_verdict")
    return found


def exercise_rows(assignments, course, db_url):
    """One row per student and exercise: assignment, student, exercise, points, max_points, diagnosis."""
    from nbgrader.api import Gradebook

    rows = []
    with Gradebook(db_url) as gradebook:
        for assignment in assignments:
            for submission in sorted(gradebook.assignment_submissions(assignment), key=lambda s: s.student.id):
                for notebook in submission.notebooks:
                    autograded = course / "autograded" / submission.student.id / assignment / f"{notebook.name}.ipynb"
                    found = diagnoses(autograded) if autograded.exists() else {}
                    for grade in sorted(notebook.grades, key=lambda g: g.name):
                        if not grade.cell_type == "code":
                            continue
                        rows.append({"assignment": assignment, "student": submission.student.id,
                                     "exercise": grade.name, "points": grade.score, "max_points": grade.max_score,
                                     "diagnosis": found.get(grade.name, "not_graded")})
    return rows


def summary(rows):
    """Lines for the instructor: per exercise, how many students got it, then the mistakes by count."""
    by_exercise = collections.defaultdict(list)
    for row in rows:
        by_exercise[row["exercise"]].append(row["diagnosis"])
    lines = []
    for exercise, found in by_exercise.items():
        counts = collections.Counter(d for d in found if d != "ok").most_common()
        mistakes = ", ".join(f"{d} {n}" for d, n in counts) or "none"
        lines.append(f"{exercise}: {found.count('ok')} of {len(found)} ok; mistakes, most frequent first: {mistakes}")
    return lines


def grade(names, course, submitted=None, force=False):
    """Autograde the submissions of each assignment, export nbgrader's grades.csv and write
    exercises.csv; returns exercises.csv's rows."""
    from nbgrader.api import Gradebook
    from nbgrader.plugins import CsvExportPlugin

    assignments = [assignment_of(prefix) for prefix in names]
    if submitted is not None:
        copy_submissions(submitted, assignments, course)
    students = {a: sorted(p.parent.name for p in (course / "submitted").glob(f"*/{a}")) for a in assignments}
    for assignment, found in students.items():
        if not found:
            raise GradingError(f"no submission of {assignment} in {course / 'submitted'} "
                               "(collect them, or give --submitted DIR laid out as STUDENT/ASSIGNMENT/NOTEBOOK.ipynb)")
    api = nbgrader_api(course)
    generate(api, names, course)
    for assignment in assignments:
        for student in students[assignment]:
            if force or not (course / "autograded" / student / assignment).is_dir():
                run("autograde", api.autograde(assignment, student, force=True, create=True), f"{assignment} {student}")
    with Gradebook(api.coursedir.db_url, api.coursedir.course_id) as gradebook:
        CsvExportPlugin(to=str(course / "grades.csv")).export(gradebook)
    rows = exercise_rows(assignments, course, api.coursedir.db_url)
    with open(course / "exercises.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, ["assignment", "student", "exercise", "points", "max_points", "diagnosis"])
        writer.writeheader()
        writer.writerows(rows)
    print(f"{course / 'grades.csv'}: points per student and assignment (nbgrader's CSV export)")
    print(f"{course / 'exercises.csv'}: points per student and exercise, with each check's diagnosis")
    for line in summary(rows):
        print(line)
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=["release", "collect", "grade"])
    parser.add_argument("notebooks", nargs="+", metavar="NB", help="a notebook's number (00) or name")
    parser.add_argument("--course", help="the course directory (default: nbgrader_config.py's, grading/)")
    parser.add_argument("--submitted", help="grade: a folder of submissions, STUDENT/ASSIGNMENT/NOTEBOOK.ipynb")
    parser.add_argument("--force", action="store_true", help="grade: autograde again what was graded already")
    options = parser.parse_args(argv)
    course = course_directory(options.course)
    submitted = Path(options.submitted).resolve() if options.submitted else None
    try:
        if options.step == "release":
            release(options.notebooks, course)
        elif options.step == "collect":
            collect(options.notebooks, course)
        else:
            grade(options.notebooks, course, submitted, options.force)
    except (GradingError, ValueError) as error:
        sys.exit(f"grade {options.step}: {error}")


if __name__ == "__main__":
    main()
