"""The package's shape: folders by role, no import circles, layers that only import downwards, and
the README's map of the folders matching them.

Imports are read from the source (every ``import`` statement, those inside functions too), so a
circle that only closes when a function runs is found as well.
"""

import ast
import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "attention_lib"
# Each subpackage, and which others it may import. The stages are the course's code: they stand
# on the platform (and the references), never on the tools that measure them.
MAY_IMPORT = {
    "platform": set(),
    "stages": {"platform", "root"},
    "measure": {"platform", "stages", "root"},
    "checks": {"platform", "stages", "measure", "root"},
}


def module_name(path):
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imported(name, path):
    """The package modules `name` (at `path`) imports, anywhere in its source."""
    found = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1] + ([base] if base else []))
            # `from a.b import c` imports module a.b.c when there is one, else names of a.b
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:     # `import a.b.c` also runs a.b and a
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


GRAPH = {name: imported(name, path) for name, path in MODULES.items()}


def cycles(graph):
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_cycle_finder_finds_a_planted_circle():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_one_that_imports_it_back():
    assert cycles(GRAPH) == [], "import circles: " + "; ".join(" <-> ".join(c) for c in cycles(GRAPH))


def layer(name):
    parts = name.split(".")
    return parts[1] if len(parts) > 2 or (len(parts) == 2 and parts[1] in MAY_IMPORT) else "root"


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_each_subpackage_imports_only_the_layers_below_it(package):
    wrong = [f"{name} imports {target}" for name, targets in GRAPH.items() if layer(name) == package
             for target in targets if layer(target) not in MAY_IMPORT[package] | {package}
             and target != "attention_lib.platform.runtime"]
    # Any module may ask the runtime where kernels run; nothing under platform imports upwards.
    assert not wrong, "\n".join(wrong)


def test_the_package_root_holds_a_handful_of_entries():
    entries = sorted(p.name for p in PACKAGE.iterdir() if p.name != "__pycache__" and not p.name.endswith(".egg-info"))
    assert len(entries) <= 8, entries
    for folder in ("stages", "checks", "measure", "platform"):
        docstring = ast.get_docstring(ast.parse((PACKAGE / folder / "__init__.py").read_text()))
        assert docstring and "Not here" in docstring, \
            f"{folder}/__init__.py must say what belongs there and what does not"


def readme_map():
    """{folder: [module names or patterns]} from the README's table of the package's folders."""
    text = (ROOT / "README.md").read_text()
    table = text[text.index("| folder, then module | what |"):]
    table = table[:table.index("\n\n")]
    found, folder = {}, None
    for row in table.splitlines()[2:]:
        first = row.split("|")[1].strip()
        heading = re.fullmatch(r"\*\*`(\w+)/`\*\*", first)
        if heading:
            folder = "" if heading.group(1) == "attention_lib" else heading.group(1)
            found[folder] = []
        else:
            found[folder] += re.findall(r"`([^`]+)`", first)
    return found


def test_the_readmes_map_is_the_folders():
    listed = readme_map()
    actual = {}
    for path in PACKAGE.rglob("*.py"):
        if path.name == "__init__.py":
            continue
        folder = path.parent.relative_to(PACKAGE).as_posix()
        actual.setdefault("" if folder == "." else folder, []).append(path.stem)
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert set(listed) == {""} | folders, f"README folders {sorted(listed)}, package folders {sorted(folders)}"
    for folder, modules in actual.items():
        patterns = [name.replace("NN", "[0-9][0-9]").replace("<topic>", "*") for name in listed[folder]]
        missing = [m for m in modules if not any(fnmatch.fnmatch(m, p) for p in patterns)]
        stale = [p for p in patterns if not any(fnmatch.fnmatch(m, p) for m in modules)]
        assert not missing, f"attention_lib/{folder}: modules missing from the README's map: {missing}"
        assert not stale, f"attention_lib/{folder}: the README's map lists modules that are not there: {stale}"


def test_every_path_of_the_package_that_the_course_names_exists():
    texts = [ROOT / "README.md", ROOT / "INSTRUCTORS.md", *sorted((ROOT / "notebooks").glob("*.ipynb")),
             *sorted((ROOT / "tests").glob("*.py")), *sorted((ROOT / "scripts").glob("*")), *MODULES.values()]
    named = {(path.name, found) for path in texts if path.is_file()
             for found in re.findall(r"attention_lib/[\w/]+\.(?:py|npz)", path.read_text())}
    missing = sorted(f"{where}: {found}" for where, found in named if not (ROOT / found).exists())
    assert named and not missing, missing


def _is_kernel(decorator):
    """`@cuda.jit` or `@cuda.jit(...)` without device=True."""
    call = decorator if isinstance(decorator, ast.Call) else None
    target = call.func if call else decorator
    if not (isinstance(target, ast.Attribute) and target.attr == "jit"):
        return False
    return not any(k.arg == "device" and getattr(k.value, "value", False) for k in (call.keywords if call else []))


def test_kernels_live_in_stages():
    """kernel_cases.library_kernels finds every kernel there, so each gets its race, compile and
    report case; a module-level kernel anywhere else would escape them."""
    outside = [f"{name}.{node.name}" for name, path in MODULES.items() if layer(name) != "stages"
               for node in ast.parse(path.read_text()).body
               if isinstance(node, ast.FunctionDef) and any(_is_kernel(d) for d in node.decorator_list)]
    assert not outside, outside
    inside = [node.name for path in (PACKAGE / "stages").glob("*.py") for node in ast.parse(path.read_text()).body
              if isinstance(node, ast.FunctionDef) and any(_is_kernel(d) for d in node.decorator_list)]
    assert "flash_attention_kernel_v2" in inside and "softmax_kernel_v1" in inside
