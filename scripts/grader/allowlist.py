"""What of an answer cell a grading run executes: its source, when it parses against the allowlist.

An answer cell may hold only:
- function definitions (a kernel decorated with ``cuda.jit``, or ``cuda.jit(...)`` with constant
  options; a NumPy function without decorators), their bodies in the restricted subset below;
- assignments of a name at the cell's top level, and expressions, in the same subset;
- imports, at the cell's top level, from the modules an answer may use (``ANSWER_MODULES``).

The restricted subset is RestrictedPython's policy (no name or attribute that starts with ``_``,
no ``exec`` or ``eval``), and besides it:
- a name read is a local, an argument, a name the answer defines, a name the notebook's own cells
  bind before the answer (never the checker's: ``check``, ``record``, ``attention_lib``, ...), or
  one of ``BUILTINS``; a name bound to a module is used only to read attributes from it, and a
  module reached that way is one of ``ANSWER_MODULES``;
- an attribute or item is assigned only on a name local to the function that assigns it;
- no ``import`` inside a function, no ``global`` or ``nonlocal``, no class, no default argument that
  is not a constant (or a name the notebook gives); no name of the notebook's is rebound;
- of a library stage module, a name and nothing of it; no attribute that opens raw memory, files
  or frames (``REFUSED_ATTRIBUTES``), whatever holds it.

``parse(source, given, defined=(), own=()) -> Parsed``: ``Parsed.problems`` is a list of
``(line, construct)``, empty when the answer may run; ``Parsed.names`` the names it defines.
``given`` is ``Given`` (``given_names(cells)``): what the notebook's cells bind before the answer.
"""

import ast
import builtins
import importlib
import types
from dataclasses import dataclass, field

from RestrictedPython import compile_restricted_exec

# The modules an answer may import from or reach attributes of: NumPy (but its doors to C and to
# files of code), math, Numba's types and CUDA, and the course's stage modules (the helpers a
# notebook gives; a check refuses an answer that calls the exercise's own library code).
ANSWER_MODULES = ("numpy", "math", "cmath", "numba", "numba.cuda", "attention_lib.stages",
                  "attention_lib.platform.launch")
# RestrictedPython's refusals that a NumPy or kernel answer needs (out[i] += x): the rule below on
# what may be assigned stands in for them.
RESTRICTED_PYTHON_ALLOWS = ("Augmented assignment of object items and slices",)
REFUSED_MODULES = ("numpy.ctypeslib", "numpy.f2py", "numpy.testing", "numpy.distutils", "numba.core", "numba.misc",
                   "numba.cuda.cudadrv")
STAGES = "attention_lib.stages"
# The checker's names: never readable from an answer, whatever the notebook binds.
CHECKER_NAMES = {"check", "hint", "reveal", "record", "engine", "EXERCISES", "attention_lib", "get_ipython",
                 "display", "In", "Out", "exit", "quit"}
# Attributes that open a door to raw memory, to files or to frames, whatever object holds them: no
# answer needs them (np.memmap of /proc/self/mem, as_strided past an array's end, a device array
# made from an address).
REFUSED_ATTRIBUTES = {"ctypes", "ctypeslib", "f2py", "py_func", "gi_frame", "gi_code", "cr_frame", "ag_frame",
                      "tb_frame", "f_globals", "f_locals", "f_back", "mro", "as_strided", "memmap", "open_memmap",
                      "fromfile", "tofile", "load", "save", "savez", "savez_compressed", "loadtxt", "savetxt",
                      "genfromtxt", "fromregex", "DataSource", "from_cuda_array_interface", "as_cuda_array",
                      "open_ipc_array", "external_stream"}
BUILTINS = {"abs", "all", "any", "bool", "complex", "dict", "divmod", "enumerate", "filter", "float", "frozenset",
            "int", "isinstance", "iter", "len", "list", "map", "max", "min", "next", "pow", "print", "range",
            "reversed", "round", "set", "slice", "sorted", "str", "sum", "tuple", "zip", "chr", "ord", "abs",
            "True", "False", "None", "NotImplemented", "Ellipsis"}
BUILTINS |= {name for name, value in vars(builtins).items()
             if isinstance(value, type) and issubclass(value, Exception) and not name.startswith("_")}


@dataclass
class Given:
    """What the notebook's own cells bind before an answer: every name bound (names), the module a
    name is (modules), the module a name was imported from (sources)."""

    names: dict = field(default_factory=dict)         # name -> True
    modules: dict = field(default_factory=dict)       # name -> the module it is, when it is one
    sources: dict = field(default_factory=dict)       # name -> the module it was imported from


@dataclass
class Parsed:
    problems: list
    names: set


def _allowed_module(path):
    if any(path == r or path.startswith(r + ".") for r in REFUSED_MODULES):
        return False
    return any(path == m or path.startswith(m + ".") for m in ANSWER_MODULES)


def _is_module(path):
    """Whether the dotted `path` names a module (importing what it takes to know)."""
    try:
        return importlib.util.find_spec(path) is not None
    except (ImportError, ValueError, AttributeError):
        return False


def _resolve(module, attribute):
    """The module path `module.attribute` leads to, or None when it is not a module (or unknown)."""
    try:
        value = getattr(importlib.import_module(module), attribute)
    except Exception:  # noqa: BLE001 (a module that does not import here is no module an answer reaches)
        return f"{module}.{attribute}" if _is_module(f"{module}.{attribute}") else None
    return value.__name__ if isinstance(value, types.ModuleType) else None


def _bind_import(node, given):
    """Record what an import statement of the notebook's cells binds."""
    if isinstance(node, ast.Import):
        for alias in node.names:
            name = alias.asname or alias.name.split(".")[0]
            given.names[name] = True
            given.modules[name] = alias.name if alias.asname else alias.name.split(".")[0]
    elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
        for alias in node.names:
            name = alias.asname or alias.name
            given.names[name] = True
            given.sources[name] = node.module
            module = _resolve(node.module, alias.name)
            if module:
                given.modules[name] = module
            else:
                given.modules.pop(name, None)


def given_names(sources):
    """Given: the top-level names that `sources` (the notebook's own code cells, in order) bind."""
    given = Given()
    for source in sources:
        try:
            tree = ast.parse(source)
        except SyntaxError:
            continue
        for node in tree.body:
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                _bind_import(node, given)
            else:
                for name in _stored(node, top=True):
                    given.names[name] = True
                    given.modules.pop(name, None)
                    given.sources.pop(name, None)
    return given


def _stored(node, top=False):
    """The names a statement binds in its own scope (not inside nested functions)."""
    found = []
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    stack = [node]
    while stack:
        item = stack.pop()
        if isinstance(item, ast.Name) and isinstance(item.ctx, (ast.Store, ast.Del)):
            found.append(item.id)
        elif isinstance(item, (ast.Import, ast.ImportFrom)):
            found += [(a.asname or a.name).split(".")[0] for a in item.names]
        elif isinstance(item, ast.ExceptHandler) and item.name:
            found.append(item.name)
        if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.append(item.name)
            continue
        if isinstance(item, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)) and not top:
            continue
        stack.extend(ast.iter_child_nodes(item))
    return found


def _chain(node):
    """(root name, [attributes]) of a chain a.b.c, or (None, []) when it does not start at a name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    return (node.id, list(reversed(parts))) if isinstance(node, ast.Name) else (None, [])


def _constant(node):
    """Whether a default argument is a constant: a literal, a negated one, a tuple of them."""
    if isinstance(node, ast.Constant):
        return True
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        return _constant(node.operand)
    if isinstance(node, ast.Tuple):
        return all(_constant(e) for e in node.elts)
    return False


def _decorator_ok(node, given):
    """@cuda.jit or @cuda.jit(constant options), with cuda the notebook's numba.cuda."""
    call = node if isinstance(node, ast.Call) else None
    target = call.func if call else node
    root, attributes = _chain(target)
    if root is None or attributes != ["jit"] or not given.modules.get(root, "").startswith("numba.cuda"):
        return False
    return call is None or (all(_constant(a) for a in call.args) and all(_constant(k.value) for k in call.keywords))


class _Reader:
    """Walks one answer cell, collecting (line, construct) problems."""

    def __init__(self, given, defined):
        self.given, self.defined, self.problems = given, set(defined), []

    def problem(self, node, what):
        self.problems.append((getattr(node, "lineno", 0), what))

    # --- names -----------------------------------------------------------------------------
    def readable(self, name, local):
        if name in local or name in self.defined:
            return True
        if name in CHECKER_NAMES:
            return False
        if name in self.given.names:
            source = self.given.sources.get(name)
            module = self.given.modules.get(name)
            if module is not None:
                return _allowed_module(module)
            return source is None or _allowed_module(source)
        return name in BUILTINS or self.from_stage(name)

    def from_stage(self, name):
        """Whether `name` is a constant or function of a stage module the notebook imports (a check
        may run an answer among its stage module's names)."""
        modules = {m for m in list(self.given.modules.values()) + list(self.given.sources.values())
                   if m and m.startswith("attention_lib.stages")}
        for module in sorted(modules):
            try:
                value = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError):
                continue
            return not isinstance(value, types.ModuleType)
        return False

    def name_problem(self, node, local):
        name = node.id
        if self.readable(name, local):
            return
        if name in CHECKER_NAMES or name in self.given.names:
            self.problem(node, f"reads {name}, which an answer may not use")
        elif hasattr(builtins, name):
            self.problem(node, f"calls the built-in {name}, which an answer may not use")
        else:
            self.problem(node, f"reads {name}, which neither the answer nor the notebook defines")

    def chain_problem(self, node, local):
        """A chain a.b.c: no refused attribute; from a module of the notebook's or the answer's, each
        module it reaches allowed; from the library's stage modules, a name and nothing of it (an
        answer calls the helpers and reads the constants the notebook gives, it never reaches into
        them: a method that changes the library's data is a way to bend a check)."""
        root, attributes = _chain(node)
        for attribute in attributes:
            if attribute in REFUSED_ATTRIBUTES:
                self.problem(node, f"reads the attribute {attribute}, which an answer may not use")
                return
        if root is None or root in local:
            return
        module, source = self.given.modules.get(root), self.given.sources.get(root) or ""
        if module is None:
            if source.startswith(STAGES) and attributes:
                self.problem(node, f"reads {root}.{attributes[0]}: of a name the library gives, an answer "
                                   "reads no attribute")
            return
        for depth, attribute in enumerate(attributes):
            reached = _resolve(module, attribute)
            if reached is None:
                if module.startswith(STAGES) and depth + 1 < len(attributes):
                    self.problem(node, f"reads {'.'.join([root] + attributes[:depth + 2])}: of a name the "
                                       "library gives, an answer reads no attribute")
                return
            if not _allowed_module(reached):
                self.problem(node, f"reaches the module {reached}, which an answer may not use")
                return
            module = reached

    # --- statements ------------------------------------------------------------------------
    def top(self, tree):
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                self.function(node, set())
            elif isinstance(node, (ast.Import, ast.ImportFrom)):
                self.top_import(node)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    for item in ast.walk(target):
                        if isinstance(item, (ast.Attribute, ast.Subscript)):
                            self.problem(item, "assigns an attribute or item of a name that is not the answer's own")
                        elif (isinstance(item, ast.Name) and isinstance(item.ctx, ast.Store)
                              and (item.id in self.given.names or item.id in CHECKER_NAMES)):
                            self.problem(item, f"rebinds {item.id}, a name of the notebook's")
                self.body([node], set(), top=True)
                self.defined |= set(_stored(node, top=True))
            elif isinstance(node, (ast.Expr, ast.Pass)):
                self.body([node], set(), top=True)
            else:
                self.problem(node, f"a {type(node).__name__} statement at the cell's top level")

    def top_import(self, node):
        if isinstance(node, ast.ImportFrom):
            if node.level or not node.module or not _allowed_module(node.module):
                self.problem(node, f"imports from {node.module or '.'}, which an answer may not use")
                return
            for alias in node.names:
                reached = _resolve(node.module, alias.name)
                name = alias.asname or alias.name
                if alias.name == "*" or alias.name.startswith("_") or (reached and not _allowed_module(reached)):
                    self.problem(node, f"imports {alias.name} from {node.module}, which an answer may not use")
                elif name in CHECKER_NAMES:
                    self.problem(node, f"rebinds {name}, a name of the notebook's")
                else:
                    self.defined.add(name)
                    if reached:
                        self.given.modules[name] = reached
                    else:
                        self.given.sources[name] = node.module
        else:
            for alias in node.names:
                if not _allowed_module(alias.name):
                    self.problem(node, f"imports {alias.name}, which an answer may not use")
                    continue
                name = alias.asname or alias.name.split(".")[0]
                if name in CHECKER_NAMES:
                    self.problem(node, f"rebinds {name}, a name of the notebook's")
                    continue
                self.defined.add(name)
                self.given.modules[name] = alias.name if alias.asname else alias.name.split(".")[0]

    def function(self, node, outer):
        for decorator in node.decorator_list:
            if not _decorator_ok(decorator, self.given):
                self.problem(decorator, f"decorates {node.name} with {ast.unparse(decorator)}: an answer's only "
                                        "decorator is cuda.jit, with constant options")
        if node.name in CHECKER_NAMES or (node.name in self.given.names and node.name not in self.defined
                                          and not outer and node.name not in self.own):
            self.problem(node, f"defines {node.name}, a name of the notebook's")
        if not outer:
            self.defined.add(node.name)
        self.arguments(node.args)
        local = set(outer) | {a.arg for a in self._all_args(node.args)}
        for statement in node.body:
            local |= set(_stored(statement))
        self.body(node.body, local)

    def arguments(self, args):
        for default in list(args.defaults) + [d for d in args.kw_defaults if d is not None]:
            notebooks = (isinstance(default, ast.Name) and default.id in self.given.names
                         and default.id not in CHECKER_NAMES and default.id not in self.given.modules)
            if not _constant(default) and not notebooks:
                self.problem(default, f"a default argument that is not a constant ({ast.unparse(default)})")

    @staticmethod
    def _all_args(args):
        return args.posonlyargs + args.args + args.kwonlyargs + [a for a in (args.vararg, args.kwarg) if a]

    def body(self, statements, local, top=False):
        for statement in statements:
            self.node(statement, local, top)

    def node(self, node, local, top):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            self.problem(node, "an import inside a function")
            return
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            self.problem(node, f"a {type(node).__name__.lower()} statement")
            return
        if isinstance(node, (ast.ClassDef, ast.AsyncFunctionDef, ast.Await, ast.AsyncFor, ast.AsyncWith)):
            self.problem(node, f"a {type(node).__name__} (an answer has none)")
            return
        if isinstance(node, ast.FunctionDef):
            self.function(node, local)
            return
        if isinstance(node, ast.Lambda):
            self.arguments(node.args)
            self.node(node.body, local | {a.arg for a in self._all_args(node.args)}, top)
            return
        if isinstance(node, (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)):
            inner = set(local)
            for generator in node.generators:
                inner |= {n.id for n in ast.walk(generator.target) if isinstance(n, ast.Name)}
            for child in ast.iter_child_nodes(node):
                self.node(child, inner, top)
            return
        if isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(node.ctx, (ast.Store, ast.Del)):
            root = node.value
            if not (isinstance(root, ast.Name) and root.id in local and not top):
                self.problem(node, f"assigns {ast.unparse(node)}, which is not a name local to a function")
        if isinstance(node, ast.Attribute):
            self.chain_problem(node, local)
            root, attributes = _chain(node)
            if root is not None:
                if not self.readable(root, local):
                    self.name_problem(ast.copy_location(ast.Name(id=root, ctx=ast.Load()), node), local)
                return
        elif isinstance(node, ast.Name):
            if isinstance(node.ctx, ast.Load):
                if not self.readable(node.id, local):
                    self.name_problem(node, local)
                elif self.given.modules.get(node.id) and node.id not in local:
                    self.problem(node, f"uses the module {node.id} as a value (only its attributes may be read)")
            return
        for child in ast.iter_child_nodes(node):
            self.node(child, local, top)


def parse(source, given, defined=(), own=()):
    """Parsed(problems, names) of an answer cell's `source` against the allowlist; `defined`: names
    the student's earlier answers define; `own`: the names the released answer cell defines."""
    try:
        tree = ast.parse(source)
    except SyntaxError as error:
        return Parsed([(error.lineno or 0, f"Python cannot read it ({error.msg})")], set())
    restricted = compile_restricted_exec(source)
    problems = []
    for message in restricted.errors:
        if any(allowed in message for allowed in RESTRICTED_PYTHON_ALLOWS):
            continue
        line, _, what = message.partition(": ")
        problems.append((int(line.split()[-1]) if line.split()[-1].isdigit() else 0, what.rstrip(".")))
    reader = _Reader(Given(dict(given.names), dict(given.modules), dict(given.sources)), defined)
    reader.own = set(own)
    reader.top(tree)
    problems += reader.problems
    unique = sorted(set(problems), key=lambda p: (p[0], p[1]))
    return Parsed(unique, set(_names_defined(tree)))


def _names_defined(tree):
    names = []
    for node in tree.body:
        names += _stored(node, top=True)
    return names
