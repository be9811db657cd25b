"""The folder service against real PostgreSQL: provisioning, the ACL as stored (DB-built
FolderNodes), `authorize_memory_access`, the `memory.md` row and concurrent first use."""

from __future__ import annotations

import asyncio

import pytest
from fastapi import FastAPI
from sqlalchemy import text

from app.folders import service
from app.folders.acl import (
    ROOT_FOLDER,
    Actor,
    FolderNode,
    Permission,
    is_allowed,
    may_create_child,
    root_folder,
    root_group_id,
    user_folder,
)
from app.kit.errors import Forbidden, NotFound
from app.kit.principal import Principal
from app.profiles import service as profiles
from tests.helpers.db import scalar, sessions

ALICE = Principal("alice", "acme", frozenset())
INTRUDERS = {
    "another user": Principal("bob", "acme", frozenset()),
    "a space admin": Principal("sam", "acme", frozenset({"space_admin"})),
    "an operator": Principal("olga", "acme", frozenset({"operator"})),
    "an operator of another company": Principal("olga", "platform", frozenset({"operator"})),
    "the same user id in another company": Principal("alice", "globex", frozenset()),
}


async def ensure_alice(app: FastAPI) -> None:
    async with sessions(app)() as session, session.begin():
        await service.ensure_user_folder(session, ALICE)


async def load(app: FastAPI, path: str, company: str = "acme") -> FolderNode:
    async with sessions(app)() as session:
        node = await service.load_folder_node(session, company, path)
    assert node is not None
    return node


async def test_first_use_creates_the_root_then_a_private_folder(app: FastAPI) -> None:
    await ensure_alice(app)

    node = await load(app, "user-memory/alice")
    # The stored tree is exactly what the pure policy describes.
    assert node == user_folder(root_folder("acme"), "alice")
    assert node.inherit is False
    assert node.parent is not None
    assert node.parent.path == ROOT_FOLDER


async def test_the_root_group_may_create_under_the_root_but_not_manage_it(app: FastAPI) -> None:
    async with sessions(app)() as session, session.begin():
        await service.ensure_root_folder(session, "acme")
    root = await load(app, ROOT_FOLDER)
    member = service.actor_of(Principal("mallory", "acme", frozenset()))

    assert member.group_ids == {root_group_id("acme")}
    assert may_create_child(member, root)
    assert is_allowed(member, root, Permission.READ)
    assert not is_allowed(member, root, Permission.MANAGE)
    foreigner = service.actor_of(Principal("eve", "globex", frozenset()))
    assert not may_create_child(foreigner, root)


async def test_only_the_owner_may_use_the_stored_private_folder(app: FastAPI) -> None:
    await ensure_alice(app)
    node = await load(app, "user-memory/alice")

    owner = service.actor_of(ALICE)
    assert is_allowed(owner, node, Permission.READ)
    assert is_allowed(owner, node, Permission.WRITE)
    assert not is_allowed(owner, node, Permission.MANAGE)
    for principal in INTRUDERS.values():
        if principal.company_id != "acme":
            continue  # never handed acme's folder: every lookup is scoped by the token's company
        actor = service.actor_of(principal)
        assert not any(is_allowed(actor, node, p) for p in Permission), principal
    # Even a made-up actor in every group gets nothing: the folder does not inherit.
    everyone = Actor("mallory", frozenset({root_group_id("acme"), "space_admin", "operator"}))
    assert not any(is_allowed(everyone, node, p) for p in Permission)


async def test_authorize_memory_access_lets_the_owner_read_and_write(app: FastAPI) -> None:
    await ensure_alice(app)
    async with sessions(app)() as session:
        for permission in (Permission.READ, Permission.WRITE):
            node = await service.authorize_memory_access(session, ALICE, permission)
            assert node.path == "user-memory/alice"
        with pytest.raises(NotFound):
            await service.authorize_memory_access(session, ALICE, Permission.MANAGE)


@pytest.mark.parametrize("who", sorted(INTRUDERS))
async def test_authorize_memory_access_never_reaches_someone_elses_folder(
    app: FastAPI, who: str
) -> None:
    await ensure_alice(app)
    async with sessions(app)() as session:
        for permission in Permission:
            with pytest.raises(NotFound):
                await service.authorize_memory_access(session, INTRUDERS[who], permission)


async def test_the_same_user_id_in_another_company_gets_its_own_folder(app: FastAPI) -> None:
    twin = INTRUDERS["the same user id in another company"]
    await ensure_alice(app)
    async with sessions(app)() as session, session.begin():
        acme_id, _ = await service.ensure_user_folder(session, ALICE)
        globex_id, _ = await service.ensure_user_folder(session, twin)

    assert acme_id != globex_id
    sql = "SELECT count(*) FROM folders WHERE company_id = :c"
    assert (await scalar(app, sql, c="acme"), await scalar(app, sql, c="globex")) == (2, 2)
    async with sessions(app)() as session:
        await service.authorize_memory_access(session, twin, Permission.WRITE)
        twin_node = await service.load_folder_node(session, "globex", "user-memory/alice")
    assert twin_node == user_folder(root_folder("globex"), "alice")


async def test_authorize_memory_access_is_404_without_a_folder(app: FastAPI) -> None:
    async with sessions(app)() as session:
        with pytest.raises(NotFound):
            await service.authorize_memory_access(session, ALICE, Permission.READ)


async def test_a_tampered_acl_is_what_the_check_sees(app: FastAPI) -> None:
    """The check runs on the stored entries: removing the owner's WRITE removes the access."""
    await ensure_alice(app)
    async with sessions(app)() as session, session.begin():
        await session.execute(
            text("DELETE FROM folder_acl WHERE principal_id = 'alice' AND permission = 'WRITE'")
        )
    async with sessions(app)() as session:
        await service.authorize_memory_access(session, ALICE, Permission.READ)
        with pytest.raises(NotFound):
            await service.authorize_memory_access(session, ALICE, Permission.WRITE)


async def test_without_write_on_the_root_nobody_creates_a_folder(app: FastAPI) -> None:
    async with sessions(app)() as session, session.begin():
        await service.ensure_root_folder(session, "acme")
        await session.execute(text("DELETE FROM folder_acl WHERE permission = 'WRITE'"))

    async with sessions(app)() as session, session.begin():
        with pytest.raises(Forbidden):
            await service.ensure_user_folder(session, ALICE)
    assert await scalar(app, "SELECT count(*) FROM folders") == 1


async def test_the_memory_file_is_hidden_and_never_ingested(app: FastAPI) -> None:
    async with sessions(app)() as session, session.begin():
        folder_id, _ = await service.ensure_user_folder(session, ALICE)
        await profiles.ensure_memory_file(session, "acme", "alice", folder_id)
        await profiles.ensure_memory_file(session, "acme", "alice", folder_id)  # idempotent

    row = await scalar(
        app,
        "SELECT row(name, skip_ingestion, hidden_in_chat, folder_id = :f)::text"
        " FROM memory_files WHERE company_id = 'acme' AND user_id = 'alice'",
        f=folder_id,
    )
    assert row == "(memory.md,t,t,t)"


async def test_concurrent_first_use_creates_each_folder_once(app: FastAPI) -> None:
    async def first_use() -> str:
        async with sessions(app)() as session, session.begin():
            folder_id, _ = await service.ensure_user_folder(session, ALICE)
            return str(folder_id)

    ids = await asyncio.gather(*(first_use() for _ in range(5)))

    assert len(set(ids)) == 1
    assert await scalar(app, "SELECT count(*) FROM folders") == 2
    assert await scalar(app, "SELECT count(*) FROM folder_acl") == 4


async def test_deleting_the_user_folder_leaves_the_root(app: FastAPI) -> None:
    await ensure_alice(app)
    async with sessions(app)() as session, session.begin():
        assert await service.delete_user_folder(session, "acme", "alice") is True
        assert await service.delete_user_folder(session, "acme", "alice") is False

    assert await scalar(app, "SELECT path FROM folders") == ROOT_FOLDER
    assert await scalar(app, "SELECT count(*) FROM folder_acl") == 2
