"""What the database holds, as comparable digests read by SQL: every table (row count and a hash
of its rows), or everything stored about one user. Equal digests before and after a request
prove it changed nothing there."""

from __future__ import annotations

from fastapi import FastAPI
from sqlalchemy import Table

from app.models import metadata
from tests.helpers.db import rows

Digest = tuple[int, str]
"""(row count, md5 of the rows' text in a stable order)."""


def _digest_sql(table: str, alias: str, where: str = "TRUE") -> str:
    return (
        f"SELECT count(*) AS n, md5(coalesce(string_agg({alias}::text, '|'"  # noqa: S608
        f" ORDER BY {alias}::text), '')) AS h FROM {table} WHERE {where}"
    )


async def database_digest(app: FastAPI) -> dict[str, Digest]:
    """Every table of the schema: its row count and a hash of all its rows."""
    # table names come from the schema's metadata, never from input
    selects = [
        f"SELECT '{table.name}' AS name, q.n, q.h FROM ({_digest_sql(f'{table.name} r', 'r')}) q"  # noqa: S608
        for table in metadata.sorted_tables
    ]
    found = await rows(app, " UNION ALL ".join(selects))
    return {row.name: (int(row.n), str(row.h)) for row in found}


def _user_tables() -> list[Table]:
    return [table for table in metadata.sorted_tables if "user_id" in table.c]


async def user_digest(app: FastAPI, company_id: str, user_id: str) -> dict[str, Digest]:
    """Everything stored about one user: the rows of every table with a `user_id`, the
    per-user folder and its ACL, and the audit events about the user's own setting."""
    folder = "f.company_id = :c AND f.path = 'user-memory/' || :u"
    selects = {
        table.name: _digest_sql(f"{table.name} r", "r", "r.company_id = :c AND r.user_id = :u")
        for table in _user_tables()
    }
    selects["folders"] = _digest_sql("folders f", "f", folder)
    selects["folder_acl"] = _digest_sql(
        "folder_acl a JOIN folders f ON f.company_id = a.company_id AND f.id = a.folder_id",
        "a",
        folder,
    )
    selects["audit_events"] = _digest_sql(
        "audit_events r",
        "r",
        "r.company_id = :c AND r.target_kind = 'user' AND r.target_id = :u",
    )
    union = " UNION ALL ".join(
        f"SELECT '{name}' AS name, q.n, q.h FROM ({sql}) q"  # noqa: S608
        for name, sql in selects.items()
    )
    found = await rows(app, union, c=company_id, u=user_id)
    return {row.name: (int(row.n), str(row.h)) for row in found}


def changed_tables(before: dict[str, Digest], after: dict[str, Digest]) -> list[str]:
    """The tables whose digest differs, with their row counts before -> after."""
    return [
        f"{name} ({before.get(name, (0, ''))[0]} -> {after.get(name, (0, ''))[0]} rows)"
        for name in sorted(before.keys() | after.keys())
        if before.get(name) != after.get(name)
    ]
