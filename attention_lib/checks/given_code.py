"""Whether an answer uses the library code it was asked to write, read from the answer's code.

An exercise names its given code (its solution, and the library code that would do the work);
an answer that reaches any of it is refused before it runs (``calls_given_code``). What counts:
the objects the answer's code names (its globals, closure values, and attributes of modules among
them, such as ``softmax.block_reduce``), in turn through every function it calls; and the ways of
reaching an object without naming it (``getattr`` with a computed name, ``vars``, ``globals``,
``__dict__``, ``eval``, ``exec``, ``__import__``, ``importlib``, ``sys.modules``), which no
kernel needs and which a GPU's compiler mostly refuses anyway.

- ``given_code_used(answer, given) -> (object or None, how)``.
"""

import dis
import types

# Names whose use lets code reach an object without naming it.
INDIRECT = ("getattr", "vars", "globals", "locals", "eval", "exec", "__import__", "__dict__", "importlib", "modules",
            "compile")


def _function(obj):
    """The Python function behind a kernel, device function or plain function (None otherwise)."""
    function = getattr(obj, "py_func", obj)
    return function if callable(function) and hasattr(function, "__code__") else None


def _codes(code):
    """A code object and every code object nested in it (lambdas, inner functions, comprehensions)."""
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _names_used(function):
    """The objects a function's code reads: its globals, and the attributes it reads of a module
    among them (``softmax.block_reduce``), nested functions and lambdas included."""
    for code in _codes(function.__code__):
        last = None                                           # the value the previous load put on the stack
        for instruction in dis.get_instructions(code):
            name = instruction.argval if isinstance(instruction.argval, str) else None
            if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME") and name in function.__globals__:
                last = function.__globals__[name]
                yield last
            elif instruction.opname in ("LOAD_ATTR", "LOAD_METHOD") and isinstance(last, types.ModuleType):
                last = getattr(last, name, None)
                if last is not None:
                    yield last
            else:
                last = None


def _indirect(function):
    """The first name of INDIRECT that the function's code uses, or None."""
    for code in _codes(function.__code__):
        for name in code.co_names:
            if name in INDIRECT:
                return name
    return None


def _closure_values(function):
    values = []
    for cell in function.__closure__ or ():
        try:
            values.append(cell.cell_contents)
        except ValueError:                                    # an empty closure cell
            pass
    return values


def given_code_used(answer, given):
    """(the first of `given` (library objects) that the answer uses, "") through any function it calls
    or any module attribute it names; (None, name) when it reaches objects by a computed name
    (``name`` is the construct, e.g. "getattr"); (None, "") when it uses none of them."""
    given_functions = {id(_function(o)): o for o in given if _function(o) is not None}
    given_objects = {id(o): o for o in given}
    seen = set()

    def hit(value):
        return given_objects.get(id(value)) or given_functions.get(id(_function(value)))

    def visit(obj):
        function = _function(obj)
        if function is None or id(function) in seen:
            return None, ""
        seen.add(id(function))
        module = getattr(function, "__module__", None) or ""
        if not module.startswith("attention_lib"):
            indirect = _indirect(function)
            if indirect:
                return None, indirect
        for value in list(_names_used(function)) + _closure_values(function):
            if hit(value) is not None:
                return hit(value), ""
            module = getattr(_function(value), "__module__", None) or ""
            if _function(value) is not None and not module.startswith(("numba", "numpy")):
                found = visit(value)                          # what it calls, in turn
                if found != (None, ""):
                    return found
        return None, ""

    for part in answer if isinstance(answer, tuple) else (answer,):
        if hit(part) is not None:
            return hit(part), ""
        found = visit(part)
        if found != (None, ""):
            return found
    return None, ""

