"""Which cells of a notebook an exercise's stub and check cell need, read from the code.

A student copy differs from its notebook only in the exercise cells (solutions cut) and so in
the check cells' verdicts; every other cell is the notebook's own, which nbval re-executes
anyway. So the copy's test runs the first cell, the exercise and check cells, and the earlier
cells whose names those read, transitively: a cell is needed when it last assigned, or since
changed in place (``x[i] = ...``, ``x.a = ...``, ``x += ...``), a name a needed cell reads; a
name read inside a function is also looked up from where the function is used.

``plan(sources) -> (needed indices, uses of the student's answer)``: the second part lists
(cell, name) where a cell other than a check reads a name an exercise cell gave it last; such a
cell would break in the student's copy, and the test fails on it.
"""

import ast


class _Names(ast.NodeVisitor):
    """What a cell does with names: assigns at its top level, changes in place, reads anywhere."""

    def __init__(self):
        self.assigned, self.changed, self.read, self.deferred, self.depth = set(), set(), set(), set(), 0

    def _reads(self, name):
        (self.deferred if self.depth else self.read).add(name)

    def visit_Name(self, node):
        if isinstance(node.ctx, ast.Load):
            self._reads(node.id)
        elif self.depth == 0:
            self.assigned.add(node.id)

    def visit_AugAssign(self, node):
        if isinstance(node.target, ast.Name):
            self._reads(node.target.id)
            if self.depth == 0:
                self.changed.add(node.target.id)
        else:
            self.visit(node.target)
        self.visit(node.value)

    def _stored_into(self, node):
        base = node.value
        while isinstance(base, (ast.Attribute, ast.Subscript)):
            base = base.value
        if isinstance(base, ast.Name) and not isinstance(node.ctx, ast.Load) and self.depth == 0:
            self.changed.add(base.id)
        self.generic_visit(node)

    visit_Attribute = visit_Subscript = _stored_into

    def visit_Import(self, node):
        if self.depth == 0:
            self.assigned.update((alias.asname or alias.name).split(".")[0] for alias in node.names)

    visit_ImportFrom = visit_Import

    def _function(self, node):
        # Decorators and defaults run where the function is defined; its body when it is
        # called, reading there the names it neither takes nor assigns.
        if not isinstance(node, ast.Lambda):
            for decorator in node.decorator_list:
                self.visit(decorator)
            if self.depth == 0:
                self.assigned.add(node.name)
        for default in node.args.defaults + [d for d in node.args.kw_defaults if d is not None]:
            self.visit(default)
        body = _Names()
        for statement in node.body if isinstance(node.body, list) else [node.body]:
            body.visit(statement)
        arguments = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
        local = body.assigned | {a.arg for a in arguments + [node.args.vararg, node.args.kwarg] if a}
        self.deferred |= (body.read | body.deferred) - local

    visit_FunctionDef = visit_AsyncFunctionDef = visit_Lambda = _function

    def visit_ClassDef(self, node):
        if self.depth == 0:
            self.assigned.add(node.name)
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1


def names(source):
    """The _Names of one code cell (IPython magics and shell lines left out)."""
    found = _Names()
    found.visit(ast.parse("\n".join(line for line in source.splitlines()
                                    if not line.lstrip().startswith(("%", "!")))))
    return found


def providers(cells, i, name):
    """The earlier cells whose work cell i sees in `name`: its last assignment, and changes since."""
    found = []
    for j in range(i - 1, -1, -1):
        if name in cells[j].changed:
            found.append(j)
        elif name in cells[j].assigned:
            return found + [j]
    return found


def needed_for(sources, targets):
    """The sorted indices of the code cells `targets` need (themselves included), read from the
    code as the module docstring says."""
    cells = [names(source) for source in sources]
    needed, resolved = set(), set()

    def resolve(name, at):
        # A function's body reads its globals when it is called, so the names a providing cell
        # reads inside functions are looked up from the reader's position too.
        if (name, at) not in resolved:
            resolved.add((name, at))
            for j in providers(cells, at, name):
                need(j)
                for later in cells[j].deferred:
                    resolve(later, at)

    def need(i):
        if i not in needed:
            needed.add(i)
            for name in cells[i].read | cells[i].deferred:
                resolve(name, i)

    for i in sorted(targets):
        need(i)
    return sorted(needed)


def plan(sources):
    """sources: a notebook's code cells, solutions in -> (sorted needed indices, [(cell, name)])."""
    cells = [names(source) for source in sources]
    exercises = {i for i, source in enumerate(sources) if "### BEGIN SOLUTION" in source}
    checks = {i + 1 for i in exercises if i + 1 < len(sources) and "check(" in sources[i + 1]}
    answer_uses = [(i, name) for i in range(len(cells)) if i not in exercises | checks
                   for name in sorted(cells[i].read | cells[i].deferred)
                   if exercises & set(providers(cells, i, name))]
    return needed_for(sources, {0} | exercises | checks), answer_uses
