"""Table tests for the folder access check: the Root Group may add folders under `user-memory`,
and a user's folder is private because its inheritance is disabled."""

from __future__ import annotations

from dataclasses import replace

import pytest

from app.folders.acl import (
    ROOT_FOLDER,
    AclEntry,
    Actor,
    FolderNode,
    Permission,
    effective_entries,
    is_allowed,
    may_create_child,
    root_folder,
    root_folder_entries,
    root_group_id,
    user_folder,
    user_folder_entries,
    user_folder_path,
)

COMPANY = "acme"
ROOT_GROUP = root_group_id(COMPANY)

OWNER = Actor("alice", frozenset({ROOT_GROUP}))
INTRUDERS = {
    "another user": Actor("bob", frozenset({ROOT_GROUP})),
    "a space admin": Actor("carol", frozenset({ROOT_GROUP, "space-admins"})),
    "an operator": Actor("olga", frozenset({ROOT_GROUP, "operators"})),
    "a root group member": Actor("mallory", frozenset({ROOT_GROUP})),
    "a group named like the owner": Actor("trudy", frozenset({ROOT_GROUP, "alice"})),
    "another company's user": Actor("eve", frozenset({root_group_id("globex")})),
}

ROOT = root_folder(COMPANY)
PRIVATE = user_folder(ROOT, "alice")


def test_policy_constructors() -> None:
    assert ROOT.path == ROOT_FOLDER == "user-memory"
    assert ROOT_GROUP == "root:acme"
    assert set(root_folder_entries(COMPANY)) == {
        AclEntry("group", "root:acme", Permission.READ),
        AclEntry("group", "root:acme", Permission.WRITE),
    }
    assert PRIVATE.path == user_folder_path("alice") == "user-memory/alice"
    assert PRIVATE.parent is ROOT
    assert PRIVATE.inherit is False
    assert set(user_folder_entries("alice")) == {
        AclEntry("user", "alice", Permission.READ),
        AclEntry("user", "alice", Permission.WRITE),
    }


def test_root_group_member_can_create_a_folder_under_the_root_but_not_manage_it() -> None:
    member = INTRUDERS["a root group member"]

    assert may_create_child(member, ROOT)
    assert is_allowed(member, ROOT, Permission.READ)
    assert not is_allowed(member, ROOT, Permission.MANAGE)


def test_another_company_cannot_create_under_the_root() -> None:
    outsider = INTRUDERS["another company's user"]

    assert not may_create_child(outsider, ROOT)
    assert not is_allowed(outsider, ROOT, Permission.READ)


def test_owner_reads_and_writes_own_folder_but_cannot_manage_it() -> None:
    assert is_allowed(OWNER, PRIVATE, Permission.READ)
    assert is_allowed(OWNER, PRIVATE, Permission.WRITE)
    assert not is_allowed(OWNER, PRIVATE, Permission.MANAGE)


@pytest.mark.parametrize("permission", [Permission.READ, Permission.WRITE, Permission.MANAGE])
@pytest.mark.parametrize("intruder", INTRUDERS.values(), ids=INTRUDERS.keys())
def test_nobody_but_the_owner_gets_into_a_private_folder(
    intruder: Actor, permission: Permission
) -> None:
    assert not is_allowed(intruder, PRIVATE, permission)


@pytest.mark.parametrize("permission", [Permission.READ, Permission.WRITE])
@pytest.mark.parametrize(
    "member",
    [actor for actor in INTRUDERS.values() if ROOT_GROUP in actor.group_ids],
    ids=[name for name, actor in INTRUDERS.items() if ROOT_GROUP in actor.group_ids],
)
def test_control_with_inheritance_the_root_group_would_get_in(
    member: Actor, permission: Permission
) -> None:
    """Same folder with inheritance on: the Root Group's grant on the root would leak in. So it is
    the disabled inheritance, not the absence of a grant, that keeps the folder private."""
    leaky = replace(PRIVATE, inherit=True)

    assert is_allowed(member, leaky, permission)
    assert not is_allowed(member, PRIVATE, permission)


def readable_by(user_id: str) -> tuple[AclEntry, ...]:
    return (AclEntry("user", user_id, Permission.READ),)


def test_effective_entries_stop_at_the_first_folder_that_does_not_inherit() -> None:
    top = FolderNode("a", inherit=False, entries=readable_by("u1"), parent=None)
    middle = FolderNode("a/b", inherit=False, entries=readable_by("u2"), parent=top)
    leaf = FolderNode("a/b/c", inherit=True, entries=readable_by("u3"), parent=middle)
    inheriting_middle = replace(middle, inherit=True)

    assert effective_entries(leaf) == readable_by("u3") + readable_by("u2")
    assert effective_entries(inheriting_middle) == readable_by("u2") + readable_by("u1")
    assert effective_entries(PRIVATE) == user_folder_entries("alice")


def test_permissions_do_not_imply_one_another() -> None:
    manager = Actor("max", frozenset())
    folder = FolderNode(
        "managed", inherit=False, entries=(AclEntry("user", "max", Permission.MANAGE),), parent=None
    )

    assert is_allowed(manager, folder, Permission.MANAGE)
    assert not is_allowed(manager, folder, Permission.READ)
    assert not is_allowed(manager, folder, Permission.WRITE)
    assert not may_create_child(manager, folder)
