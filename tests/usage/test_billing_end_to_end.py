"""Billing proof: turns saved over HTTP are consolidated by the worker through the real `openai`
SDK against the OpenAI-compatible stub, through every path that spends tokens (a retried call,
a cut-off answer, a refusal, a job that fails after its model calls answered, a condensation),
and the usage report's tokens equal, to the token, what the stub itself says it answered, per
call kind and model."""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any

import httpx
from fastapi import FastAPI

from app.consolidation.prompts import STATIC_PREFIXES
from app.kit.llm import OpenAIChatModel
from tests.helpers.apps import OPERATOR, SPACE, USER, AuthFactory, client_with
from tests.helpers.db import execute
from tests.helpers.jobs import job_row
from tests.helpers.llm_stub import Answer, StubLLMServer, refusal, reply, status
from tests.helpers.memory import put_memory, versions
from tests.helpers.settings import enable_company, patch_space
from tests.helpers.turns import queue_turn
from tests.helpers.worker import make_handler, make_worker

BASE_PROFILE = """# User Memory

## Identity
- Works as a data engineer.

## Communication Preferences
- Prefers concise answers.

## Work Context
- Migrating billing to Kafka.

## Skills & Expertise
- Knows Python.

## Recent Topics

## Open Questions / Follow-ups
"""
BIG_PROFILE = "\n".join(
    [
        "# User Memory",
        "## Identity",
        "- Works as a data engineer.",
        "## Communication Preferences",
        "## Work Context",
        *(
            f"- Runs migration project number {n} of the billing platform rewrite."
            for n in range(40)
        ),
        "## Skills & Expertise",
        "## Recent Topics",
        "## Open Questions / Follow-ups",
    ]
)
CONDENSED = """# User Memory

## Identity
- Works as a data engineer.

## Communication Preferences

## Work Context
- Runs the billing platform rewrite (40 migration projects).

## Skills & Expertise

## Recent Topics

## Open Questions / Follow-ups
"""
# each is read by the pre-filter as "ask the gate first" (no fact the offline engine reads)
NEEDS_GATE = (
    "These days the platform team is where I spend my time, mostly writing Rust.",
    "Lately the mobile team is where I spend my days, mostly writing Kotlin.",
    "Recently the security team is where I spend my time, mostly reviewing Terraform.",
)
MODELS = {"llm_gate_model": "stub-gate", "llm_model": "stub-condenser"}
PRICES = {
    model: {"prompt_per_million": 1.0, "completion_per_million": 4.0}
    for model in ("stub-gate", "gpt-4o-mini", "gpt-4o-2024-08-06")
}  # "stub-condenser" has none


def add(section: str, bullet: str) -> str:
    operation = {"op": "ADD", "section": section, "text": bullet}
    return json.dumps({"decision": "UPDATE", "operations": [operation]})


def kind_of(answer: Answer) -> str:
    """The call kind the stub can tell from the request: its fixed system message."""
    system = answer.request.messages[0]["content"]
    (kind,) = [kind for kind, prefix in STATIC_PREFIXES.items() if prefix == system]
    return kind


def billed_by_stub(answers: list[Answer]) -> dict[tuple[str, str], list[int]]:
    """(kind, model) -> [calls, prompt tokens, completion tokens] the stub answered with."""
    billed: dict[tuple[str, str], list[int]] = defaultdict(lambda: [0, 0, 0])
    for answer in answers:
        if answer.completion:
            assert answer.model is not None
            row = billed[(kind_of(answer), answer.model)]
            row[0] += 1
            row[1] += answer.prompt_tokens
            row[2] += answer.completion_tokens
    return dict(billed)


async def make_due(app: FastAPI) -> None:
    """The retry's backoff, skipped."""
    await execute(app, "UPDATE jobs SET run_after = now() WHERE status = 'retrying'")


async def usage(client: httpx.AsyncClient, auth: AuthFactory) -> dict[str, Any]:
    today = datetime.now(UTC).date()
    params = {
        "from": (today - timedelta(days=1)).isoformat(),
        "to": (today + timedelta(1)).isoformat(),
    }
    response = await client.get(
        "/v1/companies/acme/usage", params=params, headers=auth("olga", "platform", OPERATOR)
    )
    assert response.status_code == 200, response.text
    report: dict[str, Any] = response.json()
    return report


async def test_the_usage_report_bills_exactly_what_the_provider_answered(
    app: FastAPI,
    database_url: str,
    *,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    chat_model: OpenAIChatModel,
    llm_stub: StubLLMServer,
) -> None:
    await enable_company(client, auth)
    await put_memory(client, auth, BASE_PROFILE)
    handler, metrics, _ = make_handler(app, chat_model, **MODELS)
    worker = make_worker(app, handler, metrics)

    # a call answered 429 (nothing billed), retried by the queue: the gate and the update answer
    first = await queue_turn(client, auth, NEEDS_GATE[0])
    llm_stub.script(status(429, headers={"Retry-After": "0"}))
    await worker.run_once()
    assert (await job_row(app, first)).status == "retrying"
    await make_due(app)
    llm_stub.script(
        reply("UPDATE", tokens_in=211, tokens_out=1),
        reply(add("Skills & Expertise", "Writes Rust."), tokens_in=433, tokens_out=37),
    )
    await worker.run_once()
    assert (await job_row(app, first)).outcome == "updated"

    # the gate's answer cut off at its limit (billed all the same), then the update call, which
    # the provider answers as a dated model of the one asked for
    second = await queue_turn(client, auth, NEEDS_GATE[1], model="gpt-4o")
    llm_stub.script(
        reply("UPD", finish_reason="length", tokens_in=205, tokens_out=3),
        reply(
            add("Skills & Expertise", "Writes Kotlin."),
            tokens_in=470,
            tokens_out=41,
            model="gpt-4o-2024-08-06",
        ),
    )
    await worker.run_once()
    assert (await job_row(app, second)).outcome == "updated"

    # a refused update call: the job is dead, the refusal was billed
    refused = await queue_turn(client, auth, "I prefer answers in German")
    llm_stub.script(refusal("I cannot help with that."))
    await worker.run_once()
    assert (await job_row(app, refused)).status == "dead"

    # the gate answers, then the update call's answer is no valid output: the job fails after
    # two answered calls
    failed = await queue_turn(client, auth, NEEDS_GATE[2])
    llm_stub.script(
        reply("UPDATE", tokens_in=190, tokens_out=1),
        reply("Sure! I would add that they review Terraform.", tokens_in=300, tokens_out=12),
    )
    await worker.run_once()
    assert ((await job_row(app, failed)).status, (await job_row(app, failed)).error_class) == (
        "dead",
        "invalid_model_output",
    )

    # a profile over its space's budget: loading it queues a condensation, the model condenses
    assert (await patch_space(client, auth, SPACE, {"user_memory": {"max_tokens": 500}})).is_success
    await put_memory(client, auth, BIG_PROFILE, version=(await versions(app))[-1].version)
    body = {"space_id": SPACE, "messages": [{"role": "user", "content": "hello"}]}
    loaded = await client.post("/v1/chats/chat-1/context", json=body, headers=auth(USER))
    assert loaded.status_code == 200, loaded.text
    llm_stub.script(reply(CONDENSED, tokens_in=900, tokens_out=80))
    claimed = await worker.run_once()
    assert claimed is not None
    assert claimed.kind == "condensation"
    assert (await versions(app))[-1].reason == "condensation"
    assert llm_stub.pending == 0

    billed = billed_by_stub(llm_stub.answers)
    assert [a.status for a in llm_stub.answers if not a.completion] == [429]
    assert billed == {
        ("gate", "stub-gate"): [3, 211 + 205 + 190, 1 + 3 + 1],
        ("operations", "gpt-4o-mini"): [3, 433 + 10 + 300, 37 + 0 + 12],
        ("operations", "gpt-4o-2024-08-06"): [1, 470, 41],
        ("condensation", "stub-condenser"): [1, 900, 80],
    }  # the stub's own record, as scripted (a refusal reports 10 prompt tokens)
    report = await usage(client, auth)
    totals = report["totals"]
    metered = {
        (row["kind"], row["model"]): [row["calls"], row["prompt_tokens"], row["completion_tokens"]]
        for row in totals["model_calls"]
    }
    assert metered == billed
    assert totals["prompt_tokens"] == sum(row[1] for row in billed.values())
    assert totals["completion_tokens"] == sum(row[2] for row in billed.values())
    assert totals["consolidations"] == {
        "updated": 3,  # two consolidations and the condensation
        "noop": 0,
        "failed": 3,  # the 429 (then retried), the refusal, the invalid answer
        "deferred": 0,
        "offline": 0,
    }
    assert totals["turns_saved"] == 0  # the shared app's counts are flushed by its own meter

    # the estimated cost, from the prices of the process that answers the report
    async with client_with(database_url, model_prices=PRICES) as priced:
        report = await usage(priced, auth)
    assert report["unpriced_models"] == ["stub-condenser"]
    assert report["totals"]["estimated_cost"] is None
    for row in report["totals"]["model_calls"]:
        expected = (Decimal(row["prompt_tokens"]) + 4 * Decimal(row["completion_tokens"])) / 10**6
        if row["model"] == "stub-condenser":
            assert row["estimated_cost"] is None
        else:
            assert Decimal(str(row["estimated_cost"])) == expected
