"""What a grading run reads from a submission's own code: code that reaches into the checker, and
answers that are the library's solution.

What runs when grading is the course's own cells and the answers that parse against the
allowlist (scripts/grader/), in a sandbox of each submission's own, so nothing here decides a
point. This read is a report for the instructor: every code cell the student wrote or changed (any
cell whose text is not one of the released copy's) is read, never run, for what no answer needs: a
redefined `check`, the checker's modules or their private names, stderr or stdout swapped, the
environment, names reached by a computed string (getattr, vars, globals, exec, ...), modules that
reach any object (importlib, builtins, ctypes, gc, inspect, sys.modules, frames), IPython's hooks,
shell commands, files written. Names are matched as identifiers, and a string only where it starts
with a path of the process's own (/proc/) or the checker's module: never the words of a docstring
or a comment.

A copy of the library's solution (it is installed with the course, and `reveal(id, give_up=True)`
prints it) is found by comparing an answer with the solution after normalising both: comments,
docstrings and formatting dropped, every name renamed in order of first use. That is a flag for
the instructor, not a zero: a warm-up's answer may be the solution by nature.

- ``student_cells(submitted, released) -> [(index, source)]``; ``findings(source) -> [str]``;
- ``same_as_solution(answer, solution) -> bool``.
"""

import ast
import re

from IPython.core.inputtransformer2 import TransformerManager

# The names a notebook imports from the checker (the released setup cell's line, and what an
# answer may repeat); anything else from attention_lib.checks reaches into it.
CHECKER = "attention_lib.checks"
CHECKER_NAMES = {"check", "hint", "reveal"}
# Names whose binding in a student's cell replaces the course's own.
COURSE_NAMES = {"check", "hint", "reveal", "record"}
# Functions that reach an object by a computed name, or run text as code.
INDIRECT_CALLS = {"getattr", "setattr", "delattr", "vars", "globals", "exec", "eval", "compile", "__import__",
                  "breakpoint", "get_ipython"}
# Modules that reach any object, hook the interpreter or run other programs.
MODULES = {"importlib", "builtins", "ctypes", "gc", "inspect", "signal", "ipykernel", "IPython", "subprocess",
           "multiprocessing", "atexit", "faulthandler", "shutil"}
# Attributes that reach the checker, the interpreter's internals, frames or the environment.
ATTRIBUTES = {"checks", "_judge", "_key", "_graded", "_passed", "_signature", "_show", "EXERCISES",
              "modules", "settrace", "setprofile", "_getframe", "f_globals", "f_locals", "f_back", "f_builtins",
              "__dict__", "__globals__", "__closure__", "__code__", "__builtins__", "__subclasses__", "__bases__",
              "__mro__", "__getattribute__", "__setattr__", "__delattr__", "__import__", "__loader__", "__spec__",
              "__file__", "cell_contents", "environ", "environb", "getenv", "putenv", "unsetenv", "system", "popen",
              "write_text", "write_bytes"}
# Names that reach the environment or swap the output streams, imported bare.
ENVIRONMENT = {"environ", "environb", "getenv", "putenv", "unsetenv", "redirect_stderr", "redirect_stdout"}
# Text that names the environment of the grading run or the process's own files.
STRINGS = re.compile(r"^/proc/|^attention_lib\.checks\b")
# IPython's magics that change the environment, run files or run shell commands.
MAGICS = re.compile(r"^\s*(!|%+\s*(env|set_env|run|load|load_ext|system|sx|bash|sh|script|writefile|capture)\b)",
                    re.M)
WRITE_MODES = re.compile(r"[wax+]")


def student_cells(submitted, released):
    """[(index, source)] of the submission's code cells whose text is not a code cell of the
    released copy: what the student wrote (answers, cells added) or changed."""
    given = {cell.source.strip() for cell in released.cells if cell.cell_type == "code"}
    return [(i, cell.source) for i, cell in enumerate(submitted.cells)
            if cell.cell_type == "code" and cell.source.strip() not in given]


def _python(source):
    """A cell's text as Python (IPython's magics turned into calls), parsed; None if it does not parse."""
    try:
        return ast.parse(TransformerManager().transform_cell(source))
    except SyntaxError:
        return None


def _dotted(node):
    """'sys.stderr' for an attribute chain of names, else the last attribute's name."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        parts.append(node.id)
    return ".".join(reversed(parts))


def _bound_names(node):
    """The names a statement or expression node binds (assignments, definitions, imports, loops)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
        return [node.id]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [(a.asname or a.name).split(".")[0] for a in node.names]
    if isinstance(node, (ast.Global, ast.Nonlocal)):
        return list(node.names)
    return []


def _import_findings(node):
    if isinstance(node, ast.Import):
        modules = [a.name for a in node.names]
    elif isinstance(node, ast.ImportFrom):
        modules = [node.module or ""]
        if node.module == CHECKER and not {a.name for a in node.names} <= CHECKER_NAMES:
            return [f"imports {', '.join(a.name for a in node.names)} from {CHECKER}"]
        if node.module == "attention_lib" and any(a.name == "checks" for a in node.names):
            return [f"imports {CHECKER}"]
        reaching = [a.name for a in node.names if a.name in ATTRIBUTES | INDIRECT_CALLS | ENVIRONMENT]
        if reaching:
            return [f"imports {', '.join(reaching)} from {node.module}"]
    else:
        return []
    found = []
    for module in modules:
        if module.startswith(CHECKER + ".") or (isinstance(node, ast.Import) and module == CHECKER):
            found.append(f"imports {module}")
        elif module.split(".")[0] in MODULES:
            found.append(f"imports {module}")
    return found


def _docstrings(tree):
    """The ids of the docstring nodes of a tree (a docstring is prose, never read for findings)."""
    found = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            found.add(id(body[0].value))
    return found


def _node_findings(node, raw, docstrings=frozenset()):
    """What one AST node does that no answer needs (a list of short phrases)."""
    found = _import_findings(node)
    if not (isinstance(node, ast.ImportFrom) and node.module == CHECKER):
        found += [f"redefines {name}" for name in _bound_names(node) if name in COURSE_NAMES]
    if isinstance(node, ast.Name) and node.id in ENVIRONMENT:
        found.append(f"uses {node.id}")
    elif isinstance(node, ast.Name) and node.id in INDIRECT_CALLS | MODULES:
        if node.id != "get_ipython" or "get_ipython" in raw:       # not the call a magic becomes
            found.append(f"uses {node.id}")
    elif isinstance(node, ast.Attribute):
        dotted = _dotted(node)
        if node.attr in ATTRIBUTES:
            found.append(f"reads {dotted}" if isinstance(node.ctx, ast.Load) else f"assigns {dotted}")
        elif isinstance(node.ctx, (ast.Store, ast.Del)) and re.search(r"\b(stderr|stdout|__stderr__|__stdout__)\b",
                                                                       dotted):
            found.append(f"assigns {dotted}")
        elif node.attr in ("redirect_stderr", "redirect_stdout"):
            found.append(f"uses {node.attr}")
    elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and STRINGS.search(node.value)
          and id(node) not in docstrings):
        found.append(f"names {STRINGS.search(node.value).group(0)!r}")
    elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "open":
        modes = [a for a in node.args[1:2]] + [k.value for k in node.keywords if k.arg == "mode"]
        if any(isinstance(m, ast.Constant) and WRITE_MODES.search(str(m.value)) for m in modes):
            found.append("opens a file for writing")
    return found


def findings(source):
    """What a cell the student wrote does that no answer needs, in the order found, each once."""
    found = [f"runs the magic or shell command {m.group(0).strip()!r}" for m in MAGICS.finditer(source)]
    tree = _python(source)
    if tree is not None:
        docstrings = _docstrings(tree)
        for node in ast.walk(tree):
            found += _node_findings(node, source, docstrings)
    return list(dict.fromkeys(found))


class _Renamer(ast.NodeTransformer):
    """Every name (variables, arguments, functions) renamed v0, v1, ... in order of first use."""

    def __init__(self):
        self.names = {}

    def _new(self, name):
        return self.names.setdefault(name, f"v{len(self.names)}")

    def visit_Name(self, node):
        return ast.copy_location(ast.Name(id=self._new(node.id), ctx=node.ctx), node)

    def visit_arg(self, node):
        return ast.copy_location(ast.arg(arg=self._new(node.arg)), node)

    def visit_FunctionDef(self, node):
        node.name = self._new(node.name)
        self.generic_visit(node)
        return node


def _without_docstrings(tree):
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (isinstance(body, list) and body and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str)):
            node.body = body[1:] or [ast.Pass()]
    return tree


def normalised(source):
    """A cell's code with comments, docstrings, formatting and names made uniform (None if it does
    not parse): two cells that differ only in those give the same text."""
    tree = _python(source)
    if tree is None:
        return None
    return ast.dump(_Renamer().visit(_without_docstrings(tree)), annotate_fields=False)


def same_as_solution(answer, solution):
    """Whether an answer cell is the solution's cell but for comments, docstrings, layout and names."""
    mine = normalised(answer)
    return mine is not None and mine == normalised(solution)
