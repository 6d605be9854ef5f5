"""Student copies (scripts/student_copies.py, `make student`) run top to bottom without a solution.

Each copy is built with nbgrader's preprocessors and executed: no cell may fail, every exercise
cell must have become a stub, and every check cell must report "not implemented yet" instead
of a traceback. Later cells use the library, never the student's answer, so nothing else breaks:
that is read from the code (tests/cell_slices.py), and the copy runs the cells its exercises and
checks need; the others are the notebook's own cells, which nbval executes.
"""

import importlib.util
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

import cell_slices

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))   # deep dives (NNx_) too

spec = importlib.util.spec_from_file_location("student_copies", ROOT / "scripts" / "student_copies.py")
student_copies = importlib.util.module_from_spec(spec)
spec.loader.exec_module(student_copies)


def test_make_student_builds_a_copy_of_every_notebook(tmp_path):
    written = student_copies.build(tmp_path)
    assert [p.name for p in written] == [p.name for p in NOTEBOOKS]


@pytest.fixture(scope="module")
def kernel():
    """One Jupyter kernel for every copy, started where the notebooks are, so that relative paths
    resolve as in the real notebook; each copy starts with its namespace emptied (%reset), as a
    kernel a student restarts has it. One kernel, not one a notebook: 16 kernels' start-up saved."""
    from jupyter_client.manager import KernelManager
    manager = KernelManager(kernel_name="python3")
    manager.start_kernel(cwd=str(ROOT / "notebooks"))
    yield manager
    manager.shutdown_kernel(now=True)


@pytest.mark.parametrize("source", NOTEBOOKS, ids=lambda p: p.name)
def test_student_copy_runs_and_reports_not_implemented(source, kernel):
    copy = student_copies.student_copy(nbformat.read(source, as_version=4))
    code = [c for c in copy.cells if c.cell_type == "code"]
    stubs = [c for c in code if "raise NotImplementedError()" in c.source and "# YOUR CODE HERE" in c.source]
    assert stubs or source.name[2] == "x", f"{source.name}: no exercise became a stub"   # a deep dive may have none
    assert not any("### BEGIN SOLUTION" in c.source for c in code), "a solution survived"
    assert not any(c.get("outputs") for c in code), "outputs were not cleared"

    original = with_invited_snippets(nbformat.read(source, as_version=4).cells)
    code = with_invited_snippets(copy.cells)
    assert len(code) == len(original)
    invited = [i for i, c in enumerate(code) if c.get("metadata", {}).get("invited")]
    needed, answer_uses = cell_slices.plan([c.source for c in original])
    needed = cell_slices.needed_for([c.source for c in original], set(needed) | set(invited))
    assert not answer_uses, f"{source.name}: cells read the student's answer: {answer_uses}"
    reset = nbformat.v4.new_code_cell("%reset -f")
    runnable = nbformat.v4.new_notebook(metadata=copy.metadata, cells=[reset] + [code[i] for i in needed])
    NotebookClient(runnable, timeout=600, km=kernel).execute()
    code = runnable.cells

    errors = [o for c in code for o in c.outputs if o.output_type == "error"]
    assert not errors, f"{source.name}: {errors[0].ename}: {errors[0].evalue}"
    # A cell's text may arrive as several outputs (streams, the verdict displayed as text/plain beside
    # its HTML, the graded line on stderr); one check cell is one verdict.
    verdicts = ["".join(o.get("text", "") + o.get("data", {}).get("text/plain", "") for o in c.outputs)
                for c in code if "nbval-check-output" in c.metadata.get("tags", [])]
    assert len(verdicts) == len(stubs)
    assert all("[not_implemented]" in v and "Hint:" in v for v in verdicts), verdicts


# A call the text invites the student to run, as inline code: `hint("04_block_softmax", 2)`, with
# the exercise named (`hint(exercise_id)` is the text describing the function, not an invitation).
INVITED = re.compile(r"`((?:hint|reveal)\(\s*[\"'][\w]+[\"'](?:\s*,\s*\d+)?\s*\))`")


def with_invited_snippets(cells):
    """The code cells, each markdown cell's invited snippets inserted as code cells after it
    (marked `invited`): the copy's test runs them where the text invites them, so a snippet that
    uses a name not yet defined there fails."""
    code = []
    for cell in cells:
        if cell.cell_type == "code":
            code.append(cell)
        else:
            code += [nbformat.v4.new_code_cell(snippet, metadata={"invited": True})
                     for snippet in INVITED.findall(cell.source)]
    return code


def test_invited_snippets_are_found():
    cell = nbformat.v4.new_markdown_cell('Stuck? Run `hint("00_scale_add")`, then `hint("00_scale_add", 2)`; '
                                         'not `hint(exercise_id)`, `x[i]` nor `range(n)`.')
    assert [c.source for c in with_invited_snippets([cell])] == ['hint("00_scale_add")', 'hint("00_scale_add", 2)']


def test_a_copy_runs_the_cells_its_exercises_need_and_no_other():
    sources = ["import numpy as np\nfrom attention_lib import banner",        # 0: always run
               "x = np.ones(3)",                                                # 1: x
               "slow = np.linalg.svd(np.ones((9, 9)))",                         # 2: nobody needs slow
               "x[0] = 2.0",                                                    # 3: changes x
               "def tile(a):\n    return a * SCALE",                            # 4: reads SCALE when called
               "SCALE = 3",                                                     # 5: after tile, before its call
               "def answer(a):\n    ### BEGIN SOLUTION\n    return tile(x)\n    ### END SOLUTION",
               "check('id', answer)",
               "print(slow)",                                                   # 8: after the check
               "x = None"]                                                      # 9: too late for 6
    needed, answer_uses = cell_slices.plan(sources)
    assert needed == [0, 1, 3, 4, 5, 6, 7]
    assert answer_uses == []


def test_a_cell_that_reads_the_students_answer_is_named():
    sources = ["import numpy as np",
               "def answer(a):\n    ### BEGIN SOLUTION\n    return a\n    ### END SOLUTION",
               "check('id', answer)",
               "total = answer(np.ones(2)).sum()",
               "def later(a):\n    return answer(a)",
               "answer = np.sum",
               "print(answer(np.ones(2)))"]
    assert cell_slices.plan(sources)[1] == [(3, "answer"), (4, "answer")]
