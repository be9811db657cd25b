"""The LangChain adapters with the real `langchain-core` and its fake chat models, against the
real app: the chat history over the stored chat, and the runnable that wraps a chat model with
the context and turn calls (placeholder history given as `placeholder_history`)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from context_memory_client import (
    FLAG_CONTEXT_MEMORY,
    NO_RETRIES,
    AsyncMemoryClient,
    CompanyIn,
    MemoryClient,
    NotFound,
    SpacePatch,
)
from context_memory_client.langchain import ContextMemoryRunnable, MemoryChatMessageHistory
from fastapi import FastAPI
from langchain_core.callbacks import BaseCallbackHandler
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.prompts import ChatPromptTemplate

from app.profiles.profile import Section
from tests.helpers.apps import COMPANY, OPERATOR, SPACE, SPACE_ADMIN, TokenFactory
from tests.helpers.polling import wait_until_sync
from tests.helpers.profiles import memory_md

BASE_URL = "http://testserver"
PROMPT = ChatPromptTemplate.from_messages(
    [
        ("system", "Answer concisely."),
        ("placeholder", "{chat_history}"),
        ("human", "{question}"),
    ]
)


class ModelInputs(BaseCallbackHandler):
    """Records the messages each chat model call was given."""

    def __init__(self) -> None:
        self.calls: list[list[BaseMessage]] = []

    def on_chat_model_start(
        self, serialized: dict[str, Any], messages: list[list[BaseMessage]], **kwargs: Any
    ) -> None:
        self.calls.extend(messages)


def _pairs(messages: list[BaseMessage]) -> list[tuple[str, str]]:
    return [(m.type, m.text) for m in messages]


def async_memory(app: FastAPI, token: str) -> AsyncMemoryClient:
    return AsyncMemoryClient(BASE_URL, token, transport=httpx.ASGITransport(app), retry=NO_RETRIES)


async def enable(app: FastAPI, make_token: TokenFactory) -> None:
    async with (
        async_memory(app, make_token("olga", "platform", OPERATOR)) as operator,
        async_memory(app, make_token("sam", COMPANY, SPACE_ADMIN)) as admin,
    ):
        await operator.create_company(CompanyIn(COMPANY))
        await operator.set_feature_flag(COMPANY, FLAG_CONTEXT_MEMORY, enabled=True)
        await admin.update_space(SPACE, SpacePatch(context_memory=True))


async def test_the_runnable_injects_memory_and_takes_placeholder_history_instead_of_stored(
    app: FastAPI, make_token: TokenFactory
) -> None:
    await enable(app, make_token)
    inputs = ModelInputs()
    model = FakeListChatModel(responses=["A1", "A2", "A3"], callbacks=[inputs])
    async with async_memory(app, make_token()) as memory:
        await memory.create_memory(memory_md({Section.IDENTITY: ["Works at Globex."]}))
        chain = ContextMemoryRunnable(
            model, chat_id="lc-chat", space_id=SPACE, async_client=memory, prompt=PROMPT
        )
        first = await chain.ainvoke({"question": "Q1"})
        second = await chain.ainvoke(
            {"question": "Q2", "chat_history": [HumanMessage("H1"), AIMessage("R1")]}
        )
        third = await chain.ainvoke({"question": "Q3"})
        stored = [(m.role, m.content) async for m in memory.iter_messages("lc-chat")]

    assert [first.text, second.text, third.text] == ["A1", "A2", "A3"]
    assert first.response_metadata["context_memory"]["consolidation"] == "queued"
    system = inputs.calls[0][0]
    assert isinstance(system, SystemMessage)
    assert system.text.startswith("Answer concisely.")
    assert "## What I know about you" in system.text
    assert "- Works at Globex." in system.text
    assert _pairs(inputs.calls[0][1:]) == [("human", "Q1")]
    # placeholder history given: auto mode skips the stored history (no duplicates)
    assert _pairs(inputs.calls[1][1:]) == [("human", "H1"), ("ai", "R1"), ("human", "Q2")]
    # no placeholder: the stored history is loaded, without the placeholder's messages
    assert _pairs(inputs.calls[2][1:]) == [
        ("human", "Q1"),
        ("ai", "A1"),
        ("human", "Q2"),
        ("ai", "A2"),
        ("human", "Q3"),
    ]
    assert stored == [
        ("user", "Q1"),
        ("assistant", "A1"),
        ("user", "Q2"),
        ("assistant", "A2"),
        ("user", "Q3"),
        ("assistant", "A3"),
    ]


async def test_the_async_history_lists_adds_and_clears_the_stored_chat(
    app: FastAPI, make_token: TokenFactory
) -> None:
    async with async_memory(app, make_token()) as memory:
        history = MemoryChatMessageHistory("lc-async", space_id=SPACE, async_client=memory)
        assert await history.aget_messages() == []  # no turn saved yet
        await history.aadd_messages([HumanMessage("Hello"), AIMessage("Hi!")])
        await history.aadd_messages([HumanMessage("Still there?")])  # waits for its answer
        listed = await history.aget_messages()
        again = MemoryChatMessageHistory("lc-async", space_id=SPACE, async_client=memory)
        stored = await again.aget_messages()
        await history.aclear()
        cleared = await history.aget_messages()
        with pytest.raises(NotFound):
            await memory.list_messages("lc-async")

    assert _pairs(listed) == [("human", "Hello"), ("ai", "Hi!"), ("human", "Still there?")]
    assert _pairs(stored) == [("human", "Hello"), ("ai", "Hi!")]
    assert cleared == []


def test_the_sync_history_and_runnable_over_http_feed_the_users_memory(
    served_url: str, make_token: TokenFactory
) -> None:
    with MemoryClient(served_url, make_token("olga", "platform", OPERATOR)) as operator:
        operator.create_company(CompanyIn(COMPANY))
        operator.set_feature_flag(COMPANY, FLAG_CONTEXT_MEMORY, enabled=True)
    with MemoryClient(served_url, make_token()) as memory:
        history = MemoryChatMessageHistory("lc-sync", space_id=SPACE, client=memory)
        history.add_user_message("I'm a data engineer at Globex.")
        history.add_ai_message("Noted.")
        chain = ContextMemoryRunnable(
            FakeListChatModel(responses=["Berlin is lovely."]),
            chat_id="lc-sync",
            space_id=SPACE,
            client=memory,
            language_model="fake-list",
        )
        answer = chain.invoke("I live in Berlin.")
        listed = history.messages
        profile = _wait_for_profile(memory, "Based in Berlin.")
        history.clear()
        assert history.messages == []

    assert answer.text == "Berlin is lovely."
    assert _pairs(listed) == [
        ("human", "I'm a data engineer at Globex."),
        ("ai", "Noted."),
        ("human", "I live in Berlin."),
        ("ai", "Berlin is lovely."),
    ]
    assert "- Works at Globex." in profile
    assert "- Based in Berlin." in profile


def _wait_for_profile(memory: MemoryClient, text: str, timeout: float = 30.0) -> str:
    """The memory page once it holds `text`; fails after `timeout` seconds, saying what the
    page held then."""
    content = ""

    def holding() -> str:
        nonlocal content
        try:
            content = memory.get_memory().content
        except NotFound:
            content = ""
        return content if text in content else ""

    return wait_until_sync(
        holding, timeout, what=lambda: f"{text!r} in the memory page, which held {content!r}"
    )


def test_an_ai_message_without_the_message_it_answers_is_refused() -> None:
    history = MemoryChatMessageHistory(
        "lc-none", space_id=SPACE, client=MemoryClient("http://127.0.0.1:9")
    )
    with pytest.raises(ValueError, match="needs the human message"):
        history.add_messages([AIMessage("orphan")])
