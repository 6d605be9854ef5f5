"""Committed outputs are what a fresh run gives: `make test` runs nbval in strict mode, every text
output of every cell compared with the committed one, after the named patterns of
notebooks/nbval_sanitize.cfg rewrite the volatile parts (wall times, the backend's reason, ...).
These tests hold that mechanism to account: no pattern exempts what no output needs, every cell
left uncompared says why, and an output edited by hand fails the comparison."""

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
SANITIZE = ROOT / "notebooks" / "nbval_sanitize.cfg"
IGNORE = "# NBVAL_IGNORE_OUTPUT"


def patterns():
    config = configparser.ConfigParser()
    config.read(SANITIZE)
    return {name: (config[name]["regex"], config[name]["replace"]) for name in config.sections()}


def all_outputs():
    return "\n".join("".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in c.outputs)
                     for path in NOTEBOOKS for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")


def test_every_sanitize_pattern_is_named_and_needed():
    found, outputs = patterns(), all_outputs()
    assert found, "no patterns"
    for name, (regex, _) in found.items():
        assert ":" in name, f"pattern [{name}] must say what varies after its name"
        assert re.search(regex, outputs), f"pattern [{name}] matches no committed output: it exempts nothing needed"


def test_every_uncompared_cell_says_why():
    for path in NOTEBOOKS:
        for cell in nbformat.read(path, as_version=4).cells:
            lines = cell.source.splitlines()
            for i, line in enumerate(lines):
                if line.strip() == IGNORE:
                    why = lines[i + 1].strip() if i + 1 < len(lines) else ""
                    assert why.startswith("# (why:"), f"{path.name}: {IGNORE} without '# (why: ...)' under it"


def test_an_output_edited_by_hand_fails_the_comparison(tmp_path):
    """Notebook 00 up to its first cell that prints a number, that number changed: the strict run
    must fail on it."""
    copy = tmp_path / "00_gpu_basics.ipynb"
    shutil.copy(ROOT / "notebooks" / "00_gpu_basics.ipynb", copy)
    notebook = nbformat.read(copy, as_version=4)
    cell, edited = next((c, o) for c in notebook.cells if c.cell_type == "code" and IGNORE not in c.source
                        for o in c.outputs if o.get("output_type") == "stream" and re.search(r"\d{3}", o["text"]))
    edited["text"] = re.sub(r"\d(?=\d\d)", lambda m: str((int(m.group(0)) + 1) % 10), edited["text"], count=1)
    notebook.cells = notebook.cells[:notebook.cells.index(cell) + 1]     # the cells after it add nothing here
    nbformat.write(notebook, copy)
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--nbval",
                           "--nbval-current-env", "--nbval-sanitize-with", str(SANITIZE), str(copy)],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "1 failed" in done.stdout, done.stdout[-3000:]


def test_no_cell_hides_its_value_with_a_semicolon():
    """IPython hides a last expression ending in ';' by reading its input history, which nbval's
    runs do not keep: such a cell prints its value under nbval and not in Jupyter. End with
    plt.show() or an assignment instead."""
    for path in NOTEBOOKS:
        for i, cell in enumerate(nbformat.read(path, as_version=4).cells):
            lines = [line for line in cell.source.splitlines() if line.strip() and not line.lstrip().startswith("#")]
            if cell.cell_type == "code" and lines:
                assert not lines[-1].split("#", 1)[0].rstrip().endswith(";"), f"{path.name}: cell {i} ends with ';'"
