"""Mass assignment: no request body sets who owns data or what the service writes itself.

Every request model forbids unknown fields, so a body naming `user_id`, `company_id`,
`version`, `turn_count` or an ACL is refused with a 422 problem+json naming the field, and the
whole database (row counts and row hashes of every table) is what it was. Frontmatter inside a
profile is the one place such fields are accepted as text: it is ignored, and the stored
profile names its real owner.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
from fastapi import FastAPI

from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.profiles.document import parse, render
from app.profiles.profile import Frontmatter, Profile, Section
from tests.helpers.apps import SPACE, AuthFactory
from tests.helpers.memory import ME
from tests.helpers.snapshots import changed_tables, database_digest, user_digest
from tests.helpers.tenants import (
    OPERATOR_CALLER,
    OTHER_COMPANY_ADMIN,
    OTHER_COMPANY_USER,
    OWNER,
    SAME_COMPANY_USER,
    Caller,
    head_version,
    headers_of,
    profile_text,
    seed_world,
    turn_payload,
)
from tests.helpers.turns import user

ATTACKER = SAME_COMPANY_USER
ACL = [{"principal_kind": "user", "principal_id": ATTACKER.sub, "permission": "MANAGE"}]
OWNERSHIP = {
    "user_id": OWNER.sub,
    "company_id": OWNER.company,
    "version": 99,
    "turn_count": 999,
    "acl": ACL,
}
"""The fields a client must never set, with values that would hand the owner's data over."""


@dataclass(frozen=True)
class Attempt:
    """A request whose body is valid except for `extra` at `at` (a path into the body)."""

    caller: Caller
    method: str
    path: str
    body: dict[str, Any]
    at: tuple[str | int, ...] = ()
    headers: dict[str, str] = field(default_factory=dict)

    def with_field(self, name: str, value: object) -> tuple[dict[str, Any], str]:
        """The body with `name` set where `at` points, and the field the 422 must name."""
        body: Any = _copy(self.body)
        node = body
        for step in self.at:
            node = node[step]
        node[name] = value
        return body, ".".join(["body", *(str(step) for step in self.at), name])


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_copy(item) for item in value]
    return value


def attempts(canary: str, bob_head: int) -> list[Attempt]:
    memory = {"content": profile_text(canary, 7)}
    context = {"space_id": SPACE, "messages": [user(f"Hello {canary}")]}
    turn = turn_payload(canary, 7)
    explicit = {"space_id": SPACE, "user": f"I like {canary}", "assistant": "Noted."}
    if_match = {"If-Match": f'"{bob_head}"'}
    return [
        Attempt(ATTACKER, "PUT", ME, memory, headers=if_match),
        Attempt(ATTACKER, "POST", "/v1/chats/chat-shared/context", context),
        Attempt(ATTACKER, "POST", "/v1/chats/chat-shared/context", context, ("messages", 0)),
        Attempt(ATTACKER, "POST", "/v1/chats/chat-shared/turns", turn),
        Attempt(ATTACKER, "POST", "/v1/chats/chat-shared/turns", turn, ("messages", 0)),
        Attempt(ATTACKER, "POST", "/v1/chats/chat-shared/turns", turn, ("response",)),
        Attempt(ATTACKER, "POST", "/v1/me/memory/consolidations", explicit),
        # a space admin of another company reaching for the owner's company
        Attempt(OTHER_COMPANY_ADMIN, "PATCH", f"/v1/spaces/{SPACE}", {"web_search": True}),
        Attempt(
            OTHER_COMPANY_ADMIN,
            "PATCH",
            f"/v1/spaces/{SPACE}",
            {"user_memory": {"max_tokens": 500}},
            ("user_memory",),
        ),
        Attempt(
            OPERATOR_CALLER,
            "PUT",
            f"/v1/companies/globex/feature-flags/{FLAG_CONTEXT_MEMORY}",
            {"enabled": False},
        ),
        # last: accepted (in the control), it deletes the caller's memory
        Attempt(ATTACKER, "PATCH", "/v1/me/settings", {"context_memory": False}),
    ]


async def test_ownership_fields_in_a_body_are_refused_and_change_nothing(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    world = await seed_world(app, client, auth)
    bob_head = await head_version(app, ATTACKER)
    assert bob_head is not None
    problems: list[str] = []
    sent = 0
    for attempt in attempts(world.canary(ATTACKER), bob_head):
        headers = {**headers_of(auth, attempt.caller), **attempt.headers}
        for name, value in OWNERSHIP.items():
            body, named = attempt.with_field(name, value)
            before = await database_digest(app)
            response = await client.request(
                attempt.method, attempt.path, json=body, headers=headers
            )
            changed = changed_tables(before, await database_digest(app))
            sent += 1
            where = f"{attempt.method} {attempt.path} with {named}"
            fields = [error.get("field") for error in response.json().get("errors", [])]
            if response.status_code != 422 or named not in fields:
                problems.append(f"{where}: {response.status_code}, errors {fields}")
            if response.headers["content-type"] != "application/problem+json":
                problems.append(f"{where}: not problem+json")
            if changed:
                problems.append(f"{where}: changed {changed}")
    assert sent == 11 * len(OWNERSHIP)
    assert not problems, "\n".join(problems)


async def test_the_same_bodies_without_those_fields_are_accepted(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    """The control: each attempt's body is refused only for the field it smuggled in."""
    world = await seed_world(app, client, auth)
    bob_head = await head_version(app, ATTACKER)
    assert bob_head is not None
    for attempt in attempts(world.canary(ATTACKER), bob_head):
        headers = {**headers_of(auth, attempt.caller), **attempt.headers}
        response = await client.request(
            attempt.method, attempt.path, json=attempt.body, headers=headers
        )
        assert response.status_code < 300, (attempt.method, attempt.path, response.text)


def _claiming(owner: Caller, canary: str, turn_count: int) -> str:
    """A memory.md whose frontmatter says it belongs to `owner` with `turn_count`."""
    frontmatter = Frontmatter(user_id=owner.sub, turn_count=turn_count)
    return render(Profile.from_sections(frontmatter, {Section.WORK: [f"Edited {canary}"]}))


async def test_frontmatter_naming_another_user_changes_no_owner(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    """The service writes the frontmatter: the edit lands in the caller's own profile, names the
    caller, keeps the caller's turn count, and the named user's data is untouched."""
    world = await seed_world(app, client, auth)
    for caller in (ATTACKER, OTHER_COMPANY_USER):
        head = await head_version(app, caller)
        assert head is not None
        turn_count = parse(
            (await client.get(ME, headers=headers_of(auth, caller))).json()["content"]
        ).frontmatter.turn_count
        victims = {OWNER.key: await user_digest(app, *OWNER.key)}
        content = _claiming(OWNER, world.canary(caller), 999)
        response = await client.put(
            ME,
            json={"content": content},
            headers={**headers_of(auth, caller), "If-Match": f'"{head}"'},
        )
        assert response.status_code == 200, response.text
        stored = parse(response.json()["content"]).frontmatter
        assert (stored.user_id, stored.turn_count) == (caller.sub, turn_count)
        assert response.json()["version"] == head + 1
        assert world.canary(caller) in response.json()["content"]
        assert changed_tables(victims[OWNER.key], await user_digest(app, *OWNER.key)) == []
    owner_memory = await client.get(ME, headers=headers_of(auth, OWNER))
    assert owner_memory.json()["version"] == world.owner_top_version
    assert world.canary(ATTACKER) not in owner_memory.text
