"""The product's modules and their imports, read from the source: what the layout tests
(``tests/project/test_layout.py``, ``tests/project/test_layers.py``) hold as rules."""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tasks_app", "approvals", "console", "api", "config")
# A module longer than this wants splitting along one of its seams (STYLE.md: a module
# holds one concern and stays short enough to read in one sitting).
MOST_LINES = 400


def product_modules() -> dict[str, Path]:
    """Every module of the product's packages but the migrations, by dotted name."""
    modules = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if "migrations" in path.parts:
                continue
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


MODULES = product_modules()


def _is_type_checking(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_at_load(name: str) -> Iterator[str]:
    """The product modules ``name`` imports when it is loaded: its module-level imports,
    not those under ``TYPE_CHECKING`` nor those inside functions."""
    nodes = (node for node in _tree(name).body if not _is_type_checking(node))
    yield from _imported(name, nodes)


def imported_anywhere(name: str) -> Iterator[str]:
    """Every product module ``name`` imports: at load, inside functions and for type
    checking alike (a layer is broken by any of them)."""
    yield from _imported(name, ast.walk(_tree(name)))


def _tree(name: str) -> ast.Module:
    return ast.parse(MODULES[name].read_text())


def _imported(name: str, nodes: Iterable[ast.AST]) -> Iterator[str]:
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in MODULES)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parent, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in MODULES:
                    yield full
                elif base in MODULES:
                    yield base


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for successor in graph[node]:
            if successor not in index:
                visit(successor)
                low[node] = min(low[node], low[successor])
            elif successor in on_stack:
                low[node] = min(low[node], index[successor])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return found
