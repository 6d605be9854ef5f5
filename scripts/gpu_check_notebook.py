"""Execute one notebook for scripts/gpu_check.sh: its executed copy and a log, whatever happens.

    python scripts/gpu_check_notebook.py NOTEBOOK OUT_DIR [--cell-timeout SECONDS]

Runs every cell in a fresh kernel of this interpreter (the notebook's folder as its working
directory; the environment, ATTENTION_LIB_BACKEND included, is passed on), and writes the
executed copy OUT_DIR/<notebook's name> after every cell, so that a notebook stopped half way
(a failing cell, or SIGINT from the step's time budget) keeps the cells it ran and their
outputs. Prints one line per cell (its index, seconds, ok or the error's first line), then a
verdict. Exit status 0 when every cell ran without error, 1 when one failed, 130 when stopped.
The committed notebook is never written. Needs nbformat, nbclient and ipykernel.
"""

import argparse
import re
import sys
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError
from nbclient.util import run_sync


def last_line(text):
    """The last non-empty line of an error's text, terminal colours removed (tracebacks end with
    'ValueError: what went wrong')."""
    lines = [line for line in re.sub(r"\x1b\[[0-9;]*m", "", str(text)).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def stop_kernel(client):
    """Shut the notebook's kernel down if it still runs (it runs in a session of its own, so the
    step's SIGINT does not reach it; without its parent it also stops by itself within a second)."""
    if client.km is None:
        return
    try:
        run_sync(client.km.shutdown_kernel)(now=True)
    except Exception as error:  # already gone, or its loop closed: nothing left to stop
        print(f"kernel shutdown: {type(error).__name__} {last_line(error)}".rstrip(), flush=True)


def execute(source, out_dir, cell_timeout):
    notebook = nbformat.read(source, as_version=4)
    copy = out_dir / source.name
    client = NotebookClient(notebook, timeout=cell_timeout, kernel_name="python3",
                            resources={"metadata": {"path": str(source.parent)}})
    started = {}

    def on_start(cell, cell_index):
        started[cell_index] = time.perf_counter()

    def on_done(cell, cell_index, execute_reply):
        content = execute_reply.get("content", {}) if execute_reply else {}
        status = content.get("status", "no reply")
        why = f": {content.get('ename')}: {last_line(content.get('evalue', ''))}" if status == "error" else ""
        print(f"cell {cell_index:3d}  {time.perf_counter() - started.get(cell_index, time.perf_counter()):7.1f} s  "
              f"{'ok' if status == 'ok' else status}{why}", flush=True)
        nbformat.write(notebook, copy)          # the copy so far: a later stop loses nothing run

    client.on_cell_start, client.on_cell_executed = on_start, on_done
    began = time.perf_counter()
    try:
        client.execute()
        verdict, status = "every cell ran", 0
    except (CellExecutionError, CellTimeoutError) as error:
        verdict, status = f"FAILED: {last_line(error)}", 1
    except KeyboardInterrupt:
        verdict, status = "STOPPED: interrupted (the step's time budget ran out)", 130
        stop_kernel(client)
    except Exception as error:  # nbclient shuts the kernel down itself on SIGINT: the cell dies
        verdict, status = (f"STOPPED: {type(error).__name__}: {last_line(error)} (nbclient stops the kernel on "
                           "SIGINT, which the step's time budget sends)"), 1
        stop_kernel(client)
    finally:
        nbformat.write(notebook, copy)
    print(f"{source.name}: {verdict} in {time.perf_counter() - began:.1f} s; executed copy {copy}", flush=True)
    return status


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebook", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--cell-timeout", type=int, default=600, help="seconds one cell may take (default 600)")
    args = parser.parse_args(argv)
    source = args.notebook.resolve()
    if not source.is_file():
        raise SystemExit(f"no notebook {args.notebook}")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    print(f"{source.name}: executing with {sys.executable} (kernel python3 of this interpreter)", flush=True)
    return execute(source, args.out_dir.resolve(), args.cell_timeout)


if __name__ == "__main__":
    sys.exit(main())
