"""What a student sees in JupyterLab: verdicts in colour (HTML beside the unchanged plain text,
displayed by check() in a kernel, printed elsewhere), the kernel report as an HTML table that fits
the output area (its text, what print shows, unchanged), docstrings without stray blank lines."""

import ast
import re
from pathlib import Path

import nbformat
from IPython.core.formatters import DisplayFormatter
from IPython.core.inputtransformer2 import TransformerManager
from nbclient import NotebookClient

from attention_lib.checks import check, record
from attention_lib.checks.result import CheckResult
from attention_lib.measure import kernel_report

ROOT = Path(__file__).resolve().parent.parent
FORMAT = DisplayFormatter()


def test_a_verdict_is_coloured_html_beside_its_plain_line():
    passed = CheckResult("00_scale_add", True, "ok", "correct at every size tried")
    failed = CheckResult("00_scale_add", False, "out_of_bounds", "at n = 7: out[7] <past the end> & more")
    for result, colour in ((passed, "#1a7f37"), (failed, "#cf222e")):
        shown = result._repr_mimebundle_()
        assert shown["text/plain"] == str(result)              # what print shows, and what nbval compares
        assert f'<span style="color: {colour}; font-weight: bold">' in shown["text/html"]
        assert shown[record.MIME] == {"exercise_id": "00_scale_add", "diagnosis": result.diagnosis,
                                      "passed": result.passed}
    html = failed._repr_mimebundle_()["text/html"]
    assert "✘ 00_scale_add [out_of_bounds]</span>" in html and "&lt;past the end&gt; &amp; more" in html


def test_check_prints_outside_a_kernel(capsys):
    check("00_scale_add", None)
    assert capsys.readouterr().out.startswith("✘ 00_scale_add [not_implemented]: not implemented yet.")


def test_check_displays_its_verdict_in_a_kernel_once():
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        'from attention_lib.checks import check\ncheck("00_scale_add", None)'),
        nbformat.v4.new_code_cell('result = check("00_scale_add", None)'), nbformat.v4.new_code_cell("result")])
    NotebookClient(notebook, timeout=120, kernel_name="python3").execute()
    assert [len(cell.outputs) for cell in notebook.cells] == [1, 1, 1]   # the cell's value is not shown twice
    (output,) = notebook.cells[0].outputs
    assert output.output_type == "display_data"
    assert output.data["text/plain"].startswith("✘ 00_scale_add [not_implemented]: not implemented yet. Hint:")
    assert 'style="color: #cf222e' in output.data["text/html"]


ROW = {"registers": 40, "stack_bytes": 1024, "spill_bytes": 0, "shared_bytes": 33024, "dynamic_shared_bytes": 0,
       "threads_per_block": 128, "warps_per_sm": 16,
       "hot_loop": {"ffma": 128, "lds": 36, "local": 0, "ldg": 2, "total": 206, "ffma_fraction": 0.62}}


def test_the_kernel_report_shows_as_an_html_table_and_prints_as_text():
    rows = {"flash.flash_attention_kernel_v3_grouped": ROW, "basics.scale_add_kernel": ROW}
    table = kernel_report.table(rows)
    lines = str(table).splitlines()
    assert len(lines) == 3 and lines[0].split()[:3] == ["kernel", "regs", "stack"]
    assert max(map(len, lines)) > 120                             # what wrapped in the output area
    shown, _ = FORMAT.format(table)
    assert shown["text/plain"] == str(table)                       # not the quoted repr of a string
    html = shown["text/html"]
    assert html.count("<tr>") == 1 + len(rows) and html.count("<th ") == len(table.header)
    assert "<code>flash.<wbr>flash_attention_kernel_v3_grouped</code>" in html and ">33,024<" in html


DOCSTRING_EDGE = re.compile(r'^[rRuU]?("""|\'\'\')[ \t]*\n[ \t]*\n|\n[ \t]*\n[ \t]*("""|\'\'\')$')


def _stray_blank_lines(source, where):
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
                if DOCSTRING_EDGE.search(ast.get_source_segment(source, first.value) or ""):
                    found.append(f"{where}: {getattr(node, 'name', 'the module')}")
    return found


def test_no_docstring_starts_or_ends_with_a_blank_line():
    assert _stray_blank_lines('def f():\n    """Does f.\n\n    """\n', "planted") == ["planted: f"]
    found = []
    for path in sorted((ROOT / "attention_lib").rglob("*.py")):
        found += _stray_blank_lines(path.read_text(), path.relative_to(ROOT))
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        for cell in nbformat.read(path, as_version=4).cells:
            if cell.cell_type == "code":                           # IPython's magics made Python first
                found += _stray_blank_lines(TransformerManager().transform_cell(cell.source), path.name)
    assert not found, f"docstrings with a blank first or last line: {found}"
