"""The user's own setting over HTTP: on by default, and turning it off permanently deletes the
user's memory (profile, versions, pending jobs, folder) in one transaction, nobody else's."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text

from app.enablement.service import load_enablement
from app.folders import service as folders
from app.kit.principal import Principal
from app.profiles import service as profiles
from app.profiles.switch import lock_user_memory
from tests.helpers.apps import AuthFactory
from tests.helpers.db import admin_execute, backend_pid, scalar, sessions, sessions_blocked_by
from tests.helpers.memory import memory_counts, seed_memory
from tests.helpers.polling import wait_until
from tests.helpers.settings import enable_company, patch_user_settings

NOTHING_LEFT = {
    "folders": 0,
    "acl": 0,
    "files": 0,
    "versions": 0,
    "pending_jobs": 0,
    "finished_jobs": 2,
}
SEEDED = {"folders": 1, "acl": 2, "files": 1, "versions": 3, "pending_jobs": 3, "finished_jobs": 2}


async def test_the_setting_is_on_until_the_user_changes_it(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    response = await client.get("/v1/me/settings", headers=auth("alice", "acme"))
    assert response.status_code == 200
    assert response.json() == {"context_memory": True}


async def test_opting_out_deletes_the_memory_and_says_what_it_deleted(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await seed_memory(app, "alice")
    assert await memory_counts(app, "alice") == SEEDED

    response = await patch_user_settings(client, auth, {"context_memory": False})

    assert response.status_code == 200
    assert response.json() == {
        "context_memory": False,
        "deleted": {"profile": True, "versions": 3, "jobs": 3, "folder": True},
    }
    assert await memory_counts(app, "alice") == NOTHING_LEFT
    settings = await client.get("/v1/me/settings", headers=auth("alice", "acme"))
    assert settings.json() == {"context_memory": False}


async def test_opting_out_leaves_everybody_elses_memory_alone(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await seed_memory(app, "alice")
    await seed_memory(app, "bob")
    await seed_memory(app, "alice", "globex")  # the same user id in another company

    await patch_user_settings(client, auth, {"context_memory": False})

    assert await memory_counts(app, "bob") == SEEDED
    assert await memory_counts(app, "alice", "globex") == SEEDED
    root = "SELECT count(*) FROM folders WHERE company_id = 'acme' AND path = 'user-memory'"
    assert await scalar(app, root) == 1


async def test_opting_out_twice_deletes_nothing_more(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await seed_memory(app, "alice")
    await patch_user_settings(client, auth, {"context_memory": False})

    response = await patch_user_settings(client, auth, {"context_memory": False})

    assert response.status_code == 200
    assert response.json() == {
        "context_memory": False,
        "deleted": {"profile": False, "versions": 0, "jobs": 0, "folder": False},
    }


async def test_opting_out_without_any_memory_reports_zeros(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    response = await patch_user_settings(client, auth, {"context_memory": False})
    assert response.json()["deleted"] == {
        "profile": False,
        "versions": 0,
        "jobs": 0,
        "folder": False,
    }


async def test_opting_back_in_starts_from_nothing(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await seed_memory(app, "alice")
    await patch_user_settings(client, auth, {"context_memory": False})

    response = await patch_user_settings(client, auth, {"context_memory": True})

    assert response.status_code == 200
    assert response.json() == {"context_memory": True, "deleted": None}
    assert await memory_counts(app, "alice") == NOTHING_LEFT
    assert (await client.get("/v1/me/settings", headers=auth("alice", "acme"))).json() == {
        "context_memory": True
    }


async def test_turning_it_on_when_already_on_deletes_nothing(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await seed_memory(app, "alice")
    response = await patch_user_settings(client, auth, {"context_memory": True})
    assert response.json() == {"context_memory": True, "deleted": None}
    assert await memory_counts(app, "alice") == SEEDED


async def test_the_deletion_is_one_transaction_with_the_setting(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI, database_url: str
) -> None:
    """A failure at the last step (deleting jobs) leaves the memory and the setting untouched."""
    await seed_memory(app, "alice")
    await admin_execute(
        database_url,
        """
        CREATE FUNCTION test_refuse_job_delete() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'job deletion refused by the test'; END $$
        """,
        """
        CREATE TRIGGER test_refuse_job_delete BEFORE DELETE ON jobs
        FOR EACH ROW WHEN (OLD.user_id = 'alice') EXECUTE FUNCTION test_refuse_job_delete()
        """,
    )
    try:
        response = await patch_user_settings(client, auth, {"context_memory": False})
    finally:
        await admin_execute(
            database_url,
            "DROP TRIGGER test_refuse_job_delete ON jobs",
            "DROP FUNCTION test_refuse_job_delete()",
        )

    assert response.status_code == 500
    assert await memory_counts(app, "alice") == SEEDED
    settings = await client.get("/v1/me/settings", headers=auth("alice", "acme"))
    assert settings.json() == {"context_memory": True}
    assert await scalar(app, "SELECT count(*) FROM audit_events") == 0


async def test_a_writer_holding_the_user_lock_cannot_outlive_an_opt_out(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI, database_url: str
) -> None:
    """A consolidation that checked the setting before the opt-out finishes first; the opt-out
    waits for it and then deletes what it wrote, so no memory survives the opt-out."""
    await enable_company(client, auth)
    alice = Principal("alice", "acme", frozenset())

    async with sessions(app)() as writer, writer.begin():
        await lock_user_memory(writer, "acme", "alice")
        assert (await load_enablement(writer, "acme", "space-1", "alice")).enabled
        writer_pid = await backend_pid(writer)
        opt_out = asyncio.create_task(patch_user_settings(client, auth, {"context_memory": False}))

        async def opt_out_waits_for_the_lock() -> bool:
            return opt_out.done() or await sessions_blocked_by(database_url, writer_pid) > 0

        await wait_until(opt_out_waits_for_the_lock, 10, what="the opt-out waiting for the lock")
        assert not opt_out.done()
        folder_id, _ = await folders.ensure_user_folder(writer, alice)
        await profiles.ensure_memory_file(writer, "acme", "alice", folder_id)
        await writer.execute(
            text(
                "INSERT INTO memory_versions (company_id, user_id, version, content, sha256,"
                " tokens, reason) VALUES ('acme', 'alice', 1, 'x', :sha, 1, 'consolidation')"
            ),
            {"sha": "0" * 64},
        )

    response = await opt_out
    assert response.json()["deleted"] == {
        "profile": True,
        "versions": 1,
        "jobs": 0,
        "folder": True,
    }
    counts = await memory_counts(app, "alice")
    assert (counts["folders"], counts["files"], counts["versions"]) == (0, 0, 0)
    async with sessions(app)() as late_writer, late_writer.begin():
        await lock_user_memory(late_writer, "acme", "alice")
        context = await load_enablement(late_writer, "acme", "space-1", "alice")
    assert [c.key for c in context.decision.blocking] == ["user_setting"]


async def test_deleting_the_folder_cascades_to_the_profile_and_its_versions(
    app: FastAPI, database_url: str
) -> None:
    """The FKs alone remove memory.md and its versions with the folder (a safety net)."""
    await seed_memory(app, "alice")
    await admin_execute(database_url, "DELETE FROM folders WHERE path = 'user-memory/alice'")

    counts = await memory_counts(app, "alice")
    assert (counts["folders"], counts["acl"], counts["files"], counts["versions"]) == (0, 0, 0, 0)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "body.context_memory"),
        ({"context_memory": "false"}, "body.context_memory"),
        ({"context_memory": 0}, "body.context_memory"),
        ({"context_memory": None}, "body.context_memory"),
        ({"context_memory": False, "user_id": "bob"}, "body.user_id"),
    ],
)
async def test_invalid_bodies_are_422_and_delete_nothing(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI, body: dict[str, Any], field: str
) -> None:
    await seed_memory(app, "alice")
    response = await patch_user_settings(client, auth, body)

    assert response.status_code == 422
    assert field in [error["field"] for error in response.json()["errors"]]
    assert await memory_counts(app, "alice") == SEEDED
