"""Facts in every script reach memory: a turn saved over HTTP in Chinese, Japanese, Korean,
Arabic, Hebrew, Russian, Hindi or Greek is consolidated by the worker on real PostgreSQL, with
the obedient model (eval/obedient.py, served as a real OpenAI-compatible endpoint and called
with the real `openai` SDK) and with the offline engine; small talk in those languages stays a
NOOP without a model call."""

from __future__ import annotations

import unicodedata
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
import pytest
from fastapi import FastAPI

from app.kit.llm import OpenAIChatModel
from eval.obedient import obedient_answer
from eval.recorder import ModelRecorder
from tests.helpers.apps import OPERATOR, AuthFactory
from tests.helpers.memory import head_content, versions
from tests.helpers.metrics import sample
from tests.helpers.profiles import bullets
from tests.helpers.settings import enable_company
from tests.helpers.turns import queue_turn
from tests.helpers.worker import make_handler, make_worker, run_one

FACTS = {
    "Chinese": "我搬到了里斯本。",
    "Japanese": "私は大阪に住んでいます。",
    "Korean": "저는 서울에서 간호사로 일해요.",
    "Arabic": "أعمل مهندسة برمجيات في دبي.",
    "Hebrew": "אני גר בחיפה ועובד כמורה.",
    "Russian": "Я переехал в Казань.",
    "Hindi": "मैं पुणे में डेटा वैज्ञानिक हूँ।",
    "Greek": "Μένω στη Θεσσαλονίκη και διδάσκω φυσική.",
}
SMALL_TALK = ["谢谢！", "ありがとうございます。", "감사합니다!", "شكرا", "תודה רבה!", "спасибо"]


def nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


@pytest.fixture
async def memory_on(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    await enable_company(client, auth)


@dataclass(frozen=True)
class Obedient:
    """The obedient model on 127.0.0.1 (`recorder`, which records each call's kind) and the
    service's real `OpenAIChatModel` talking to it (`model`)."""

    recorder: ModelRecorder
    model: OpenAIChatModel


@pytest.fixture
async def obedient() -> AsyncIterator[Obedient]:
    recorder = ModelRecorder(answer=obedient_answer)
    await recorder.start()
    try:
        async with OpenAIChatModel(
            api_key=None, base_url=recorder.base_url, timeout_seconds=10.0
        ) as model:
            yield Obedient(recorder, model)
    finally:
        await recorder.stop()


@pytest.mark.usefixtures("memory_on")
@pytest.mark.parametrize("language", FACTS)
async def test_with_the_obedient_model_each_fact_is_in_memory_as_written(
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    obedient: Obedient,
    language: str,
) -> None:
    fact = FACTS[language]
    await queue_turn(client, auth, fact)

    job, metrics = await run_one(app, obedient.model)

    assert (job.status, job.outcome) == ("succeeded", "updated")
    assert sample(metrics, "consolidation_prefilter_total", decision="gate") == 1
    assert [call.kind for call in obedient.recorder.calls] == ["gate", "operations"]
    content = await head_content(app)
    assert content is not None
    assert nfc(fact) in [nfc(bullet) for bullet in bullets(content, "Identity")]


@pytest.mark.usefixtures("memory_on")
async def test_with_the_obedient_model_small_talk_in_those_languages_costs_no_call(
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    obedient: Obedient,
) -> None:
    for text in SMALL_TALK:
        await queue_turn(client, auth, text)

    job, metrics = await run_one(app, obedient.model)

    assert (job.status, job.outcome) == ("succeeded", "noop")
    assert sample(metrics, "consolidation_prefilter_total", decision="noop") == 1
    assert obedient.recorder.calls == []
    assert await versions(app) == []


@pytest.mark.usefixtures("memory_on")
async def test_the_offline_engine_keeps_each_fact_it_cannot_read_verbatim(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    for fact in FACTS.values():
        await queue_turn(client, auth, fact)
    for text in SMALL_TALK:
        await queue_turn(client, auth, text)
    handler, metrics, _ = make_handler(app)
    turns = len(FACTS) + len(SMALL_TALK)

    claimed = await make_worker(app, handler, metrics, batch_size=turns).run_once()

    assert claimed is not None
    assert len(claimed.job_ids) == turns  # one coalesced claim
    (version,) = await versions(app)
    assert version.model == "offline-rules"
    assert [nfc(b) for b in bullets(version.content, "Identity")] == [
        nfc(fact) for fact in FACTS.values()
    ]
    assert bullets(version.content, "Recent Topics") == []


@pytest.mark.usefixtures("memory_on")
async def test_offline_small_talk_in_those_languages_writes_nothing(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    for text in SMALL_TALK:
        await queue_turn(client, auth, text)
    handler, metrics, _ = make_handler(app)

    await make_worker(app, handler, metrics).run_once()

    assert await versions(app) == []
    assert sample(metrics, "consolidations_total", result="noop") == 1


@pytest.mark.usefixtures("memory_on")
async def test_a_spent_model_budget_falls_back_to_the_offline_engine_which_keeps_the_fact(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, obedient: Obedient
) -> None:
    await queue_turn(client, auth, FACTS["Chinese"])
    await run_one(app, obedient.model)
    calls = len(obedient.recorder.calls)
    assert calls == 2  # the gate and the operations call spent the month's tokens
    response = await client.put(
        "/v1/companies/acme/model-budget",
        json={"monthly_tokens": 1, "when_spent": "offline"},
        headers=auth("olga", "platform", OPERATOR),
    )
    assert response.status_code == 200, response.text
    await queue_turn(client, auth, FACTS["Russian"])

    job, _ = await run_one(app, obedient.model)

    assert (job.status, job.outcome) == ("succeeded", "updated")
    assert len(obedient.recorder.calls) == calls  # no call once the budget was spent
    newest = (await versions(app))[-1]
    assert newest.model == "offline-rules"
    assert nfc(FACTS["Russian"]) in [nfc(b) for b in bullets(newest.content, "Identity")]
    assert nfc(FACTS["Chinese"]) in [nfc(b) for b in bullets(newest.content, "Identity")]
