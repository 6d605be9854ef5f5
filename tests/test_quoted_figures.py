"""A figure a notebook's text quotes from an output is the figure the output shows.

notebooks/quoted_figures/<notebook>.yml lists, for its notebook, each number its markdown quotes from a code
cell's output (its own, or another notebook's: `from`): a regex for the phrase in the markdown and
one for the line in the output, each with one group around the number, and a relative tolerance
for a rounded quote (0: equal once both are read as numbers). nbval compares every output with a
fresh run; this compares the text with the outputs, so neither can drift from what the code prints.
"""

import re
from pathlib import Path

import nbformat
import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
TABLES = NOTEBOOKS / "quoted_figures"
SUPERSCRIPTS = str.maketrans("⁻⁰¹²³⁴⁵⁶⁷⁸⁹", "-0123456789")


def number(text):
    """A number as the notebooks write it: 1,234; 9.3e-07; 9.3·10⁻⁷; 9.3 × 10⁻⁷; −2; 43 %; 2.5x."""
    text = text.strip().replace("\u2212", "-").replace(",", "").replace("\u202f", "").replace(" ", "")
    power = re.fullmatch(r"(-?[\d.]+)(?:·|×|x)10([⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+)", text)
    if power:
        return float(power.group(1)) * 10 ** int(power.group(2).translate(SUPERSCRIPTS))
    if re.fullmatch(r"10[⁻⁰¹²³⁴⁵⁶⁷⁸⁹]+", text):
        return 10.0 ** int(text[2:].translate(SUPERSCRIPTS))
    return float(text.rstrip("%x"))


def texts(path):
    """(markdown cells' text, code outputs' text) of one notebook."""
    cells = nbformat.read(path, as_version=4).cells
    markdown = "\n\n".join(c.source for c in cells if c.cell_type == "markdown")
    outputs = "\n".join("".join(o.get("text", "") + str(o.get("data", {}).get("text/plain", "")) for o in c.outputs)
                        for c in cells if c.cell_type == "code")
    return markdown, outputs


def mismatches(entry, markdown, outputs):
    """What is wrong with one entry, in words (an empty list when the quote holds)."""
    quoted = [m.group(1) for m in re.finditer(entry["text"], markdown)]
    printed = {m.group(1) for m in re.finditer(entry["output"], outputs)}
    if not quoted:
        return [f"the text has no {entry['text']!r}"]
    if len(printed) != 1:
        return [f"the outputs have {len(printed)} different figures for {entry['output']!r}: {sorted(printed)}"]
    value, tolerance = number(printed.pop()), float(entry.get("tolerance", 0))
    return [f"the text quotes {q} where the output shows {value:g} ({entry['text']!r})" for q in quoted
            if abs(number(q) - value) > tolerance * abs(value)]


def table():
    """{notebook file name: [entries]} from one YAML file per notebook."""
    return {f"{path.stem}.ipynb": yaml.safe_load(path.read_text()) or [] for path in sorted(TABLES.glob("*.yml"))}


def test_every_notebook_of_the_table_exists_and_every_entry_is_complete():
    names = {p.name for p in NOTEBOOKS.glob("*.ipynb")}
    for name, entries in table().items():
        assert name in names, f"quoted_figures/{name[:-6]}.yml is named after no notebook"
        for entry in entries:
            assert {"text", "output"} <= set(entry) <= {"text", "output", "tolerance", "from"}, entry
            assert entry.get("from", name) in names, entry
            assert re.compile(entry["text"]).groups == 1 and re.compile(entry["output"]).groups == 1, entry


@pytest.mark.parametrize("name", sorted(table()))
def test_the_text_quotes_the_figures_the_outputs_show(name):
    markdown, outputs = texts(NOTEBOOKS / name)
    problems = []
    for entry in table()[name]:
        source_outputs = outputs if "from" not in entry else texts(NOTEBOOKS / entry["from"])[1]
        problems += mismatches(entry, markdown, source_outputs)
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("written, value", [("1,234", 1234), ("9.3e-07", 9.3e-7), ("9.3·10⁻⁷", 9.3e-7),
                                            ("2.2 × 10⁻⁹", 2.2e-9), ("10⁻⁹", 1e-9), ("\u22122", -2),
                                            ("43 %", 43), ("7.2x", 7.2)])
def test_numbers_are_read_as_the_notebooks_write_them(written, value):
    assert number(written) == pytest.approx(value)


def test_a_changed_quote_or_a_changed_output_is_found():
    entry = {"text": r"largest error ([\d.]+·10[⁻\d¹²³⁴⁵⁶⁷⁸⁹⁰]+)", "output": r"largest error ([\d.e-]+)"}
    assert mismatches(entry, "the largest error 9.3·10⁻⁷ here", "largest error 9.3e-07\n") == []
    assert mismatches(entry, "the largest error 1.6·10⁻⁶ here", "largest error 9.3e-07\n") == [
        "the text quotes 1.6·10⁻⁶ where the output shows 9.3e-07 ('largest error ([\\\\d.]+·10[⁻\\\\d¹²³⁴⁵⁶⁷⁸⁹⁰]+)')"]
    assert mismatches(entry, "the largest error 9.3·10⁻⁷ here", "largest error 9.4e-07\n")
    assert mismatches(entry, "no figure", "largest error 9.3e-07\n") == [f"the text has no {entry['text']!r}"]
    rounded = {**entry, "tolerance": 0.05}
    assert mismatches(rounded, "largest error 9.3·10⁻⁷", "largest error 9.61e-07\n") == []
