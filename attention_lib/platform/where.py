"""Source locations a student can find: "your cell In [12], line 15" instead of IPython's file name.

A function defined in a Jupyter cell has a code file such as ``/tmp/ipykernel_4711/1101779405.py``:
IPython's name for that cell's source, which appears nowhere on the student's screen. IPython keeps
the execution count of every cell it compiled (``get_ipython().compile._filename_map``); the
prompt ``In [12]`` beside the cell shows the same number. Everything else (the library, a test
file, a script) is named by its path inside the course, or by its file name.

- ``describe(filename, lineno)``: the place in words, e.g. ``your cell In [12], line 15``.
- ``describe_file(filename)``: the file alone, e.g. ``your cell In [12]``.
- ``describe_with_code(filename, lineno)``: the same, followed by the line's code.
"""

import linecache
import os
import sys


def _cell_number(filename):
    """The execution count IPython gave the cell compiled under `filename`, or None."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    names = getattr(getattr(shell, "compile", None), "_filename_map", None) or {}
    return names.get(filename)


def describe_file(filename):
    """The file in words: "your cell In [12]", "attention_lib/stages/flash.py" or the file's name."""
    number = _cell_number(filename)
    if number is not None:
        return f"your cell In [{number}]"
    marker = f"{os.sep}attention_lib{os.sep}"
    if marker in filename:
        return f"attention_lib{os.sep}{filename.rsplit(marker, 1)[1]}"
    return os.path.basename(filename)


def describe(filename, lineno):
    """Where (filename, lineno) is, in words a student can act on."""
    place = describe_file(filename)
    return f"{place}, line {lineno}" if place.startswith("your cell") else f"{place}:{lineno}"


def describe_with_code(filename, lineno):
    """describe(), then the line's code after a colon when the source is known."""
    code = linecache.getline(filename, lineno).strip()
    return f"{describe(filename, lineno)}: {code}" if code else describe(filename, lineno)
