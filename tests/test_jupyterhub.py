"""A class on one JupyterHub (classroom/jupyterhub_config.py), started here on loopback with its
proxy (configurable-http-proxy's Python implementation) and stopped afterwards: an instructor and
two students log in through the hub's login form; the instructor releases notebook 00 with
nbgrader; each student's own server, started through the hub, fetches it, gets an answer written
into it (one student right, one wrong) and submits it, all through the proxy; the instructor
collects and autogrades (the graded copy: no reveal cells, hidden tests), and the scores and the
wrong answer's diagnosis are read back. Without a hub: the GPU and simulator profiles of a shared
GPU, and the seats per GPU the instructor guide quotes."""

import concurrent.futures
import csv
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
BIN = Path(sys.executable).parent
PASSWORD = "a-test-password"
INSTRUCTOR, RIGHT, WRONG = "teacher", "ada", "grace"
ASSIGNMENT = "00_gpu_basics"
COURSE_ID = "attention-course"

spec = importlib.util.spec_from_file_location("student_copies", ROOT / "scripts" / "student_copies.py")
student_copies = importlib.util.module_from_spec(spec)
spec.loader.exec_module(student_copies)


def free_ports(count):
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def wait_for(what, probe, seconds):
    """probe() until it returns something true, for at most `seconds`; fails naming `what`."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        found = probe()
        if found:
            return found
        time.sleep(0.2)
    pytest.fail(f"{what}: not after {seconds} s")


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def hub(tmp_path):
    """The hub and its proxy, running from classroom/jupyterhub_config.py in their own process
    group; stopped (and checked stopped) afterwards. Yields (url, environment, tmp_path)."""
    port, hub_port, api_port = free_ports(3)
    env = dict(os.environ, CLASSROOM_TEST_PASSWORD=PASSWORD, CLASSROOM_IP="127.0.0.1",
               CLASSROOM_PORT=str(port), CLASSROOM_HUB_PORT=str(hub_port), CLASSROOM_PROXY_API_PORT=str(api_port),
               CLASSROOM_DATA=str(tmp_path / "hub"), CLASSROOM_INSTRUCTORS=INSTRUCTOR,
               CLASSROOM_STUDENTS=f"{RIGHT},{WRONG}", ATTENTION_EXCHANGE=str(tmp_path / "exchange"),
               ATTENTION_COURSE_DIR=str(tmp_path / "course"),
               PATH=os.pathsep.join([str(BIN), os.environ.get("PATH", "")]))
    (tmp_path / "exchange").mkdir()
    log = open(tmp_path / "hub.log", "w")
    process = subprocess.Popen([str(BIN / "jupyterhub"), "-f", str(ROOT / "classroom" / "jupyterhub_config.py")],
                               cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        def up():
            if process.poll() is not None:
                pytest.fail(f"the hub stopped (exit {process.returncode}): {(tmp_path / 'hub.log').read_text()[-2000:]}")
            try:
                return requests.get(f"{url}/hub/api", timeout=2).status_code == 200
            except requests.ConnectionError:
                return False
        wait_for("the hub answering through its proxy", up, 60)
        yield url, env, tmp_path
    finally:
        process.send_signal(signal.SIGTERM)      # the hub stops the users' servers and its proxy
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def log_in(url, name, password=PASSWORD):
    """A browser's session for `name` through the hub's login form; None when refused."""
    session = requests.Session()
    session.get(f"{url}/hub/login", timeout=10)
    done = session.post(f"{url}/hub/login", data={"username": name, "password": password,
                                                  "_xsrf": session.cookies.get("_xsrf")},
                        allow_redirects=False, timeout=30)
    return session if done.status_code == 302 and "jupyterhub-session-id" in session.cookies else None


def api_token(url, session, name):
    """A token for `name`'s own REST calls, asked for with the logged-in session."""
    done = session.post(f"{url}/hub/api/users/{name}/tokens", json={"note": "test", "expires_in": 600},
                        headers={"X-XSRFToken": session.cookies.get("_xsrf")}, timeout=10)
    assert done.status_code == 201, done.text
    return {"Authorization": f"token {done.json()['token']}"}


def start_server(url, name, auth):
    """Start `name`'s server through the hub and wait until the hub says it is ready."""
    done = requests.post(f"{url}/hub/api/users/{name}/server", headers=auth, timeout=30)
    assert done.status_code in (201, 202), done.text

    def ready():
        server = requests.get(f"{url}/hub/api/users/{name}", headers=auth, timeout=10).json()["servers"].get("", {})
        return server.get("ready")
    wait_for(f"{name}'s server", ready, 120)


def answered(notebook, wrong):
    """A fetched student copy with every exercise answered by the course's solution; with `wrong`,
    00_scale_add loses its bounds guard."""
    solutions = {c.metadata["nbgrader"]["grade_id"]: c.source
                 for c in student_copies.source_notebook(nbformat.read(ROOT / "notebooks" / f"{ASSIGNMENT}.ipynb",
                                                                       as_version=4)).cells
                 if c.get("metadata", {}).get("nbgrader", {}).get("solution")}
    for cell in notebook.cells:
        grade_id = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id")
        if grade_id in solutions:
            cell.source = solutions[grade_id]
            if wrong and grade_id == "00_scale_add_answer":
                cell.source = cell.source.replace("    if i < out.shape[0]:\n        out[i]", "    out[i]")
    return notebook


def student_works(url, name, auth, wrong):
    """Through the student's own server: fetch the assignment, write the answers, submit."""
    server = f"{url}/user/{name}"
    form = {"course_id": COURSE_ID, "assignment_id": ASSIGNMENT}
    listed = requests.post(f"{server}/assignments/fetch", data=form, headers=auth, timeout=60)
    assert listed.status_code == 200 and listed.json()["success"], listed.text[:2000]
    path = f"{server}/api/contents/{ASSIGNMENT}/{ASSIGNMENT}.ipynb"
    fetched = requests.get(path, headers=auth, timeout=30)
    assert fetched.status_code == 200, f"{name} has no fetched copy: {fetched.text[:500]}"
    notebook = nbformat.from_dict(fetched.json()["content"])
    assert any("raise NotImplementedError()" in c.source for c in notebook.cells), "the fetched copy has no stub"
    saved = requests.put(path, json={"type": "notebook", "format": "json",
                                     "content": answered(notebook, wrong)}, headers=auth, timeout=30)
    assert saved.status_code == 200, saved.text[:500]
    submitted = requests.post(f"{server}/assignments/submit", data=form, headers=auth, timeout=60)
    assert submitted.status_code == 200 and submitted.json()["success"], submitted.text[:2000]


def instructor(step, env):
    """The instructor's nbgrader step (scripts/grade.py, what make release-assignment/collect/grade run)."""
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "grade.py"), step, "00"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"grade.py {step}: {done.stderr[-3000:]}"
    return done.stdout


def test_a_class_releases_fetches_submits_and_is_graded_on_the_hub(hub):
    url, env, tmp_path = hub
    assert log_in(url, RIGHT, "not-the-password") is None, "a wrong password was accepted"
    sessions = {name: log_in(url, name) for name in (INSTRUCTOR, RIGHT, WRONG)}
    assert all(sessions.values()), f"refused: {[n for n, s in sessions.items() if s is None]}"
    auth = {name: api_token(url, session, name) for name, session in sessions.items()}
    who = {name: requests.get(f"{url}/hub/api/user", headers=auth[name], timeout=10).json() for name in auth}
    assert {name: (w["name"], w["admin"]) for name, w in who.items()} == {
        INSTRUCTOR: (INSTRUCTOR, True), RIGHT: (RIGHT, False), WRONG: (WRONG, False)}

    with concurrent.futures.ThreadPoolExecutor(2) as pool:      # the servers start while the instructor releases
        starting = [pool.submit(start_server, url, name, auth[name]) for name in (RIGHT, WRONG)]
        assert f"released {ASSIGNMENT}" in instructor("release", env)
        for future in starting:
            future.result()

    for name in (RIGHT, WRONG):
        student_works(url, name, auth[name], wrong=(name == WRONG))
    pids = {name: requests.get(f"{url}/hub/api/users/{name}", headers=auth[INSTRUCTOR], timeout=10)
            .json()["servers"][""]["state"]["pid"] for name in (RIGHT, WRONG)}

    assert "2 submission(s)" in instructor("collect", env)
    instructor("grade", env)
    with open(tmp_path / "course" / "exercises.csv", newline="") as handle:
        graded = {(r["student"], r["exercise"]): (float(r["points"]), r["diagnosis"], r["hidden"], r["flag"])
                  for r in csv.DictReader(handle)}
    exercises = [e.exercise_id for e in student_copies.exercises(
        nbformat.read(ROOT / "notebooks" / f"{ASSIGNMENT}.ipynb", as_version=4))]
    # Each check's verdict, and its hidden cases (other random data) where it passed.
    wanted = {(name, e): (1.0, "ok", "ok", "") for name in (RIGHT, WRONG) for e in exercises}
    wanted[WRONG, "00_scale_add"] = (0.0, "out_of_bounds", "not_run", "")
    assert graded == wanted

    for name in (RIGHT, WRONG):                                  # the students log out: their servers stop
        requests.delete(f"{url}/hub/api/users/{name}/server", headers=auth[name], timeout=30)
    wait_for("the students' servers stopping", lambda: not any(alive(pid) for pid in pids.values()), 60)


@pytest.mark.parametrize("password, authenticator, spawner", [(None, "pam", "localprocess"),
                                                             (PASSWORD, "dummy", "simple")])
def test_the_hub_uses_system_accounts_unless_a_test_password_is_set(tmp_path, monkeypatch, password, authenticator,
                                                                    spawner):
    from traitlets.config.loader import PyFileConfigLoader

    for variable in ("CLASSROOM_TEST_PASSWORD", "CLASSROOM_IP", "CLASSROOM_PORT"):
        monkeypatch.delenv(variable, raising=False)
    if password:
        monkeypatch.setenv("CLASSROOM_TEST_PASSWORD", password)
    monkeypatch.setenv("CLASSROOM_DATA", str(tmp_path))
    monkeypatch.setenv("CLASSROOM_INSTRUCTORS", INSTRUCTOR)
    monkeypatch.setenv("CLASSROOM_STUDENTS", f"{RIGHT}, {WRONG}")
    config = PyFileConfigLoader("jupyterhub_config.py", path=str(ROOT / "classroom")).load_config()
    assert (config.JupyterHub.authenticator_class, config.JupyterHub.spawner_class) == (authenticator, spawner)
    assert (config.JupyterHub.ip, config.JupyterHub.port, config.JupyterHub.hub_ip) == ("127.0.0.1", 8000, "127.0.0.1")
    assert config.Authenticator.admin_users == {INSTRUCTOR}
    assert config.Authenticator.allowed_users == {INSTRUCTOR, RIGHT, WRONG}
    assert config.Spawner.cmd == [str(BIN / "jupyterhub-singleuser")]
    assert config.ConfigurableHTTPProxy.command == [str(BIN / "configurable-http-proxy")]


class FakeSpawner:
    """What the hub's hooks read of a spawner: the user's name and the profile picked."""

    def __init__(self, name, backend):
        self.user = type("User", (), {"name": name})()
        self.user_options = {"backend": backend}


def _hub_config(tmp_path, monkeypatch, seats):
    from traitlets.config.loader import PyFileConfigLoader

    monkeypatch.setenv("CLASSROOM_DATA", str(tmp_path))
    monkeypatch.setenv("CLASSROOM_TEST_PASSWORD", PASSWORD)
    if seats is None:
        monkeypatch.delenv("CLASSROOM_GPU_SEATS", raising=False)
    else:
        monkeypatch.setenv("CLASSROOM_GPU_SEATS", str(seats))
    return PyFileConfigLoader("jupyterhub_config.py", path=str(ROOT / "classroom")).load_config()


def test_a_shared_gpu_gives_each_server_a_profile_and_holds_to_its_seats(tmp_path, monkeypatch):
    config = _hub_config(tmp_path, monkeypatch, seats=2)
    assert 'value="gpu"' in config.Spawner.options_form and 'value="simulator" checked' in config.Spawner.options_form
    assert config.Spawner.options_from_form({"backend": ["gpu"]}) == {"backend": "gpu"}
    with pytest.raises(ValueError, match=r"^backend must be 'gpu' or 'simulator', got 'tpu'$"):
        config.Spawner.options_from_form({"backend": ["tpu"]})
    take, free = config.Spawner.pre_spawn_hook, config.Spawner.post_stop_hook
    backend = config.Spawner.environment["ATTENTION_LIB_BACKEND"]
    ada, grace, alan, sim = (FakeSpawner(n, b) for n, b in (("ada", "gpu"), ("grace", "gpu"), ("alan", "gpu"),
                                                            ("sim", "simulator")))
    assert (backend(ada), backend(sim)) == ("gpu", "simulator")
    take(ada), take(grace), take(sim)                           # the simulator takes no seat
    with pytest.raises(RuntimeError, match=r"^all 2 GPU seats are taken; start your server with the Simulator profile$"):
        take(alan)
    free(ada)
    take(alan)


def test_without_gpu_seats_there_is_no_choice_and_the_course_decides(tmp_path, monkeypatch):
    monkeypatch.delenv("CLASSROOM_GRADED", raising=False)
    config = _hub_config(tmp_path, monkeypatch, seats=None)
    assert "ATTENTION_LIB_BACKEND" not in config.Spawner.environment
    assert "ATTENTION_LIB_GRADED" not in config.Spawner.environment


def test_a_graded_class_runs_every_servers_checks_as_grading_does(tmp_path, monkeypatch):
    from attention_lib.checks import engine
    monkeypatch.setenv("CLASSROOM_GRADED", "1")
    config = _hub_config(tmp_path, monkeypatch, seats=None)
    assert config.Spawner.environment[engine.GRADED_VARIABLE] == "1"
    assert not config.Spawner.get("options_form")


def _gpu_seats():
    spec = importlib.util.spec_from_file_location("gpu_seats", ROOT / "classroom" / "gpu_seats.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_instructor_guide_quotes_the_seats_the_estimate_gives():
    """The figures of INSTRUCTORS.md's "A class on one GPU server" are classroom/gpu_seats.py's."""
    seats = _gpu_seats().seats
    guide = " ".join((ROOT / "INSTRUCTORS.md").read_text().split())
    for gib in (139, 79, 15):
        found = seats(gib)
        for notebook in ("10_performance", "11_backward", "00_gpu_basics"):
            per_student, fit = found[notebook]
            quoted = f"`{notebook}`: {per_student:.2f} GiB, {fit} students on {gib} GiB"
            assert quoted in guide, f"INSTRUCTORS.md should say {quoted!r}"
