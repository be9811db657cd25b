"""No two files of `app/` import each other, directly or through others: the graph of their
imports is acyclic, so each file can be read (and loaded) after the ones it uses.

The packages' order is import-linter's (tests/test_package_order.py); this is the same rule one
level down, between the files of a package and across packages. An import counts when it runs
as its module is loaded or is read by the type checker: at the top level, in a class body, under
`if TYPE_CHECKING:` (as import-linter counts it) or in a `try`. An import inside a function does
not count: it runs when the function is called, after every module is loaded, which is why the
code uses one for what only some processes need (alembic, the openai SDK, the web framework in
the worker's reach); a circle closed that way is the author's declared choice, not an accident
of import order.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "app"

Graph = dict[str, set[str]]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def loaded_imports(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports of a module that run when it is loaded (or that the type checker reads):
    every statement but a function's body is searched."""
    pending: list[ast.AST] = list(tree.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            pending.extend(ast.iter_child_nodes(node))


def import_graph(package: Path) -> Graph:
    """Module -> the modules of the package it imports (a name imported from a package is the
    package's submodule when there is one, else the package's `__init__`)."""
    root = package.parent
    paths = {module_name(path, root): path for path in package.rglob("*.py")}
    graph: Graph = {name: set() for name in paths}
    for name, path in paths.items():
        is_package = path.name == "__init__.py"
        for node in loaded_imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                base = node.module or ""
                if node.level:
                    anchor = name.split(".")
                    anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                    base = ".".join([*anchor, *([base] if base else [])])
                targets = [
                    f"{base}.{alias.name}" if f"{base}.{alias.name}" in paths else base
                    for alias in node.names
                ]
            graph[name].update(target for target in targets if target in paths)
        graph[name].discard(name)
    return graph


def cycles(graph: Graph) -> list[list[str]]:
    """One circle of imports per strongly connected set of modules (Tarjan), each written from
    its first module round to it again."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph[module]):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            members: set[str] = set()
            while True:
                member = stack.pop()
                on_stack.discard(member)
                members.add(member)
                if member == module:
                    break
            if len(members) > 1:
                found.append(circle(graph, members))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return found


def circle(graph: Graph, members: set[str]) -> list[str]:
    """A shortest path of imports from the first of `members` back to it, within `members`."""
    start = min(members)
    paths = {start: [start]}
    frontier = [start]
    while frontier:
        reached = []
        for module in frontier:
            for target in sorted(graph[module] & members):
                if target == start:
                    return [*paths[module], start]
                if target not in paths:
                    paths[target] = [*paths[module], target]
                    reached.append(target)
        frontier = reached
    raise AssertionError(f"{sorted(members)} hold no circle")


def test_no_file_of_app_imports_itself_through_others() -> None:
    found = cycles(import_graph(APP))
    assert found == [], "\n".join(" -> ".join(loop) for loop in found)


def test_a_circle_between_two_files_is_found_and_printed(tmp_path: Path) -> None:
    """Through a type-checking import and a relative one, as the circle between enablement's
    schemas and service once was; a function-level import closes none."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "schemas.py").write_text(
        "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from pkg.service import X\n"
    )
    (package / "service.py").write_text("from . import schemas\n")
    (package / "lazy.py").write_text("def f() -> None:\n    from pkg import service\n")
    (package / "tail.py").write_text("from pkg.service import schemas\n")

    assert cycles(import_graph(package)) == [["pkg.schemas", "pkg.service", "pkg.schemas"]]
