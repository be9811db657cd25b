"""A company holding a row of every kind the export carries, the export read back as records,
and the normal form two exports of the same data share."""

from __future__ import annotations

import uuid
from collections import Counter
from datetime import UTC, datetime
from typing import Any

import httpx
import orjson
from fastapi import FastAPI

from app.enablement.decision import FLAG_ALLOW_WITH_WEB_SEARCH, FLAG_CONTEXT_MEMORY
from app.portability.format import MEDIA_TYPE, header_line
from app.portability.kinds import RECORD_TYPES
from app.profiles import service as profiles
from app.profiles.document import Frontmatter, Operation, OpKind, Profile, Section
from app.profiles.versions import ExpectedHead, VersionPolicy, VersionSource, content_sha256
from eval.import_stream import user_memory_records
from tests.helpers.apps import OPERATOR, SPACE, SPACE_ADMIN, AuthFactory
from tests.helpers.db import sessions
from tests.helpers.memory import ME
from tests.helpers.profiles import STORED_COUNTER, memory_md
from tests.helpers.settings import set_flag
from tests.helpers.turns import assistant, user

OPERATOR_HEADERS = ("olga", "platform", OPERATOR)
POLICY = {
    "secrets": "drop",
    "payment_cards": "drop",
    "bank_accounts": "drop",
    "national_ids": "drop",
    "email_addresses": "redact",
    "phone_numbers": "drop",
    "instructions": "drop",
    "recent_topics_days": 30,
    "inactive_memory_days": 0,
}


def operator(auth: AuthFactory) -> dict[str, str]:
    return auth(*OPERATOR_HEADERS)


async def seed_company(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, company: str, canary: str
) -> None:
    """Flags, a memory policy, two spaces, user settings, users' folders, profiles with several
    versions of every reason the API writes (a consolidation with its provenance, one value of
    which the policy redacted), a cleared profile, an opted-out user, chats and audit events;
    every text carries `canary`."""
    await set_flag(client, auth, FLAG_CONTEXT_MEMORY, True, company)
    await set_flag(client, auth, FLAG_ALLOW_WITH_WEB_SEARCH, True, company)
    policy = await client.put(
        f"/v1/companies/{company}/memory-policy", json=POLICY, headers=operator(auth)
    )
    assert policy.status_code == 200, policy.text
    admin = auth("sam", company, SPACE_ADMIN)
    for space, body in (
        (SPACE, {"context_memory": True, "user_memory": {"max_tokens": 3000}}),
        ("space-2", {"web_search": True, "user_memory": {"language_model": "gpt-4o"}}),
    ):
        response = await client.patch(f"/v1/spaces/{space}", json=body, headers=admin)
        assert response.status_code == 200, response.text

    alice = auth("alice", company)
    for version, line in enumerate(("Analyst", "Senior analyst", "Head of risk"), start=1):
        content = memory_md({Section.WORK: [f"{line} at {canary}"]})
        condition = {"If-None-Match": "*"} if version == 1 else {"If-Match": f'"{version - 1}"'}
        saved = await client.put(ME, json={"content": content}, headers={**alice, **condition})
        assert saved.status_code in (200, 201), saved.text
    restored = await client.post(f"{ME}/versions/1/restore", headers={**alice, "If-Match": '"3"'})
    assert restored.status_code == 201, restored.text
    turn_ids = []
    for number in range(3):
        response = await client.post(
            "/v1/chats/chat-1/turns",
            json={
                "space_id": SPACE,
                "messages": [user(f"Question {number} about {canary}")],
                "response": assistant(f"Answer {number} about {canary}"),
                "language_model": "gpt-4o-mini",
            },
            headers=alice,
        )
        assert response.status_code == 202, response.text
        turn_ids.append(response.json()["turn_id"])
    await _consolidate(app, company, "alice", canary, turn_ids)

    bob = auth("bob", company)
    created = await client.put(
        ME,
        json={"content": memory_md({Section.SKILLS: [f"Python for {canary}"]}, user_id="bob")},
        headers={**bob, "If-None-Match": "*"},
    )
    assert created.status_code == 201, created.text
    assert (await client.delete(ME, headers=bob)).status_code == 204  # a cleared head
    response = await client.post(
        "/v1/chats/chat-b/turns",
        json={
            "space_id": "space-2",
            "messages": [user(f"Bob asks about {canary}")],
            "response": assistant("Bob gets an answer"),
            "history_mode": "record_all",
        },
        headers=bob,
    )
    assert response.status_code in (201, 202), response.text

    carol = auth("carol", company)
    for enabled in (True, False):  # a stored setting, off
        response = await client.patch(
            "/v1/me/settings", json={"context_memory": enabled}, headers=carol
        )
        assert response.status_code == 200, response.text


async def _consolidate(
    app: FastAPI, company: str, user_id: str, canary: str, turn_ids: list[str]
) -> None:
    """A worker's version, with everything a version records of where it came from; the
    policy redacts the e-mail address in it."""
    policy = VersionPolicy(STORED_COUNTER, keep=50)
    async with sessions(app)() as session, session.begin():
        current, version = await profiles.load_profile(session, company, user_id)
        added = f"Reach {canary.lower()} at falcon@example.com"
        profile = Profile.from_sections(
            Frontmatter(user_id),
            {
                **{section: list(current.bullets(section)) for section in Section},
                Section.FOLLOWUPS: [added],
            },
        )
        source = VersionSource(
            "consolidation",
            operations=(Operation(OpKind.ADD, Section.FOLLOWUPS, text=added),),
            source_turn_ids=tuple(turn_ids),
            model="gpt-4o-mini",
            tokens_in=812,
            tokens_out=64,
            job_id=uuid.uuid4(),
        )
        written = await profiles.save_consolidation(
            session, ExpectedHead(company, user_id, version), profile, source, policy
        )
        assert written is not None


async def export_of(client: httpx.AsyncClient, auth: AuthFactory, company: str) -> bytes:
    response = await client.get(f"/v1/companies/{company}/export", headers=operator(auth))
    assert response.status_code == 200, response.text
    assert response.headers["content-type"] == MEDIA_TYPE
    return response.content


async def import_into(
    client: httpx.AsyncClient, auth: AuthFactory, company: str, stream: bytes
) -> httpx.Response:
    return await client.post(
        f"/v1/companies/{company}/import",
        content=stream,
        headers={**operator(auth), "Content-Type": MEDIA_TYPE},
    )


def stream_of(company: str, *lines: dict[str, Any], trailer: bool = True) -> bytes:
    """A stream of `lines` for `company`, with its header and (unless told) its trailer."""
    counts = Counter(str(line["type"]) for line in lines)
    header = orjson.loads(header_line(company, datetime(2026, 12, 1, tzinfo=UTC), RECORD_TYPES))
    end = [{"type": "end", "counts": dict(counts)}] if trailer else []
    return b"".join(orjson.dumps(line) + b"\n" for line in [header, *lines, *end])


def memory_records(company: str, user_id: str, contents: list[str]) -> list[dict[str, Any]]:
    """The records of one user's memory: the root and the user's folder with their ACLs, the
    memory.md and a version per document in `contents` (a stream needs the root once)."""
    versions = [
        {
            "type": "memory_version",
            "user_id": user_id,
            "version": number,
            "content": content,
            "sha256": content_sha256(content),
            "tokens": 1,
            "reason": "user_edit",
            "operations": [],
            "source_turn_ids": [],
            "created_at": "2026-11-01T10:00:00+00:00",
        }
        for number, content in enumerate(contents, start=1)
    ]
    return user_memory_records(company, [(user_id, versions)])


def records(stream: bytes) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in stream.splitlines()]


OWN_EVENTS = frozenset({"company.exported", "company.imported"})


def normalised(stream: bytes) -> list[dict[str, Any]]:
    """The records with what two exports of the same data may differ in taken out: the time
    of the snapshot, and the audit events of exports and imports themselves (with their
    count)."""
    found: list[dict[str, Any]] = []
    dropped = 0
    for record in records(stream):
        kept = dict(record)
        if kept["type"] == "header":
            del kept["exported_at"]
        if kept["type"] == "audit_event" and kept["action"] in OWN_EVENTS:
            dropped += 1
            continue
        if kept["type"] == "end":
            kept["counts"] = {
                **kept["counts"],
                "audit_event": kept["counts"]["audit_event"] - dropped,
            }
        found.append(kept)
    return found
