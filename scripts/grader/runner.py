"""Inside a submission's sandbox: execute the graded notebook it is given on stdin, write it back
executed on the file descriptor named by --out (never the standard output, which the notebook's
kernel inherits).

    python runner.py --out FD --check-seconds S --cell-seconds S --memory-mb M  < graded.ipynb

A check cell (nbgrader's grade: true) stops after --check-seconds of wall-clock time, any other
cell after --cell-seconds: the kernel is interrupted, the cell shows a ``CellTimeoutError`` and the
next cell runs. A kernel that dies leaves the cells after it unexecuted. The runner and the kernel
together may hold --memory-mb of data (an allocation past it raises MemoryError in the kernel).
The runner makes itself non-dumpable first: the kernel runs as the same user, and without this it
could open the runner's pipe through /proc or trace it.
"""

import argparse
import ctypes
import os
import resource
import sys

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import DeadKernelError


class _Client(NotebookClient):
    """nbclient's client, marking the cell whose wall-clock limit ran out."""

    async def _async_handle_timeout(self, timeout, cell=None):
        if cell is not None:
            cell.metadata["grading_timeout"] = timeout
        return await super()._async_handle_timeout(timeout, cell)


PR_SET_DUMPABLE = 4      # prctl(2)


def _shield():
    """Make this process non-dumpable: its /proc entries (fd, mem, environ) become root's, and a
    process of the same user can no longer trace it."""
    if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0) failed")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", type=int, required=True)
    parser.add_argument("--check-seconds", type=float, required=True)
    parser.add_argument("--cell-seconds", type=float, required=True)
    parser.add_argument("--memory-mb", type=int, required=True)
    options = parser.parse_args()
    _shield()
    data = options.memory_mb << 20                   # heap and private mappings, inherited by the kernel
    resource.setrlimit(resource.RLIMIT_DATA, (data, data))
    out = os.fdopen(options.out, "w")
    os.set_inheritable(options.out, False)
    # The kernel inherits this process's standard output: make it the standard error.
    os.dup2(2, 1)
    notebook = nbformat.reads(sys.stdin.read(), as_version=4)
    # An empty HOME of this user's own, and the working folder.
    os.makedirs(os.environ["HOME"], mode=0o700, exist_ok=True)
    os.chdir(os.environ["HOME"])

    def limit(cell):
        graded = cell.get("metadata", {}).get("nbgrader", {}).get("grade")
        return int(options.check_seconds if graded else options.cell_seconds)

    client = _Client(notebook, kernel_name="python3", timeout_func=limit, interrupt_on_timeout=True,
                            error_on_timeout={"ename": "CellTimeoutError",
                                              "evalue": "the cell ran past its wall-clock limit"},
                            allow_errors=True, startup_timeout=60, record_timing=False)
    try:
        client.execute()
    except DeadKernelError:
        notebook.metadata["grading_kernel_died"] = True
    out.write(nbformat.writes(notebook))
    out.close()


if __name__ == "__main__":
    main()
