"""Grading a class that can be trusted (scripts/grade.py: make release-assignment, collect, grade,
feedback), with a made-up class on a made-up notebook of two of notebook 00's exercises
(00_scale_add, a kernel, and 00_warp_divergence, a NumPy function), small so that grading a class of
thirteen stays cheap. Notebook 00 itself is graded end to end on the hub (tests/test_jupyterhub.py).

The class: released with a due date and hidden tests, fetched and submitted through nbgrader's
exchange (one student by e-mail, as files), collected, graded, one student resubmits and the next
`grade` regrades that one alone, feedback generated, released and fetched. Its students: perfect,
blank, each tampering trick (stderr swallowed, `check` redefined, a check cell deleted or edited,
points edited, the library reached by getattr with a computed name), a right answer whose check
raises a warning, a kernel that never ends, an answer tuned to the visible check's data, a
resubmission, a late e-mailed folder. The made-up notebook gives 00_scale_add a budget of 5 s of
CPU instead of 30, so the hang costs the test seconds; the engine's budget is the same code.
"""

import csv
import datetime
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from numba import cuda

from attention_lib.checks import check

ROOT = Path(__file__).resolve().parent.parent
COURSE_ID = "attention-course"
ASSIGNMENT = "90_tiny"
NOTEBOOK = f"{ASSIGNMENT}.ipynb"
HIDDEN_SEED = 7              # the hidden cases' random data: other alphas than the visible check's


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


student_copies = _script("student_copies")
integrity = _script("integrity")
grade_script = _script("grade")

SETUP = '''import attention_lib                  # first: it decides GPU or simulator before Numba's CUDA loads
import numpy as np
from numba import cuda

from attention_lib.checks import check, hint, reveal
from attention_lib.checks.engine import EXERCISES
EXERCISES["00_scale_add"].seconds = 5   # this made-up course's budget: a loop that never ends stops sooner'''
SCALE_ADD = '''@cuda.jit
def scale_add_kernel(alpha, x, y, out):
    """out[i] = alpha * x[i] + y[i]; x, y, out: (n,) float32; one thread per element."""
    ### BEGIN SOLUTION
{body}
    ### END SOLUTION'''
SCALE_ADD_BODY = """    i = cuda.grid(1)
    if i < out.shape[0]:
        out[i] = alpha * x[i] + y[i]"""
WARPS = '''def divergent_warps(rows, cols, block):
    """Which warps of the launch covering (rows, cols) with block (bx, by) split at the bounds guard;
    (blocks along y, blocks along x, warps per block) bool."""
    ### BEGIN SOLUTION
{body}
    ### END SOLUTION'''
WARPS_BODY = """    bx, by = block
    blocks_x, blocks_y = -(-cols // bx), -(-rows // by)
    lanes = np.arange(bx * by).reshape(-1, 32)            # (warps, 32) thread ids, x fastest
    split = np.zeros((blocks_y, blocks_x, len(lanes)), bool)
    for yb in range(blocks_y):
        for xb in range(blocks_x):
            inside = (yb * by + lanes // bx < rows) & (xb * bx + lanes % bx < cols)
            split[yb, xb] = inside.any(axis=1) & ~inside.all(axis=1)
    return split"""


def made_up_notebook():
    """A course notebook of two exercises, each with its check cell and its reveal cell."""
    tagged = {"tags": ["nbval-check-output"]}
    cell, code = nbformat.v4.new_markdown_cell, nbformat.v4.new_code_cell
    return nbformat.v4.new_notebook(cells=[
        cell("# A made-up notebook"), code(SETUP),
        cell("Write the kernel."), code(SCALE_ADD.format(body=SCALE_ADD_BODY)),
        code('check("00_scale_add", scale_add_kernel)', metadata=tagged), code('reveal("00_scale_add")'),
        cell("Which warps split?"), code(WARPS.format(body=WARPS_BODY)),
        code('check("00_warp_divergence", divergent_warps)', metadata=tagged), code('reveal("00_warp_divergence")'),
        cell("The end.")], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                    "language": "python"}})


# --- The class: what each student hands in, made from the copy they fetched --------------------

def _cell(notebook, grade_id):
    return next(c for c in notebook.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id)


def answered(notebook, scale_add=SCALE_ADD_BODY, warps=WARPS_BODY):
    """The fetched copy with its two answer cells written (bodies in the skeletons' places)."""
    _cell(notebook, "00_scale_add_answer").source = SCALE_ADD.format(body=scale_add)
    _cell(notebook, "00_warp_divergence_answer").source = WARPS.format(body=warps)
    return notebook


def swallow_stderr(notebook):
    answer = _cell(notebook, "00_scale_add_answer")
    answer.source = "import io, sys\nsys.stderr = io.StringIO()   # nbgrader scores a cell without stderr\n\n" + answer.source
    return notebook


def redefine_check(notebook):
    answer = _cell(notebook, "00_warp_divergence_answer")
    answer.source += "\n\n\ndef check(exercise_id, answer):\n    return None\n"
    return notebook


def delete_check_cell(notebook):
    notebook.cells.remove(_cell(notebook, "00_scale_add"))
    return notebook


def edit_check_cell(notebook):
    _cell(notebook, "00_scale_add").source = 'print("✔ 00_scale_add [ok]")'
    return notebook


def edit_points(notebook):
    _cell(notebook, "00_scale_add").metadata.nbgrader["points"] = 10
    return notebook


def reach_by_getattr(notebook):
    _cell(notebook, "00_scale_add_answer").source = (
        'from attention_lib.stages import basics\n\nscale_add_kernel = getattr(basics, "scale_add" + "_kernel")')
    return notebook


WARNING_BODY = WARPS_BODY.replace("    return split", """    import warnings
    from numba.core.errors import NumbaPerformanceWarning
    warnings.warn("Grid size 1 will likely result in GPU under-utilization", NumbaPerformanceWarning)
    return split""")
HANG_BODY = """    i = cuda.grid(1)
    while i < out.shape[0]:                   # a grid-stride loop that never strides
        out[i] = alpha * x[i] + y[i]"""


def visible_alphas():
    """The alphas the visible check of 00_scale_add draws, recorded by a kernel run on the simulator."""
    seen = set()

    @cuda.jit
    def recorder(alpha, x, y, out):
        i = cuda.grid(1)
        if i == 0:
            seen.add(float(alpha))
        if i < out.shape[0]:
            out[i] = alpha * x[i] + y[i]
    check("00_scale_add", recorder, verbose=False)
    return sorted(seen)


def tuned(notebook):
    """Right only for the alphas the visible check draws: an answer tuned to the check's data."""
    known = " or ".join(f"alpha == np.float32({a!r})" for a in visible_alphas())
    body = f"""    i = cuda.grid(1)
    if i < out.shape[0]:
        if {known}:
            out[i] = alpha * x[i] + y[i]
        else:
            out[i] = x[i] + y[i]"""
    return answered(notebook, scale_add=body)

# student: (what they hand in, from the fetched copy; how)
CLASS = {
    "perfect": (answered, "exchange"),
    "blank": (lambda nb: nb, "exchange"),
    "stderr": (swallow_stderr, "exchange"),
    "redefined": (redefine_check, "exchange"),
    "deleted": (lambda nb: delete_check_cell(answered(nb)), "exchange"),
    "edited": (edit_check_cell, "exchange"),
    "points": (lambda nb: edit_points(answered(nb)), "exchange"),
    "getattr": (lambda nb: reach_by_getattr(answered(nb)), "exchange"),
    "warning": (lambda nb: answered(nb, warps=WARNING_BODY), "exchange"),
    "hang": (lambda nb: answered(nb, scale_add=HANG_BODY), "exchange"),
    "tuned": (tuned, "exchange"),
    "resubmitted": (lambda nb: nb, "exchange"),          # blank first; answered() after the first grading
    "emailed": (answered, "files"),
}
# (student, exercise): (points, diagnosis, hidden cases' diagnosis, flag) after the second grading.
OK = (1.0, "ok", "ok", "")
EXPECTED = {
    "perfect": [OK, OK],
    "blank": [(0.0, "not_implemented", "not_run", "")] * 2,
    "stderr": [(0.0, "not_implemented", "not_run", "tampered")] * 2,
    "redefined": [(0.0, "not_implemented", "not_run", "tampered")] * 2,
    "deleted": [(0.0, "ok", "ok", "tampered"), OK],
    "edited": [(0.0, "not_implemented", "not_run", "tampered"), (0.0, "not_implemented", "not_run", "")],
    "points": [(0.0, "ok", "ok", "tampered"), OK],
    "getattr": [(0.0, "calls_given_code", "not_run", "tampered"), (0.0, "ok", "ok", "tampered")],
    "warning": [OK, OK],
    "hang": [(0.0, "timeout", "not_run", ""), OK],
    "tuned": [(0.0, "ok", "wrong_values", ""), OK],
    "resubmitted": [OK, OK],
    "emailed": [OK, OK],
}
EXERCISES = ["00_scale_add", "00_warp_divergence"]
# The flag's reason each trick must be named with.
REASONS = {"stderr": "assigns sys.stderr", "redefined": "redefines check", "getattr": "uses getattr",
           "deleted": "its check cell was deleted", "edited": "its check cell was edited",
           "points": "its check cell's points were edited to 10"}


def exchange_step(kind, student, base):
    """A student's nbgrader exchange step (fetch_assignment, submit, fetch_feedback), run as the
    Assignments tab runs it: their own working folder and cache, the course's exchange."""
    from nbgrader.auth import Authenticator
    from nbgrader.coursedir import CourseDirectory
    from nbgrader.exchange.default import ExchangeFetchAssignment, ExchangeFetchFeedback, ExchangeSubmit
    from traitlets.config import Config

    config = Config()
    config.Exchange.root = str(base / "exchange")
    config.Exchange.cache = str(base / "caches" / student)
    config.Exchange.assignment_dir = str(base / "students" / student)
    config.CourseDirectory.course_id = COURSE_ID
    config.CourseDirectory.student_id = student
    config.CourseDirectory.assignment_id = ASSIGNMENT
    (base / "students" / student).mkdir(parents=True, exist_ok=True)
    app = {"fetch": ExchangeFetchAssignment, "submit": ExchangeSubmit, "feedback": ExchangeFetchFeedback}[kind]
    app(coursedir=CourseDirectory(config=config), authenticator=Authenticator(config=config), config=config).start()
    return base / "students" / student / ASSIGNMENT


def hand_in(student, base, make):
    """Fetch (once), write the student's notebook, submit."""
    folder = base / "students" / student / ASSIGNMENT
    if not folder.exists():
        exchange_step("fetch", student, base)
    fetched = nbformat.read(folder / NOTEBOOK, as_version=4)
    nbformat.write(make(fetched), folder / NOTEBOOK)
    exchange_step("submit", student, base)


def instructor(base, step, *options):
    """scripts/grade.py as make runs it; its output (it must succeed)."""
    env = dict(os.environ, ATTENTION_EXCHANGE=str(base / "exchange"))
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "grade.py"), step, "90", "--course",
                           str(base / "course"), "--notebooks-folder", str(base / "notebooks"), *options],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"grade.py {step}: {done.stderr[-3000:]}"
    return done.stdout


def utc(moment):
    return moment.strftime("%Y-%m-%d %H:%M:%S UTC")


@pytest.fixture(scope="module")
def term(tmp_path_factory):
    """The made-up class through a whole cycle; the course folder and each step's output."""
    base = tmp_path_factory.mktemp("class")
    (base / "notebooks").mkdir()
    (base / "exchange").mkdir()
    nbformat.write(made_up_notebook(), base / "notebooks" / NOTEBOOK)
    now = datetime.datetime.now(datetime.timezone.utc)
    outputs = {"release": instructor(base, "release", "--due", utc(now + datetime.timedelta(days=1)),
                                     "--hidden-seed", str(HIDDEN_SEED))}
    for student, (make, how) in CLASS.items():
        if how == "exchange":
            hand_in(student, base, make)
    # The e-mailed folder, saved two days after the due date: grading writes its timestamp.txt.
    emailed = base / "emailed" / "emailed" / ASSIGNMENT
    emailed.mkdir(parents=True)
    nbformat.write(answered(nbformat.read(base / "course" / "release" / ASSIGNMENT / NOTEBOOK, as_version=4)),
                   emailed / NOTEBOOK)
    late = (now + datetime.timedelta(days=2)).timestamp()
    os.utime(emailed / NOTEBOOK, (late, late))
    outputs["collect"] = instructor(base, "collect")
    started = time.monotonic()
    outputs["grade"] = instructor(base, "grade", "--submitted", str(base / "emailed"))
    outputs["grade seconds"] = time.monotonic() - started
    outputs["first rows"] = _csv(base / "course" / "exercises.csv")
    hand_in("resubmitted", base, answered)
    outputs["collect again"] = instructor(base, "collect")
    outputs["grade again"] = instructor(base, "grade", "--submitted", str(base / "emailed"))
    outputs["feedback"] = instructor(base, "feedback")
    for student, (_, how) in CLASS.items():
        if how == "exchange":
            exchange_step("feedback", student, base)
    return base, outputs


def _csv(path):
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def _rows(base):
    return {(r["student"], r["exercise"]): r for r in _csv(base / "course" / "exercises.csv")}


def test_every_student_gets_the_points_of_their_verdicts_and_each_trick_its_flag(term):
    base, _ = term
    rows = _rows(base)
    found = {student: [(float(rows[student, e]["points"]), rows[student, e]["diagnosis"], rows[student, e]["hidden"],
                        rows[student, e]["flag"]) for e in EXERCISES] for student in CLASS}
    assert found == EXPECTED
    for student, reason in REASONS.items():
        flagged = [rows[student, e]["reasons"] for e in EXERCISES if rows[student, e]["flag"] == "tampered"]
        assert flagged and all(reason in r for r in flagged[:1]), (student, flagged)


def test_nbgraders_own_score_is_overridden_where_it_disagrees(term):
    """nbgrader alone gives the stderr trick full points; the gradebook's manual score, the export
    and the feedback say the verdict's points."""
    from nbgrader.api import Gradebook

    base, _ = term
    rows = _rows(base)
    assert float(rows["stderr", "00_scale_add"]["nbgrader_points"]) == 1.0      # what the trick got from nbgrader
    with Gradebook(f"sqlite:///{base / 'course' / 'gradebook.db'}", COURSE_ID) as gradebook:
        for (student, exercise), row in rows.items():
            assert gradebook.find_grade(exercise, ASSIGNMENT, ASSIGNMENT, student).score == float(row["points"])
    totals = {r["student_id"]: float(r["raw_score"]) for r in _csv(base / "course" / "grades.csv")}
    assert totals == {s: sum(p for p, *_ in EXPECTED[s]) for s in CLASS}
    page = (base / "course" / "feedback" / "stderr" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
    assert re.search(r"Score:\s*0(\.0)?\s*/\s*2", page), "the feedback shows nbgrader's score, not the verdicts'"


def test_the_verdicts_are_signed_with_the_runs_key_and_a_forged_one_is_not(term):
    base, _ = term
    notebook = nbformat.read(base / "course" / "autograded" / "perfect" / ASSIGNMENT / NOTEBOOK, as_version=4)
    records = [o["data"][grade_script.record.MIME] for c in notebook.cells for o in c.get("outputs", [])
               if grade_script.record.MIME in o.get("data", {})]
    assert len(records) == 4 and all("signature" in r for r in records)        # visible and hidden, per exercise
    assert not any(grade_script.record.verify(r, "another run's key") for r in records)
    forged = dict(records[0], diagnosis="ok", passed=True, signature="0" * 64)
    cell = {"outputs": [{"data": {grade_script.record.MIME: forged}}]}
    assert grade_script.verdict_records(cell, records[0]["exercise_id"], "the key")[2] == [
        "its cell shows a verdict no check of this run made"]


def test_a_check_redefined_or_silenced_in_an_answer_cell_changes_nothing_the_grader_reads(term):
    base, _ = term
    for student in ("redefined", "stderr"):
        notebook = nbformat.read(base / "course" / "autograded" / student / ASSIGNMENT / NOTEBOOK, as_version=4)
        cell = _cell(notebook, "00_warp_divergence")
        assert cell.source.startswith(student_copies.GRADED_IMPORT)
        shown = [o["data"]["text/plain"] for o in cell.outputs if "text/plain" in o.get("data", {})]
        assert shown[0].startswith("✘ 00_warp_divergence [not_implemented]"), shown


def test_a_right_answer_whose_check_warns_scores_and_writes_nothing_to_stderr(term):
    base, _ = term
    notebook = nbformat.read(base / "course" / "autograded" / "warning" / ASSIGNMENT / NOTEBOOK, as_version=4)
    outputs = _cell(notebook, "00_warp_divergence").outputs
    assert not [o for o in outputs if o.get("name") == "stderr" or o.get("output_type") == "error"], outputs
    assert float(_rows(base)["warning", "00_warp_divergence"]["nbgrader_points"]) == 1.0


def test_a_kernel_that_never_ends_is_stopped_by_its_checks_budget_not_the_cell_timeout(term):
    base, outputs = term
    notebook = nbformat.read(base / "course" / "autograded" / "hang" / ASSIGNMENT / NOTEBOOK, as_version=4)
    cell = _cell(notebook, "00_scale_add")
    assert not [o for o in cell.outputs if o.get("output_type") == "error"], "nbgrader's cell timeout fired"
    assert "[timeout]: at n = 1" in cell.outputs[0]["data"]["text/plain"]
    seconds = json.loads((base / "course" / "verdicts" / "hang" / f"{ASSIGNMENT}.json").read_text())["seconds"]
    place = sorted(CLASS).index("hang") + 1
    assert f"[{place:>2}/13] {ASSIGNMENT} hang: 1 of 2 points, graded in {seconds:.1f} s" in outputs["grade"]


def test_hidden_cases_catch_an_answer_tuned_to_the_visible_checks_data(term):
    base, _ = term
    released = (base / "course" / "release" / ASSIGNMENT / NOTEBOOK).read_text()
    source = (base / "course" / "source" / ASSIGNMENT / NOTEBOOK).read_text()
    assert "hidden_check" not in released and f"seed={HIDDEN_SEED}" in source
    row = _rows(base)["tuned", "00_scale_add"]
    assert (row["diagnosis"], row["hidden"], row["points"]) == ("ok", "wrong_values", "0.0")


def test_the_graded_copy_leaves_out_the_reveal_cells(term):
    base, _ = term
    released = nbformat.read(base / "course" / "release" / ASSIGNMENT / NOTEBOOK, as_version=4)
    assert not any("reveal(" in c.source for c in released.cells if c.cell_type == "code")
    assert len(released.cells) == len(made_up_notebook().cells) - 2


def test_grading_prints_a_line_per_submission_with_nbgraders_warnings(term):
    base, outputs = term
    lines = re.findall(rf"^\[\s*\d+/13\] {ASSIGNMENT} (\w+): (.*)$", outputs["grade"], re.M)
    assert [student for student, _ in lines] == sorted(CLASS)
    assert all("graded in" in what for _, what in lines)
    for note in ("Attribute 'points' for cell 00_scale_add has changed! (should be: 1.0, got: 10.0)",
                 "Missing grade cell 00_scale_add encountered, adding to notebook",
                 "Attribute 'checksum' for cell 00_scale_add has changed!", "seconds late"):
        assert re.search(rf"^    nbgrader: .*{re.escape(note)}", outputs["grade"], re.M), note
    rows = _rows(base)
    assert "seconds late" in rows["emailed", "00_scale_add"]["warnings"]
    assert "got: 10.0" in rows["points", "00_scale_add"]["warnings"]
    assert "checksum" in rows["edited", "00_scale_add"]["warnings"]
    assert not any("checksum" in r["warnings"] for (s, _), r in rows.items() if s != "edited"), \
        "a check cell with hidden tests was reported changed"


def test_a_resubmission_is_regraded_without_force_and_nothing_else(term):
    base, outputs = term
    before = {(r["student"], r["exercise"]): r["points"] for r in outputs["first rows"]}
    assert before["resubmitted", "00_scale_add"] == "0.0"
    regraded = [line for line in outputs["grade again"].splitlines() if "graded in" in line]
    assert len(regraded) == 1 and f"{ASSIGNMENT} resubmitted: 2 of 2 points" in regraded[0], outputs["grade again"]
    assert outputs["grade again"].count(": unchanged, ") == len(CLASS) - 1


def test_a_folder_submission_gets_a_timestamp_and_its_feedback(term):
    base, outputs = term
    stamp = (base / "course" / "submitted" / "emailed" / ASSIGNMENT / "timestamp.txt").read_text()
    saved = datetime.datetime.fromtimestamp((base / "emailed" / "emailed" / ASSIGNMENT / NOTEBOOK).stat().st_mtime,
                                            datetime.timezone.utc)
    assert stamp == saved.strftime(grade_script.TIMESTAMP)
    page = base / "course" / "feedback" / "emailed" / ASSIGNMENT / f"{ASSIGNMENT}.html"
    assert f"    {page}: submitted as files, send it" in outputs["feedback"]


def test_feedback_reaches_every_student_through_the_exchange(term):
    base, outputs = term
    assert f"feedback on {ASSIGNMENT}: {len(CLASS)} page(s)" in outputs["feedback"]
    for student, (_, how) in CLASS.items():
        if how == "exchange":
            pages = list((base / "students" / student / ASSIGNMENT / "feedback").glob(f"*/{ASSIGNMENT}.html"))
            assert pages, f"{student} fetched no feedback"
            assert "00_scale_add" in max(pages).read_text()


def test_a_copy_of_the_solution_is_flagged_not_zeroed(term):
    base, _ = term
    rows = _rows(base)
    assert rows["perfect", "00_scale_add"]["same_as_solution"] == "yes" and rows["perfect", "00_scale_add"]["points"] == "1.0"
    assert rows["tuned", "00_scale_add"]["same_as_solution"] == ""


# --- Without a class: the pieces ------------------------------------------------------------------

def test_no_solution_of_the_course_looks_like_tampering():
    for path in student_copies.course_notebooks():
        notebook = nbformat.read(path, as_version=4)
        for exercise in student_copies.exercises(notebook):
            assert integrity.findings(notebook.cells[exercise.answer_cell].source) == [], exercise.exercise_id


@pytest.mark.parametrize("source, finding", [
    ("import io, sys\nsys.stderr = io.StringIO()", "assigns sys.stderr"),
    ("from contextlib import redirect_stderr", "imports redirect_stderr from contextlib"),
    ("def check(*args):\n    return None", "redefines check"),
    ("check = print", "redefines check"),
    ("from attention_lib.checks import engine", "imports engine from attention_lib.checks"),
    ("import attention_lib.checks.record", "imports attention_lib.checks.record"),
    ("attention_lib.checks.engine._judge = lambda *a: ('ok', '')", "assigns attention_lib.checks.engine._judge"),
    ("setattr(engine, '_judge', None)", "uses setattr"),
    ("f = getattr(mask, 'tile_is' + '_masked')", "uses getattr"),
    ("import os\nkey = os.environ['ATTENTION_LIB_GRADING_KEY']", "reads os.environ"),
    ("text = open('/proc/self/environ').read()", "names '/proc/'"),
    ("!cat /proc/self/environ", "runs the magic or shell command '!'"),
    ("get_ipython().events.register('post_run_cell', print)", "uses get_ipython"),
    ("import sys\nsys.modules['x']", "reads sys.modules"),
    ("with open('../gradebook.db', 'w') as handle:\n    pass", "opens a file for writing"),
])
def test_each_way_into_the_checker_is_found(source, finding):
    assert finding in integrity.findings(source)


def test_ordinary_code_and_magics_are_not_findings():
    assert integrity.findings("%%time\nimport numpy as np\nout = np.zeros(3)\nevent.record()\nprint(open('a').read())") == []
    assert integrity.findings("from attention_lib.checks import check, hint\ncheck('00_scale_add', f)") == []


def test_a_copy_is_the_solution_but_for_names_comments_and_docstrings():
    solution = 'def f(x, y):\n    """Adds."""\n    total = x + y   # the sum\n    return total'
    assert integrity.same_as_solution("def g(a, b):\n    s = a + b\n    return s", solution)
    assert not integrity.same_as_solution("def g(a, b):\n    return a + b", solution)
    assert not integrity.same_as_solution("def g(a, b):\n    raise NotImplementedError()", solution)


def test_a_record_verifies_only_under_its_key_and_unchanged():
    record = grade_script.record
    key = "k" * 64
    record._key = key
    try:
        made = record.record("00_scale_add", "ok", True)
        hidden = record.record("00_scale_add", "ok", True, hidden=True)
    finally:
        record._key = None
    assert record.verify(made, key) and record.verify(hidden, key)
    assert not record.verify(made, "another key")
    assert not record.verify(dict(made, diagnosis="wrong_values"), key)
    assert not record.verify(dict(hidden, hidden=False), key)
    assert not record.verify({k: v for k, v in made.items() if k != "signature"}, key)
    assert record.record("00_scale_add", "ok", True) == {"exercise_id": "00_scale_add", "diagnosis": "ok", "passed": True}


def test_the_check_cell_imports_check_itself_and_hides_its_hidden_cases():
    cell = student_copies.graded_check_cell('check("00_scale_add", my_kernel)', "00_scale_add", hidden_seed=11)
    assert cell.splitlines() == [student_copies.GRADED_IMPORT, 'record.graded(check("00_scale_add", my_kernel))',
                                 "### BEGIN HIDDEN TESTS", "from attention_lib.checks import engine",
                                 'record.graded(record.hidden_check(engine, "00_scale_add", my_kernel, seed=11))',
                                 "### END HIDDEN TESTS"]
    copy = student_copies.student_copy(made_up_notebook(), graded=True)
    tests = [c.source for c in copy.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
    assert tests == [student_copies.GRADED_IMPORT + '\nrecord.graded(check("00_scale_add", scale_add_kernel))',
                     student_copies.GRADED_IMPORT + '\nrecord.graded(check("00_warp_divergence", divergent_warps))']


def test_graded_copies_of_the_course_leave_out_exactly_the_reveal_cells():
    for path in student_copies.course_notebooks():
        notebook = nbformat.read(path, as_version=4)
        graded, plain = (student_copies.student_copy(notebook, path.name, graded=g) for g in (True, False))
        reveals = [c for c in notebook.cells if student_copies.is_reveal_cell(c)]
        assert len(plain.cells) - len(graded.cells) == len(reveals)
        assert not any("reveal(" in c.source for c in graded.cells if c.cell_type == "code"), path.name


def test_validate_fails_an_unsolved_copy_naming_its_exercises_and_passes_a_solved_one(tmp_path):
    (tmp_path / "unsolved").mkdir()
    (tmp_path / "solved").mkdir()
    nbformat.write(student_copies.student_copy(made_up_notebook()), tmp_path / "unsolved" / NOTEBOOK)
    nbformat.write(student_copies.source_notebook(made_up_notebook()), tmp_path / "solved" / NOTEBOOK)
    # From the course's folder, as the Validate button runs it under make lab: with nbgrader_config.py.
    done = subprocess.run([sys.executable, "-m", "nbgrader", "validate", str(tmp_path / "unsolved" / NOTEBOOK),
                           str(tmp_path / "solved" / NOTEBOOK)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    unsolved = done.stdout.split("Success!")[0]                 # the first notebook's report
    assert "VALIDATION FAILED ON 2 CELL(S)" in unsolved, done.stdout[-2000:]
    for exercise in EXERCISES:
        assert f"{exercise}: 0 of 1 point, verdict not_implemented" in unsolved
    assert done.stdout.rstrip().endswith("Success! Your notebook passes all the tests."), done.stdout[-2000:]


def test_an_exercise_without_its_check_cell_is_named():
    notebook = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("def f():\n    ### BEGIN SOLUTION\n    return 1\n    ### END SOLUTION"),
        nbformat.v4.new_code_cell("print(f())")])
    with pytest.raises(ValueError, match=r"^99_demo.ipynb: the solution in cell 0 has no check cell after it"):
        student_copies.source_notebook(notebook, "99_demo.ipynb")


def test_the_metadata_comes_from_the_markers():
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
    assert "nbgrader" not in notebook.cells[1].metadata, "the notebook itself was changed"


@pytest.mark.parametrize("target, variables, planned", [
    ("grade", ["NB=00 03", "SUBMITTED=subs", "FORCE=1"],
     "ATTENTION_LIB_BACKEND=simulator {python} scripts/grade.py grade 00 03 --submitted subs --force"),
    ("release-assignment", ["NB=00", "DUE=2026-12-20 17:00 UTC"],
     'ATTENTION_LIB_BACKEND=simulator {python} scripts/grade.py release 00 --due "2026-12-20 17:00 UTC"'),
    ("collect", ["NB=00"], "ATTENTION_LIB_BACKEND=simulator {python} scripts/grade.py collect 00"),
    ("feedback", ["NB=03"], "ATTENTION_LIB_BACKEND=simulator {python} scripts/grade.py feedback 03"),
    ("student", ["GRADED=1"], "{python} scripts/student_copies.py --graded release"),
])
def test_make_runs_the_grading_steps(tmp_path, target, variables, planned):
    venv = tmp_path / "venv"
    done = subprocess.run(["make", "-n", "-C", str(ROOT), target, *variables, f"VENV={venv}"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert planned.format(python=venv / "bin" / "python") in done.stdout.splitlines()


def test_grading_forces_the_simulator_and_a_fresh_key_and_puts_the_environment_back(monkeypatch):
    monkeypatch.setenv("ATTENTION_LIB_BACKEND", "gpu")
    monkeypatch.delenv(grade_script.record.KEY_VARIABLE, raising=False)
    with grade_script.grading_environment() as first:
        assert os.environ["ATTENTION_LIB_BACKEND"] == "simulator"
        assert os.environ[grade_script.record.KEY_VARIABLE] == first
        with grade_script.grading_environment() as second:
            assert second != first
    assert os.environ["ATTENTION_LIB_BACKEND"] == "gpu" and grade_script.record.KEY_VARIABLE not in os.environ


@pytest.mark.parametrize("arguments, says", [
    (["grade", "00"], "grade grade: no submission of 00_gpu_basics in {course}/submitted (collect them, or give "
                      "--submitted DIR laid out as STUDENT/ASSIGNMENT/NOTEBOOK.ipynb)"),
    (["grade", "00", "--submitted", "{course}"], "grade grade: --submitted {course} holds no STUDENT/ASSIGNMENT "
                                                 "folder for 00_gpu_basics"),
    (["grade", "42"], "grade grade: no notebook is numbered '42'; the notebooks are {numbers}"),
])
def test_a_grading_mistake_is_named_in_one_line(tmp_path, arguments, says):
    course = tmp_path / "course"
    course.mkdir()
    with pytest.raises(SystemExit) as stopped:
        grade_script.main([a.format(course=course) for a in arguments] + ["--course", str(course)])
    numbers = [p.name.split("_", 1)[0] for p in student_copies.course_notebooks()]
    assert str(stopped.value) == says.format(course=course, numbers=numbers)


def test_a_due_date_nbgrader_cannot_read_is_named():
    with pytest.raises(ValueError, match=r"^--due must be a date and time such as '2026-12-20 17:00 UTC', got 'soon'$"):
        grade_script.parse_due("soon")


# --- The session plans --------------------------------------------------------------------------

SESSIONS = ROOT / "classroom" / "sessions"


def _known_codes():
    """Every diagnosis a check can give: the engine's (its docstring's list), each exercise's own
    and its limits' codes."""
    from attention_lib.checks import EXERCISES as registered, engine

    listed = re.findall(r"^- (``.*?``):", engine.__doc__, re.M)          # "- ``wrong_shape``, ``wrong_values``:"
    codes = {code for line in listed for code in re.findall(r"``(\w+)``", line)}
    for exercise in registered.values():
        codes |= set(exercise.diagnoses) | {getattr(limit, "code", None) for limit in exercise.limits}
    return codes - {None}


@pytest.mark.parametrize("notebook", student_copies.course_notebooks(), ids=lambda p: p.stem)
def test_each_notebook_has_a_session_plan_naming_its_exercises_and_their_mistakes(notebook):
    from attention_lib.checks import EXERCISES as registered

    plan = (SESSIONS / f"{notebook.stem}.md").read_text()
    number = notebook.name.split("_", 1)[0]
    ids = {e.exercise_id for e in student_copies.exercises(nbformat.read(notebook, as_version=4))}
    ids |= {i for i in registered if i.split("_", 1)[0] == number}
    missing = [i for i in sorted(ids) if f"`{i}`" not in plan]
    assert not missing, f"classroom/sessions/{notebook.stem}.md does not name {missing}"
    named = set(re.findall(r"`(\d\dx?_[a-z0-9_]+)`", plan))
    unknown = named - set(registered) - {p.stem for p in student_copies.course_notebooks()} - {
        n.split("_", 1)[0] for n in named}
    assert not unknown, f"classroom/sessions/{notebook.stem}.md names exercises no check knows: {sorted(unknown)}"
    mistakes = plan.split("**Usual mistakes.**", 1)[1] if "**Usual mistakes.**" in plan else ""
    codes = set(re.findall(r"`([a-z][a-z0-9_]+)`", mistakes)) - named
    assert not codes - _known_codes(), f"{notebook.stem}'s plan names codes no check gives: {sorted(codes - _known_codes())}"
    assert ids and mistakes or not ids, f"{notebook.stem}'s plan lists no usual mistakes"


def test_every_plan_is_a_notebooks():
    stems = {p.stem for p in student_copies.course_notebooks()}
    assert {p.stem for p in SESSIONS.glob("*.md")} - {"README"} == stems


@pytest.mark.parametrize("penalty", [None, "zero"])
def test_the_course_config_limits_a_cell_restores_deleted_checks_and_takes_the_late_penalty(monkeypatch, penalty):
    from traitlets.config.loader import PyFileConfigLoader

    if penalty:
        monkeypatch.setenv("ATTENTION_LATE_PENALTY", penalty)
    else:
        monkeypatch.delenv("ATTENTION_LATE_PENALTY", raising=False)
    config = PyFileConfigLoader("nbgrader_config.py", path=str(ROOT)).load_config()
    assert config.Execute.timeout == 120 and config.OverwriteCells.add_missing_cells is True
    assert config.LateSubmissionPlugin.penalty_method == (penalty or "none")


def test_hidden_cases_run_only_after_a_pass_on_other_data_and_leave_the_seed_as_it_was(capsys):
    from attention_lib.checks import EXERCISES as registered, engine, mutation, record

    kernel = mutation.solution_copy(registered["00_scale_add"])
    usual = engine.SEED
    record._graded.pop("00_scale_add", None)
    assert record.hidden_check(engine, "00_scale_add", kernel, seed=HIDDEN_SEED).diagnosis == "not_run"
    record.graded(check("00_scale_add", kernel, verbose=False))
    hidden = record.hidden_check(engine, "00_scale_add", kernel, seed=HIDDEN_SEED)
    assert (hidden.passed, hidden.diagnosis, engine.SEED) == (True, "ok", usual)
    assert capsys.readouterr().out.splitlines()[-1] == "✔ 00_scale_add, hidden cases [ok]: right on other random data too"
