"""The packages depend one way: import-linter's contracts in pyproject.toml
(`[tool.importlinter]`, the order explained in `app/__init__.py`) hold for every import of
`app/`, function-level, relative and type-checking ones included.

`lint-imports` (`make lint`) prints the contracts and, when one is broken, every chain of imports
that breaks it.
"""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(project: Path) -> subprocess.CompletedProcess[str]:
    """`lint-imports` with the project's contracts, over the `app` package in `project` (it
    puts its working directory first on the import path)."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--config", str(ROOT / "pyproject.toml")],
        cwd=project,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_no_module_imports_from_a_layer_above_its_own() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.search(r"Contracts: [1-9]\d* kept, 0 broken\.", result.stdout), result.stdout
    analysed = re.search(r"Analyzed (\d+) files", result.stdout)
    assert analysed is not None
    # every file of app, and each package outside it that app imports (the graph holds them,
    # squashed to their top-level name, for the contract that forbids the web framework)
    files = list((ROOT / "app").rglob("*.py"))
    assert int(analysed.group(1)) == len(files) + len(imported_from_outside(files))


def imported_from_outside(files: list[Path]) -> set[str]:
    """The top-level names of what `files` import from outside `app`, the standard library's
    included."""
    names: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                names.update(alias.name.partition(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module.partition(".")[0])
    return names - {"app"}


# The edges that once tied the six domain packages into one loop (each upward now), written at
# the end of their files as function-level imports, and imports each contract must refuse:
# (file under app/, the code added, what the report must say)
PLANTED = [
    *(
        (source, f"\n\ndef _planted() -> None:\n    import {target}\n", f"- {importer} -> {target}")
        for source, importer, target in [
            ("consolidation/runner.py", "app.consolidation.runner", "app.turns.repository"),
            ("consolidation/prompts.py", "app.consolidation.prompts", "app.turns.schemas"),
            ("enablement/service.py", "app.enablement.service", "app.consolidation.kinds"),
            ("conversations/repository.py", "app.conversations.repository", "app.consolidation"),
            ("profiles/repository.py", "app.profiles.repository", "app.consolidation.pipeline"),
            ("enablement/repository.py", "app.enablement.repository", "app.profiles.models"),
            ("folders/repository.py", "app.folders.repository", "app.profiles.models"),
            ("jobs/worker.py", "app.jobs.worker", "app.turns.repository"),
            ("jobs/queue.py", "app.jobs.queue", "app.consolidation.kinds"),
            ("kit/db/engine.py", "app.kit.db.engine", "app.jobs.queue"),
        ]
    ),
    (
        "jobs/queue.py",
        "\nfrom typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from app.turns import save\n",
        "- app.jobs.queue -> app.turns.save",
    ),
    ("quotas/rule.py", "\nfrom ..folders import acl\n", "- app.quotas.rule -> app.folders.acl"),
    (
        "detectors/__init__.py",
        "\nfrom app.kit import config\n",
        "- app.detectors -> app.kit.config",
    ),
    (
        "erasure/service.py",
        "\nfrom app import portability\n",
        "- app.erasure.service -> app.portability",
    ),
    (
        "usage/meter.py",
        "\nfrom app.rate_limits import policy\n",
        "- app.usage.meter -> app.rate_limits.policy",
    ),
    ("sidecar.py", '"""A module with no layer."""\n', "- app.sidecar"),
    # the kit's core, free of the web framework: directly, and through a module of its own
    ("kit/db/readiness.py", "\nimport starlette.responses\n", "app.kit.db.readiness -> starlette"),
    (
        "kit/tokens.py",
        "\n\ndef _planted() -> None:\n    from app.kit import deps\n",
        "app.kit.tokens -> app.kit.deps",
    ),
]


def test_an_upward_import_breaks_the_contracts(tmp_path: Path) -> None:
    """Each planted import, in a copy of `app/`, is reported: upward ones (function-level,
    type-checking and relative alike), one between independent siblings, one between
    independent packages, a module given no layer, and the web framework imported by the kit's
    core, directly or through another module."""
    shutil.copytree(ROOT / "app", tmp_path / "app", ignore=shutil.ignore_patterns("__pycache__"))
    for source, code, _ in PLANTED:
        with (tmp_path / "app" / source).open("a", encoding="utf-8") as module:
            module.write(code)

    result = lint_imports(tmp_path)

    assert result.returncode == 1, result.stdout + result.stderr
    report = result.stdout
    missing = [reported for _, _, reported in PLANTED if reported not in report]
    assert missing == [], report
    assert re.search(r"Contracts: 0 kept, [1-9]\d* broken\.", report), report
