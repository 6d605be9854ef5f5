"""Answers made from an exercise's solution: the solution as a student would write it, and its mutants.

A check is proven by its mutants: each single-point change of the solution (a comparison turned
around, a bound off by one, two indices swapped, a statement or a barrier deleted, a float32 made a
Python float...; in a plain function that counts, + and - exchanged, * made + and a constant off by
one) must be refused by the check, or be shown to compute the same thing (``scripts/mutants.py``,
``make mutants``; the equivalent ones are listed with their reason in
``tests/equivalent_mutants/NN.yml``, NN the notebook).

- ``solution_copy(exercise)``: the solution's code as a new function (a kernel, a device function
  or a plain function, as the solution is), compiled from its source in a copy of its module's
  names: what a student who wrote the library's code submits (the library's own object is refused
  as given code).
- ``mutants(exercise)``: every Mutant of the catalogue below, in a fixed order, each with an id
  (``<exercise>#<n>``), the line it changes and what it changed.
- ``build(exercise, source, label)``: an answer from a (mutated) source.
"""

import ast
import copy
import inspect
import linecache
import textwrap
from dataclasses import dataclass

from numba import cuda


def _answer_part(exercise):
    """The object the student writes: the solution, or its first part when it is a tuple."""
    solution = exercise.solution
    return solution[0] if isinstance(solution, tuple) else solution


def solution_source(exercise):
    """(source, filename, first line) of the solution's function, dedented, decorators kept."""
    function = getattr(_answer_part(exercise), "py_func", _answer_part(exercise))
    lines, first = inspect.getsourcelines(function)
    return textwrap.dedent("".join(lines)), inspect.getsourcefile(function), first


def build(exercise, source, label):
    """The answer made of `source` (the solution's function, changed or not), compiled under the
    file name `label` (its text registered there, so its lines can be shown and shipped), in a copy
    of the solution's module names, and jitted as the solution is (kernel, device function, or
    none for a plain function)."""
    part = _answer_part(exercise)
    function = getattr(part, "py_func", part)
    namespace = dict(function.__globals__)
    for name, cell in zip(function.__code__.co_freevars, function.__closure__ or ()):
        namespace[name] = cell.cell_contents
    tree = ast.parse(source)
    definition = tree.body[0]
    definition.decorator_list = []                     # jitted below, as the solution is
    code = ast.unparse(definition) + "\n"
    linecache.cache[label] = (len(code), None, code.splitlines(keepends=True), label)
    exec(compile(code, label, "exec"), namespace)
    made = namespace[definition.name]
    if part is function:
        return made
    if getattr(part, "_device", False) or getattr(part, "targetoptions", {}).get("device"):
        return cuda.jit(device=True)(made)
    bounds = getattr(part, "launch_bounds", None) or getattr(part, "targetoptions", {}).get("launch_bounds")
    return cuda.jit(launch_bounds=bounds)(made) if bounds else cuda.jit(made)


def solution_copy(exercise):
    """The solution as a new function: what a student who wrote the library's code submits."""
    source, _, _ = solution_source(exercise)
    return build(exercise, source, f"<solution of {exercise.exercise_id}>")


def variant(exercise, *changes):
    """The solution with each (old, new) text change made, built as solution_copy builds it: a planted
    answer whose every other line is the library's, so what a check says is about the change alone.
    ValueError when the solution has no `old`."""
    source, _, _ = solution_source(exercise)
    for old, new in changes:
        if old not in source:
            raise ValueError(f"the solution of {exercise.exercise_id} has no {old!r}")
        source = source.replace(old, new)
    return build(exercise, source, f"<planted answer of {exercise.exercise_id}>")


@dataclass
class Mutant:
    """One single-point change of a solution."""

    mutant_id: str           # "<exercise id>#<n>"
    line: int                # the changed line, counted in the solution's own source (1 = its first)
    at: str                  # that line's code, as the solution has it
    change: str              # what was changed, in words
    source: str              # the whole changed function

    @property
    def key(self):
        """What names the mutant across edits elsewhere in the solution: its change and its line's code."""
        return f"{self.change} @ {self.at}"


def _mutated(tree, node_index, transform):
    """A deep copy of `tree` whose node number `node_index` (ast.walk order) is transformed; None
    when the transform does not apply."""
    tree = copy.deepcopy(tree)
    for index, node in enumerate(ast.walk(tree)):
        if index == node_index:
            return tree if transform(node, tree) else None
    return None


# --- The catalogue: each operator yields (node index, description, transform) --------------------

_BOUNDARY = {ast.Lt: (ast.LtE, ast.Gt), ast.LtE: (ast.Lt, ast.GtE), ast.Gt: (ast.GtE, ast.Lt),
             ast.GtE: (ast.Gt, ast.LtE), ast.Eq: (ast.NotEq,), ast.NotEq: (ast.Eq,)}
_SYMBOL = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!="}


def _is_barrier(statement):
    call = getattr(statement, "value", None)
    return (isinstance(statement, ast.Expr) and isinstance(call, ast.Call)
            and getattr(call.func, "attr", None) == "syncthreads")


def _comparisons(node):
    if isinstance(node, ast.Compare):
        for position, op in enumerate(node.ops):
            for other in _BOUNDARY.get(type(op), ()):
                def swap(n, tree, position=position, other=other):
                    n.ops[position] = other()
                    return True
                yield f"{_SYMBOL[type(op)]} -> {_SYMBOL[other]}", swap


def _plus_minus_one(node):
    """±1 on each component of a subscript's index and on each argument of range()."""
    places = []
    if isinstance(node, ast.Subscript) and getattr(node.value, "attr", None) != "shape":   # not an axis number
        parts = node.slice.elts if isinstance(node.slice, ast.Tuple) else [node.slice]
        places = [(parts, i) for i, p in enumerate(parts) if not isinstance(p, ast.Slice)]
    elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "range":
        places = [(node.args, i) for i in range(len(node.args))]
    for where, i in places:
        for delta, sign in ((1, "+"), (-1, "-")):
            def shift(n, tree, where=where, i=i, delta=delta, sign=sign):
                target = _same(n, tree, where)
                target[i] = ast.BinOp(target[i], ast.Add() if delta > 0 else ast.Sub(), ast.Constant(1))
                return True
            yield f"{ast.unparse(where[i])} -> {ast.unparse(where[i])} {sign} 1", shift


def _same(node, tree, where):
    """The list of `node` (in the copied tree) that corresponds to `where` (a list of the original)."""
    if isinstance(node, ast.Subscript):
        return node.slice.elts if isinstance(node.slice, ast.Tuple) else _SliceList(node)
    return node.args


class _SliceList(list):
    """A subscript's single index as a list of one, writing back into the subscript."""

    def __init__(self, node):
        super().__init__([node.slice])
        self.node = node

    def __setitem__(self, i, value):
        self.node.slice = value


def _swapped_indices(node):
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Tuple) and len(node.slice.elts) >= 2:
        for i in range(len(node.slice.elts) - 1):
            def swap(n, tree, i=i):
                elts = n.slice.elts
                elts[i], elts[i + 1] = elts[i + 1], elts[i]
                return True
            yield f"indices {i} and {i + 1} of {ast.unparse(node)} swapped", swap


def _swapped_arguments(node):
    if isinstance(node, ast.Call) and len(node.args) >= 2 and getattr(node.func, "id", None) != "range":
        for i in range(len(node.args) - 1):
            def swap(n, tree, i=i):
                n.args[i], n.args[i + 1] = n.args[i + 1], n.args[i]
                return True
            yield f"arguments {i} and {i + 1} of {ast.unparse(node.func)}(...) swapped", swap


def _python_float(node):
    if isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "float32" \
            and len(node.args) == 1:
        def unwrap(n, tree):
            for parent in ast.walk(tree):
                for name, value in ast.iter_fields(parent):
                    if value is n:
                        setattr(parent, name, ast.Call(ast.Name("float", ast.Load()), n.args, []))
                        return True
                    if isinstance(value, list) and any(v is n for v in value):
                        value[[i for i, v in enumerate(value) if v is n][0]] = ast.Call(
                            ast.Name("float", ast.Load()), n.args, [])
                        return True
            return False
        yield f"{ast.unparse(node)} -> float({ast.unparse(node.args[0])})", unwrap


def _statements(node):
    """Each statement deleted (replaced by pass); each barrier moved into the if before or after it."""
    for field in ("body", "orelse"):
        body = getattr(node, field, None)
        if not isinstance(body, list) or isinstance(node, ast.FunctionDef) and field == "orelse":
            continue
        for i, statement in enumerate(body):
            if isinstance(statement, ast.Pass) or (isinstance(statement, ast.Expr)
                                                   and isinstance(statement.value, ast.Constant)):
                continue                               # a docstring or a pass: deleting changes nothing
            def delete(n, tree, field=field, i=i):
                getattr(n, field)[i] = ast.Pass()
                return True
            label = "barrier" if _is_barrier(statement) else "statement"
            yield f"{label} deleted: {ast.unparse(statement).splitlines()[0]}", delete, statement.lineno
            if _is_barrier(statement):
                for j, end in ((i - 1, "end"), (i + 1, "start")):
                    if 0 <= j < len(body) and isinstance(body[j], ast.If):
                        def move(n, tree, field=field, i=i, j=j, end=end):
                            statements = getattr(n, field)
                            barrier = statements[i]
                            if end == "end":
                                statements[j].body.append(barrier)
                            else:
                                statements[j].body.insert(0, barrier)
                            del statements[i]
                            return True
                        side = "before" if j < i else "after"
                        yield f"barrier moved into the {end} of the if {side} it", move, statement.lineno


def _simulator_constants(node):
    """A shape constant (THREADS_PER_ROW, BLOCK_Q, ...) replaced by its value on the simulator."""
    from attention_lib.checks import shapes
    names = {name: pair[0] for constants in shapes.stage_constants().values() for name, pair in constants.items()
             if not isinstance(pair[0], tuple)}
    if isinstance(node, ast.Name) and node.id in names and isinstance(node.ctx, ast.Load):
        value = names[node.id]

        def replace(n, tree):
            for parent in ast.walk(tree):
                for name, field_value in ast.iter_fields(parent):
                    if field_value is n:
                        setattr(parent, name, ast.Constant(value))
                        return True
                    if isinstance(field_value, list) and any(v is n for v in field_value):
                        field_value[[i for i, v in enumerate(field_value) if v is n][0]] = ast.Constant(value)
                        return True
            return False
        yield f"{node.id} -> {value}", replace


def _replace_node(tree, node, new):
    """Put `new` where `node` stands in `tree`; False when it is not found."""
    for parent in ast.walk(tree):
        for name, value in ast.iter_fields(parent):
            if value is node:
                setattr(parent, name, new)
                return True
            if isinstance(value, list) and any(v is node for v in value):
                value[[i for i, v in enumerate(value) if v is node][0]] = new
                return True
    return False


def _block_dropped(node):
    """A design slip, not a token's: the block's place dropped from an index, as if the launch had
    one block (cuda.blockIdx.x -> 0; cuda.grid(n) -> the thread's place in its block)."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Attribute) \
            and node.value.attr == "blockIdx" and node.attr in "xyz":
        yield f"{ast.unparse(node)} -> 0", lambda n, tree: _replace_node(tree, n, ast.Constant(0))
    if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "grid" and len(node.args) == 1 \
            and isinstance(node.args[0], ast.Constant) and node.args[0].value in (1, 2, 3):
        axes = "xyz"[:node.args[0].value]
        threads = [ast.parse(f"cuda.threadIdx.{a}", mode="eval").body for a in axes]
        local = threads[0] if len(threads) == 1 else ast.Tuple(threads, ast.Load())
        yield (f"{ast.unparse(node)} -> {ast.unparse(local)}",
               lambda n, tree, local=local: _replace_node(tree, n, copy.deepcopy(local)))


def _walk_from_zero(node):
    """A design slip: a loop that starts at 0 instead of where this thread's share, or this block's
    band, starts (range(first, end, step) -> range(0, end, step)): every thread walks the same
    elements, or a block walks tiles it never needed."""
    if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "range" and len(node.args) >= 2 \
            and not (isinstance(node.args[0], ast.Constant) and node.args[0].value == 0):
        def from_zero(n, tree):
            n.args[0] = ast.Constant(0)
            return True
        yield f"range({ast.unparse(node.args[0])}, ...) -> range(0, ...)", from_zero


_ARITHMETIC = {ast.Add: (ast.Sub, "+", "-"), ast.Sub: (ast.Add, "-", "+"), ast.Mult: (ast.Add, "*", "+")}


def _arithmetic(node):
    """A formula's slips, for plain functions that count (a kernel's arithmetic is checked by its
    values): + and - exchanged, * made +, and each integer constant off by one."""
    if isinstance(node, ast.BinOp) and type(node.op) in _ARITHMETIC:
        other, before, after = _ARITHMETIC[type(node.op)]

        def exchange(n, tree, other=other):
            n.op = other()
            return True
        yield f"{before} -> {after} in {ast.unparse(node)}", exchange
    if isinstance(node, ast.Constant) and type(node.value) is int:
        for delta in (1, -1):
            def shift(n, tree, delta=delta):
                n.value += delta
                return True
            yield f"{node.value} -> {node.value + delta}", shift


_ORDINALS = ("1st", "2nd", "3rd", "4th", "5th", "6th", "7th", "8th", "9th", "nth")

OPERATORS = (_comparisons, _plus_minus_one, _swapped_indices, _swapped_arguments, _python_float, _statements,
             _simulator_constants, _block_dropped, _walk_from_zero)


def mutants(exercise):
    """Every Mutant of the solution of `exercise`, in a fixed order (ast.walk order, then operator)."""
    plain = not hasattr(_answer_part(exercise), "py_func")
    operators = OPERATORS + ((_arithmetic,) if plain else ())
    source, _, _ = solution_source(exercise)
    tree = ast.parse(source)
    definition = tree.body[0]
    lines = source.splitlines()
    found, seen = [], {ast.unparse(definition)}
    for index, node in enumerate(ast.walk(definition)):
        for operator in operators:
            for change, transform, *at_line in operator(node):
                mutated = _mutated(ast.Module([definition], []), index + 1, transform)
                if mutated is None:
                    continue
                text = ast.unparse(mutated)
                if text in seen:
                    continue
                seen.add(text)
                line = at_line[0] if at_line else getattr(node, "lineno", definition.lineno)
                at = lines[line - 1].strip()
                same = sum(1 for m in found if m.at == at and m.change.split(" (")[0] == change)
                if same:                              # a second "< -> <=" on one line: its own key
                    change = f"{change} ({_ORDINALS[min(same, len(_ORDINALS) - 1)]} on the line)"
                found.append(Mutant(f"{exercise.exercise_id}#{len(found) + 1}", line, at, change, text + "\n"))
    return found
