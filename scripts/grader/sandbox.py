"""One submission's sandbox: bubblewrap (Debian's ``bubblewrap``), run as root only to set it up.

What runs inside: ``runner.py`` and the notebook kernel it starts, as the user ``nobody`` with no
capabilities, in new PID, network, IPC and UTS namespaces (no network but loopback, no process of
the machine visible), under a root of its own that holds read-only: the system (/usr, /etc), this
Python and its environment, and the course's code (the repository, with the course directory and
the exchange hidden under empty folders). Writable: an empty /tmp, where HOME is. The notebook
comes in on stdin and goes out on a pipe; nothing inside can write anything outside. The process
tree ends with the sandbox (--die-with-parent, and PID 1 of its namespace gone takes the rest), so
a process a submission leaves behind does not outlive its grading.

- ``available() -> str | None``: None, or the one line that says what is missing;
- ``command(hidden) -> [str]``: the bubblewrap command around ``runner.py``;
- ``run(notebook_json, check_seconds, cell_seconds, total_seconds, hidden, memory_mb) -> (json or None, note)``:
  the executed notebook, or why there is none (its time ran out, its output grew past MOST_BYTES);
  the kernel's data is capped at memory_mb (MEMORY_MB by default: a check needs under 1 GB).
"""

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
USER = "65534"            # nobody
MISSING = ("grading needs bubblewrap to sandbox each submission: install Debian's package "
           "(apt-get install bubblewrap), then run make grade again")


def available():
    """None when a sandbox can be made here; else the line that says why not."""
    if shutil.which("bwrap") is None:
        return MISSING
    if shutil.which("setpriv") is None:
        return "grading needs setpriv (util-linux) to run a submission as nobody: install util-linux"
    # A sandbox that cannot start here (no user namespaces for this user, a kernel that refuses
    # them) is said once, not as every student's not_graded.
    try:
        done = subprocess.run(command()[:-2] + ["true"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"grading cannot start its sandbox here: {error}"
    if done.returncode != 0:
        said = (done.stderr.strip().splitlines() or ["no message"])[-1]
        return f"grading cannot start its sandbox here (bubblewrap says: {said})"
    return None


def _python_trees():
    """The folders this Python needs: its environment and the interpreter it was made from."""
    trees = {Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve(), Path(sys.executable).resolve().parent.parent}
    return sorted(trees)


def command(hidden=()):
    """bwrap ... setpriv ... python runner.py: the sandbox as argv (without runner's options)."""
    # As root, every namespace but the user's (a user namespace maps only root, so the switch to
    # nobody below could not happen); as anyone else, all of them.
    spaces = (["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try"]
              if os.geteuid() == 0 else ["--unshare-all"])
    argv = ["bwrap", *spaces, "--die-with-parent", "--new-session", "--clearenv",
            "--ro-bind", "/usr", "/usr", "--ro-bind", "/etc", "/etc"]
    for link in ("bin", "lib", "lib64", "sbin"):
        target = Path("/") / link
        if target.is_symlink():
            argv += ["--symlink", os.readlink(target), str(target)]
        elif target.is_dir():
            argv += ["--ro-bind", str(target), str(target)]
    # A private /tmp first, so that a tree under /tmp (a clone in /tmp, say) is bound over it, not hidden.
    argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/tmp"]
    trees = [t for t in _python_trees() + [ROOT] if not str(t).startswith("/usr/")]
    # The folders above each tree, made readable (bubblewrap makes them for root alone).
    parents = sorted({p for t in trees for p in t.parents if str(p) not in ("/", "/tmp")}, key=lambda p: len(p.parts))
    for parent in parents:
        argv += ["--perms", "0755", "--dir", str(parent)]
    for tree in trees:
        argv += ["--ro-bind", str(tree), str(tree)]
    for folder in hidden:
        folder = Path(folder).resolve()
        if any(folder == t or t in folder.parents for t in _python_trees() + [ROOT]) and folder.is_dir():
            argv += ["--tmpfs", str(folder)]
    argv += ["--chdir", "/tmp",
             "--setenv", "HOME", "/tmp/home", "--setenv", "PATH", f"{Path(sys.executable).parent}:/usr/bin:/bin",
             "--setenv", "LANG", "C.UTF-8", "--setenv", "ATTENTION_LIB_BACKEND", "simulator",
             "--setenv", "ATTENTION_LIB_GRADED", "1",
             "--setenv", "PYTHONDONTWRITEBYTECODE", "1", "--setenv", "MPLBACKEND", "Agg",
             "--setenv", "PYTHONHASHSEED", "0"]
    if os.geteuid() == 0:
        argv += ["setpriv", f"--reuid={USER}", f"--regid={USER}", "--clear-groups",
                 "--no-new-privs", "--inh-caps=-all", "--bounding-set=-all"]
    return argv + [sys.executable, str(HERE / "runner.py")]


# The most a sandbox may hand back: an executed notebook past it is stopped (its outputs are the
# student's to make as large as they like).
MOST_BYTES = 64 << 20
# The data a submission's runner and kernel may hold together, in MB (the kernel's MemoryError past it).
MEMORY_MB = 4096


def run(notebook_json, check_seconds, cell_seconds, total_seconds, hidden=(), memory_mb=MEMORY_MB):
    """Execute a graded notebook (its JSON text) in a fresh sandbox: (executed JSON or None, note),
    the note saying why there is none (its time ran out, its output grew past MOST_BYTES, it failed)."""
    read, write = os.pipe()
    argv = command(hidden) + ["--out", str(write), "--check-seconds", str(check_seconds),
                              "--cell-seconds", str(cell_seconds), "--memory-mb", str(int(memory_mb))]
    process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               pass_fds=(write,), start_new_session=True)
    os.close(write)
    chunks, tail, size = [], [b""], [0]

    def stop():
        try:
            os.killpg(process.pid, 9)
        except ProcessLookupError:
            pass

    def drain():
        with os.fdopen(read, "rb") as handle:
            while chunk := handle.read(1 << 16):
                size[0] += len(chunk)
                if size[0] > MOST_BYTES:
                    stop()
                    return
                chunks.append(chunk)

    def drain_errors():
        while chunk := process.stderr.read(1 << 14):
            tail[0] = (tail[0] + chunk)[-4096:]

    readers = [threading.Thread(target=f, daemon=True) for f in (drain, drain_errors)]
    for reader in readers:
        reader.start()
    try:
        process.stdin.write(notebook_json.encode())
        process.stdin.close()
    except BrokenPipeError:
        pass
    try:
        process.wait(timeout=total_seconds)
    except subprocess.TimeoutExpired:
        stop()
        process.wait()
        return None, f"the sandbox ran past its limit of {total_seconds:g} s and was stopped"
    finally:
        for reader in readers:
            reader.join(30)
    if size[0] > MOST_BYTES:
        return None, f"the notebook's outputs grew past {MOST_BYTES >> 20} MB and the sandbox was stopped"
    text = b"".join(chunks).decode("utf-8", "replace")
    if process.returncode != 0 or not text:
        last = tail[0].decode("utf-8", "replace").strip().splitlines()[-1:] or ["no message"]
        return None, f"the sandbox ended with status {process.returncode}: {last[0][:300]}"
    return text, ""
