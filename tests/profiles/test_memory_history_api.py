"""The user's memory history over HTTP: version list, one version, diff, restore, retention,
export, and that nobody reaches another user's memory through any of it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text

from app.profiles.document import Section, parse, render_body
from tests.helpers.apps import AuthFactory, client_with
from tests.helpers.db import sessions
from tests.helpers.memory import ME, create, replace
from tests.helpers.profiles import memory_md

WORK = Section.WORK


async def history(client: httpx.AsyncClient, headers: dict[str, str], *edits: list[str]) -> None:
    """Version 1 holds `edits[0]` as Work Context bullets, version 2 `edits[1]`, and so on."""
    first = await create(client, headers, memory_md({WORK: edits[0]}))
    assert first.status_code == 201, first.text
    for version, bullets in enumerate(edits[1:], start=1):
        response = await replace(client, headers, memory_md({WORK: bullets}), version)
        assert response.status_code == 200, response.text


async def test_versions_are_listed_newest_first_without_content(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await history(client, auth("alice"), ["a"], ["a", "b"], ["a2", "b"], ["b"])

    first = await client.get(f"{ME}/versions?limit=2", headers=auth("alice"))
    assert first.status_code == 200
    page = first.json()
    assert [item["version"] for item in page["items"]] == [4, 3]
    newest = page["items"][0]
    assert set(newest) == {
        "version",
        "sha256",
        "tokens",
        "reason",
        "created_at",
        "model",
        "tokens_in",
        "tokens_out",
        "source_turn_ids",
        "job_id",
        "operation_counts",
    }
    assert newest["reason"] == "user_edit"
    assert newest["operation_counts"] == {"ADD": 0, "UPDATE": 0, "DELETE": 1}
    assert page["items"][1]["operation_counts"] == {"ADD": 0, "UPDATE": 1, "DELETE": 0}
    assert len(newest["sha256"]) == 64

    second = await client.get(
        f"{ME}/versions", params={"limit": 2, "cursor": page["next_cursor"]}, headers=auth("alice")
    )
    assert [item["version"] for item in second.json()["items"]] == [2, 1]
    assert second.json()["next_cursor"] is None


async def test_one_version_has_its_content_and_operations(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await history(client, auth("alice"), ["a"], ["a2", "b"])

    response = await client.get(f"{ME}/versions/2", headers=auth("alice"))

    assert response.status_code == 200
    body = response.json()
    assert parse(body["content"]).bullets(WORK) == ("a2", "b")
    assert body["operations"] == [
        {"op": "UPDATE", "section": "Work Context", "old": "a", "new": "a2"},
        {"op": "ADD", "section": "Work Context", "old": None, "new": "b"},
    ]
    assert (await client.get(f"{ME}/versions/3", headers=auth("alice"))).status_code == 404
    assert (await client.get(f"{ME}/versions/0", headers=auth("alice"))).status_code == 422


async def test_diff_against_the_previous_version_by_default(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await history(client, auth("alice"), ["a"], ["a", "b"], ["b"])

    response = await client.get(f"{ME}/versions/2/diff", headers=auth("alice"))

    assert response.status_code == 200
    body = response.json()
    assert (body["from"], body["to"]) == (1, 2)
    assert body["diff"].startswith("--- memory.md@1\n+++ memory.md@2\n")
    assert "\n+- b\n" in body["diff"]

    explicit = (await client.get(f"{ME}/versions/3/diff?against=1", headers=auth("alice"))).json()
    assert (explicit["from"], explicit["to"]) == (1, 3)
    assert "\n-- a\n" in explicit["diff"]
    assert "\n+- b\n" in explicit["diff"]

    first = (await client.get(f"{ME}/versions/1/diff", headers=auth("alice"))).json()
    assert first["from"] == 0  # the empty document
    assert "+# User Memory\n" in first["diff"]


async def test_diff_of_unknown_versions_is_404(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await history(client, auth("alice"), ["a"], ["b"])

    unknown_to = await client.get(f"{ME}/versions/9/diff", headers=auth("alice"))
    unknown_from = await client.get(f"{ME}/versions/2/diff?against=7", headers=auth("alice"))

    assert unknown_to.status_code == 404
    assert unknown_from.status_code == 404


async def test_restore_makes_a_new_version_with_the_old_body(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await history(client, auth("alice"), ["a"], ["a", "b"], ["c"])
    old = (await client.get(f"{ME}/versions/1", headers=auth("alice"))).json()

    response = await client.post(
        f"{ME}/versions/1/restore", headers={**auth("alice"), "If-Match": '"3"'}
    )

    assert response.status_code == 201, response.text
    assert response.headers["etag"] == '"4"'
    assert response.headers["location"] == f"{ME}/versions/4"
    restored = parse(response.json()["content"])
    assert render_body(restored) == render_body(parse(old["content"]))
    assert restored.frontmatter.user_id == "alice"
    old_updated = parse(old["content"]).frontmatter.last_updated
    assert old_updated is not None
    assert restored.frontmatter.last_updated is not None
    assert restored.frontmatter.last_updated >= old_updated
    version = (await client.get(f"{ME}/versions/4", headers=auth("alice"))).json()
    assert version["reason"] == "restore"
    assert version["operations"] == [
        {"op": "UPDATE", "section": "Work Context", "old": "c", "new": "a"}
    ]


async def test_restore_needs_the_current_etag(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    await history(client, auth("alice"), ["a"], ["b"])
    url = f"{ME}/versions/1/restore"

    missing = await client.post(url, headers=auth("alice"))
    stale = await client.post(url, headers={**auth("alice"), "If-Match": '"1"'})
    unknown = await client.post(
        f"{ME}/versions/5/restore", headers={**auth("alice"), "If-Match": '"2"'}
    )

    assert missing.status_code == 428
    assert stale.status_code == 412
    assert unknown.status_code == 404
    assert (await client.get(ME, headers=auth("alice"))).json()["version"] == 2


async def test_restoring_the_current_content_writes_nothing(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await history(client, auth("alice"), ["a"], ["b"])

    response = await client.post(
        f"{ME}/versions/2/restore", headers={**auth("alice"), "If-Match": '"2"'}
    )

    assert response.status_code == 200
    assert response.json()["version"] == 2


@pytest.fixture
async def small_retention_client(database_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with client_with(database_url, memory_max_versions=3) as http:
        yield http


async def test_retention_keeps_the_newest_versions_contiguously(
    small_retention_client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    client = small_retention_client
    await history(client, auth("alice"), *[[f"fact {n}"] for n in range(1, 7)])

    listed = (await client.get(f"{ME}/versions", headers=auth("alice"))).json()

    assert [item["version"] for item in listed["items"]] == [6, 5, 4]
    assert (await client.get(f"{ME}/versions/3", headers=auth("alice"))).status_code == 404
    head = await client.get(ME, headers=auth("alice"))
    assert head.json()["version"] == 6
    oldest = (await client.get(f"{ME}/versions/4/diff", headers=auth("alice"))).json()
    assert oldest["from"] == 0  # version 3 was pruned: the diff starts from the empty document
    restore = await client.post(
        f"{ME}/versions/4/restore", headers={**auth("alice"), "If-Match": '"6"'}
    )
    assert restore.status_code == 201
    listed = (await client.get(f"{ME}/versions", headers=auth("alice"))).json()
    assert [item["version"] for item in listed["items"]] == [7, 6, 5]


# --- nobody else --------------------------------------------------------------------------------


async def test_another_user_reaches_none_of_it(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await history(client, auth("alice"), ["alice secret"], ["alice secret 2"])
    intruders = [auth("bob"), auth("alice", "globex"), auth("sam", "acme", ("space_admin",))]
    intruders.append(auth("olga", "acme", ("operator",)))

    for headers in intruders:
        with_tag = {**headers, "If-Match": '"2"'}
        for response in (
            await client.get(ME, headers=headers),
            await client.get(f"{ME}/versions", headers=headers),
            await client.get(f"{ME}/versions/1", headers=headers),
            await client.get(f"{ME}/versions/2/diff?against=1", headers=headers),
            await client.post(f"{ME}/versions/1/restore", headers=with_tag),
            await client.delete(ME, headers=with_tag),
            await client.put(ME, json={"content": memory_md()}, headers=with_tag),
        ):
            assert response.status_code in {404, 412}, response.request.url
            assert "alice secret" not in response.text
        # The PUT is about the intruder's own (absent) profile: If-Match "2" matches nothing of
        # theirs, so 412, and nothing is written; everything that reads is 404.
        assert (await client.get(ME, headers=headers)).status_code == 404

    alice = await client.get(ME, headers=auth("alice"))
    assert alice.json()["version"] == 2
    assert "alice secret 2" in alice.json()["content"]


async def test_a_user_without_a_memory_folder_gets_404_everywhere(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await history(client, auth("alice"), ["alice secret"])
    bob = {**auth("bob"), "If-Match": '"1"'}

    assert (await client.get(ME, headers=bob)).status_code == 404
    assert (await client.get(f"{ME}/versions", headers=bob)).status_code == 404
    assert (await client.get(f"{ME}/versions/1", headers=bob)).status_code == 404
    assert (await client.get(f"{ME}/versions/1/diff", headers=bob)).status_code == 404
    assert (await client.post(f"{ME}/versions/1/restore", headers=bob)).status_code == 404
    assert (await client.delete(ME, headers=bob)).status_code == 404


# --- export -------------------------------------------------------------------------------------


async def seed_chat(app: FastAPI, company: str, user: str, chat_id: str, *texts: str) -> uuid.UUID:
    """One turn in `chat_id` saving `texts` (user, assistant, user, ...) and its finished job."""
    turn_id = uuid.uuid4()
    async with sessions(app)() as session, session.begin():
        await session.execute(
            text(
                "INSERT INTO turns (company_id, id, user_id, chat_id, space_id, history_mode)"
                " VALUES (:c, :id, :u, :chat, 'space-1', 'auto')"
            ),
            {"c": company, "id": turn_id, "u": user, "chat": chat_id},
        )
        for n, content in enumerate(texts):
            await session.execute(
                text(
                    "INSERT INTO chat_messages (company_id, user_id, chat_id, turn_id, role,"
                    " content, source, tokens) VALUES (:c, :u, :chat, :t, :role, :content,"
                    " :source, 3)"
                ),
                {
                    "c": company,
                    "u": user,
                    "chat": chat_id,
                    "t": turn_id,
                    "role": "user" if n % 2 == 0 else "assistant",
                    "content": content,
                    "source": "request" if n % 2 == 0 else "response",
                },
            )
        await session.execute(
            text(
                "INSERT INTO jobs (company_id, id, user_id, kind, status, outcome, version,"
                " max_attempts, payload) VALUES (:c, :id, :u, 'consolidation', 'succeeded',"
                " 'updated', 1, 5, :payload)"
            ),
            {
                "c": company,
                "id": uuid.uuid4(),
                "u": user,
                "payload": f'{{"turn_ids": ["{turn_id}"]}}',
            },
        )
    return turn_id


async def test_export_holds_everything_about_the_caller_and_nothing_else(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    for headers in (auth("alice"), auth("bob"), auth("alice", "globex")):
        await client.patch("/v1/me/settings", json={"context_memory": False}, headers=headers)
        await client.patch("/v1/me/settings", json={"context_memory": True}, headers=headers)
    await history(client, auth("alice"), ["alice fact"], ["alice fact", "alice fact 2"])
    await history(client, auth("bob"), ["bob fact"])
    await history(client, auth("alice", "globex"), ["globex alice fact"])
    chat_a = await seed_chat(app, "acme", "alice", "chat-a", "alice q1", "alice a1")
    await seed_chat(app, "acme", "alice", "chat-b", "alice q2", "alice a2")
    await seed_chat(app, "acme", "alice", "chat-a", "alice q3", "alice a3")
    await seed_chat(app, "acme", "bob", "chat-a", "bob q1", "bob a1")
    await seed_chat(app, "globex", "alice", "chat-a", "globex q1", "globex a1")

    response = await client.get(f"{ME}/export", headers=auth("alice"))

    assert response.status_code == 200
    export = response.json()
    assert set(export) == {
        "user_id",
        "company_id",
        "exported_at",
        "settings",
        "profile",
        "versions",
        "chats",
        "jobs",
        "audit_events",
        "policy_actions",
    }
    assert (export["user_id"], export["company_id"]) == ("alice", "acme")
    assert export["settings"] == {"context_memory": True}
    assert export["profile"]["version"] == 2
    assert [v["version"] for v in export["versions"]] == [1, 2]
    assert export["versions"][1]["operations"] == [
        {"op": "ADD", "section": "Work Context", "old": None, "new": "alice fact 2"}
    ]
    assert [chat["chat_id"] for chat in export["chats"]] == ["chat-a", "chat-b"]
    chat = export["chats"][0]
    assert [m["content"] for m in chat["messages"]] == [
        "alice q1",
        "alice a1",
        "alice q3",
        "alice a3",
    ]
    assert chat["turns"][0]["id"] == str(chat_a)
    assert len(export["jobs"]) == 3
    assert set(export["jobs"][0]) == {
        "id",
        "kind",
        "status",
        "outcome",
        "version",
        "created_at",
        "finished_at",
    }
    assert [e["action"] for e in export["audit_events"]] == ["user_settings.update"] * 2
    assert export["policy_actions"] == []
    for foreign in ("bob", "globex"):
        assert foreign not in response.text


async def test_export_without_a_memory_folder_still_holds_settings_and_chats(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    await history(client, auth("alice"), ["alice secret"])
    await seed_chat(app, "acme", "bob", "chat-1", "bob question")

    export = (await client.get(f"{ME}/export", headers=auth("bob"))).json()

    assert export["profile"] is None
    assert export["versions"] == []
    assert [m["content"] for m in export["chats"][0]["messages"]] == ["bob question"]
    assert "alice" not in str(export)
