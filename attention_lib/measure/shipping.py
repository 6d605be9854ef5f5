"""A kernel, with everything its code reaches, sent to another process to be compiled for a GPU.

The compiler needs a process where the simulator is off, so a kernel written in a notebook (or
built by a check around a student's device function) is rebuilt there from its source. ``ship``
describes it in JSON: the source of every function it needs that no importable module holds (the
kernel, the notebook's device functions it calls, a check's kernel around the student's function),
each with the globals and closure values its code names, as references the other process can
resolve (a module, a module's attribute, a number, a constant array, another shipped function).
``rebuild`` (in the compiling process) executes each source in a namespace of its own, at its
original file name and line numbers, so what the compiler says points at the student's own lines.

A name that cannot be sent (an object of no importable module) raises ``Unshippable`` naming it;
a function whose source is unknown (made by exec from a string) raises ``SourceUnavailable``.
"""

import ast
import importlib
import inspect
import textwrap
import types

import numpy as np


class Unshippable(TypeError):
    """A function reaches an object that cannot be rebuilt in another process."""


class SourceUnavailable(Unshippable):
    """A function's source is not known (made by exec from a string, or typed at a bare prompt)."""


def _function(obj):
    """The Python function behind a kernel, device function or function (None otherwise)."""
    function = getattr(obj, "py_func", obj)
    return function if isinstance(function, types.FunctionType) else None


def _is_device(obj):
    """Whether a jitted object is a device function (a simulator one, or a GPU dispatcher)."""
    if getattr(obj, "_device", False):
        return True
    return bool(getattr(obj, "targetoptions", {}).get("device"))


def _options(obj):
    """The jit options a kernel was made with that change what the compiler makes of it."""
    bounds = getattr(obj, "launch_bounds", None) or getattr(obj, "targetoptions", {}).get("launch_bounds")
    return {"launch_bounds": list(bounds)} if bounds else {}


def importable(value):
    """("attribute", module, name) when `value` is an attribute of an importable module under its
    own name (the library's functions and constants, NumPy's types, math's functions), else None."""
    inner = _function(value) or value
    owner, name = getattr(inner, "__module__", None), getattr(inner, "__name__", None)
    if not owner or not name or owner == "__main__" or not isinstance(owner, str):
        return None
    if not owner.startswith(("attention_lib", "numba", "numpy", "math", "operator")):
        return None
    try:
        module = importlib.import_module(owner)
    except ImportError:
        return None
    return ["attribute", owner, name] if getattr(module, name, None) is value else None


def _names(code):
    """Every global name a code object (and the code nested in it) refers to."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _names(const)
    return names


def _source(fn):
    """The function's source, dedented, its decorators blanked, padded so that its lines keep their
    numbers in the original file."""
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        raise SourceUnavailable(f"the source of {fn.__name__} is not available to send to the compiler") from None
    source = textwrap.dedent("".join(lines))
    tree = ast.parse(source)
    definition = next((node for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if definition is None or definition.name != fn.__code__.co_name:
        raise Unshippable(f"{fn.__name__}: not a def statement (a lambda cannot be compiled for a GPU here)")
    body = source.splitlines(keepends=True)
    for decorator in definition.decorator_list:        # the decorators' lines, blank: rebuild applies jit
        for line in range(decorator.lineno - 1, decorator.end_lineno):
            body[line] = "\n"
    return "\n" * (max(first, 1) - 1) + "".join(body)


class _Shipper:
    def __init__(self):
        self.functions, self.index = [], {}

    def reference(self, name, value, owner):
        if isinstance(value, types.ModuleType):
            return ["module", value.__name__]
        if isinstance(value, np.generic):
            return ["numpy", value.dtype.str, value.item()]
        if isinstance(value, (bool, int, float, str, type(None))):
            return ["value", value]
        if isinstance(value, tuple) and all(isinstance(v, (bool, int, float)) for v in value):
            return ["value", list(value), "tuple"]
        if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
            return ["array", value.dtype.str, list(value.shape), value.ravel().tolist()]
        if type(value).__module__.startswith("numba") and type(value).__name__ in ("Float", "Integer", "Boolean"):
            return ["attribute", "numba.types", str(value)]
        found = importable(value)
        if found is not None:
            return found
        if _function(value) is not None:
            return ["function", self.add(value)]
        raise Unshippable(f"{owner} uses {name!r} ({type(value).__name__}), which cannot be sent to the GPU "
                          "compiler: use numbers, modules, the library's functions or your own functions")

    def add(self, obj):
        fn = _function(obj)
        if id(fn) in self.index:
            return self.index[id(fn)]
        position = len(self.functions)
        self.index[id(fn)] = position
        entry = {"name": fn.__code__.co_name, "filename": fn.__code__.co_filename, "source": _source(fn),
                 "jit": None if obj is fn else ("device" if _is_device(obj) else "kernel"),
                 "options": _options(obj), "globals": {}}
        self.functions.append(entry)
        values = {name: fn.__globals__[name] for name in sorted(_names(fn.__code__)) if name in fn.__globals__}
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
            try:
                values[name] = cell.cell_contents
            except ValueError:                          # an empty cell: a name assigned later
                continue
        for name, value in values.items():
            entry["globals"][name] = self.reference(name, value, fn.__code__.co_name)
        return position


def ship(kernel):
    """A JSON-able description of `kernel` (a kernel, a device function or a function) and of every
    function it reaches that no importable module holds; Unshippable when something can't be sent."""
    shipper = _Shipper()
    root = shipper.add(kernel)
    return {"functions": shipper.functions, "root": root}


def _resolve(reference, built):
    kind, *what = reference
    if kind == "module":
        return importlib.import_module(what[0])
    if kind == "attribute":
        return getattr(importlib.import_module(what[0]), what[1])
    if kind == "numpy":
        return np.dtype(what[0]).type(what[1])
    if kind == "value":
        return tuple(what[0]) if len(what) > 1 else what[0]
    if kind == "array":
        return np.array(what[2], dtype=np.dtype(what[0])).reshape(what[1])
    return built[what[0]]


def rebuild(shipped):
    """The kernel `ship` described, rebuilt here (a process whose Numba compiles for a GPU): every
    function executed from its source in a namespace of its own, then jitted as it was."""
    from numba import cuda
    built = {}

    def make(position):
        if position in built:
            return built[position]
        entry = shipped["functions"][position]
        for reference in entry["globals"].values():      # what it calls first
            if reference[0] == "function" and reference[1] != position:
                make(reference[1])
        namespace = {"__name__": "attention_lib_shipped", "__builtins__": __builtins__}
        namespace.update({name: _resolve(ref, built) for name, ref in entry["globals"].items()
                          if ref[0] != "function" or ref[1] != position})
        exec(compile(entry["source"], entry["filename"], "exec"), namespace)
        function = namespace[entry["name"]]
        options = dict(entry["options"])
        if "launch_bounds" in options:
            options["launch_bounds"] = tuple(options["launch_bounds"])
        if entry["jit"] == "device":
            function = cuda.jit(device=True)(function)
        elif entry["jit"] == "kernel":
            function = cuda.jit(**options)(function)
        built[position] = function
        return function

    return make(shipped["root"])
