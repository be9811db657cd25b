"""The migrations: run by alembic, and the head they lead to, read without it.

Alembic is imported by the functions that run it: only `migrate` (and the embedded database's
start) needs it, and it costs every process ~0.2 s of start-up."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.kit.config import PROJECT_ROOT

if TYPE_CHECKING:
    from alembic.config import Config

ALEMBIC_INI = PROJECT_ROOT / "alembic.ini"


def alembic_config(url: str) -> Config:
    from alembic.config import Config  # noqa: PLC0415

    config = Config(str(ALEMBIC_INI))
    config.set_main_option("script_location", str(PROJECT_ROOT / "migrations"))
    config.attributes["database_url"] = url
    config.attributes["skip_logging"] = True  # keep the service's JSON logging configuration
    return config


def run_migrations(url: str, revision: str = "head") -> None:
    """Alembic upgrade (blocking: call it from a thread when an event loop is running)."""
    from alembic import command  # noqa: PLC0415

    command.upgrade(alembic_config(url), revision)


def head_revision(versions: Path | None = None) -> str | None:
    """The revision `migrate` upgrades to, as alembic's `ScriptDirectory.get_current_head()`
    gives it, read from the `revision` and `down_revision` assignments of the migration files
    in `versions` (default: the service's), parsed, not imported: no alembic, no module of
    theirs run. None without migrations; several heads are an error, as they are to alembic."""
    revisions: set[str] = set()
    revised: set[str] = set()
    for path in (versions or migrations_dir() / "versions").glob("*.py"):
        if path.name.startswith(("__init__", ".#")):  # the files alembic skips
            continue
        assigned = _module_constants(path, ("revision", "down_revision"))
        revision = assigned.get("revision")
        if not isinstance(revision, str):
            raise RuntimeError(f"{path.name}: no `revision` string")
        revisions.add(revision)
        down = assigned.get("down_revision")
        revised.update((down,) if isinstance(down, str) else down or ())
    heads = revisions - revised
    if len(heads) > 1:
        raise RuntimeError(f"the migrations have several heads: {', '.join(sorted(heads))}")
    return next(iter(heads), None)


def _module_constants(path: Path, names: tuple[str, ...]) -> dict[str, Any]:
    """The literal values assigned to `names` at the top level of the Python file `path`."""
    found: dict[str, Any] = {}
    for node in ast.parse(path.read_text(encoding="utf-8"), str(path)).body:
        targets: list[ast.expr]
        if isinstance(node, ast.AnnAssign):
            targets, value = [node.target], node.value
        elif isinstance(node, ast.Assign):
            targets, value = node.targets, node.value
        else:
            continue
        for target in targets:
            if value is not None and isinstance(target, ast.Name) and target.id in names:
                found[target.id] = ast.literal_eval(value)
    return found


def migrations_dir() -> Path:
    return PROJECT_ROOT / "migrations"
