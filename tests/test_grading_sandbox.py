"""A submission's sandbox (scripts/grader/sandbox.py): what it allows and denies, each shown by a
probe notebook run in it as grading runs a submission: its cells stand for code that got past the
allowlist, so each one tries what a submission must not do.

The sandbox needs Debian's bubblewrap (`bwrap`); .ci/run installs it. Without it these tests fail
with the line that names the package: grading cannot run without it either.
"""

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
spec = importlib.util.spec_from_file_location("grade", ROOT / "scripts" / "grade.py")
grade = importlib.util.module_from_spec(spec)
spec.loader.exec_module(grade)
sandbox = grade.sandbox
MARKER = f"sandbox-probe-{os.getpid()}-{int(time.time())}"


def _probe(*sources, graded=()):
    """A notebook of code cells; those at the indices in `graded` are check cells (nbgrader's
    grade: true, the check cell's wall-clock limit)."""
    cells = [nbformat.v4.new_code_cell(text) for text in sources]
    for index in graded:
        cells[index].metadata["nbgrader"] = {"grade": True, "grade_id": f"probe_{index}", "points": 1}
    return nbformat.v4.new_notebook(cells=cells, metadata={"kernelspec": {
        "name": "python3", "display_name": "Python 3", "language": "python"}})


def _printed(cell):
    return "".join(o.get("text", "") for o in cell.outputs if o.get("output_type") == "stream").strip()


def _raised(cell):
    return next((o["ename"] for o in cell.outputs if o.get("output_type") == "error"), None)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two probe notebooks run one after the other, as two students of a class: the first plants
    files and a daemon, the second looks for them. A course folder inside the repository (where
    grading/ lives by default) and one outside it stand for the gradebook's."""
    missing = sandbox.available()
    assert missing is None, missing
    outside = tmp_path_factory.mktemp("course")
    (outside / "gradebook.db").write_text("grades")
    inside = Path(tempfile.mkdtemp(prefix=".sandbox-test-course-", dir=ROOT))
    (inside / "gradebook.db").write_text("grades")
    os.environ["ATTENTION_SANDBOX_PROBE"] = "a secret of the grader's process"
    first = _probe(
        "import os, socket, subprocess, time\nprint(os.getuid(), os.getgid(), os.environ['HOME'])",
        "print(sorted(os.listdir(os.environ['HOME'])))",
        f"for path in [{str(ROOT / 'attention_lib' / 'planted.py')!r}, os.path.expanduser('~/planted.py'), "
        "'/tmp/planted.txt']:\n    try:\n        open(path, 'w').write('x')\n        print('wrote', path)\n"
        "    except OSError as error:\n        print('refused', path, error.errno)",
        f"print(os.path.exists({str(outside)!r}), sorted(os.listdir({str(inside)!r})))",
        "s = socket.socket()\ns.settimeout(3)\ntry:\n    s.connect(('1.1.1.1', 53))\n    print('connected')\n"
        "except OSError as error:\n    print('no network', error.errno)",
        "print(open('/proc/net/dev').read().count(':'), len([p for p in os.listdir('/proc') if p.isdigit()]))",
        "print(sorted(k for k in os.environ if 'SANDBOX_PROBE' in k or 'KEY' in k))",
        f"subprocess.Popen(['sh', '-c', 'sleep 300 # {MARKER}'], start_new_session=True)\nprint('daemon started')",
        "time.sleep(120)",
        "print('the cell after the sleep ran')",
        "import numpy as np\ntry:\n    big = np.ones(6 << 30, np.uint8)\n    print('allocated', big.nbytes)\n"
        "except MemoryError:\n    print('refused')",
        "try:\n    print(os.listdir(f'/proc/{os.getppid()}/fd'))\nexcept PermissionError:\n    print('runner out of reach')",
        graded=(8,))
    second = _probe("import os\nprint(sorted(os.listdir(os.environ['HOME'])), os.path.exists('/tmp/planted.txt'))")
    try:
        started = time.monotonic()
        text, note = sandbox.run(nbformat.writes(first), check_seconds=3, cell_seconds=30, total_seconds=120,
                                 hidden=[inside, outside])
        seconds = time.monotonic() - started
        after = subprocess.run(["pgrep", "-f", MARKER], capture_output=True, text=True).stdout.split()
        planted = (ROOT / "attention_lib" / "planted.py").exists()
        again, _ = sandbox.run(nbformat.writes(second), check_seconds=3, cell_seconds=30, total_seconds=60)
    finally:
        os.environ.pop("ATTENTION_SANDBOX_PROBE", None)
        shutil.rmtree(inside, ignore_errors=True)
    assert text is not None, note
    return {"cells": nbformat.reads(text, as_version=4).cells, "seconds": seconds, "after": after,
            "planted": planted, "again": nbformat.reads(again, as_version=4).cells}


def test_it_runs_as_nobody_with_an_empty_home_of_its_own(runs):
    assert _printed(runs["cells"][0]) == "65534 65534 /tmp/home"
    assert _printed(runs["cells"][1]) in ("[]", "['.ipython']", "['.ipython', '.local']")


def test_the_course_is_read_only_and_home_and_tmp_are_its_own(runs):
    lines = _printed(runs["cells"][2]).splitlines()
    assert lines[0] == f"refused {ROOT / 'attention_lib' / 'planted.py'} 30"          # EROFS
    assert lines[1].startswith("wrote /tmp/home/planted.py") and lines[2] == "wrote /tmp/planted.txt"
    assert not runs["planted"]


def test_the_course_directory_and_the_gradebook_are_out_of_sight(runs):
    assert _printed(runs["cells"][3]) == "False []"


def test_there_is_no_network_and_no_process_of_the_machine(runs):
    assert _printed(runs["cells"][4]).startswith("no network")
    interfaces, processes = map(int, _printed(runs["cells"][5]).split())
    assert interfaces == 1 and processes < 12          # lo alone; a handful of processes, its own


def test_the_graders_environment_does_not_reach_it(runs):
    assert _printed(runs["cells"][6]) == "[]"


def test_a_check_cell_stops_at_its_wall_clock_limit_and_the_next_cell_runs(runs):
    cells = runs["cells"]
    assert cells[8].metadata.get("grading_timeout") == 3
    assert _printed(cells[9]) == "the cell after the sleep ran"
    assert runs["seconds"] < 60, runs["seconds"]


def test_a_submission_holds_at_most_its_memory_and_cannot_reach_the_runner(runs):
    assert sandbox.MEMORY_MB < 6 << 10
    assert _printed(runs["cells"][10]) == "refused"                # 6 GiB past the 4 GiB allowed
    assert _printed(runs["cells"][11]) == "runner out of reach"    # its pipe and memory, through /proc


def test_nothing_a_submission_leaves_behind_outlives_its_grading(runs):
    assert _printed(runs["cells"][7]) == "daemon started"
    assert runs["after"] == [], "a process of the sandbox outlived it"
    assert _printed(runs["again"][0]) in ("[] False", "['.ipython'] False", "['.ipython', '.local'] False")


def test_a_sandbox_past_its_total_time_is_stopped_and_says_so():
    text, note = sandbox.run(nbformat.writes(_probe("import time\ntime.sleep(60)")), check_seconds=3,
                             cell_seconds=60, total_seconds=8)
    assert text is None and note == "the sandbox ran past its limit of 8 s and was stopped"


def test_a_kernel_that_dies_leaves_the_cells_after_it_unrun():
    text, note = sandbox.run(nbformat.writes(_probe("import os\nos._exit(1)", "print('after')")), check_seconds=3,
                             cell_seconds=30, total_seconds=60)
    notebook = nbformat.reads(text, as_version=4)
    assert notebook.metadata.get("grading_kernel_died") is True and notebook.cells[1].outputs == []


def test_without_bubblewrap_grading_names_the_package_in_one_line(monkeypatch, tmp_path):
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    assert sandbox.available() == sandbox.MISSING and "apt-get install bubblewrap" in sandbox.MISSING
    with pytest.raises(SystemExit) as stopped:
        grade.main(["grade", "00", "--course", str(tmp_path)])
    assert str(stopped.value) == f"grade grade: {sandbox.MISSING}"


def test_ci_installs_bubblewrap():
    assert "bubblewrap" in (ROOT / ".ci" / "run").read_text()


@pytest.mark.parametrize("option, value", [("--check-seconds", "0"), ("--cell-seconds", "soon"), ("--jobs", "0")])
def test_a_limit_that_is_not_a_number_of_seconds_is_named(option, value, capsys):
    with pytest.raises(SystemExit):
        grade.main(["grade", "00", option, value])
    assert option in capsys.readouterr().err


def test_outputs_past_the_limit_stop_the_sandbox_and_say_so(monkeypatch):
    monkeypatch.setattr(sandbox, "MOST_BYTES", 1 << 20)
    text, note = sandbox.run(nbformat.writes(_probe("for i in range(40):\n    print('x' * 100_000)")),
                             check_seconds=3, cell_seconds=30, total_seconds=60)
    assert text is None and note == "the notebook's outputs grew past 1 MB and the sandbox was stopped"


def test_a_sandbox_that_cannot_start_here_is_said_in_one_line(monkeypatch):
    assert sandbox.available() is None
    monkeypatch.setattr(sandbox, "command", lambda hidden=(): ["sh", "-c", "echo 'no namespaces' >&2; exit 1",
                                                               "python", "runner.py"])
    assert sandbox.available() == "grading cannot start its sandbox here (bubblewrap says: no namespaces)"
