"""The access check over folder ACL entries (owner, group, inheritance), and the memory policy.

Pure: folders, entries and actors are values; nothing here reads the database.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

PrincipalKind = Literal["user", "group"]

ROOT_FOLDER = "user-memory"


class Permission(StrEnum):
    """A permission on a folder.

    Permissions do not imply one another: MANAGE grants neither READ nor WRITE, and WRITE does not
    grant READ. Each must be granted by its own entry, so an ACL says exactly what it allows.
    """

    READ = "READ"
    WRITE = "WRITE"
    MANAGE = "MANAGE"


@dataclass(frozen=True)
class AclEntry:
    """Grants one permission on a folder to a user or a group."""

    principal_kind: PrincipalKind
    principal_id: str
    permission: Permission


@dataclass(frozen=True)
class FolderNode:
    """A folder with its own ACL entries; `inherit` adds the parent's effective entries."""

    path: str
    inherit: bool
    entries: tuple[AclEntry, ...]
    parent: FolderNode | None


@dataclass(frozen=True)
class Actor:
    """Who asks: a user and the groups the user belongs to (always incl. the Root Group)."""

    user_id: str
    group_ids: frozenset[str]


def root_group_id(company_id: str) -> str:
    """The id of the company's Root Group, which every user of the company belongs to."""
    return f"root:{company_id}"


def effective_entries(folder: FolderNode) -> tuple[AclEntry, ...]:
    """The folder's own entries, then its ancestors' while each folder on the way inherits."""
    entries: list[AclEntry] = []
    node: FolderNode | None = folder
    while node is not None:
        entries.extend(node.entries)
        node = node.parent if node.inherit else None
    return tuple(entries)


def _grants(entry: AclEntry, actor: Actor) -> bool:
    if entry.principal_kind == "user":
        return entry.principal_id == actor.user_id
    return entry.principal_id in actor.group_ids


def is_allowed(actor: Actor, folder: FolderNode, permission: Permission) -> bool:
    """True when an effective entry grants `permission` to the actor or one of its groups.

    Roles such as space admin or operator are not principals here: they grant nothing on folders.
    """
    return any(
        entry.permission == permission and _grants(entry, actor)
        for entry in effective_entries(folder)
    )


def may_create_child(actor: Actor, parent: FolderNode) -> bool:
    """Creating a subfolder needs WRITE on the parent (not MANAGE)."""
    return is_allowed(actor, parent, Permission.WRITE)


def root_folder_entries(company_id: str) -> tuple[AclEntry, ...]:
    """Root Group READ and WRITE on `user-memory` (anyone may add a folder), but no MANAGE."""
    group = root_group_id(company_id)
    return (
        AclEntry("group", group, Permission.READ),
        AclEntry("group", group, Permission.WRITE),
    )


def user_folder_path(user_id: str) -> str:
    return f"{ROOT_FOLDER}/{user_id}"


def user_folder_entries(user_id: str) -> tuple[AclEntry, ...]:
    """Only the owner may read and write the per-user folder; nobody may manage it."""
    return (
        AclEntry("user", user_id, Permission.READ),
        AclEntry("user", user_id, Permission.WRITE),
    )


def root_folder(company_id: str) -> FolderNode:
    """The company's `user-memory` folder as the policy creates it."""
    return FolderNode(
        ROOT_FOLDER, inherit=False, entries=root_folder_entries(company_id), parent=None
    )


def user_folder(root: FolderNode, user_id: str) -> FolderNode:
    """A user's private folder under `root`.

    Inheritance is disabled so that the Root Group's access to `root` does not leak into it.
    """
    return FolderNode(
        user_folder_path(user_id), inherit=False, entries=user_folder_entries(user_id), parent=root
    )
