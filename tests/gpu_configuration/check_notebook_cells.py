"""Every notebook cell that branches on the backend runs its GPU branch here, with the cells it
needs (read from the code: tests/cell_slices.py), in this process configured as on a GPU machine.
A cell that needs the device itself runs against the stand-ins of fake_device.py."""

import linecache
from pathlib import Path

import cell_slices
import matplotlib
import nbformat
import pytest

matplotlib.use("Agg")                        # figures are made, not shown

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
BRANCHES = ("ON_SIMULATOR", "attention_lib.BACKEND", "runtime.BACKEND")


def code_of(path):
    return [c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code"]


def backend_cells(path):
    return [i for i, source in enumerate(code_of(path)) if any(word in source for word in BRANCHES)]


@pytest.mark.parametrize("path", [p for p in NOTEBOOKS if backend_cells(p)], ids=lambda p: p.name)
def test_the_cells_that_branch_on_the_backend_run_as_on_a_gpu(path):
    sources = code_of(path)
    namespace = {"__name__": "__main__", "display": print}        # IPython's display, where no kernel runs
    for i in cell_slices.needed_for(sources, backend_cells(path)):
        source = "\n".join(line for line in sources[i].splitlines() if not line.lstrip().startswith(("%", "!")))
        filename = f"<{path.name} code cell {i}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # kernels' source
        exec(compile(source, filename, "exec"), namespace)
