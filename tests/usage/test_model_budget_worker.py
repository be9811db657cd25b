"""The model budget in the worker: once a company's month is spent, `offline` consolidates with
the offline engine without calling the model, `defer` puts the jobs back until the next month
(nothing lost, no attempt used); the 80 % and 100 % alerts fire once per company and month
across worker processes; raising the budget brings deferred jobs forward."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.consolidation.pipeline import RULES_ENGINE
from app.jobs.worker import Worker
from app.kit.llm import OpenAIChatModel
from app.kit.observability import Metrics
from app.usage.budget import period_of
from tests.helpers.apps import OPERATOR, AuthFactory
from tests.helpers.db import rows, scalar
from tests.helpers.jobs import job_row
from tests.helpers.llm_stub import StubLLMServer, reply
from tests.helpers.memory import put_memory, versions
from tests.helpers.metrics import sample
from tests.helpers.settings import enable_company
from tests.helpers.turns import queue_turn
from tests.helpers.worker import make_handler, make_worker

OLGA = ("olga", "platform", OPERATOR)
PROFILE = """# User Memory

## Identity
- Works as a data engineer.

## Communication Preferences

## Work Context

## Skills & Expertise
- Knows Python.

## Recent Topics

## Open Questions / Follow-ups
"""
NEEDS_GATE = (
    "These days the platform team is where I spend my time, mostly writing Rust.",
    "Lately the mobile team is where I spend my days, mostly writing Kotlin.",
    "Recently the security team is where I spend my time, mostly reviewing Terraform.",
    "Nowadays the search team is where most of my week goes, mostly tuning Elasticsearch.",
)


def add(bullet: str) -> str:
    operation = {"op": "ADD", "section": "Skills & Expertise", "text": bullet}
    return json.dumps({"decision": "UPDATE", "operations": [operation]})


async def set_budget(
    client: httpx.AsyncClient, auth: AuthFactory, monthly_tokens: int | None, when_spent: str
) -> dict[str, Any]:
    response = await client.put(
        "/v1/companies/acme/model-budget",
        json={"monthly_tokens": monthly_tokens, "when_spent": when_spent},
        headers=auth(*OLGA),
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def consolidations(client: httpx.AsyncClient, auth: AuthFactory) -> dict[str, int]:
    today = datetime.now(UTC).date().isoformat()
    response = await client.get(
        "/v1/companies/acme/usage", params={"from": today, "to": today}, headers=auth(*OLGA)
    )
    assert response.status_code == 200, response.text
    result: dict[str, int] = response.json()["totals"]["consolidations"]
    return result


@pytest.fixture
async def spent(
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    chat_model: OpenAIChatModel,
    llm_stub: StubLLMServer,
) -> None:
    """Memory on, a profile, and one consolidation by the model that spent 121 tokens."""
    await enable_company(client, auth)
    await put_memory(client, auth, PROFILE)
    await queue_turn(client, auth, NEEDS_GATE[0])
    llm_stub.script(
        reply("UPDATE", tokens_in=50, tokens_out=1),
        reply(add("Writes Rust."), tokens_in=60, tokens_out=10),
    )
    handler, metrics, _ = make_handler(app, chat_model)
    assert await make_worker(app, handler, metrics).run_once() is not None
    assert len(llm_stub.requests) == 2


@pytest.mark.usefixtures("spent")
async def test_offline_a_spent_budget_consolidates_without_calling_the_model(
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    chat_model: OpenAIChatModel,
    llm_stub: StubLLMServer,
) -> None:
    budget = await set_budget(client, auth, 100, "offline")
    assert (budget["spent_tokens"], budget["used_share"]) == (121, 1.21)
    job_id = await queue_turn(client, auth, "I prefer answers in German")
    handler, metrics, _ = make_handler(app, chat_model)

    await make_worker(app, handler, metrics).run_once()

    assert len(llm_stub.requests) == 2  # none since the budget was spent
    job = await job_row(app, job_id)
    assert (job.status, job.outcome) == ("succeeded", "updated")
    newest = (await versions(app))[-1]
    assert (newest.model, newest.tokens_in) == (RULES_ENGINE, None)
    assert "Prefers answers in German." in newest.content
    counted = await consolidations(client, auth)
    assert (counted["updated"], counted["offline"]) == (2, 1)
    assert sample(metrics, "model_budget_used_ratio", company_id="acme") == 1.21


@pytest.mark.usefixtures("spent")
async def test_defer_keeps_the_jobs_queued_until_the_next_month_and_loses_nothing(
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    chat_model: OpenAIChatModel,
    llm_stub: StubLLMServer,
) -> None:
    await set_budget(client, auth, 100, "defer")
    first = await queue_turn(client, auth, NEEDS_GATE[1])
    second = await queue_turn(client, auth, NEEDS_GATE[2])
    handler, metrics, _ = make_handler(app, chat_model)
    worker = make_worker(app, handler, metrics)
    head = (await versions(app))[-1].version

    claimed = await worker.run_once()

    assert claimed is not None
    assert sorted(claimed.job_ids) == sorted([first, second])  # coalesced, deferred together
    next_month = period_of(datetime.now(UTC).date()).end_instant
    for job_id in (first, second):
        job = await job_row(app, job_id)
        assert (job.status, job.attempts, job.error_class) == ("queued", 0, None)
        assert job.run_after == next_month
    assert await worker.run_once() is None  # not claimable before then
    assert len(llm_stub.requests) == 2
    assert (await versions(app))[-1].version == head
    assert await scalar(app, "SELECT count(*) FROM turns") == 3
    assert sample(metrics, "jobs_total", kind="consolidation", outcome="deferred") == 2
    assert (await consolidations(client, auth))["deferred"] == 1

    # an operator raises the budget: the deferred jobs are due again, and run on the model
    await set_budget(client, auth, 10_000, "defer")
    llm_stub.script(
        reply("UPDATE", tokens_in=40, tokens_out=1),
        reply(add("Writes Kotlin and reviews Terraform."), tokens_in=70, tokens_out=12),
    )
    assert await worker.run_once() is not None
    for job_id in (first, second):
        assert (await job_row(app, job_id)).outcome == "updated"


def fired(workers: list[tuple[Worker, Metrics]], threshold: str) -> float:
    """The alert's count summed over the worker processes."""
    return sum(
        sample(metrics, "model_budget_threshold_crossed_total", threshold=threshold)
        for _, metrics in workers
    )


async def test_the_80_and_100_percent_alerts_fire_once_across_worker_processes(
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    chat_model: OpenAIChatModel,
    llm_stub: StubLLMServer,
) -> None:
    await enable_company(client, auth)
    await put_memory(client, auth, PROFILE)
    await set_budget(client, auth, 1000, "offline")
    workers = []
    for _ in range(2):  # two worker processes, each with its own metrics
        handler, metrics, _ = make_handler(app, chat_model)
        workers.append((make_worker(app, handler, metrics), metrics))
    spends = [((290, 10), (190, 10)), ((290, 10), (90, 10)), ((90, 10), (40, 10))]
    crossed: list[tuple[float, float]] = []

    for n, ((gate_in, gate_out), (ops_in, ops_out)) in enumerate(spends):
        await queue_turn(client, auth, NEEDS_GATE[n])
        llm_stub.script(
            reply("UPDATE", tokens_in=gate_in, tokens_out=gate_out),
            reply(add(f"Skill number {n}."), tokens_in=ops_in, tokens_out=ops_out),
        )
        worker, _ = workers[n % 2]
        await worker.run_once()
        crossed.append((fired(workers, "0.8"), fired(workers, "1.0")))
    await queue_turn(client, auth, NEEDS_GATE[3])
    await workers[1][0].run_once()  # spent: offline, no call, no alert again

    assert crossed == [(0, 0), (1, 0), (1, 1)]  # 500, then 900 (80 % at 800), then 1050
    assert (fired(workers, "0.8"), fired(workers, "1.0")) == (1, 1)  # not again, offline
    assert len(llm_stub.requests) == 6
    assert [sample(m, "model_budget_used_ratio", company_id="acme") for _, m in workers] == [
        1.05,  # after the call that went past the budget, the bound: one decision in flight
        1.05,  # as read before the offline run
    ]
    assert await rows(app, "SELECT threshold_percent FROM model_budget_crossings ORDER BY 1") == [
        (80,),
        (100,),
    ]
