"""Size control in the worker: a profile over its space's token budget is condensed by the model
to about 90% of it, or, with no model or a failed condensation, truncated by whole lines."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.kit.llm import OpenAIChatModel
from app.profiles.budget import TRUNCATION_MARKER
from app.profiles.document import parse
from tests.helpers.apps import SPACE, USER, AuthFactory
from tests.helpers.db import rows
from tests.helpers.jobs import job_row
from tests.helpers.llm_stub import StubLLMServer, reply, status
from tests.helpers.memory import put_memory, versions
from tests.helpers.metrics import sample
from tests.helpers.profiles import bullets
from tests.helpers.settings import enable_company, patch_space
from tests.helpers.turns import queue_turn
from tests.helpers.worker import make_handler, make_worker

BUDGET = 500
BIG_PROFILE = "\n".join(
    [
        "# User Memory",
        "## Identity",
        "- Works as a data engineer.",
        "## Communication Preferences",
        "- Prefers concise answers.",
        "## Work Context",
        *(
            f"- Runs migration project number {n} of the billing platform rewrite."
            for n in range(30)
        ),
        "## Skills & Expertise",
        *(
            f"- Knows internal tool number {n} used by the billing platform team."
            for n in range(30)
        ),
        "## Recent Topics",
        "## Open Questions / Follow-ups",
        "- Wants a reminder about the quarterly report.",
    ]
)
CONDENSED = """# User Memory

## Identity
- Works as a data engineer.

## Communication Preferences
- Prefers concise answers.

## Work Context
- Runs the billing platform rewrite (30 migration projects).

## Skills & Expertise
- Knows the billing team's internal tools.

## Recent Topics

## Open Questions / Follow-ups
- Wants a reminder about the quarterly report.
"""


@pytest.fixture
async def over_budget(app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory) -> None:
    """Memory on, the space's budget lowered to 500, and a stored profile well over it."""
    await enable_company(client, auth)
    response = await patch_space(client, auth, SPACE, {"user_memory": {"max_tokens": BUDGET}})
    assert response.status_code == 200, response.text
    await put_memory(client, auth, BIG_PROFILE)
    assert (await versions(app))[-1].tokens > BUDGET


async def load_context(client: httpx.AsyncClient, auth: AuthFactory) -> dict[str, Any]:
    """The orchestrator's load call; over budget it queues a condensation job."""
    body = {"space_id": SPACE, "messages": [{"role": "user", "content": "hello"}]}
    response = await client.post("/v1/chats/chat-1/context", json=body, headers=auth(USER))
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


async def condensation_jobs(app: FastAPI) -> list[Any]:
    return await rows(app, "SELECT id, status FROM jobs WHERE kind = 'condensation'")


@pytest.mark.usefixtures("over_budget")
async def test_offline_a_condensation_job_truncates_the_stored_profile_to_the_budget(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await load_context(client, auth)
    assert len(await condensation_jobs(app)) == 1
    handler, metrics, _ = make_handler(app)

    claimed = await make_worker(app, handler, metrics).run_once()

    assert claimed is not None
    assert claimed.kind == "condensation"
    new = (await versions(app))[-1]
    assert (new.version, new.reason) == (2, "truncation")
    assert new.tokens <= BUDGET
    assert new.content.endswith(TRUNCATION_MARKER + "\n")
    assert bullets(new.content, "Identity") == ["Works as a data engineer."]
    assert bullets(new.content, "Open Questions / Follow-ups") == []  # dropped first
    assert {op["op"] for op in new.operations} == {"DELETE"}
    assert parse(new.content).frontmatter.turn_count == 0  # not a consolidation
    assert sample(metrics, "truncations_total") == 1
    job = await job_row(app, claimed.jobs[0].id)
    assert (job.status, job.outcome, job.version) == ("succeeded", "updated", 2)

    await load_context(client, auth)  # now within budget: nothing more is queued
    assert [j.status for j in await condensation_jobs(app)] == ["succeeded"]


@pytest.mark.usefixtures("over_budget")
async def test_a_condensation_job_uses_the_model_when_there_is_one(
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    chat_model: OpenAIChatModel,
    llm_stub: StubLLMServer,
) -> None:
    await load_context(client, auth)
    llm_stub.script(reply(CONDENSED, tokens_in=900, tokens_out=80))
    handler, metrics, _ = make_handler(app, chat_model)

    await make_worker(app, handler, metrics).run_once()

    new = (await versions(app))[-1]
    assert (new.reason, new.tokens_in, new.tokens_out) == ("condensation", 900, 80)
    assert new.content.split("\n\n", 1)[1] == CONDENSED.replace(
        "## Recent Topics\n", "## Recent Topics\n_(empty)_\n"
    )
    assert sample(metrics, "condensations_total") == 1
    assert "Target: about 450 tokens" in llm_stub.requests[0].messages[1]["content"]  # ~90 %
    assert llm_stub.requests[0].body["max_completion_tokens"] == 564  # the budget + 64


@pytest.mark.usefixtures("over_budget")
async def test_a_consolidation_over_budget_is_condensed_in_the_same_version(
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    chat_model: OpenAIChatModel,
    llm_stub: StubLLMServer,
) -> None:
    await queue_turn(client, auth, "I prefer answers in German")
    llm_stub.script(  # the offline engine reads the preference: no gate
        reply(
            '{"decision": "UPDATE", "operations": [{"op": "ADD", "section": '
            '"Communication Preferences", "text": "Prefers answers in German."}]}'
        ),
        reply(CONDENSED.replace("concise answers.", "concise answers in German.")),
    )
    handler, metrics, _ = make_handler(app, chat_model)

    await make_worker(app, handler, metrics).run_once()

    new = (await versions(app))[-1]
    assert new.reason == "consolidation"
    assert new.tokens <= BUDGET
    assert bullets(new.content, "Communication Preferences") == [
        "Prefers concise answers in German."
    ]
    assert new.operations[0]["op"] == "ADD"  # the model's operation, then the condensing
    assert parse(new.content).frontmatter.turn_count == 1
    assert sample(metrics, "condensations_total") == 1
    assert sample(metrics, "truncations_total") == 0


@pytest.mark.usefixtures("over_budget")
async def test_a_failed_condensation_falls_back_to_truncation(
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    chat_model: OpenAIChatModel,
    llm_stub: StubLLMServer,
) -> None:
    await queue_turn(client, auth, "I prefer answers in German")
    llm_stub.script(  # the offline engine reads the preference: no gate
        reply(
            '{"decision": "UPDATE", "operations": [{"op": "ADD", "section": '
            '"Communication Preferences", "text": "Prefers answers in German."}]}'
        ),
        status(503),
    )
    handler, metrics, _ = make_handler(app, chat_model)

    await make_worker(app, handler, metrics).run_once()

    new = (await versions(app))[-1]
    assert new.reason == "consolidation"
    assert new.tokens <= BUDGET
    assert new.content.endswith(TRUNCATION_MARKER + "\n")
    assert "Prefers answers in German." in bullets(new.content, "Communication Preferences")
    assert sample(metrics, "condensations_total") == 0
    assert sample(metrics, "truncations_total") == 1
