"""Grading a class with nbgrader (scripts/grade.py, `make grade`): a made-up class of three students
(the solutions, a blank copy, typical mistakes) on notebooks 00 and 03 goes through nbgrader's own
generate_assignment, autograde and export; the points and the diagnoses are read back. nbgrader's
Validate fails an unsolved copy, naming its exercises, and passes a solved one."""

import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


student_copies = _script("student_copies")
NOTEBOOKS = {"00": "00_gpu_basics", "03": "03_causal_mask"}

# Typical wrong answers, planted in the solutions: exercise -> (the solution's text, what the
# student wrote, the diagnosis its check must give).
MISTAKES = {
    "00": {"00_scale_add": ("    if i < out.shape[0]:\n        out[i] = alpha * x[i] + y[i]",     # no bounds guard
                            "    out[i] = alpha * x[i] + y[i]", "out_of_bounds")},
    "03": {"03_causal_mask": ("j > position", "j >= position", "mask_includes_diagonal")},    # j >= i masked
}
# Who submitted what: autograde runs each submission's whole notebook (6 to 10 s of CPU each), so
# notebook 03 gets only the copy with a mistake.
CLASS = {"solved": ("00",), "blank": ("00",), "mistakes": ("00", "03")}


def expected(student, prefix):
    """{exercise: diagnosis} the checks must give a student's copy of notebook `prefix`."""
    ids = [e.exercise_id for e in student_copies.exercises(_notebook(prefix))]
    if student == "solved":
        return dict.fromkeys(ids, "ok")
    if student == "blank":
        return dict.fromkeys(ids, "not_implemented")
    return {e: MISTAKES[prefix][e][2] if e in MISTAKES[prefix] else "ok" for e in ids}


def _notebook(prefix):
    return nbformat.read(ROOT / "notebooks" / f"{NOTEBOOKS[prefix]}.ipynb", as_version=4)


def with_mistakes(prefix):
    """The source version (solutions in, nbgrader's metadata) with MISTAKES planted in its answers."""
    notebook = student_copies.source_notebook(_notebook(prefix))
    for exercise, (solution, wrong, _) in MISTAKES[prefix].items():
        cells = [c for c in notebook.cells if c.metadata.get("nbgrader", {}).get("grade_id") == f"{exercise}_answer"]
        assert cells and solution in cells[0].source, f"{exercise}: the planted mistake's solution text is gone: {solution!r}"
        cells[0].source = cells[0].source.replace(solution, wrong)
    return notebook


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A made-up class graded by `scripts/grade.py grade` (what `make grade` runs): the course
    directory and the command's output."""
    base = tmp_path_factory.mktemp("class")
    made = {"solved": lambda prefix: student_copies.source_notebook(_notebook(prefix)),
            "blank": lambda prefix: student_copies.student_copy(_notebook(prefix)),
            "mistakes": with_mistakes}
    for student, prefixes in CLASS.items():
        for prefix in prefixes:
            folder = base / "submitted" / student / NOTEBOOKS[prefix]
            folder.mkdir(parents=True)
            nbformat.write(made[student](prefix), folder / f"{NOTEBOOKS[prefix]}.ipynb")
    course = base / "course"
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "grade.py"), "grade", *NOTEBOOKS,
                           "--course", str(course), "--submitted", str(base / "submitted")],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return course, done.stdout


def _csv(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def test_each_student_gets_the_points_of_the_exercises_checked_ok(graded):
    course, _ = graded
    totals = {(r["student_id"], r["assignment"]): (float(r["score"]), float(r["max_score"]))
              for r in _csv(course / "grades.csv")}                      # nbgrader export's own CSV
    wanted = {}
    for student, prefixes in CLASS.items():
        for prefix in prefixes:
            verdicts = expected(student, prefix).values()
            wanted[student, NOTEBOOKS[prefix]] = (list(verdicts).count("ok"), len(verdicts))
    assert {key: totals[key] for key in wanted} == wanted            # export also lists who did not submit
    assert all(totals[key][0] == 0 for key in set(totals) - set(wanted))
    assert wanted["solved", "00_gpu_basics"][0] > 0 and 0 < wanted["mistakes", "00_gpu_basics"][0] < wanted[
        "mistakes", "00_gpu_basics"][1], "the class must have full, partial and zero points"


def test_the_report_names_each_students_diagnosis_per_exercise(graded):
    course, _ = graded
    rows = _csv(course / "exercises.csv")
    found = {(r["student"], r["exercise"]): (r["diagnosis"], float(r["points"])) for r in rows}
    wanted = {(student, exercise): (diagnosis, 1.0 if diagnosis == "ok" else 0.0)
              for student, prefixes in CLASS.items() for prefix in prefixes
              for exercise, diagnosis in expected(student, prefix).items()}
    assert found == wanted


def test_the_summary_counts_each_exercises_mistakes(graded):
    _, output = graded
    assert "00_scale_add: 1 of 3 ok; mistakes, most frequent first: not_implemented 1, out_of_bounds 1" in output
    assert "03_causal_mask: 0 of 1 ok; mistakes, most frequent first: mask_includes_diagonal 1" in output


def test_the_released_copy_is_the_student_copy(graded):
    """What nbgrader's generate_assignment released is what make student and make lab write."""
    course, _ = graded
    released = nbformat.read(course / "release" / "00_gpu_basics" / "00_gpu_basics.ipynb", as_version=4)
    ours = student_copies.student_copy(_notebook("00"))
    assert [c.source for c in released.cells] == [c.source for c in ours.cells]
    assert [c.metadata.get("nbgrader") for c in released.cells] == [c.metadata.get("nbgrader") for c in ours.cells]


def test_validate_fails_an_unsolved_copy_naming_its_exercises_and_passes_a_solved_one(tmp_path):
    (tmp_path / "unsolved").mkdir()
    (tmp_path / "solved").mkdir()
    nbformat.write(student_copies.student_copy(_notebook("00")), tmp_path / "unsolved" / "00_gpu_basics.ipynb")
    nbformat.write(student_copies.source_notebook(_notebook("00")), tmp_path / "solved" / "00_gpu_basics.ipynb")
    # From the course's folder, as the Validate button runs it under make lab: with nbgrader_config.py.
    done = subprocess.run([sys.executable, "-m", "nbgrader", "validate", str(tmp_path / "unsolved" / "00_gpu_basics.ipynb"),
                           str(tmp_path / "solved" / "00_gpu_basics.ipynb")], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    unsolved = done.stdout.split("Success!")[0]                 # the first notebook's report
    exercises = expected("blank", "00")
    assert f"VALIDATION FAILED ON {len(exercises)} CELL(S)" in unsolved, done.stdout[-2000:]
    for exercise in exercises:
        assert f"{exercise}: 0 of 1 point, verdict not_implemented" in unsolved
    assert done.stdout.rstrip().endswith("Success! Your notebook passes all the tests."), done.stdout[-2000:]


def test_an_exercise_without_its_check_cell_is_named():
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION"),
        nbformat.v4.new_code_cell("print(f())")])
    with pytest.raises(ValueError, match=r"^99_demo.ipynb: the solution in cell 0 has no check cell after it"):
        student_copies.source_notebook(notebook, "99_demo.ipynb")


def test_the_metadata_comes_from_the_markers_and_a_bare_check_keeps_its_verdict():
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_markdown_cell("An exercise."),
        nbformat.v4.new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION"),
        nbformat.v4.new_code_cell('check("99_demo", f)', metadata={"tags": ["nbval-check-output"]})])
    source = student_copies.source_notebook(notebook, "99_demo.ipynb")
    answer, test = source.cells[1], source.cells[2]
    assert answer.metadata.nbgrader == {"grade": False, "solution": True, "locked": False, "task": False,
                                        "grade_id": "99_demo_answer", "schema_version": 3}
    assert test.metadata.nbgrader == {"grade": True, "solution": False, "locked": True, "task": False,
                                      "points": 1, "grade_id": "99_demo", "schema_version": 3}
    assert test.source.startswith('_verdict = check("99_demo", f)\n')
    assert 'if not _verdict.passed:\n    print(f"99_demo: 0 of 1 point, verdict {_verdict.diagnosis}", ' \
           "file=sys.stderr)" in test.source
    assert "nbgrader" not in notebook.cells[1].metadata, "the notebook itself was changed"


def test_make_grade_runs_the_grading_script(tmp_path):
    planned = subprocess.run(["make", "-n", "-C", str(ROOT), "grade", "NB=00 03", "SUBMITTED=subs",
                              f"VENV={tmp_path / 'venv'}"], capture_output=True, text=True, timeout=60)
    assert planned.returncode == 0, planned.stderr
    assert "scripts/grade.py grade 00 03 --submitted subs" in planned.stdout


@pytest.mark.parametrize("arguments, says", [
    (["grade", "00"], "grade grade: no submission of 00_gpu_basics in {course}/submitted (collect them, or give "
                      "--submitted DIR laid out as STUDENT/ASSIGNMENT/NOTEBOOK.ipynb)"),
    (["grade", "00", "--submitted", "{course}"], "grade grade: --submitted {course} holds no STUDENT/ASSIGNMENT "
                                                 "folder for 00_gpu_basics"),
    (["grade", "42"], "grade grade: no notebook is numbered '42'; the notebooks are {numbers}"),
])
def test_a_grading_mistake_is_named_in_one_line(tmp_path, arguments, says):
    grade = _script("grade")
    course = tmp_path / "course"
    course.mkdir()
    with pytest.raises(SystemExit) as stopped:
        grade.main([a.format(course=course) for a in arguments] + ["--course", str(course)])
    numbers = [p.name.split("_", 1)[0] for p in student_copies.course_notebooks()]
    assert str(stopped.value) == says.format(course=course, numbers=numbers)
