"""Load and inject over HTTP: the "What I know about you" section appears exactly when the
enablement matrix, the folder ACL and a stored profile allow it; an over-budget profile is
injected truncated and queues one condensation; the common path is one SQL statement."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.profiles.document import TRUNCATION_MARKER, Section
from app.profiles.injection import MEMORY_SECTION_TITLE
from tests.helpers.apps import COMPANY, SPACE, AuthFactory
from tests.helpers.db import rows, statements
from tests.helpers.memory import seed_profile
from tests.helpers.settings import enable_company, patch_space, patch_user_settings
from tests.helpers.turns import context as load
from tests.helpers.turns import new_chat, save_turn, system, user

ALICE_FACTS = {
    Section.IDENTITY: ["Alice is a data engineer in Berlin"],
    Section.COMMUNICATION: ["Prefers short answers with code"],
}
BOB_FACTS = {Section.IDENTITY: ["Bob is a pastry chef in Lyon"]}


def system_prompt(result: dict[str, Any]) -> str:
    first = result["messages"][0]
    assert first["role"] == "system"
    assert first["content"] == result["system_prompt"]
    return str(first["content"])


async def test_profile_is_injected_into_the_system_prompt(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    await seed_profile(app, "alice", ALICE_FACTS, version=3)

    result = await load(
        client, auth, new_chat(), [system("Be helpful."), user("Hi")], system_prompt="Base."
    )

    prompt = system_prompt(result)
    assert prompt.startswith("Base.\n\n## " + MEMORY_SECTION_TITLE)
    assert "# User Memory" in prompt
    assert "- Alice is a data engineer in Berlin" in prompt
    assert "user_id:" not in prompt
    assert "turn_count" not in prompt
    assert "Be helpful." not in prompt  # the request's system_prompt wins over the template's
    memory = result["memory"]
    assert memory["enabled"] is True
    assert memory["injected"] is True
    assert memory["version"] == 3
    assert 0 < memory["tokens"] <= 2000
    assert all(c["satisfied"] for c in memory["conditions"])


async def test_memory_section_joins_the_templates_system_message(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    await seed_profile(app, "alice", ALICE_FACTS)

    result = await load(client, auth, new_chat(), [system("Be helpful."), user("Hi")])

    assert system_prompt(result).startswith("Be helpful.\n\n## " + MEMORY_SECTION_TITLE)
    assert [m["role"] for m in result["messages"]] == ["system", "user"]


@pytest.mark.parametrize(
    ("setup", "injected", "blocked_by"),
    [
        ("all_on", True, None),
        ("company_flag_off", False, "company_flag"),
        ("space_disabled", False, "space_setting"),
        ("web_search_on", False, "web_search"),
        ("web_search_on_but_allowed", True, None),
        ("user_opted_out", False, "user_setting"),
    ],
)
async def test_section_present_exactly_when_memory_is_effectively_enabled(
    *,
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    setup: str,
    injected: bool,
    blocked_by: str | None,
) -> None:
    if setup != "company_flag_off":
        await enable_company(client, auth, allow_with_web_search=setup.endswith("allowed"))
    if setup == "space_disabled":
        await patch_space(client, auth, SPACE, {"context_memory": False}, expect=200)
    if setup.startswith("web_search_on"):
        await patch_space(client, auth, SPACE, {"web_search": True}, expect=200)
    if setup == "user_opted_out":
        await seed_profile(app, "alice", ALICE_FACTS)
        # opting out deletes the memory
        await patch_user_settings(client, auth, {"context_memory": False}, "alice", expect=200)
    # a profile row exists in every case (re-seeded after the opt-out deleted it)
    await seed_profile(app, "alice", ALICE_FACTS, version=7)

    result = await load(client, auth, new_chat(), [system("Be helpful."), user("Hi")])

    assert (MEMORY_SECTION_TITLE in system_prompt(result)) is injected
    assert ("Alice is a data engineer" in str(result["messages"])) is injected
    memory = result["memory"]
    assert memory["enabled"] is injected
    assert memory["injected"] is injected
    if blocked_by is None:
        assert memory["version"] == 7
    else:
        assert memory["version"] is None
        assert memory["tokens"] is None
        blocked = [c["key"] for c in memory["conditions"] if not c["satisfied"]]
        assert blocked == [blocked_by]
        assert memory["reason"] == next(
            c["reason"] for c in memory["conditions"] if c["key"] == blocked_by
        )


async def test_no_profile_yet_means_no_section_at_all(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)

    result = await load(client, auth, new_chat(), [system("Be helpful."), user("Hi")], debug=True)

    assert result["system_prompt"] == "Be helpful."
    assert result["memory"]["enabled"] is True
    assert result["memory"]["injected"] is False
    assert "no profile yet" in result["memory"]["reason"]
    assert result["debug"]["memory"]["profile_exists"] is False


async def test_an_empty_profile_injects_nothing(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    await seed_profile(app, "alice", {})

    result = await load(client, auth, new_chat(), [user("Hi")], debug=True)

    assert result["system_prompt"] is None
    assert result["memory"]["injected"] is False
    assert "holds no notes" in result["memory"]["reason"]
    assert result["debug"]["memory"]["profile_exists"] is True


async def test_without_any_system_prompt_there_is_no_system_message(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    result = await load(client, auth, new_chat(), [user("Hi")])
    assert result["system_prompt"] is None
    assert [m["role"] for m in result["messages"]] == ["user"]


async def test_another_users_profile_is_never_injected(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    await seed_profile(app, "bob", BOB_FACTS)
    chat = "shared-chat-id"

    alice = await load(client, auth, chat, [user("Hi")], sub="alice")
    bob = await load(client, auth, chat, [user("Hi")], sub="bob")

    assert alice["system_prompt"] is None
    assert alice["memory"]["injected"] is False
    assert "pastry chef" in bob["system_prompt"]


async def test_the_folder_acl_gates_reading_memory(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    await seed_profile(app, "alice", ALICE_FACTS)
    async with app.state.database.engine.begin() as conn:
        await conn.exec_driver_sql(
            "DELETE FROM folder_acl WHERE company_id = $1 AND principal_id = $2"
            " AND permission = 'READ'",
            (COMPANY, "alice"),
        )

    result = await load(client, auth, new_chat(), [user("Hi")], debug=True)

    assert result["system_prompt"] is None
    assert result["memory"]["enabled"] is True
    assert result["memory"]["injected"] is False
    assert result["debug"]["memory"]["access"] == "denied"


def big_profile() -> dict[Section, list[str]]:
    def lines(topic: str) -> list[str]:
        return [f"{topic} fact {n}: " + "lorem ipsum dolor sit amet" * 6 for n in range(12)]

    return {
        Section.IDENTITY: lines("Identity"),
        Section.WORK: lines("Work"),
        Section.RECENT: [
            f"2026-11-{d:02d} 09:00 UTC: topic {d} " + "x y z" * 10 for d in range(1, 20)
        ],
        Section.FOLLOWUPS: lines("Follow-up"),
    }


async def test_over_budget_profile_is_truncated_and_condensed_once(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    await patch_space(client, auth, SPACE, {"user_memory": {"max_tokens": 500}}, expect=200)
    await seed_profile(app, "alice", big_profile())

    first = await load(client, auth, new_chat(), [user("Hi")], debug=True)
    second = await load(client, auth, new_chat(), [user("Hi")], debug=True)
    # concurrent loads of the over-budget profile still share the one pending condensation
    await asyncio.gather(*(load(client, auth, new_chat(), [user("Hi")]) for _ in range(6)))

    for result in (first, second):
        prompt = system_prompt(result)
        assert TRUNCATION_MARKER in prompt
        assert "Identity fact 0" in prompt  # identity is dropped last
        assert result["memory"]["tokens"] <= 500
        assert result["debug"]["tokens"]["profile"] > 500
        assert result["debug"]["memory"]["truncated"] is True
    jobs = await rows(
        app,
        "SELECT id, kind, payload FROM jobs WHERE company_id = :c AND user_id = 'alice'",
        c=COMPANY,
    )
    assert len(jobs) == 1
    job_id, kind, payload = jobs[0]
    assert kind == "condensation"
    assert payload == {"space_id": "space-1", "version": "1"}
    assert first["debug"]["memory"]["condensation_job_id"] == str(job_id)
    assert second["debug"]["memory"]["condensation_job_id"] == str(job_id)


async def test_common_path_is_one_select(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    """Flags, settings, profile, folder ACL and history come back from one statement, with no
    BEGIN or COMMIT around it: a single read needs no transaction of its own."""
    await enable_company(client, auth)
    await seed_profile(app, "alice", ALICE_FACTS)
    chat = new_chat()
    await save_turn(client, auth, chat, [user("Q0")], "R0")

    with statements(app) as seen:
        result = await load(client, auth, chat, [user("Q1")])

    assert result["memory"]["injected"] is True
    assert result["history"]["loaded_messages"] == 2
    assert len(seen) == 1, seen
    assert seen[0].lstrip().upper().startswith("SELECT")
