"""The example orchestrator's turn against the real app and a real OpenAI-compatible server:
the model gets exactly the messages the service composed, and the turn it saves is the one the
next turn's model sees as history."""

from __future__ import annotations

from fastapi import FastAPI

from examples.orchestrator import (
    SYSTEM_PROMPT,
    CannedModel,
    OpenAICompatibleModel,
    Orchestrator,
    model_from_env,
)
from tests.helpers.apps import SPACE, AuthFactory, client_of
from tests.helpers.llm_stub import StubLLMServer, reply
from tests.helpers.settings import enable_company


def test_without_a_model_configured_the_orchestrator_answers_with_a_canned_reply() -> None:
    assert isinstance(model_from_env({}), CannedModel)
    assert isinstance(model_from_env({"OPENAI_BASE_URL": "http://x/v1"}), OpenAICompatibleModel)


async def test_a_turn_sends_the_composed_messages_to_the_model_and_saves_its_answer(
    app: FastAPI, auth: AuthFactory, llm_stub: StubLLMServer
) -> None:
    model = model_from_env({"OPENAI_BASE_URL": llm_stub.base_url, "DEMO_MODEL": "demo-model"})
    assert isinstance(model, OpenAICompatibleModel)
    llm_stub.script(reply("Nice to meet you."), reply("Globex, you said."))
    async with client_of(app) as http:
        await enable_company(http, auth)
        http.headers.update(auth())
        orchestrator = Orchestrator(http, model, space_id=SPACE, chat_id="chat-1")

        first = await orchestrator.run_turn("I'm a data engineer at Globex.")
        second = await orchestrator.run_turn("Where do I work?")
        stored = (await http.get("/v1/chats/chat-1/messages")).json()["items"]
    await model.aclose()

    assert first.reply == "Nice to meet you."
    assert first.saved["consolidation"]["status"] == "queued"
    assert first.job_id is not None
    sent = [request.messages for request in llm_stub.requests]
    assert [request.model for request in llm_stub.requests] == ["demo-model", "demo-model"]
    assert sent[0] == first.context["messages"]
    assert sent[0][0] == {"role": "system", "content": SYSTEM_PROMPT}
    assert sent[1][1:] == [
        {"role": "user", "content": "I'm a data engineer at Globex."},
        {"role": "assistant", "content": "Nice to meet you."},
        {"role": "user", "content": "Where do I work?"},
    ]
    assert second.reply == "Globex, you said."
    assert [(m["role"], m["content"]) for m in stored] == [
        ("user", "I'm a data engineer at Globex."),
        ("assistant", "Nice to meet you."),
        ("user", "Where do I work?"),
        ("assistant", "Globex, you said."),
    ]
