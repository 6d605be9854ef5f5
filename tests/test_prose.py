"""Plain prose (COURSE.md, "Prose"): short sentences, one idea each, few long ones, lists where a
sentence would chain colons.

A notebook's markdown is measured the way a reader meets it: fenced code, inline code and $math$
count as one word each; headings are left out; a sentence ends at . ! ? or a paragraph break, and
each list item is a sentence of its own; pieces of fewer than 3 words are not sentences. A
plain-English technical text averages about 15-20 words a sentence.
"""

import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
MOST_WORDS_A_SENTENCE = 20.0
MOST_LONG_SENTENCES, LONG = 3, 35
MOST_COLONS_A_SENTENCE = 0.5


def sentences(markdown):
    """The sentences of a markdown text, as described above."""
    text = re.sub(r"```.*?```", " X ", markdown, flags=re.S)
    text = re.sub(r"`[^`]*`", "X", text)
    text = re.sub(r"\$\$.*?\$\$|\$[^$]*\$", "X", text, flags=re.S)
    text = re.sub(r"^#+.*$", "", text, flags=re.M)
    pieces = re.split(r"(?<=[.!?])\s+|\n\s*\n|\n\s*(?:[-*]|\d+\.)\s+", text)
    return [piece for piece in pieces if len(piece.split()) >= 3]


def prose(path):
    """(sentences, words a sentence, sentences over LONG words, colons and semicolons a sentence)."""
    cells = nbformat.read(path, as_version=4).cells
    found = sentences("\n\n".join(c.source for c in cells if c.cell_type == "markdown"))
    words = [len(s.split()) for s in found]
    marks = sum(s.count(":") + s.count(";") for s in found)
    return len(found), sum(words) / len(found), sum(w > LONG for w in words), marks / len(found)


def test_sentences_split_as_a_reader_reads_them():
    text = "# A heading\n\nOne short sentence here. A second one, with `code()` and $x_i$ in it!\n\n" \
           "- a list item of words\n- ok\n\n```python\nprint('not prose. at all.')\n```"
    assert sentences(text) == ["One short sentence here.", "A second one, with X and X in it!",
                               "- a list item of words"]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_a_notebooks_sentences_are_short(path):
    count, mean, long, marks = prose(path)
    assert mean <= MOST_WORDS_A_SENTENCE, f"{path.name}: {mean:.1f} words a sentence over {count} sentences"
    assert long <= MOST_LONG_SENTENCES, f"{path.name}: {long} sentences over {LONG} words"
    assert marks <= MOST_COLONS_A_SENTENCE, f"{path.name}: {marks:.2f} colons and semicolons a sentence"
