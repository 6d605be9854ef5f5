"""JupyterHub for a class of this course on one machine: `make hub` (or
`jupyterhub -f classroom/jupyterhub_config.py` with the course's environment active).

Everything JupyterHub needs comes with the course's pip install (the classroom extra, also in the
test extra): JupyterHub, and its proxy as the Python implementation of configurable-http-proxy,
so no Node.js. Each user's server is the course's own environment (this Python's
jupyterhub-singleuser: JupyterLab, the course, nbgrader's Assignments tab and Validate button),
and nbgrader's exchange is a folder on disk (ATTENTION_EXCHANGE, nbgrader_config.py). Read
classroom/README.md first.

Settings, from the environment:
- CLASSROOM_IP (127.0.0.1: this machine only), CLASSROOM_PORT (8000): where people connect;
  CLASSROOM_HUB_PORT (8081) and CLASSROOM_PROXY_API_PORT (8001): the hub's and the proxy's own
  ports, always on 127.0.0.1;
- CLASSROOM_DATA: the hub's database, cookie secret and the test's homes (classroom/data/);
- CLASSROOM_INSTRUCTORS, CLASSROOM_STUDENTS: user names, comma-separated; instructors are the
  hub's admins;
- CLASSROOM_GPU_SEATS: on a machine with a GPU, how many servers may use it at once
  (`python classroom/gpu_seats.py` prints the estimate per notebook). Set, each user picks a
  profile when starting a server: "GPU" (ATTENTION_LIB_BACKEND=gpu, while a seat is free) or
  "Simulator" (ATTENTION_LIB_BACKEND=simulator: Numba's CUDA simulator on the CPU). Unset, there
  is no choice and the course decides as it does on any machine (a GPU if one works);
- CLASSROOM_GRADED: set to 1 for a graded class: every server runs the checks as grading does
  (ATTENTION_LIB_GRADED: no library solution revealed, each answer compiled for a GPU before it runs);
- CLASSROOM_TEST_PASSWORD: set only for a test or a demonstration on one machine. Then anyone
  listed logs in with this one password (JupyterHub's DummyAuthenticator) and every server runs
  as the hub's own system user with a home under CLASSROOM_DATA/homes/ (SimpleLocalProcessSpawner).
  Unset, the hub uses the machine's accounts (PAM): each listed user needs a system account, and
  each server runs as its user (LocalProcessSpawner), which needs the hub to run as root.
"""

import os
import sys

c = get_config()  # noqa: F821 (JupyterHub's config loader defines it)
here = os.path.dirname(os.path.abspath(__file__))
bin_dir = os.path.dirname(sys.executable)               # the course's environment: the hub's own


def names(variable):
    return {name.strip() for name in os.environ.get(variable, "").split(",") if name.strip()}


data = os.environ.get("CLASSROOM_DATA", os.path.join(here, "data"))
os.makedirs(data, exist_ok=True)
instructors, students = names("CLASSROOM_INSTRUCTORS"), names("CLASSROOM_STUDENTS")
test_password = os.environ.get("CLASSROOM_TEST_PASSWORD")

c.JupyterHub.ip = os.environ.get("CLASSROOM_IP", "127.0.0.1")
c.JupyterHub.port = int(os.environ.get("CLASSROOM_PORT", "8000"))
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = int(os.environ.get("CLASSROOM_HUB_PORT", "8081"))
c.JupyterHub.db_url = "sqlite:///" + os.path.join(data, "jupyterhub.sqlite")
c.JupyterHub.cookie_secret_file = os.path.join(data, "jupyterhub_cookie_secret")
c.JupyterHub.pid_file = os.path.join(data, "jupyterhub.pid")

# The proxy: configurable-http-proxy's Python implementation (PyPI), same command line as the npm one.
c.ConfigurableHTTPProxy.command = [os.path.join(bin_dir, "configurable-http-proxy")]
c.ConfigurableHTTPProxy.api_url = f"http://127.0.0.1:{int(os.environ.get('CLASSROOM_PROXY_API_PORT', '8001'))}"

c.Authenticator.allowed_users = instructors | students
c.Authenticator.admin_users = instructors

# Each user's server: the course's environment, opening JupyterLab. nbgrader in it reads
# classroom/nbgrader_config.py (the exchange, the course id) through JUPYTER_CONFIG_PATH.
c.Spawner.cmd = [os.path.join(bin_dir, "jupyterhub-singleuser")]
c.Spawner.default_url = "/lab"
c.Spawner.environment = {
    "JUPYTER_CONFIG_PATH": here,
    "ATTENTION_EXCHANGE": os.environ.get("ATTENTION_EXCHANGE", "/srv/nbgrader/exchange"),
    "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "/usr/bin:/bin")]),
}
# Profiles when the machine's GPU is shared (CLASSROOM_GPU_SEATS): the GPU for as many servers as
# it has seats, the simulator for everyone else; a seat is free again when its server stops.
gpu_seats = int(os.environ.get("CLASSROOM_GPU_SEATS", "0") or 0)
seated = set()                                          # users whose running server holds a GPU seat
PROFILE_FORM = """
<label><input type="radio" name="backend" value="simulator" checked> Simulator: Numba's CUDA simulator on the CPU</label><br>
<label><input type="radio" name="backend" value="gpu"> GPU ({seats} seats; when all are taken, pick the simulator)</label>
"""


def profile_from_form(formdata):
    """The profile a user picked: {"backend": "gpu" or "simulator"}."""
    backend = formdata.get("backend", ["simulator"])[0]
    if backend not in ("gpu", "simulator"):
        raise ValueError(f"backend must be 'gpu' or 'simulator', got {backend!r}")
    return {"backend": backend}


def take_seat(spawner):
    """Before a server starts: a GPU profile takes a seat, or is refused when none is free."""
    if spawner.user_options.get("backend") != "gpu":
        return
    if spawner.user.name not in seated and len(seated) >= gpu_seats:
        raise RuntimeError(f"all {gpu_seats} GPU seats are taken; start your server with the Simulator profile")
    seated.add(spawner.user.name)


def free_seat(spawner):
    seated.discard(spawner.user.name)


if gpu_seats:
    c.Spawner.options_form = PROFILE_FORM.format(seats=gpu_seats)
    c.Spawner.options_from_form = profile_from_form
    c.Spawner.pre_spawn_hook = take_seat
    c.Spawner.post_stop_hook = free_seat
    c.Spawner.environment["ATTENTION_LIB_BACKEND"] = lambda spawner: spawner.user_options.get("backend", "simulator")

if os.environ.get("CLASSROOM_GRADED", "") not in ("", "0"):
    c.Spawner.environment["ATTENTION_LIB_GRADED"] = "1"

# A server on the simulator starts in seconds, but a loaded machine may take longer.
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 60

if test_password:
    c.JupyterHub.authenticator_class = "dummy"
    c.DummyAuthenticator.password = test_password
    c.JupyterHub.spawner_class = "simple"
    c.SimpleLocalProcessSpawner.home_dir_template = os.path.join(data, "homes", "{username}")
    # Every server runs as the hub's system user, whose name nbgrader would give every submission;
    # a student's submissions are named after the hub name instead (classroom/nbgrader_config.py).
    c.Spawner.environment["ATTENTION_STUDENT_ID"] = lambda spawner: (
        "" if spawner.user.name in instructors else spawner.user.name)
    if os.getuid() == 0:                                 # a container's root: Jupyter asks for consent
        c.Spawner.args = ["--allow-root"]
else:
    c.JupyterHub.authenticator_class = "pam"
    c.JupyterHub.spawner_class = "localprocess"
