"""`DELETE /v1/me` over HTTP: everything of the caller goes in one transaction (memory, folder,
chats, every job, idempotency records, the setting, the audit events about them), the answer
counts it, a second call counts zeros, and one `user.erased` event with the counts remains. The
caller's edits of company settings are anonymised wherever they are, and only theirs: an actor
is a company and a user id, both must match."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import text

from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.folders import service as folders
from app.kit.principal import Principal
from app.profiles import service as profiles
from app.profiles.switch import lock_user_memory
from tests.helpers.apps import OPERATOR, SPACE, SPACE_ADMIN, AuthFactory
from tests.helpers.db import (
    admin_execute,
    backend_pid,
    execute,
    rows,
    scalar,
    sessions,
    sessions_blocked_by,
)
from tests.helpers.memory import memory_counts, put_memory, seed_memory
from tests.helpers.polling import wait_until
from tests.helpers.settings import (
    enable_company,
    patch_space,
    patch_user_settings,
    register_company,
)
from tests.helpers.turns import assistant, turn_body, user

PROFILE = """# User Memory

## Identity
- Works on project falcon.

## Communication Preferences

## Work Context

## Skills & Expertise

## Recent Topics

## Open Questions / Follow-ups
"""
ZEROS: dict[str, Any] = {
    "deleted": {
        "profile": False,
        "versions": 0,
        "folder": False,
        "chats": 0,
        "turns": 0,
        "messages": 0,
        "jobs": 0,
        "idempotency_keys": 0,
        "settings": False,
        "audit_events": 0,
    },
    "anonymised": {"audit_events": 0, "settings": 0},
}
NOTHING = {"folders": 0, "acl": 0, "files": 0, "versions": 0, "pending_jobs": 0, "finished_jobs": 0}


async def erase(
    client: httpx.AsyncClient, auth: AuthFactory, sub: str = "alice", company: str = "acme"
) -> Any:
    response = await client.delete("/v1/me", headers=auth(sub, company))
    assert response.status_code == 200, response.text
    return response.json()


async def keyed_turn(
    client: httpx.AsyncClient, auth: AuthFactory, chat: str, key: str, sub: str = "alice"
) -> httpx.Response:
    body = turn_body([user("I work at Initech.")], "Noted.")
    headers = auth(sub, "acme") | {"Idempotency-Key": key}
    response = await client.post(f"/v1/chats/{chat}/turns", json=body, headers=headers)
    assert response.status_code == 202, response.text
    return response


async def history_counts(app: FastAPI, sub: str = "alice") -> tuple[int, int, int, int]:
    """(turns, messages, idempotency records, stored settings) of the user."""
    where = "company_id = 'acme' AND user_id = :u"
    return (
        await scalar(app, f"SELECT count(*) FROM turns WHERE {where}", u=sub),  # noqa: S608
        await scalar(app, f"SELECT count(*) FROM chat_messages WHERE {where}", u=sub),  # noqa: S608
        await scalar(app, f"SELECT count(*) FROM idempotency_keys WHERE {where}", u=sub),  # noqa: S608
        await scalar(app, f"SELECT count(*) FROM user_settings WHERE {where}", u=sub),  # noqa: S608
    )


async def seed_user(client: httpx.AsyncClient, auth: AuthFactory, sub: str = "alice") -> None:
    """A stored setting (off, then on again), a profile, two chats of three turns (two keyed),
    three pending jobs of which one then succeeded."""
    await patch_user_settings(client, auth, {"context_memory": False}, sub, expect=200)
    await patch_user_settings(client, auth, {"context_memory": True}, sub, expect=200)
    response = await client.put(
        "/v1/me/memory",
        json={"content": PROFILE},
        headers=auth(sub, "acme") | {"If-None-Match": "*"},
    )
    assert response.status_code == 201, response.text
    await keyed_turn(client, auth, "chat-a", f"key-{sub}-1", sub)
    await keyed_turn(client, auth, "chat-a", f"key-{sub}-2", sub)
    body = turn_body(
        [user("Hello"), assistant("Hi"), user("Bye")], "Ciao", history_mode="record_all"
    )
    response = await client.post("/v1/chats/chat-b/turns", json=body, headers=auth(sub, "acme"))
    assert response.status_code == 202, response.text
    app: FastAPI = client._transport.app  # type: ignore[attr-defined]
    await execute(
        app,
        "UPDATE jobs SET status = 'succeeded', outcome = 'noop', finished_at = now()"
        " WHERE id = (SELECT id FROM jobs WHERE user_id = :u ORDER BY created_at LIMIT 1)",
        u=sub,
    )


async def test_erasure_deletes_everything_of_the_caller_and_counts_it(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await enable_company(client, auth)
    await seed_user(client, auth)
    assert await history_counts(app) == (3, 8, 2, 1)

    answer = await erase(client, auth)

    assert answer == {
        "deleted": {
            "profile": True,
            "versions": 1,
            "folder": True,
            "chats": 2,
            "turns": 3,
            "messages": 8,
            "jobs": 3,
            "idempotency_keys": 2,
            "settings": True,
            "audit_events": 2,
        },
        "anonymised": {"audit_events": 0, "settings": 0},
    }
    assert await memory_counts(app, "alice") == NOTHING
    assert await history_counts(app) == (0, 0, 0, 0)
    me = auth("alice", "acme")
    assert (await client.get("/v1/me/settings", headers=me)).json() == {"context_memory": True}
    assert (await client.get("/v1/me/memory", headers=me)).status_code == 404


async def test_a_second_erasure_finds_nothing_and_records_nothing(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await enable_company(client, auth)
    await seed_user(client, auth)
    await erase(client, auth)
    events = await scalar(app, "SELECT count(*) FROM audit_events")

    assert await erase(client, auth) == ZEROS
    assert await scalar(app, "SELECT count(*) FROM audit_events") == events


async def test_erasing_a_user_who_never_came_answers_zeros(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    assert await erase(client, auth, "nobody") == ZEROS
    assert await scalar(app, "SELECT count(*) FROM audit_events") == 0


async def test_erasure_leaves_other_users_and_companies_alone(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await enable_company(client, auth)
    await seed_user(client, auth, "alice")
    await seed_user(client, auth, "bob")
    await seed_memory(app, "alice", "globex")  # the same user id in another company
    bob_before = (await memory_counts(app, "bob"), await history_counts(app, "bob"))
    globex_before = await memory_counts(app, "alice", "globex")

    await erase(client, auth, "alice")

    assert (await memory_counts(app, "bob"), await history_counts(app, "bob")) == bob_before
    assert await memory_counts(app, "alice", "globex") == globex_before
    root = "SELECT count(*) FROM folders WHERE company_id = 'acme' AND path = 'user-memory'"
    assert await scalar(app, root) == 1


async def test_the_audit_trail_keeps_one_event_with_counts_and_forgets_who_changed_spaces(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await enable_company(client, auth)
    await seed_user(client, auth)
    admin = auth("alice", "acme", SPACE_ADMIN)
    response = await client.patch(f"/v1/spaces/{SPACE}", json={"web_search": True}, headers=admin)
    assert response.status_code == 200, response.text
    await patch_space(client, auth, "space-2", {"web_search": True}, expect=200)  # by sam

    answer = await erase(client, auth)

    assert answer["anonymised"] == {"audit_events": 1, "settings": 1}
    events = await rows(
        app,
        "SELECT actor_id, action, target_kind, target_id, old, new FROM audit_events"
        " WHERE company_id = 'acme' AND target_kind <> 'feature_flag' ORDER BY id",
    )
    assert [(e.actor_id, e.action, e.target_id) for e in events] == [
        ("erased-user", "space_settings.update", SPACE),
        ("sam", "space_settings.update", "space-2"),
        ("alice", "user.erased", "alice"),
    ]
    erased = events[-1]
    assert (erased.target_kind, erased.old, erased.new) == ("user", None, answer)
    editors = await rows(app, "SELECT space_id, updated_by FROM space_settings ORDER BY space_id")
    assert [(s.space_id, s.updated_by) for s in editors] == [
        (SPACE, "erased-user"),
        ("space-2", "sam"),
    ]


async def two_alices_change_company_other(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    """Operator alice of acme turns on company other's flag; alice of other, a space admin
    there (another person with the same id), changes a space of other."""
    await register_company(client, auth, "other")
    response = await client.put(
        f"/v1/companies/other/feature-flags/{FLAG_CONTEXT_MEMORY}",
        json={"enabled": True},
        headers=auth("alice", "acme", OPERATOR),
    )
    assert response.status_code == 200, response.text
    response = await client.patch(
        f"/v1/spaces/{SPACE}",
        json={"web_search": True},
        headers=auth("alice", "other", SPACE_ADMIN),
    )
    assert response.status_code == 200, response.text


async def actors_in_company_other(app: FastAPI) -> dict[str, tuple[str, str]]:
    """Who company other's records name, as (company, user id), by what they record."""
    found = await rows(
        app,
        "SELECT 'event ' || action AS what, actor_company_id AS company, actor_id AS id"
        " FROM audit_events WHERE company_id = 'other'"
        " UNION ALL SELECT 'flag', updated_by_company_id, updated_by"
        " FROM company_feature_flags WHERE company_id = 'other'"
        " UNION ALL SELECT 'space', updated_by_company_id, updated_by"
        " FROM space_settings WHERE company_id = 'other'",
    )
    return {row.what: (row.company, row.id) for row in found}


async def test_erasing_alice_of_other_leaves_the_record_naming_alice_of_acme_untouched(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await two_alices_change_company_other(client, auth)

    answer = await erase(client, auth, "alice", "other")

    assert answer["anonymised"] == {"audit_events": 1, "settings": 1}  # her own space change
    assert await actors_in_company_other(app) == {
        "event feature_flag.set": ("acme", "alice"),
        "flag": ("acme", "alice"),
        "event space_settings.update": ("other", "erased-user"),
        "space": ("other", "erased-user"),
        "event user.erased": ("other", "alice"),
    }


async def test_erasing_alice_of_acme_anonymises_her_record_in_company_other(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await two_alices_change_company_other(client, auth)

    answer = await erase(client, auth, "alice", "acme")

    assert answer["anonymised"] == {"audit_events": 1, "settings": 1}
    assert await actors_in_company_other(app) == {
        "event feature_flag.set": ("acme", "erased-user"),
        "flag": ("acme", "erased-user"),
        "event space_settings.update": ("other", "alice"),
        "space": ("other", "alice"),
    }
    erased = await rows(
        app,
        "SELECT company_id, actor_company_id, actor_id FROM audit_events WHERE company_id = 'acme'",
    )
    assert [tuple(event) for event in erased] == [("acme", "acme", "alice")]  # the user.erased


async def test_the_erasure_is_one_transaction(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI, database_url: str
) -> None:
    """A failure at the last delete (the audit events) leaves everything of the user in place."""
    await enable_company(client, auth)
    await seed_user(client, auth)
    memory_before, history_before = await memory_counts(app, "alice"), await history_counts(app)
    await admin_execute(
        database_url,
        """
        CREATE FUNCTION test_refuse_audit_delete() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'audit deletion refused by the test'; END $$
        """,
        """
        CREATE TRIGGER test_refuse_audit_delete BEFORE DELETE ON audit_events
        FOR EACH ROW EXECUTE FUNCTION test_refuse_audit_delete()
        """,
    )
    try:
        response = await client.delete("/v1/me", headers=auth("alice", "acme"))
    finally:
        await admin_execute(
            database_url,
            "DROP TRIGGER test_refuse_audit_delete ON audit_events",
            "DROP FUNCTION test_refuse_audit_delete()",
        )

    assert response.status_code == 500
    assert await memory_counts(app, "alice") == memory_before
    assert await history_counts(app) == history_before
    erased = "SELECT count(*) FROM audit_events WHERE action = 'user.erased'"
    assert await scalar(app, erased) == 0


async def test_a_writer_holding_the_user_lock_cannot_outlive_an_erasure(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI, database_url: str
) -> None:
    """A memory write that took the user's lock before the erasure commits first; the erasure
    waits for it and then deletes what it wrote."""
    alice = Principal("alice", "acme", frozenset())
    async with sessions(app)() as writer, writer.begin():
        await lock_user_memory(writer, "acme", "alice")
        writer_pid = await backend_pid(writer)
        erasure = asyncio.create_task(client.delete("/v1/me", headers=auth("alice", "acme")))

        async def erasure_waits_for_the_lock() -> bool:
            return erasure.done() or await sessions_blocked_by(database_url, writer_pid) > 0

        await wait_until(erasure_waits_for_the_lock, 10, what="the erasure waiting for the lock")
        assert not erasure.done()
        folder_id, _ = await folders.ensure_user_folder(writer, alice)
        await profiles.ensure_memory_file(writer, "acme", "alice", folder_id)
        await writer.execute(
            text(
                "INSERT INTO memory_versions (company_id, user_id, version, content, sha256,"
                " tokens, reason) VALUES ('acme', 'alice', 1, 'x', :sha, 1, 'consolidation')"
            ),
            {"sha": "0" * 64},
        )

    response = await erasure
    assert response.status_code == 200, response.text
    deleted = response.json()["deleted"]
    assert (deleted["profile"], deleted["versions"], deleted["folder"]) == (True, 1, True)
    assert await memory_counts(app, "alice") == NOTHING


async def test_a_ready_job_is_gone_after_the_erasure(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await enable_company(client, auth)
    await put_memory(client, auth, PROFILE)
    job_id = uuid.UUID(
        (await keyed_turn(client, auth, "chat-a", "k-1")).json()["consolidation"]["job_id"]
    )

    assert (await erase(client, auth))["deleted"]["jobs"] == 1

    assert await scalar(app, "SELECT count(*) FROM jobs WHERE id = :id", id=job_id) == 0
    me = auth("alice", "acme")
    assert (await client.get(f"/v1/jobs/{job_id}", headers=me)).status_code == 404
