"""What an answer's own code is made of, read from its source: the functions it reaches, and the
Python floats in it.

- ``functions_reached(answer)``: the Python functions of the answer (a function, a kernel, or a
  tuple of them) and of every function it reaches through its globals and closure values, outside
  the library's stages (a copy of a stage function, run in names of its own, is the answer's).
- ``python_floats(answer)``: [(filename, line, text)] of every float that Python types as a
  float64 (a literal such as ``0.0``, ``math.inf``, ``float(...)``) that is not made float32 on
  the spot (``np.float32(0.0)``, ``float32(...)``): those assigned to a variable first (the
  variable becomes a float64, and so does all arithmetic with it), then those compared or stored
  (which the compiler often folds away).
"""

import ast
import inspect
import sys
import textwrap
import types

_FLOAT32 = ("float32",)
_MATH_FLOATS = ("inf", "pi", "e", "tau", "nan")


def _filled(cell):
    try:
        cell.cell_contents
    except ValueError:
        return False
    return True


def functions_reached(answer, seen=None):
    """The answer's Python functions and those they reach (see the module's docstring)."""
    seen = {} if seen is None else seen
    for part in answer if isinstance(answer, tuple) else (answer,):
        function = getattr(part, "py_func", part)
        if not isinstance(function, types.FunctionType) or id(function) in seen:
            continue
        module = sys.modules.get(function.__module__ or "")
        if (function.__module__ or "").startswith("attention_lib.stages") and module is not None \
                and function.__globals__ is vars(module):
            continue                                  # the library's own function, not a copy of it
        seen[id(function)] = function
        values = [function.__globals__.get(name) for name in function.__code__.co_names]
        values += [cell.cell_contents for cell in function.__closure__ or () if _filled(cell)]
        for value in values:
            if value is not None and isinstance(getattr(value, "py_func", value), types.FunctionType):
                functions_reached(value, seen)
    return list(seen.values())


def _float32_call(node):
    """Whether a call node makes a float32: float32(...), np.float32(...), numba.float32(...)."""
    target = node.func
    name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
    return name in _FLOAT32


def _is_python_float(node):
    if isinstance(node, ast.Constant) and isinstance(node.value, float):
        return True
    if isinstance(node, ast.Attribute) and node.attr in _MATH_FLOATS and getattr(node.value, "id", None) == "math":
        return True
    return isinstance(node, ast.Call) and getattr(node.func, "id", None) == "float"


def python_floats(answer):
    """[(filename, line, code)] of the answer's Python floats (see the module's docstring)."""
    found = []
    for function in functions_reached(answer):
        try:
            lines, first = inspect.getsourcelines(function)
        except (OSError, TypeError):
            continue
        tree = ast.parse(textwrap.dedent("".join(lines)))
        inside_float32, assigned = set(), set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and _float32_call(node):
                inside_float32.update(id(n) for arg in node.args for n in ast.walk(arg))
            targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
            if isinstance(node, (ast.Assign, ast.AugAssign)) and not any(isinstance(t, ast.Subscript) for t in targets):
                assigned.update(id(n) for n in ast.walk(node.value))
        for node in ast.walk(tree):
            if _is_python_float(node) and id(node) not in inside_float32:
                line = first + node.lineno - 1
                found.append((id(node) not in assigned, function.__code__.co_filename, line,
                              lines[node.lineno - 1].strip()))
    # A float assigned to a variable first (it makes a float64 variable); compared or stored after.
    return [f[1:] for f in sorted(set(found))]
