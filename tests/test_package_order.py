"""The packages depend one way (the order is `app.LAYERS`, explained in `app/__init__.py`): no
module imports from a layer above its own, function-level and type-checking imports included.

`python -m tests.test_package_order` prints the package graph this test checks.
"""

from __future__ import annotations

import ast
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from app import LAYERS

APP = Path(__file__).resolve().parent.parent / "app"


@dataclass(frozen=True)
class Import:
    source: str  # the importing module's path under app/, e.g. "turns/save.py"
    target: str  # the imported module, e.g. "app.jobs.queue"
    line: int


def unit_of(module: str) -> str | None:
    """The layer unit (top-level module or package) of a dotted `app.` module name."""
    parts = module.split(".")
    if parts[0] != "app" or len(parts) < 2:
        return None
    return parts[1]


def unit_of_path(source: str) -> str:
    first = source.split("/", maxsplit=1)[0]
    return first.removesuffix(".py")


def layer_of(unit: str) -> int:
    for index, layer in enumerate(LAYERS):
        if unit in layer:
            return index
    raise LookupError(f"app/{unit} has no layer in app.LAYERS: add it where it belongs")


def imports_of(path: Path, source: str | None = None) -> list[Import]:
    """The `app.` imports of a file, read as app/`source` (default: its own path under app/)."""
    source = source or path.relative_to(APP).as_posix()
    package = ["app", *source.split("/")[:-1]]
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found += [Import(source, alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []
            module = ".".join([*base, node.module] if node.module else base)
            if node.module is None or module == "app":  # `from app import jobs`: one per name
                found += [Import(source, f"{module}.{a.name}", node.lineno) for a in node.names]
            else:
                found.append(Import(source, module, node.lineno))
    found.sort(key=lambda found_import: found_import.line)
    return [found_import for found_import in found if unit_of(found_import.target) is not None]


def all_imports() -> list[Import]:
    return [found for path in sorted(APP.rglob("*.py")) for found in imports_of(path)]


def upward(found: Import) -> bool:
    target = unit_of(found.target)
    assert target is not None
    return layer_of(target) > layer_of(unit_of_path(found.source))


def report(imports: list[Import]) -> str:
    """Each unit's layer and the units it imports, with the violations at the end."""
    edges: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for found in imports:
        source, target = unit_of_path(found.source), unit_of(found.target)
        if target is not None and target != source:
            edges[source][target] += 1
    lines = []
    for number, layer in enumerate(LAYERS, start=1):
        for unit in layer:
            if unit in edges or number > 1:
                targets = ", ".join(f"{t} ({n})" for t, n in sorted(edges[unit].items()))
                lines.append(f"{number}. {unit} -> {targets or '(nothing)'}")
    wrong = [f for f in imports if upward(f)]
    lines.append(f"upward imports: {len(wrong)}")
    lines += [f"  app/{f.source}:{f.line} imports {f.target}" for f in wrong]
    return "\n".join(lines)


def test_every_module_of_the_app_has_a_layer() -> None:
    units = {unit_of_path(p.relative_to(APP).as_posix()) for p in APP.rglob("*.py")}
    for unit in units - {"__init__"}:
        layer_of(unit)


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    imports = all_imports()
    assert imports, "the scan found no imports at all"
    assert [f for f in imports if upward(f)] == [], report(imports)


# The edges that once tied the six domain packages into one loop: each is upward now.
FORMER_EDGES = [
    ("consolidation/runner.py", "app.turns.repository"),
    ("consolidation/explicit.py", "app.turns.save"),
    ("consolidation/explicit.py", "app.turns.schemas"),
    ("enablement/service.py", "app.consolidation.jobs"),
    ("conversations/repository.py", "app.consolidation.queue"),
    ("profiles/repository.py", "app.consolidation.models"),
    ("enablement/repository.py", "app.profiles.models"),
    ("folders/repository.py", "app.profiles.models"),
    ("jobs/worker.py", "app.turns.repository"),
    ("jobs/queue.py", "app.consolidation.kinds"),
    ("kit/db.py", "app.jobs.queue"),
]


@pytest.mark.parametrize(("source", "target"), FORMER_EDGES)
def test_an_upward_import_is_caught(source: str, target: str) -> None:
    assert upward(Import(source, target, 1))


def test_relative_and_function_level_imports_are_read(tmp_path: Path) -> None:
    module = tmp_path / "service.py"
    module.write_text(
        "from . import repository\n"
        "def late() -> None:\n"
        "    from app.turns import save\n"
        "    import app.consolidation.pipeline\n",
        encoding="utf-8",
    )
    imports = imports_of(module, "profiles/service.py")
    assert [(i.target, i.line) for i in imports] == [
        ("app.profiles.repository", 1),
        ("app.turns", 3),
        ("app.consolidation.pipeline", 4),
    ]
    assert [upward(i) for i in imports] == [False, True, True]


if __name__ == "__main__":
    graph = report(all_imports())
    print(graph)
    sys.exit(1 if not graph.endswith("upward imports: 0") else 0)
