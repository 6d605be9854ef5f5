"""Grading that student code cannot reach (scripts/grade.py and scripts/grader/: make
release-assignment, collect, grade, feedback), with a made-up class on a made-up notebook of two
exercises (00_scale_add, a kernel, and the warps of a 2-D launch, a NumPy function), small so that
grading a class of thirty-three stays cheap. Notebook 00 itself is graded end to end on the hub
(tests/test_jupyterhub.py); the sandbox alone is tried in tests/test_grading_sandbox.py.

The class: released with a due date and hidden tests, fetched and submitted through nbgrader's
exchange (one student by e-mail, as files), collected, graded, one student resubmits and the next
`grade` regrades that one alone, feedback generated, released and fetched. Its students: perfect,
blank, a student for each trick (the checker's classes, its record module or NumPy patched from an
answer cell, a forged record before an exception, the key read from /proc, code hidden through
print.__self__, __builtins__, operator.attrgetter, runpy or io.open, the library's solution as a
default argument, a .py file submitted beside the notebook, a startup file planted in HOME, a
daemon, os._exit, a check cell duplicated, deleted or edited, points edited or set to text, a
sleeping answer, a file that is not JSON), honest students with magics, scratch cells, docstrings,
an unusual style and an input guard, a right answer whose check warns, a kernel that never ends, an
answer tuned to the visible check's data, a resubmission, a late e-mailed folder. Each trick gets
exactly what its honest part earns and its flag; the honest ones full points and no flag. The
made-up notebook gives 00_scale_add a budget of 5 s of CPU instead of 30, so the hang costs the
test seconds; the engine's budget is the same code.
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

from attention_lib.checks import EXERCISES as EXERCISES_REGISTERED, check, engine

ROOT = Path(__file__).resolve().parent.parent
COURSE_ID = "attention-course"
ASSIGNMENT = "90_tiny"
NOTEBOOK = f"{ASSIGNMENT}.ipynb"
HIDDEN_SEED = 7              # the hidden cases' random data: other alphas than the visible check's
# The warps exercise, under the name the checks register it by (notebook 00's or deep dive 00x's).
WARP = next(e for e in ("00x_warp_divergence", "00_warp_divergence") if e in EXERCISES_REGISTERED)


def _script(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


student_copies = _script("student_copies")
integrity = _script("integrity")
grade_script = _script("grade")
allowlist, rebuild = grade_script.rebuild.allowlist, grade_script.rebuild

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
        code(f'check("{WARP}", divergent_warps)', metadata=tagged), code(f'reveal("{WARP}")'),
        cell("The end.")], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                    "language": "python"}})


# --- The class: what each student hands in, made from the copy they fetched --------------------

def _cell(notebook, grade_id):
    return next(c for c in notebook.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade_id") == grade_id)


def answered(notebook, scale_add=SCALE_ADD_BODY, warps=WARPS_BODY):
    """The fetched copy with its two answer cells written (bodies in the skeletons' places)."""
    _cell(notebook, "00_scale_add_answer").source = SCALE_ADD.format(body=scale_add)
    _cell(notebook, f"{WARP}_answer").source = WARPS.format(body=warps)
    return notebook


def _answer(notebook, exercise, source):
    _cell(notebook, f"{exercise}_answer").source = source
    return notebook


def _scratch(notebook, *sources):
    """Code cells of the student's own before the last cell (scratch work: never run)."""
    notebook.cells[-1:-1] = [nbformat.v4.new_code_cell(text) for text in sources]
    return notebook


def swallow_stderr(notebook):
    answer = _cell(notebook, "00_scale_add_answer")
    answer.source = "import io, sys\nsys.stderr = io.StringIO()   # nbgrader scores a cell without stderr\n\n" + answer.source
    return notebook


def redefine_check(notebook):
    answer = _cell(notebook, f"{WARP}_answer")
    answer.source += "\n\n\ndef check(exercise_id, answer):\n    return None\n"
    return notebook


def delete_check_cell(notebook):
    notebook.cells.remove(_cell(notebook, "00_scale_add"))
    return notebook


def edit_check_cell(notebook):
    _cell(notebook, "00_scale_add").source = 'print("✔ 00_scale_add [ok]")'
    return notebook


def edit_points(notebook, points=10):
    _cell(notebook, "00_scale_add").metadata.nbgrader["points"] = points
    return notebook


def duplicate_check_cell(notebook):
    cell = _cell(notebook, "00_scale_add")
    twin = nbformat.from_dict(json.loads(json.dumps(cell)))
    twin["id"] = "twin-of-the-check"
    notebook.cells.insert(notebook.cells.index(cell), twin)
    return notebook


def reach_by_getattr(notebook):
    _cell(notebook, "00_scale_add_answer").source = (
        'from attention_lib.stages import basics\n\nscale_add_kernel = getattr(basics, "scale_add" + "_kernel")')
    return notebook


STUB = SCALE_ADD.format(body="    raise NotImplementedError()")
WRONG = SCALE_ADD.format(body="    pass")
FORGED = """    from IPython.display import display
    display({"application/vnd.attention-lib.verdict+json": {"exercise_id": "00_scale_add", "diagnosis": "ok",
             "passed": True}}, raw=True)
    raise SystemExit("the real check stops here")"""
PROC_KEY = """    key = [v for v in open("/proc/self/environ").read().split("\\0") if "KEY" in v]
    print(key)"""
STARTUP = ('import attention_lib.checks.engine as e\\n'
           'e._judge = lambda *a, **k: (\\"ok\\", \\"\\")')
# A 00_scale_add answer that tries a trick (blank or wrong beside it), by student: the check of the
# warps, a NumPy function, is their honest part.
TRICKS = {
    "patch_result": STUB + '\n\n\ntype(check("00_scale_add", scale_add_kernel)).__post_init__ = (\n'
                           '    lambda self: setattr(self, "passed", True))\n',
    "patch_record": STUB + '\n\n\nrecord.record = lambda e, d, p, hidden=False: {"exercise_id": e, "diagnosis": "ok",'
                           ' "passed": True}\n',
    "patch_numpy": WRONG + "\n\n\nnp.allclose = lambda *a, **k: True\nnp.array_equal = lambda *a, **k: True\n",
    "forged": SCALE_ADD.format(body=FORGED),
    "proc_key": SCALE_ADD.format(body=PROC_KEY),
    "print_self": STUB + '\n\n\nprint.__self__.exec(bytes.fromhex("7072696e74283129").decode())\n',
    "builtins": STUB + '\n\n\n__builtins__["exec"]("import attention_lib.checks.engine as e; e._still_a_stub = None")\n',
    "attrgetter": 'import operator\n\n' + STUB + '\n\n\nrecorder = operator.attrgetter("__glo" + "bals__")(check)["record"]\n',
    "runpy": 'import runpy\n\nfrom attention_lib.stages import basics\n\n'
             'scale_add_kernel = runpy.run_path(basics.__file__)["scale_add_kernel"]\n',
    "io_open": 'import io\n\nwith io.open("my_answer.py", "w") as handle:\n'
               '    handle.write("from attention_lib.stages.basics import scale_add_kernel")\n\n'
               'from my_answer import scale_add_kernel\n',
    "default_solution": 'from attention_lib.stages import basics\n\n\n'
                        'def scale_add_kernel(alpha, x, y, out, solution=basics.scale_add_kernel):\n'
                        '    return solution(alpha, x, y, out)\n',
    "py_beside": "from helper import scale_add_kernel\n",
    "home_startup": 'import os\n\n' + STUB + '\n\n\nfolder = os.path.expanduser("~/.ipython/profile_default/startup")\n'
                    'os.makedirs(folder, exist_ok=True)\n'
                    f'open(os.path.join(folder, "00.py"), "w").write("{STARTUP}")\n',
    "daemon": 'import os\n\n' + STUB + '\n\n\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n'
              '        import time\n        time.sleep(20)\n        open("exercises.csv", "a").write("daemon,1.0\\n")\n'
              '    os._exit(0)\n',
    "os_exit": 'import os\n\n' + STUB + '\n\n\nos._exit(1)\n',
    "sleeping": 'import time\n\n' + SCALE_ADD.format(body="    time.sleep(200)"),
}
# Each trick's flag reason names the construct (and its line).
TRICK_REASONS = {
    "patch_result": "__post_init__", "patch_record": "reads record", "patch_numpy": "assigns np.allclose",
    "forged": "an import inside a function", "proc_key": "calls the built-in open", "print_self": "__self__",
    "builtins": "__builtins__", "attrgetter": "imports operator", "runpy": "imports runpy", "io_open": "imports io",
    "default_solution": "a default argument that is not a constant", "py_beside": "imports from helper",
    "home_startup": "imports os", "daemon": "imports os", "os_exit": "imports os", "sleeping": "imports time",
}
# The .py file py_beside submits beside the notebook.
HELPER = "from attention_lib.stages.basics import scale_add_kernel  # the library's own\n"


def trick(name):
    """The student's notebook: the warps right (their honest part), 00_scale_add's answer a trick."""
    return lambda notebook: _answer(answered(notebook), "00_scale_add", TRICKS[name])


def scratch_work(notebook):
    """Honest work with a scratch cell that keeps notes in a file under a name the checker has."""
    return _scratch(answered(notebook), "record = []\nwith open('my_notes.txt', 'w') as notes:\n"
                                        "    notes.write('warps of 32 threads')\nrecord.append(1)")


def magics(notebook):
    return _scratch(answered(notebook), "%load_ext autoreload\n%autoreload 2", "!nvidia-smi",
                    "%%capture\nprint(divergent_warps(40, 40, (32, 8)).sum())", "%time divergent_warps(9, 9, (8, 8))")


DOCSTRING_BODY = '    """Reads the launch environment (rows, cols, block) and nothing else."""\n' + WARPS_BODY
STYLE_WARPS = '''WARP_LANES = 32


def split_of(inside):
    """Which rows of (warps, lanes) hold threads on both sides of the guard."""
    return np.array([row.any() and not row.all() for row in inside])


def divergent_warps(rows, cols, block):
    """Which warps split at the guard: (blocks along y, blocks along x, warps per block) bool."""
    bx, by = block
    threads = np.arange(bx * by)
    tx, ty = threads % bx, threads // bx
    grid_y, grid_x = (rows + by - 1) // by, (cols + bx - 1) // bx
    return np.array([[split_of(((yb * by + ty < rows) & (xb * bx + tx < cols)).reshape(-1, WARP_LANES))
                      for xb in range(grid_x)] for yb in range(grid_y)])'''
STYLE_SCALE_ADD = """    i = cuda.threadIdx.x + cuda.blockIdx.x * cuda.blockDim.x
    if i >= out.shape[0]:
        return
    out[i] = alpha * x[i] + y[i]"""
GUARD_BODY = """    if len(block) != 2:
        raise NotImplementedError("only 2-D blocks")
""" + WARPS_BODY
WARNING_BODY = WARPS_BODY.replace("    return split", """    np.float32(3e38) * np.float32(10)          # overflows: NumPy warns
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
    "points_text": (lambda nb: edit_points(answered(nb), "abc"), "exchange"),
    "duplicated": (lambda nb: duplicate_check_cell(answered(nb)), "exchange"),
    "getattr": (lambda nb: reach_by_getattr(answered(nb)), "exchange"),
    **{name: (trick(name), "exchange") for name in TRICKS},
    "not_json": (answered, "exchange"),                  # the file replaced by text that is not JSON
    "scratch": (scratch_work, "exchange"),
    "magics": (magics, "exchange"),
    "docstring": (lambda nb: answered(nb, warps=DOCSTRING_BODY), "exchange"),
    "style": (lambda nb: _answer(answered(nb, scale_add=STYLE_SCALE_ADD), WARP, STYLE_WARPS), "exchange"),
    "guard": (lambda nb: answered(nb, warps=GUARD_BODY), "exchange"),
    "warning": (lambda nb: answered(nb, warps=WARNING_BODY), "exchange"),
    "hang": (lambda nb: answered(nb, scale_add=HANG_BODY), "exchange"),
    "tuned": (tuned, "exchange"),
    "resubmitted": (lambda nb: nb, "exchange"),          # blank first; answered() after the first grading
    "emailed": (answered, "files"),
}
# (student, exercise): (points, diagnosis, hidden cases' diagnosis, flag) after the second grading.
OK = (1.0, "ok", "ok", "")
BLANK = (0.0, "not_implemented", "not_run", "")
NOT_GRADABLE = (0.0, "not_gradable", "not_run", "not_gradable")
NOT_GRADED = (0.0, "no_verdict", "not_run", "not_graded")
EXPECTED = {
    "perfect": [OK, OK],
    "blank": [BLANK, BLANK],
    "stderr": [NOT_GRADABLE, BLANK],
    "redefined": [BLANK, NOT_GRADABLE],
    "deleted": [(0.0, "ok", "ok", "tampered"), OK],
    "edited": [(0.0, "not_implemented", "not_run", "tampered"), BLANK],
    "points": [(0.0, "ok", "ok", "tampered"), OK],
    "points_text": [(0.0, "ok", "ok", "tampered"), OK],
    "duplicated": [(0.0, "ok", "ok", "tampered"), OK],
    "getattr": [NOT_GRADABLE, OK],
    **{name: [NOT_GRADABLE, OK] for name in TRICKS},
    "not_json": [NOT_GRADED, NOT_GRADED],
    "scratch": [OK, OK],
    "magics": [OK, OK],
    "docstring": [OK, OK],
    "style": [OK, OK],
    "guard": [OK, OK],
    "warning": [OK, OK],
    "hang": [(0.0, "timeout", "not_run", ""), OK],
    "tuned": [(0.0, "ok", "wrong_values", ""), OK],
    "resubmitted": [OK, OK],
    "emailed": [OK, OK],
}
EXERCISES = ["00_scale_add", WARP]
HONEST = ["perfect", "scratch", "magics", "docstring", "style", "guard", "warning", "emailed", "resubmitted"]
# The flag's reason each trick must be named with.
REASONS = {"stderr": "imports sys", "redefined": "defines check", "getattr": "calls the built-in getattr",
           "deleted": "its check cell was deleted", "edited": "its check cell was edited",
           "points": "its check cell's points were edited to 10", "points_text": "points were edited to 'abc'",
           "duplicated": "its cell 00_scale_add appears 2 times", "not_json": "the notebook is not valid JSON",
           **TRICK_REASONS}


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
    if student == "py_beside":
        (folder / "helper.py").write_text(HELPER)
    if student == "not_json":
        (folder / NOTEBOOK).write_text('{"cells": [ this is not JSON')
    exchange_step("submit", student, base)


def instructor(base, step, *options):
    """scripts/grade.py as make runs it; its output (it must succeed)."""
    env = dict(os.environ, ATTENTION_EXCHANGE=str(base / "exchange"))
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "grade.py"), step, "90", "--course",
                           str(base / "course"), "--notebooks-folder", str(base / "notebooks"), *options],
                          env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"grade.py {step}: {done.stderr[-3000:]}"
    return done.stdout


# The made-up course's wall-clock limits (a check cell: the hang's 5 s of CPU fits on a loaded
# machine; any other cell) and two sandboxes at a time, one a core.
LIMITS = ["--check-seconds", "60", "--cell-seconds", "30", "--jobs", "2"]


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
    outputs["grade"] = instructor(base, "grade", "--submitted", str(base / "emailed"), *LIMITS)
    outputs["grade seconds"] = time.monotonic() - started
    outputs["first rows"] = _csv(base / "course" / "exercises.csv")
    hand_in("resubmitted", base, answered)
    outputs["collect again"] = instructor(base, "collect")
    outputs["grade again"] = instructor(base, "grade", "--submitted", str(base / "emailed"), *LIMITS)
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


def test_every_student_gets_the_points_of_their_honest_work_and_each_trick_its_flag(term):
    base, _ = term
    rows = _rows(base)
    found = {student: [(float(rows[student, e]["points"]), rows[student, e]["diagnosis"], rows[student, e]["hidden"],
                        rows[student, e]["flag"]) for e in EXERCISES] for student in CLASS}
    assert found == EXPECTED
    for student, reason in REASONS.items():
        flagged = [rows[student, e]["reasons"] for e in EXERCISES if rows[student, e]["flag"]]
        assert flagged and reason in flagged[0], (student, flagged)


def test_an_answer_not_run_is_named_by_its_line_and_construct(term):
    base, _ = term
    rows = _rows(base)
    assert "line 9: reads record, which an answer may not use" in rows["patch_record", "00_scale_add"]["reasons"]
    assert "line 9: assigns np.allclose" in rows["patch_numpy", "00_scale_add"]["reasons"]
    assert "line 1: imports from helper, which an answer may not use" in rows["py_beside", "00_scale_add"]["reasons"]
    for student in TRICKS:
        assert re.search(r"its answer was not run: line \d+: ", rows[student, "00_scale_add"]["reasons"]), student


def test_honest_work_with_magics_scratch_cells_docstrings_a_style_and_a_guard_is_never_flagged(term):
    base, _ = term
    rows = _rows(base)
    for student in HONEST:
        assert [(rows[student, e]["points"], rows[student, e]["flag"], rows[student, e]["reasons"])
                for e in EXERCISES] == [("1.0", "", "")] * 2, student
    # The scan of the scratch cells is a report, not a flag.
    assert "runs the magic or shell command '!'" in rows["magics", WARP]["report"]
    assert "opens a file for writing" in rows["scratch", WARP]["report"]
    assert rows["docstring", WARP]["report"] == ""


def test_the_graded_notebook_is_the_courses_cells_and_the_answers_alone(term):
    """What ran for a student: the source's cells in order (check cells with their hidden tests),
    the answers as written where they parse, the released stub where not; no scratch cell."""
    base, _ = term
    source = nbformat.read(base / "course" / "source" / ASSIGNMENT / NOTEBOOK, as_version=4)
    for student in ("magics", "scratch", "py_beside", "duplicated", "deleted"):
        ran = nbformat.read(base / "course" / "autograded" / student / ASSIGNMENT / NOTEBOOK, as_version=4)
        assert [c.source for c in ran.cells if not c.get("metadata", {}).get("nbgrader", {}).get("solution")] == \
               [c.source for c in source.cells if not c.get("metadata", {}).get("nbgrader", {}).get("solution")], student
    ran = nbformat.read(base / "course" / "autograded" / "py_beside" / ASSIGNMENT / NOTEBOOK, as_version=4)
    released = nbformat.read(base / "course" / "release" / ASSIGNMENT / NOTEBOOK, as_version=4)
    assert _cell(ran, "00_scale_add_answer").source == _cell(released, "00_scale_add_answer").source
    assert _cell(ran, f"{WARP}_answer").source == WARPS.format(body=WARPS_BODY)


def test_nbgraders_own_score_is_overridden_where_it_disagrees(term):
    """The gradebook, the export and the feedback say the verdicts' points."""
    from nbgrader.api import Gradebook

    base, _ = term
    rows = _rows(base)
    assert float(rows["not_json", "00_scale_add"]["nbgrader_points"]) == 1.0     # an unexecuted cell, to nbgrader
    with Gradebook(f"sqlite:///{base / 'course' / 'gradebook.db'}", COURSE_ID) as gradebook:
        for (student, exercise), row in rows.items():
            assert gradebook.find_grade(exercise, ASSIGNMENT, ASSIGNMENT, student).score == float(row["points"])
    totals = {r["student_id"]: float(r["raw_score"]) for r in _csv(base / "course" / "grades.csv")}
    assert totals == {s: sum(p for p, *_ in EXPECTED[s]) for s in CLASS}
    page = (base / "course" / "feedback" / "not_json" / ASSIGNMENT / f"{ASSIGNMENT}.html").read_text()
    assert re.search(r"Score:\s*0(\.0)?\s*/\s*2", page), "the feedback shows nbgrader's score, not the verdicts'"


def test_the_verdicts_are_the_course_checks_one_per_check_cell(term):
    base, _ = term
    notebook = nbformat.read(base / "course" / "autograded" / "perfect" / ASSIGNMENT / NOTEBOOK, as_version=4)
    records = [o["data"][grade_script.record.MIME] for c in notebook.cells for o in c.get("outputs", [])
               if grade_script.record.MIME in o.get("data", {})]
    assert sorted((r["exercise_id"], r.get("hidden", False), r["diagnosis"]) for r in records) == sorted(
        (e, hidden, "ok") for e in EXERCISES for hidden in (False, True))
    twice = {"outputs": [{"data": {grade_script.record.MIME: records[0]}}] * 2}
    assert grade_script.verdict_records(twice, records[0]["exercise_id"])[2] == ["its cell shows more than one verdict"]


def test_a_check_redefined_or_silenced_in_an_answer_cell_changes_nothing_the_grader_reads(term):
    base, _ = term
    for student in ("redefined", "stderr"):
        notebook = nbformat.read(base / "course" / "autograded" / student / ASSIGNMENT / NOTEBOOK, as_version=4)
        cell = _cell(notebook, WARP)
        assert cell.source.startswith(student_copies.GRADED_IMPORT)
        shown = [o["data"]["text/plain"] for o in cell.outputs if "text/plain" in o.get("data", {})]
        assert shown[0].startswith(f"✘ {WARP} [not_implemented]"), shown


def test_a_right_answer_whose_check_warns_scores_and_writes_nothing_to_stderr(term):
    base, _ = term
    notebook = nbformat.read(base / "course" / "autograded" / "warning" / ASSIGNMENT / NOTEBOOK, as_version=4)
    outputs = _cell(notebook, WARP).outputs
    assert not [o for o in outputs if o.get("name") == "stderr" or o.get("output_type") == "error"], outputs
    assert float(_rows(base)["warning", WARP]["nbgrader_points"]) == 1.0


def test_a_kernel_that_never_ends_is_stopped_by_its_checks_budget_not_the_wall_clock(term):
    base, outputs = term
    notebook = nbformat.read(base / "course" / "autograded" / "hang" / ASSIGNMENT / NOTEBOOK, as_version=4)
    cell = _cell(notebook, "00_scale_add")
    assert "grading_timeout" not in cell.metadata and not [o for o in cell.outputs if o.get("output_type") == "error"]
    assert "[timeout]: at n = 1" in cell.outputs[0]["data"]["text/plain"]
    seconds = json.loads((base / "course" / "verdicts" / "hang" / f"{ASSIGNMENT}.json").read_text())["seconds"]
    place = sorted(CLASS).index("hang") + 1
    assert f"[{place:>2}/{len(CLASS)}] {ASSIGNMENT} hang: 1 of 2 points, graded in {seconds:.1f} s" in outputs["grade"]


def test_no_student_stops_the_class_and_a_trick_costs_seconds(term):
    """Every student graded or flagged in one run, the ones after os._exit and not_json too; the
    sleeping answer is not run, so it costs what any submission costs."""
    base, outputs = term
    seconds = {s: json.loads((base / "course" / "verdicts" / s / f"{ASSIGNMENT}.json").read_text())["seconds"]
               for s in CLASS}
    assert seconds["sleeping"] < 60 and seconds["os_exit"] < 60, seconds
    assert len(_rows(base)) == 2 * len(CLASS)
    names = sorted(CLASS)
    assert names[names.index("os_exit") + 1] in ("patch_numpy", "patch_record", "patch_result", "perfect", "points")
    assert "daemon,1.0" not in (base / "course" / "exercises.csv").read_text()


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


def test_grading_prints_a_line_per_submission_with_its_flags_and_lateness(term):
    base, outputs = term
    lines = re.findall(rf"^\[\s*\d+/{len(CLASS)}\] {ASSIGNMENT} (\w+): (.*)$", outputs["grade"], re.M)
    assert [student for student, _ in lines] == sorted(CLASS)
    assert all("graded in" in what for _, what in lines)
    assert re.search(r"^    00_scale_add: tampered \(its check cell's points were edited to 10\)$", outputs["grade"], re.M)
    assert re.search(r"^    00_scale_add: not_gradable \(its answer was not run: line 1: imports os", outputs["grade"], re.M)
    assert re.search(r"^    nbgrader: .*seconds late", outputs["grade"], re.M)
    rows = _rows(base)
    assert "seconds late" in rows["emailed", "00_scale_add"]["warnings"]
    assert not any(r["warnings"] for (s, _), r in rows.items() if s != "emailed")


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


def test_every_solution_and_stub_of_the_course_parses_against_the_allowlist():
    """What a grading run would refuse of the course's own answers: nothing (the allowlist's floor)."""
    for path in student_copies.course_notebooks():
        source = student_copies.source_notebook(nbformat.read(path, as_version=4), path.name)
        released = student_copies.student_copy(nbformat.read(path, as_version=4), path.name, graded=True)
        built = rebuild.rebuild(source, released, source)
        assert built.not_gradable == {}, (path.name, built.not_gradable)
        built = rebuild.rebuild(source, released, released)
        assert built.not_gradable == {}, (path.name, built.not_gradable)


GIVEN = allowlist.given_names([SETUP, 'from attention_lib.checks import check, record\n'
                                      'record.graded(check("00_scale_add", scale_add_kernel))'])


@pytest.mark.parametrize("source, construct", [
    ("type(check('x', f)).__post_init__ = None", '"__post_init__" is an invalid attribute name'),
    ("record.record = print", "reads record, which an answer may not use"),
    ("np.allclose = lambda *a, **k: True", "assigns np.allclose"),
    ("def f():\n    np.linalg.norm = None", "assigns np.linalg.norm"),
    ("print.__self__.exec('1')", '"__self__" is an invalid attribute name'),
    ("x = __builtins__", '"__builtins__" is an invalid variable name'),
    ("import operator", "imports operator, which an answer may not use"),
    ("import runpy", "imports runpy"),
    ("import io", "imports io"),
    ("from attention_lib.checks import engine", "imports from attention_lib.checks"),
    ("from attention_lib.stages import basics\ndef f(a, g=basics.divergent_warps):\n    return g(a)",
     "a default argument that is not a constant"),
    ("def f():\n    import os\n    return os", "an import inside a function"),
    ("def f():\n    return open('/proc/self/environ').read()", "calls the built-in open"),
    ("def f():\n    return getattr(np, 'all' + 'close')", "calls the built-in getattr"),
    ("def f():\n    return vars(np)", "calls the built-in vars"),
    ("def f():\n    return eval('1')", "Eval calls are not allowed"),
    ("def f():\n    return attention_lib.checks.engine", "reads attention_lib, which an answer may not use"),
    ("def f():\n    return np.ctypeslib", "reads the attribute ctypeslib"),
    ("def f(x):\n    return x.ctypes.data", "reads the attribute ctypes"),
    ("def f():\n    m = np\n    return m", "uses the module np as a value"),
    ("def f():\n    global np\n    np = None", "a global statement"),
    ("class Patch:\n    pass", "a ClassDef statement at the cell's top level"),
    ("for i in range(3):\n    pass", "a For statement at the cell's top level"),
    ("EXERCISES['00_scale_add'].seconds = 1000", "assigns an attribute or item of a name"),
    ("check = print", "rebinds check"),
    ("@np.vectorize\ndef f(x):\n    return x", "decorates f with np.vectorize"),
    ("from helper import answer", "imports from helper"),
    ("def f():\n    return np.testing.assert_allclose", "reaches the module numpy.testing"),
    ("def f(a):\n    return np.memmap('/proc/self/mem', mode='r+', offset=0)", "reads the attribute memmap"),
    ("def f(a):\n    return np.lib.stride_tricks.as_strided(a, (10**9,))", "reads the attribute as_strided"),
    ("from attention_lib.stages import basics\n\n\ndef f():\n    basics.scale_add_kernel.targetoptions.clear()",
     "reads basics.scale_add_kernel.targetoptions: of a name the library gives, an answer reads no attribute"),
    ("from attention_lib.stages.basics import TRANSPOSE_BLOCK\nn = TRANSPOSE_BLOCK.count(1)",
     "reads TRANSPOSE_BLOCK.count: of a name the library gives"),
])
def test_the_allowlist_refuses_each_way_out_naming_its_line_and_construct(source, construct):
    problems = allowlist.parse(source, GIVEN).problems
    assert any(construct in what and line >= 1 for line, what in problems), problems


@pytest.mark.parametrize("source", [
    SCALE_ADD.format(body=SCALE_ADD_BODY), WARPS.format(body=WARPS_BODY), STYLE_WARPS,
    WARPS.format(body=GUARD_BODY), WARPS.format(body=DOCSTRING_BODY),
    "from attention_lib.stages import basics\n\n\ndef f(rows, cols):\n    return basics.grid_2d(rows, cols), basics.WARP_SIZE",
    "from numba import float32\nfrom attention_lib.stages.basics import WARP_SIZE\nHALF = WARP_SIZE // 2\n\n\n"
    "@cuda.jit(device=True)\ndef twice(v):\n    return v * float32(2)\n",
    "def f(a, rows=3, shape=(2, -1), name=None):\n    out = np.empty_like(a)\n    out[0] += 1\n    out.shape = shape\n"
    "    for _ in range(rows):\n        out = out.T\n    return [x for x in out if x.any()], f'{name}'\n",
])
def test_the_allowlist_takes_honest_answers_of_any_style(source):
    assert allowlist.parse(source, GIVEN).problems == []


def test_a_stub_is_a_function_that_raises_not_implemented_in_its_body_not_in_a_guard(tmp_path):
    """The check's own rule, which grading uses as it is (the rebuilt notebook holds no code of the
    grader's): a right answer with an input guard is judged by what it computes; the released stub
    is not_implemented."""
    module = tmp_path / "answers.py"
    module.write_text("import numpy as np\n\n\n" + WARPS.format(body=GUARD_BODY).replace("divergent_warps", "guarded")
                      + "\n\n\n" + WARPS.format(body="    # YOUR CODE HERE\n    raise NotImplementedError()"))
    spec = importlib.util.spec_from_file_location("answers", module)
    answers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(answers)
    assert engine._still_a_stub(answers.divergent_warps) is True
    assert engine._still_a_stub(answers.guarded) is False
    assert engine._still_a_stub((answers.guarded, answers.divergent_warps)) is True
    assert check("00x_warp_divergence", answers.guarded, verbose=False).passed


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


def test_ordinary_code_magics_and_docstrings_are_not_findings():
    assert integrity.findings("%%time\nimport numpy as np\nout = np.zeros(3)\nevent.record()\nprint(open('a').read())") == []
    assert integrity.findings("from attention_lib.checks import check, hint\ncheck('00_scale_add', f)") == []
    assert integrity.findings('def f():\n    """The environment of a launch: see /proc/ and attention_lib.checks."""\n'
                              '    # os.environ is not read here\n    return 1') == []


def test_a_copy_is_the_solution_but_for_names_comments_and_docstrings():
    solution = 'def f(x, y):\n    """Adds."""\n    total = x + y   # the sum\n    return total'
    assert integrity.same_as_solution("def g(a, b):\n    s = a + b\n    return s", solution)
    assert not integrity.same_as_solution("def g(a, b):\n    return a + b", solution)
    assert not integrity.same_as_solution("def g(a, b):\n    raise NotImplementedError()", solution)


def test_a_record_is_the_verdict_and_nothing_more():
    record = grade_script.record
    assert record.record("00_scale_add", "ok", True) == {"exercise_id": "00_scale_add", "diagnosis": "ok", "passed": True}
    assert record.record("00_scale_add", "ok", 1, hidden=True) == {"exercise_id": "00_scale_add", "diagnosis": "ok",
                                                                   "passed": True, "hidden": True}


def test_the_check_cell_imports_check_itself_and_hides_its_hidden_cases():
    cell = student_copies.graded_check_cell('check("00_scale_add", my_kernel)', "00_scale_add", hidden_seed=11)
    assert cell.splitlines() == [student_copies.GRADED_IMPORT, 'record.graded(check("00_scale_add", my_kernel))',
                                 "### BEGIN HIDDEN TESTS", "from attention_lib.checks import engine",
                                 'record.graded(record.hidden_check(engine, "00_scale_add", my_kernel, seed=11))',
                                 "### END HIDDEN TESTS"]
    copy = student_copies.student_copy(made_up_notebook(), graded=True)
    tests = [c.source for c in copy.cells if c.get("metadata", {}).get("nbgrader", {}).get("grade")]
    assert tests == [student_copies.GRADED_IMPORT + '\nrecord.graded(check("00_scale_add", scale_add_kernel))',
                     student_copies.GRADED_IMPORT + f'\nrecord.graded(check("{WARP}", divergent_warps))']


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
    """Every diagnosis a check can give: the engine's, each exercise's own and its limits' codes."""
    from attention_lib.checks import EXERCISES as registered, engine

    codes = set(engine.ENGINE_CODES)
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
