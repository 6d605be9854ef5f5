"""`make lab` serves a student's own copies of the notebooks, never the solutions: a working folder
built on the first run and never overwritten (scripts/lab.py, scripts/student_copies.py --keep),
one notebook started over on request (make fresh-copy), the notebooks with solutions one command
away (make solutions). JupyterLab is started here as make lab starts it (no browser, loopback, a
free port, its own process, stopped afterwards) and read through its contents API."""

import contextlib
import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
import requests

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "a-test-token"

spec = importlib.util.spec_from_file_location("student_copies", ROOT / "scripts" / "student_copies.py")
student_copies = importlib.util.module_from_spec(spec)
spec.loader.exec_module(student_copies)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def solution_lines(notebook):
    """{answer cell's grade_id: the lines between its solution markers that the given code around
    them does not also have (a bare `return` may be both)}."""
    found = {}
    for exercise in student_copies.exercises(notebook):
        before, rest = notebook.cells[exercise.answer_cell].source.split("### BEGIN SOLUTION", 1)
        inside, after = rest.split("### END SOLUTION", 1)
        given = {line.strip() for line in (before + after).splitlines()}
        found[f"{exercise.exercise_id}_answer"] = [line.strip() for line in inside.splitlines()
                                                   if line.strip() and line.strip() not in given]
    return found


@contextlib.contextmanager
def running_lab(folder, log_path):
    """JupyterLab as `make lab LAB_FLAGS=--no-browser` starts it, on the working folder `folder`,
    on loopback and a free port, in a process of its own, stopped afterwards. Yields (url, the
    command's first line)."""
    port = free_port()
    flags = ["--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
             f"--IdentityProvider.token={TOKEN}"] + (["--allow-root"] if os.getuid() == 0 else [])
    # JupyterLab's settings and open tabs of its own, not this machine user's (a keymap, say).
    lab_home = Path(log_path).parent / "jupyterlab-user"
    env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(lab_home / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(lab_home / "workspaces"))
    log = open(log_path, "w")
    process = subprocess.Popen([sys.executable, str(ROOT / "scripts" / "lab.py"), "--folder", str(folder), *flags],
                               stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, f"JupyterLab stopped: {Path(log_path).read_text()[-2000:]}"
            try:
                if requests.get(f"{url}/api/status", headers={"Authorization": f"token {TOKEN}"}, timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, "JupyterLab did not answer within 60 s"
            time.sleep(0.2)
        yield url, Path(log_path).read_text().splitlines()[0]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


@pytest.fixture
def lab(tmp_path):
    folder = tmp_path / "my-notebooks"
    with running_lab(folder, tmp_path / "lab.log") as (url, first_line):
        yield url, folder, first_line


def test_make_lab_serves_the_students_copies_and_no_solution(lab):
    url, folder, first_line = lab
    auth = {"Authorization": f"token {TOKEN}"}
    assert first_line.startswith(f"{folder}/: your copies of the notebooks ("), first_line
    listing = requests.get(f"{url}/api/contents", headers=auth, timeout=10).json()
    served = sorted(item["name"] for item in listing["content"] if item["type"] == "notebook")
    assert served == [p.name for p in student_copies.course_notebooks()]
    # Opening the lab opens notebook 00.
    assert requests.get(f"{url}/", headers=auth, allow_redirects=False, timeout=10).headers["Location"].startswith(
        "/lab/tree/00_gpu_basics.ipynb")

    for name in served:
        notebook = nbformat.from_dict(requests.get(f"{url}/api/contents/{name}", headers=auth,
                                                   timeout=30).json()["content"])
        original = nbformat.read(ROOT / "notebooks" / name, as_version=4)
        code = [c for c in notebook.cells if c.cell_type == "code"]
        assert not any("### BEGIN SOLUTION" in c.source or c.get("outputs") for c in code), f"{name}: not a student copy"
        answers = {c.metadata["nbgrader"]["grade_id"]: c.source for c in code
                   if c.metadata.get("nbgrader", {}).get("solution")}
        for grade_id, lines in solution_lines(original).items():
            assert "raise NotImplementedError()" in answers[grade_id], f"{name}: {grade_id} is not a stub"
            shown = [line for line in lines if line in {a.strip() for a in answers[grade_id].splitlines()}]
            assert not shown, f"{name}: {grade_id} shows the solution's lines {shown}"


def test_a_second_build_keeps_the_students_answers_and_adds_new_notebooks(tmp_path):
    folder = tmp_path / "my-notebooks"
    created, kept = student_copies.keep(folder)
    assert [p.name for p in created] == [p.name for p in student_copies.course_notebooks()] and not kept
    mine = folder / "00_gpu_basics.ipynb"
    notebook = nbformat.read(mine, as_version=4)
    answer = next(c for c in notebook.cells if "raise NotImplementedError()" in c.source)
    answer.source = answer.source.replace("raise NotImplementedError()", "pass  # my answer, in progress")
    nbformat.write(notebook, mine)
    (folder / "03_causal_mask.ipynb").unlink()          # as if notebook 03 came with a later update

    created, kept = student_copies.keep(folder)
    assert [p.name for p in created] == ["03_causal_mask.ipynb"]
    assert "pass  # my answer, in progress" in mine.read_text(), "make lab overwrote an answer"

    fresh, backup = student_copies.fresh(folder, "00")          # make fresh-copy NB=00
    assert fresh == mine and "my answer, in progress" not in mine.read_text()
    assert backup.parent == folder / "backups" and "pass  # my answer, in progress" in backup.read_text()


def test_fresh_copy_of_an_unknown_notebook_is_refused_in_one_line(tmp_path):
    with pytest.raises(SystemExit) as stopped:                  # what make fresh-copy NB=42 prints
        student_copies.main(["--fresh", "42", str(tmp_path)])
    assert str(stopped.value) == (f"student_copies: no notebook is numbered '42'; the notebooks are "
                                  f"{[p.name.split('_', 1)[0] for p in student_copies.course_notebooks()]}")
    assert not list(tmp_path.iterdir())


def _planned(target, *variables):
    done = subprocess.run(["make", "-n", "-C", str(ROOT), target, *variables, "VENV=/nonexistent-venv"],
                          capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout


def test_make_lab_solutions_and_fresh_copy_run_the_scripts():
    assert "scripts/lab.py --folder my-notebooks" in _planned("lab", "LAB_FLAGS=--no-browser")[1]
    assert "--no-browser" in _planned("lab", "LAB_FLAGS=--no-browser")[1]
    assert "scripts/lab.py --solutions" in _planned("solutions")[1]
    assert "scripts/student_copies.py --fresh 03 my-notebooks" in _planned("fresh-copy", "NB=03")[1]
    command = _lab_module().lab_command(ROOT / "notebooks", ["--no-browser"])
    assert f"--ServerApp.root_dir={ROOT / 'notebooks'}" in command and command[-1] == "--no-browser", command


def _lab_module():
    spec = importlib.util.spec_from_file_location("lab", ROOT / "scripts" / "lab.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_working_folder_and_the_course_directory_are_not_committed():
    done = subprocess.run(["git", "-C", str(ROOT), "check-ignore", "my-notebooks/00_gpu_basics.ipynb",
                           "grading/gradebook.db"], capture_output=True, text=True, timeout=30)
    assert done.stdout.split() == ["my-notebooks/00_gpu_basics.ipynb", "grading/gradebook.db"]
