"""The package's shape, read from its source with ``ast`` (docs/architecture.md describes it):
module-level imports between tmaflow's modules form no circle, no module imports a package
``__init__`` above it, no module grows past 600 lines, and an import of a tmaflow module inside
a function says on its line why it is not at the top."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "tmaflow"
MAX_LINES = 600


def _name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
PACKAGES = {_name(p) for p in MODULES.values() if p.name == "__init__.py"}


def _package_of(module: str) -> str:
    return module if module in PACKAGES else module.rpartition(".")[0]


def _targets(node: ast.Import | ast.ImportFrom, module: str) -> list[str]:
    """The tmaflow modules an import statement in ``module`` names: a submodule where a name
    is one, else the module (or package ``__init__``) the names come from."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name in MODULES]
    if node.level:
        base = _package_of(module).split(".")
        base = ".".join(base[:len(base) - node.level + 1] + ([node.module] if node.module else []))
    else:
        base = node.module or ""
    if base not in MODULES:
        return []
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def _module_level(tree: ast.Module):
    """Import statements run when the module is imported (not those inside functions or classes)."""
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))


def _local(tree: ast.Module):
    """Import statements inside functions (and methods)."""
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    yield node


TREES = {m: ast.parse(p.read_text(), str(p)) for m, p in MODULES.items()}
GRAPH = {m: {t for node in _module_level(tree) for t in _targets(node, m)} - {m}
         for m, tree in TREES.items()}


def _cycle(graph: dict) -> list[str] | None:
    """One circle of ``graph``, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(m):
        state[m] = 1
        path.append(m)
        for t in sorted(graph.get(m, ())):
            if state.get(t) == 1:
                return path[path.index(t):] + [t]
            if t not in state:
                found = visit(t)
                if found:
                    return found
        state[m] = 2
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None


def test_the_graph_is_read():
    """The checks below see the package: the top-level modules and the tensor-map chain."""
    assert {"tmaflow", "tmaflow.runtime.driver", "tmaflow.tma.tensormap", "tmaflow.launch.args"} <= set(MODULES)
    assert "tmaflow.runtime.memory" in GRAPH["tmaflow.tma.tensormap"]
    assert "tmaflow.tma.tensormap" in GRAPH["tmaflow.launch.args"]


def test_the_cycle_finder_finds_a_circle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_module_level_imports_form_no_circle():
    assert _cycle(GRAPH) is None


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_imports_a_package_init_above_it(module):
    above = {p for p in PACKAGES if module != p and module.startswith(p + ".")}
    local = {t for node in _local(TREES[module]) for t in _targets(node, module)}
    assert not (GRAPH[module] | local) & above


@pytest.mark.parametrize("module", sorted(MODULES))
def test_no_module_is_over_600_lines(module):
    assert len(MODULES[module].read_text().splitlines()) <= MAX_LINES


@pytest.mark.parametrize("module", sorted(MODULES))
def test_a_function_local_import_of_tmaflow_says_why(module):
    lines = MODULES[module].read_text().splitlines()
    silent = [f"{MODULES[module].name}:{node.lineno}: {lines[node.lineno - 1].strip()}"
              for node in _local(TREES[module]) if _targets(node, module)
              and not any("#" in lines[i] for i in range(node.lineno - 1, node.end_lineno))]
    assert not silent
