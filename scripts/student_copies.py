"""Build the student copies of the notebooks: solutions cut, outputs cleared.

    python scripts/student_copies.py [OUT_DIR]        (make student: OUT_DIR = release)

Uses nbgrader's own preprocessors, without its database or course layout: ClearSolutions turns
the code between an exercise cell's solution markers into `# YOUR CODE HERE` /
`raise NotImplementedError()` (signature, docstring and hints stay), ClearOutput removes every
output. `enforce_metadata=False` lets it work on plain cells, without nbgrader's cell metadata.
"""

import sys
from pathlib import Path

import nbformat
from nbconvert.preprocessors import ClearOutputPreprocessor
from nbgrader.preprocessors import ClearSolutions

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def student_copy(notebook):
    """The student version of one notebook (a new NotebookNode)."""
    resources = {}
    notebook, resources = ClearSolutions(enforce_metadata=False).preprocess(notebook, resources)
    notebook, resources = ClearOutputPreprocessor().preprocess(notebook, resources)
    return notebook


def build(out_dir):
    """Write a student copy of every course notebook into out_dir; returns their paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for source in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")):
        copy = student_copy(nbformat.read(source, as_version=4))
        target = out_dir / source.name
        nbformat.write(copy, target)
        written.append(target)
    return written


if __name__ == "__main__":
    for path in build(sys.argv[1] if len(sys.argv) > 1 else ROOT / "release"):
        print(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
