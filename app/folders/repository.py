"""SQL for the folder tree, its ACL entries and the `memory.md` file row (flushes, never commits).

Reads return `acl.FolderNode` chains so that the access check runs on what is stored.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Select, String, and_, bindparam, delete, func, literal, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import aliased

from app.folders.acl import AclEntry, FolderNode, Permission, PrincipalKind
from app.folders.models import Folder, FolderAclEntry

# A chain deeper than this is corrupt (the tree is two levels deep); stop instead of looping.
_MAX_DEPTH = 16


@dataclass(frozen=True)
class FolderRecord:
    """A stored folder: its id and its node (with the ancestors' nodes and all ACL entries)."""

    id: uuid.UUID
    node: FolderNode


async def insert_folder(
    session: AsyncSession,
    company_id: str,
    path: str,
    *,
    parent_id: uuid.UUID | None,
    inherit_access: bool,
) -> uuid.UUID | None:
    """Create the folder unless `path` exists; the new id, or None when it already existed.

    `ON CONFLICT DO NOTHING` waits for a concurrent inserter of the same path to finish, so a
    caller that gets None can read the winner's folder (and its ACL entries) right after.
    """
    statement = (
        insert(Folder)
        .values(
            company_id=company_id,
            id=uuid.uuid4(),
            path=path,
            parent_id=parent_id,
            inherit_access=inherit_access,
        )
        .on_conflict_do_nothing(index_elements=[Folder.company_id, Folder.path])
        .returning(Folder.id)
    )
    return (await session.execute(statement)).scalar_one_or_none()


async def insert_acl_entries(
    session: AsyncSession, company_id: str, folder_id: uuid.UUID, entries: Iterable[AclEntry]
) -> None:
    rows = [
        {
            "company_id": company_id,
            "folder_id": folder_id,
            "principal_kind": entry.principal_kind,
            "principal_id": entry.principal_id,
            "permission": entry.permission.value,
        }
        for entry in entries
    ]
    if rows:
        await session.execute(insert(FolderAclEntry).values(rows).on_conflict_do_nothing())


def _select_folder_statement() -> Select[Any]:
    """The chain of folders from :path up to the root, each with its ACL entries, root-most
    first: built once (bound per call), so each call costs neither its construction nor its
    cache key."""
    company_id, path = bindparam("company_id", type_=String), bindparam("path", type_=String)
    parent = aliased(Folder)
    anchor = (
        select(
            Folder.id,
            Folder.parent_id,
            Folder.path,
            Folder.inherit_access,
            literal(0).label("depth"),
        )
        .where(Folder.company_id == company_id, Folder.path == path)
        .cte("chain", recursive=True)
    )
    chain = anchor.union_all(
        select(
            parent.id,
            parent.parent_id,
            parent.path,
            parent.inherit_access,
            anchor.c.depth + 1,
        ).where(
            parent.company_id == company_id,
            parent.id == anchor.c.parent_id,
            anchor.c.depth < _MAX_DEPTH,
        )
    )
    return (
        select(
            chain.c.id,
            chain.c.path,
            chain.c.inherit_access,
            chain.c.depth,
            FolderAclEntry.principal_kind,
            FolderAclEntry.principal_id,
            FolderAclEntry.permission,
        )
        .select_from(
            chain.outerjoin(
                FolderAclEntry,
                and_(
                    FolderAclEntry.company_id == company_id,
                    FolderAclEntry.folder_id == chain.c.id,
                ),
            )
        )
        .order_by(
            chain.c.depth.desc(),
            FolderAclEntry.principal_kind,
            FolderAclEntry.principal_id,
            FolderAclEntry.permission,
        )
    )


_SELECT_FOLDER = _select_folder_statement()


async def select_folder(session: AsyncSession, company_id: str, path: str) -> FolderRecord | None:
    """The folder at `path` with its ancestors and every ACL entry on the way, in one statement.

    The ancestors are always loaded (whether or not the folder inherits); `acl.is_allowed`
    decides what inheritance means.
    """
    params = {"company_id": company_id, "path": path}
    rows = (await session.execute(_SELECT_FOLDER, params)).all()
    if not rows:
        return None

    # Rows come root-most first; build each node on top of its parent's.
    folders: dict[int, tuple[uuid.UUID, str, bool]] = {}
    entries: dict[int, list[AclEntry]] = {}
    for row in rows:
        folders[row.depth] = (row.id, row.path, row.inherit_access)
        bucket = entries.setdefault(row.depth, [])
        if row.principal_kind is not None:
            kind: PrincipalKind = "user" if row.principal_kind == "user" else "group"
            bucket.append(AclEntry(kind, row.principal_id, Permission(row.permission)))
    node: FolderNode | None = None
    for depth in sorted(folders, reverse=True):
        _, folder_path, inherit = folders[depth]
        node = FolderNode(folder_path, inherit, tuple(entries[depth]), node)
    assert node is not None
    return FolderRecord(folders[0][0], node)


async def delete_folder(session: AsyncSession, company_id: str, path: str) -> bool:
    """Delete the folder at `path`; the FKs cascade to its ACL entries, subfolders and files."""
    statement = (
        delete(Folder)
        .where(Folder.company_id == company_id, Folder.path == path)
        .returning(Folder.id)
    )
    return (await session.execute(statement)).first() is not None


async def lock_child_creation(session: AsyncSession, company_id: str) -> None:
    """Serialise creating children of the company's root folder (user folders) until the
    caller's transaction ends, so that a count of them read after it stays true until commit."""
    key = f"folders.children\x1f{company_id}"
    await session.execute(select(func.pg_advisory_xact_lock(func.hashtextextended(key, 0))))


async def count_children(
    session: AsyncSession, company_id: str, parent_id: uuid.UUID, *, up_to: int
) -> int:
    """How many folders `parent_id` holds, counted up to `up_to` (the scan stops there)."""
    children = (
        select(literal(1))
        .where(Folder.company_id == company_id, Folder.parent_id == parent_id)
        .limit(up_to)
        .subquery()
    )
    return int((await session.execute(select(func.count()).select_from(children))).scalar_one())


# --- the user's folder held by the orchestrator's turn write (app/turns) -------------------------


def user_folder_key_share(after: str) -> str:
    """A `SELECT` of the id of the folder at :folder_path in :company_id, key-share-locked until
    the transaction ends, for a `WITH` entry that must run once the earlier entry `after` (a
    constant of the composing statement, never user input) has run: its locks are taken first.

    Being a locking read it answers with the newest committed row, not with the statement's
    snapshot: a folder deleted by a transaction that committed while the statement waited for
    a lock is no row. While held, the folder cannot be deleted (an erasure or opt-out waits).
    """
    return f"""
    SELECT fo.id FROM folders fo
    WHERE fo.company_id = :company_id AND fo.path = :folder_path
      AND EXISTS (SELECT FROM {after})
    FOR KEY SHARE OF fo"""  # noqa: S608


# --- a folder and its parent as a fragment of the orchestrator's one-statement read (app/turns) ---


def _acl_lateral(folder: str, alias: str) -> str:
    # `folder` and `alias` are constants of this module, never user input
    return f"""
LEFT JOIN LATERAL (
    SELECT array_agg(a.principal_kind) AS kinds, array_agg(a.principal_id) AS principals,
           array_agg(a.permission) AS permissions
    FROM folder_acl a WHERE a.company_id = :company_id AND a.folder_id = {folder}.id
) {alias} ON true"""  # noqa: S608


FOLDER_COLUMNS = """
    fo.path AS folder_path, fo.inherit_access AS folder_inherit,
    fa.kinds AS folder_kinds, fa.principals AS folder_principals,
    fa.permissions AS folder_permissions,
    pf.path AS parent_path, pf.inherit_access AS parent_inherit,
    pa.kinds AS parent_kinds, pa.principals AS parent_principals,
    pa.permissions AS parent_permissions"""


def folder_joins(folder_id: str) -> str:
    """Joins the folder whose id is the SQL expression `folder_id` (a column of an earlier
    join, never user input) in :company_id, its parent, and both ACLs, for `FOLDER_COLUMNS`.
    Each table is pinned to :company_id itself, not through another table's `company_id`: Citus
    router-plans outer joins only so."""
    return f"""
LEFT JOIN folders fo ON fo.company_id = :company_id AND fo.id = {folder_id}
LEFT JOIN folders pf ON pf.company_id = :company_id AND pf.id = fo.parent_id
{_acl_lateral("fo", "fa")}
{_acl_lateral("pf", "pa")}"""


def folder_node_of(row: Mapping[str, Any]) -> FolderNode | None:
    """The `FOLDER_COLUMNS` of a row as the node the access check reads (None: no folder).

    The tree is two levels deep; a grandparent's entries are never read (under-grants).
    """
    if row["folder_path"] is None:
        return None
    parent = None
    if row["parent_path"] is not None:
        parent = FolderNode(
            row["parent_path"], row["parent_inherit"], _entries_of(row, "parent"), parent=None
        )
    return FolderNode(row["folder_path"], row["folder_inherit"], _entries_of(row, "folder"), parent)


_PERMISSIONS = {permission.value: permission for permission in Permission}


def _entries_of(row: Mapping[str, Any], prefix: str) -> tuple[AclEntry, ...]:
    kinds = row[f"{prefix}_kinds"] or []
    principals = row[f"{prefix}_principals"] or []
    permissions = row[f"{prefix}_permissions"] or []
    return tuple(
        AclEntry("user" if kind == "user" else "group", principal, _PERMISSIONS[permission])
        for kind, principal, permission in zip(kinds, principals, permissions, strict=True)
        if kind is not None
    )
