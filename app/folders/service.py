"""Folder provisioning (`user-memory` and the per-user folders) and THE memory access check.

Every read or write of a user's profile calls `authorize_memory_access`; nothing else decides
who may touch a memory folder.
"""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncSession

from app.folders import repository
from app.folders.acl import (
    ROOT_FOLDER,
    Actor,
    FolderNode,
    Permission,
    is_allowed,
    may_create_child,
    root_folder_entries,
    root_group_id,
    user_folder_entries,
    user_folder_path,
)
from app.folders.errors import MemoryFolderRefused, NoMemory, RootFolderMissing
from app.kit.principal import Principal
from app.quotas.errors import UsersWithMemoryQuotaReached


def actor_of(principal: Principal) -> Actor:
    """The principal as the ACL sees it: the user plus the company's Root Group.

    Roles (space admin, operator) are deliberately not groups: they grant nothing on folders.
    """
    return Actor(principal.user_id, frozenset({root_group_id(principal.company_id)}))


async def load_folder_node(session: AsyncSession, company_id: str, path: str) -> FolderNode | None:
    """The stored folder at `path` with its ancestors and ACL entries, or None."""
    record = await repository.select_folder(session, company_id, path)
    return None if record is None else record.node


async def _ensure_root(session: AsyncSession, company_id: str) -> repository.FolderRecord:
    folder_id = await repository.insert_folder(
        session, company_id, ROOT_FOLDER, parent_id=None, inherit_access=False
    )
    if folder_id is not None:
        await repository.insert_acl_entries(
            session, company_id, folder_id, root_folder_entries(company_id)
        )
    record = await repository.select_folder(session, company_id, ROOT_FOLDER)
    if record is None:  # inserted above, or committed by whoever won the conflict
        raise RuntimeError(f"the {ROOT_FOLDER} folder vanished while it was being ensured")
    return record


async def ensure_root_folder(session: AsyncSession, company_id: str) -> FolderNode:
    """The company's `user-memory` folder, created with the Root Group's READ and WRITE if missing.

    Safe under concurrency: the insert is `ON CONFLICT DO NOTHING` on (company_id, path), and only
    the transaction that created the folder writes its ACL entries.
    """
    return (await _ensure_root(session, company_id)).node


async def ensure_user_folder(
    session: AsyncSession, principal: Principal, *, users_with_memory_quota: int = 0
) -> tuple[uuid.UUID, FolderNode]:
    """The caller's private folder `user-memory/<user_id>`, created on first use.

    Creation goes through the ACL like any other client would: the caller needs WRITE on the root
    (granted to the Root Group), else 403. The new folder does not inherit, and only the owner
    gets READ and WRITE on it. The root is created first if it is missing.

    `users_with_memory_quota` (0: none): when the company already has that many user folders,
    none is created (`UsersWithMemoryQuotaReached`). Exact under concurrency: creations in one
    company are serialised by a lock held until the caller commits, and the count is read
    after it.
    """
    company_id, path = principal.company_id, user_folder_path(principal.user_id)
    existing = await repository.select_folder(session, company_id, path)
    if existing is not None:
        return existing.id, existing.node

    root = await _ensure_root(session, company_id)
    if not may_create_child(actor_of(principal), root.node):
        raise MemoryFolderRefused
    if users_with_memory_quota > 0:
        await repository.lock_child_creation(session, company_id)
        # read after the lock: a folder of ours committed meanwhile, and every other one
        existing = await repository.select_folder(session, company_id, path)
        if existing is not None:
            return existing.id, existing.node
        count = await repository.count_children(
            session, company_id, root.id, up_to=users_with_memory_quota
        )
        if count >= users_with_memory_quota:
            raise UsersWithMemoryQuotaReached(users_with_memory_quota)
    folder_id = await repository.insert_folder(
        session, company_id, path, parent_id=root.id, inherit_access=False
    )
    if folder_id is not None:
        await repository.insert_acl_entries(
            session, company_id, folder_id, user_folder_entries(principal.user_id)
        )
    created = await repository.select_folder(session, company_id, path)
    if created is None:
        raise RuntimeError(f"the folder {path} vanished while it was being ensured")
    return created.id, created.node


async def authorize_memory_access(
    session: AsyncSession, principal: Principal, permission: Permission
) -> FolderNode:
    """THE access check for a user's memory: `permission` on the caller's own folder, or 404.

    The folder is loaded from the database with its ACL entries and checked by `acl.is_allowed`.
    A missing folder and a denied permission are both `NoMemory`, so nobody learns whether a
    memory exists. There is no way to name another user's folder: the path comes from the token.
    """
    node = await load_folder_node(
        session, principal.company_id, user_folder_path(principal.user_id)
    )
    if node is None or not is_allowed(actor_of(principal), node, permission):
        raise NoMemory
    return node


async def delete_user_folder(session: AsyncSession, company_id: str, user_id: str) -> bool:
    """Delete `user-memory/<user_id>` (cascading to its ACL, `memory.md` and its versions)."""
    return await repository.delete_folder(session, company_id, user_folder_path(user_id))


async def read_root_folder(session: AsyncSession, company_id: str) -> FolderNode:
    """The company's `user-memory` folder as stored (404 when it was never created)."""
    node = await load_folder_node(session, company_id, ROOT_FOLDER)
    if node is None:
        raise RootFolderMissing
    return node
