"""Several users of two companies, each owning data that carries a canary of their own, and the
search for canaries in what a response shows (body, headers, and base64url-encoded cursors).

The owner (`alice` of `acme`) has the most: a profile with five versions, a private and a
shared chat, a queued and a dead job, audit events of her setting, her folder. `bob` (same
company), `alice` of `globex` (same user id, another company) and the bystander `carol` of
`globex` own less of the same kinds. Every text a user stored contains their canary.
"""

from __future__ import annotations

import base64
import binascii
import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson
from fastapi import FastAPI
from sqlalchemy import text

from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.profiles.profile import Section
from tests.helpers.apps import OPERATOR, SPACE, SPACE_ADMIN, AuthFactory
from tests.helpers.db import scalar, sessions
from tests.helpers.memory import ME
from tests.helpers.profiles import memory_md
from tests.helpers.settings import set_flag
from tests.helpers.turns import assistant, user

ACME, GLOBEX = "acme", "globex"
SHARED_CHAT = "chat-shared"
"""A chat id every data user has a chat under: the same id must never join their histories."""
PRIVATE_CHAT = "chat-owner-only"
"""A chat id only the owner has."""
SPACE_BUDGET = {ACME: 3000, GLOBEX: 4000}
"""Each company's `space-1` budget, as its own space admin set it."""


@dataclass(frozen=True)
class Caller:
    """Who makes a request: a user of a company with roles; `label` names them in reports."""

    label: str
    sub: str
    company: str
    roles: tuple[str, ...] = ()

    @property
    def key(self) -> tuple[str, str]:
        return (self.company, self.sub)


OWNER = Caller("owner", "alice", ACME)
SAME_COMPANY_USER = Caller("same-company user", "bob", ACME)
SAME_COMPANY_ADMIN = Caller("same-company space admin", "sam", ACME, SPACE_ADMIN)
OPERATOR_CALLER = Caller("operator", "olga", "platform", OPERATOR)
OTHER_COMPANY_USER = Caller("other-company user (same user id)", "alice", GLOBEX)
OTHER_COMPANY_ADMIN = Caller("other-company space admin", "eve", GLOBEX, SPACE_ADMIN)
SAME_COMPANY_OPERATOR = Caller("same-company operator", "cora", ACME, ("company_operator",))
OTHER_COMPANY_OPERATOR = Caller("other-company operator", "otto", GLOBEX, ("company_operator",))
BYSTANDER = Caller("bystander", "carol", GLOBEX)

CALLERS = (
    SAME_COMPANY_USER,
    SAME_COMPANY_ADMIN,
    OPERATOR_CALLER,
    OTHER_COMPANY_USER,
    OTHER_COMPANY_ADMIN,
    SAME_COMPANY_OPERATOR,
    OTHER_COMPANY_OPERATOR,
    OWNER,
)
"""Every caller with a valid token; the owner last, so the others meet the owner's data intact."""
DATA_USERS = (OWNER, SAME_COMPANY_USER, OTHER_COMPANY_USER, BYSTANDER)
"""The users seeded with data of their own; the number of profile versions each gets."""
VERSIONS = {OWNER.key: 5, SAME_COMPANY_USER.key: 1, OTHER_COMPANY_USER.key: 2, BYSTANDER.key: 1}


# the run's hex digits spelled as letters (0-f -> g-v): a part of letters only never looks like a
# key to the memory policy's detectors (a profile holding one would be refused), where 12 hex
# digits did in about 1 run of 250 (a letter next to a digit often enough, and high entropy)
_LETTERS_FOR_HEX = str.maketrans("0123456789abcdef", "ghijklmnopqrstuv")


def canary_of(caller: Caller, run: str) -> str:
    """Unique per caller and run (48 bits of it), in letters only, so that no canary looks like
    a key to the memory policy's secret detectors: 80,000 of them drawn, none flagged."""
    return f"CANARY.{caller.sub}.{caller.company}.{run[:12].translate(_LETTERS_FOR_HEX)}"


@dataclass
class World:
    """What was seeded: every caller's canary, and the ids of the owner's objects."""

    run: str
    canaries: dict[tuple[str, str], str]
    owner_turn_ids: list[str] = field(default_factory=list)
    owner_queued_job: str = ""
    owner_dead_job: str = ""
    owner_idempotency_key: str = ""

    @property
    def owner_top_version(self) -> int:
        return VERSIONS[OWNER.key]

    def canary(self, caller: Caller) -> str:
        return self.canaries[caller.key]

    def foreign_canaries(self, caller: Caller | None) -> dict[tuple[str, str], str]:
        """Every canary that is not the caller's own (all of them for a caller without a
        valid token)."""
        own = None if caller is None else caller.key
        return {key: canary for key, canary in self.canaries.items() if key != own}

    def owner_secrets(self) -> list[str]:
        """Ids of the owner's objects that no other user's response may carry."""
        return [*self.owner_turn_ids, self.owner_queued_job, self.owner_dead_job]


def headers_of(auth: AuthFactory, caller: Caller) -> dict[str, str]:
    return auth(caller.sub, caller.company, caller.roles)


def profile_text(canary: str, version: int) -> str:
    return memory_md(
        {
            Section.IDENTITY: [f"Known as {canary}"],
            Section.WORK: [f"Project {canary} phase {version}"],
        }
    )


def turn_payload(canary: str, turn: int) -> dict[str, Any]:
    return {
        "space_id": SPACE,
        "messages": [user(f"Question {turn} about {canary}")],
        "response": assistant(f"Answer {turn} about {canary}"),
        "language_model": "gpt-4o-mini",
    }


async def _seed_user(
    client: httpx.AsyncClient, auth: AuthFactory, world: World, owner: Caller
) -> None:
    headers = headers_of(auth, owner)
    canary = world.canary(owner)
    created = await client.put(
        ME, json={"content": profile_text(canary, 1)}, headers={**headers, "If-None-Match": "*"}
    )
    assert created.status_code == 201, created.text
    for version in range(2, VERSIONS[owner.key] + 1):
        replaced = await client.put(
            ME,
            json={"content": profile_text(canary, version)},
            headers={**headers, "If-Match": f'"{version - 1}"'},
        )
        assert replaced.status_code == 200, replaced.text
    chats = [SHARED_CHAT, SHARED_CHAT] + ([PRIVATE_CHAT] * 3 if owner == OWNER else [])
    for turn, chat in enumerate(chats):
        first = turn == 0 and owner == OWNER
        extra = {"Idempotency-Key": world.owner_idempotency_key} if first else {}
        saved = await client.post(
            f"/v1/chats/{chat}/turns",
            json=turn_payload(canary, turn),
            headers={**headers, **extra},
        )
        assert saved.status_code == 202, saved.text
        if owner == OWNER:
            world.owner_turn_ids.append(saved.json()["turn_id"])
            world.owner_queued_job = saved.json()["consolidation"]["job_id"]


async def _seed_dead_job(app: FastAPI, owner: Caller) -> str:
    job_id = uuid.uuid4()
    async with sessions(app)() as session, session.begin():
        await session.execute(
            text(
                "INSERT INTO jobs (company_id, id, user_id, kind, status, max_attempts, attempts,"
                " error_class, error_message) VALUES (:c, :id, :u, 'consolidation', 'dead', 5, 5,"
                " 'ModelTimeout', 'The model did not answer in time.')"
            ),
            {"c": owner.company, "id": job_id, "u": owner.sub},
        )
    return str(job_id)


async def seed_world(app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory) -> World:
    """Both companies enabled, their `space-1` configured by their own admins, and every data
    user's profile versions and chats (the owner also a dead job and setting changes)."""
    run = uuid.uuid4().hex
    callers = {*CALLERS, BYSTANDER}
    world = World(
        run=run,
        canaries={caller.key: canary_of(caller, run) for caller in callers},
        owner_idempotency_key=f"seed-{run}",
    )
    for company, admin in ((ACME, SAME_COMPANY_ADMIN), (GLOBEX, OTHER_COMPANY_ADMIN)):
        await set_flag(client, auth, FLAG_CONTEXT_MEMORY, True, company)
        body = {"context_memory": True, "user_memory": {"max_tokens": SPACE_BUDGET[company]}}
        response = await client.patch(
            f"/v1/spaces/{SPACE}", json=body, headers=headers_of(auth, admin)
        )
        assert response.status_code == 200, response.text
    for enabled in (False, True):  # two audit events about the owner's own setting
        response = await client.patch(
            "/v1/me/settings", json={"context_memory": enabled}, headers=headers_of(auth, OWNER)
        )
        assert response.status_code == 200, response.text
    for data_user in DATA_USERS:
        await _seed_user(client, auth, world, data_user)
    world.owner_dead_job = await _seed_dead_job(app, OWNER)
    return world


async def head_version(app: FastAPI, caller: Caller) -> int | None:
    """The caller's current profile version (None without a profile)."""
    found: int | None = await scalar(
        app,
        "SELECT max(version) FROM memory_versions WHERE company_id = :c AND user_id = :u",
        c=caller.company,
        u=caller.sub,
    )
    return found


# --- what a response shows ----------------------------------------------------------------------

_BASE64URL = re.compile(r"[A-Za-z0-9_-]{8,}={0,2}")


def _strings(value: object) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _decoded(value: str) -> str | None:
    """The text a base64url string (a cursor, an opaque token) stands for, if it is one."""
    if not _BASE64URL.fullmatch(value):
        return None
    try:
        raw = base64.urlsafe_b64decode(value + "=" * (-len(value) % 4))
    except (binascii.Error, ValueError):
        return None
    return raw.decode("utf-8", errors="ignore")


def visible_texts(response: httpx.Response) -> list[str]:
    """Everything a client could read in a response: the headers, the raw body, and every
    string of a JSON body decoded from base64url where it is base64url."""
    texts = [f"{name}: {value}" for name, value in response.headers.multi_items()]
    texts.append(response.text)
    try:
        document = orjson.loads(response.content) if response.content else None
    except orjson.JSONDecodeError:
        document = None
    for value in [*_strings(document), *response.headers.values()]:
        for token in re.findall(r"[A-Za-z0-9_=-]{8,}", value):
            decoded = _decoded(token)
            if decoded:
                texts.append(decoded)
    return texts


def found_in(response: httpx.Response, needles: dict[str, str]) -> list[str]:
    """The names of the needles (name -> text) that appear anywhere in the response."""
    texts = visible_texts(response)
    return [name for name, needle in needles.items() if any(needle in t for t in texts)]
