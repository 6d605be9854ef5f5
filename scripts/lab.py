"""JupyterLab on your own copies of the notebooks (make lab), or on the notebooks with their
solutions (make solutions).

    python scripts/lab.py [--folder my-notebooks] [JUPYTERLAB FLAGS ...]
    python scripts/lab.py --solutions [JUPYTERLAB FLAGS ...]

Your copies: the student copy of every notebook (solutions cut, outputs cleared: the copies
`make student` writes), made in the folder the first time and never overwritten, so your answers
survive `git pull` and the next `make lab`; a notebook an update adds is copied in beside them;
`make fresh-copy NB=03` starts one notebook over (the old copy kept in the folder's backups/).
Any other flag goes to JupyterLab (--no-browser, --port=8890, ...).
"""

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import student_copies  # noqa: E402 (a script beside this one)

ROOT = student_copies.ROOT


def lab_command(root_dir, flags):
    """The command that serves root_dir and opens the first notebook."""
    first = student_copies.course_notebooks()[0].name
    # nbgrader's formgrader is the instructor's, on a course directory inside the served folder
    # (make grade grades without it); here it would only log that the course is elsewhere.
    return [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root_dir}",
            f"--LabApp.default_url=/lab/tree/{first}",
            "--ServerApp.jpserver_extensions=nbgrader.server_extensions.formgrader=False", *flags]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--folder", default="my-notebooks", help="your copies (default my-notebooks/)")
    parser.add_argument("--solutions", action="store_true", help="serve notebooks/, the notebooks WITH solutions")
    options, flags = parser.parse_known_args(argv)
    folder = (ROOT / options.folder).resolve()
    if options.solutions:
        root_dir = student_copies.NOTEBOOKS
        print(f"notebooks/: the notebooks WITH their solutions (your own copies: {student_copies._shown(folder)}/, "
              "make lab)", flush=True)
    else:
        created, kept = student_copies.keep(folder)
        root_dir = folder
        print(f"{student_copies._shown(folder)}/: your copies of the notebooks ({len(created)} new, {len(kept)} "
              "kept as you left them); the solutions are in notebooks/ (make solutions)", flush=True)
    # nbgrader's Validate button reads nbgrader_config.py from the folder the server runs in.
    os.chdir(ROOT)
    command = lab_command(root_dir, flags)
    os.execv(command[0], command)


if __name__ == "__main__":
    main()
