"""Seed 000 end to end over HTTP: what the model receives from `/context` after real turn-saves,
for every cell of the scenario matrix, the record_all example, the multi-chain RAG pattern,
the history bounds, the single system message and the debug trace."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from app.kit.tokens import TokenCounter
from tests.helpers.apps import AuthFactory, app_with, client_of, client_with
from tests.helpers.db import execute, rows
from tests.helpers.turns import (
    Msg,
    assistant,
    context,
    new_chat,
    pairs,
    save_turn,
    stored,
    system,
    user,
)

SYS = system("Answer concisely.")
Q0, R0 = user("Which city is the capital of France?"), assistant("Paris.")
H1, A1 = user("I am planning a trip to France."), assistant("Nice! How can I help?")
Q1 = user("What should I see first?")

CURRENT = [SYS, Q1]
MEMORY_CURRENT = [SYS, Q0, R0, Q1]
PLACEHOLDER = [SYS, H1, A1, Q1]
MEMORY_PLACEHOLDER = [SYS, Q0, R0, H1, A1, Q1]

# (scenario, mode) -> what the model receives; seed 000 "Scenario Behavior Matrix"
MATRIX: dict[tuple[str, str], list[Msg]] = {
    ("S1", "auto"): CURRENT,
    ("S1", "always"): CURRENT,
    ("S1", "never"): CURRENT,
    ("S1", "record_all"): CURRENT,
    ("S2", "auto"): MEMORY_CURRENT,
    ("S2", "always"): MEMORY_CURRENT,
    ("S2", "never"): CURRENT,
    ("S2", "record_all"): MEMORY_CURRENT,
    ("S3", "auto"): PLACEHOLDER,
    ("S3", "always"): PLACEHOLDER,
    ("S3", "never"): PLACEHOLDER,
    ("S3", "record_all"): PLACEHOLDER,
    ("S4", "auto"): PLACEHOLDER,
    ("S4", "always"): MEMORY_PLACEHOLDER,
    ("S4", "never"): PLACEHOLDER,
    ("S4", "record_all"): PLACEHOLDER,
}
HAS_HISTORY = {"S2", "S4"}
HAS_PLACEHOLDER = {"S3", "S4"}


@pytest.mark.parametrize(("scenario", "mode"), sorted(MATRIX))
async def test_scenario_matrix_cell(
    client: httpx.AsyncClient, auth: AuthFactory, scenario: str, mode: str
) -> None:
    chat = new_chat()
    if scenario in HAS_HISTORY:
        await save_turn(client, auth, chat, [Q0], R0["content"], history_mode=mode)
    fields: dict[str, Any] = {"history_mode": mode}
    if scenario in HAS_PLACEHOLDER:
        fields["placeholder_history"] = [H1, A1]

    result = await context(client, auth, chat, [SYS, Q1], **fields)

    assert pairs(result["messages"]) == pairs(MATRIX[(scenario, mode)])
    assert result["history"]["mode"] == mode
    assert result["history"]["placeholder_detected"] == (scenario in HAS_PLACEHOLDER)
    loads = mode == "always" or (mode != "never" and scenario not in HAS_PLACEHOLDER)
    assert result["history"]["loaded"] is loads
    expected_loaded = 2 if loads and scenario in HAS_HISTORY else 0
    assert result["history"]["loaded_messages"] == expected_loaded


@pytest.mark.parametrize(
    ("scenario", "mode"), sorted(cell for cell in MATRIX if cell[0] in HAS_PLACEHOLDER)
)
async def test_inline_placeholder_is_detected_by_the_heuristic(
    client: httpx.AsyncClient, auth: AuthFactory, scenario: str, mode: str
) -> None:
    """The same placeholder cells when the template inlines the history into `messages`."""
    chat = new_chat()
    if scenario in HAS_HISTORY:
        await save_turn(client, auth, chat, [Q0], R0["content"], history_mode=mode)

    result = await context(client, auth, chat, [SYS, H1, A1, Q1], history_mode=mode)

    assert pairs(result["messages"]) == pairs(MATRIX[(scenario, mode)])
    assert result["history"]["detected_by"] == "heuristic"


async def test_record_all_two_turns_store_duplicates_as_the_seed_shows(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    chat = new_chat()
    r1, q2, r2 = assistant("R1"), user("Q2"), assistant("R2")
    turn1: dict[str, Any] = {"history_mode": "record_all", "placeholder_history": [H1, A1]}
    first = await context(client, auth, chat, [Q1], **turn1)
    assert pairs(first["messages"]) == pairs([H1, A1, Q1])
    await save_turn(client, auth, chat, [Q1], "R1", **turn1)
    assert pairs(await stored(client, auth, chat)) == pairs([H1, A1, Q1, r1])

    turn2: dict[str, Any] = {"history_mode": "record_all", "placeholder_history": [H1, A1, Q1, r1]}
    second = await context(client, auth, chat, [q2], **turn2)
    assert pairs(second["messages"]) == pairs([H1, A1, Q1, r1, q2])
    await save_turn(client, auth, chat, [q2], "R2", **turn2)

    memory = await stored(client, auth, chat)
    assert pairs(memory) == pairs([H1, A1, Q1, r1, H1, A1, Q1, r1, q2, r2])
    assert [m["source"] for m in memory] == ["placeholder"] * 2 + ["request", "response"] + [
        "placeholder"
    ] * 4 + ["request", "response"]


async def test_multi_chain_rag_answer_chain_never_sees_the_contextualize_exchange(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    chat = new_chat()
    chat_history = [H1, A1]
    question = user("And by train?")
    rephrase = system("Rephrase to a standalone question.")
    answer_system = system("Answer concisely.")
    standalone = "How do I travel around France by train?"

    contextualize = await context(
        client, auth, chat, [rephrase, question], placeholder_history=chat_history
    )
    assert pairs(contextualize["messages"]) == pairs([rephrase, H1, A1, question])
    await save_turn(
        client, auth, chat, [rephrase, question], standalone, placeholder_history=chat_history
    )

    answer = await context(
        client, auth, chat, [answer_system, user(standalone)], placeholder_history=chat_history
    )

    assert pairs(answer["messages"]) == pairs([answer_system, H1, A1, user(standalone)])
    assert answer["history"]["loaded"] is False
    # the contextualize exchange is stored, but only for callers that load history
    assert pairs(await stored(client, auth, chat)) == pairs([question, assistant(standalone)])


async def test_history_is_bounded_by_message_count(database_url: str, auth: AuthFactory) -> None:
    chat = new_chat()
    async with client_with(database_url, history_max_messages=3) as small:
        for n in range(3):
            await save_turn(small, auth, chat, [user(f"Q{n}")], f"R{n}")
        result = await context(small, auth, chat, [user("Q3")])
    assert pairs(result["messages"]) == pairs(
        [assistant("R1"), user("Q2"), assistant("R2"), user("Q3")]
    )
    assert result["history"]["loaded_messages"] == 3


async def test_history_is_bounded_by_stored_tokens(database_url: str, auth: AuthFactory) -> None:
    chat = new_chat()
    counter = TokenCounter()
    turns = [(f"question {n} " + "word " * 20, f"answer {n} " + "word " * 20) for n in range(3)]
    budget = counter.count(turns[-1][0]) + counter.count(turns[-1][1])
    async with client_with(database_url, history_max_tokens=budget) as small:
        for question, answer in turns:
            await save_turn(small, auth, chat, [user(question)], answer)
        result = await context(small, auth, chat, [user("next")], debug=True)
    assert pairs(result["messages"]) == pairs(
        [user(turns[-1][0]), assistant(turns[-1][1]), user("next")]
    )
    assert result["debug"]["history"]["loaded_tokens"] == budget
    assert result["debug"]["history"]["stored_messages_read"] == 6


async def test_turn_save_stores_messages_uncounted(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    chat = new_chat()
    await save_turn(client, auth, chat, [user("How long is the Loire?")], "About 1,000 km.")
    counts = await rows(app, "SELECT tokens FROM chat_messages WHERE chat_id = :chat", chat=chat)
    assert [row.tokens for row in counts] == [None, None]


@pytest.mark.parametrize("slack", [-1, 0, 1])
async def test_the_budget_is_exact_at_its_edge_for_uncounted_messages(
    database_url: str, auth: AuthFactory, slack: int
) -> None:
    """Multi-byte text (each character 3 UTF-8 bytes, one or more tokens): the byte bound
    cannot settle a budget this tight, so the load counts; the selection is the exact one."""
    chat = new_chat()
    counter = TokenCounter()
    turns = [(f"問題 {n} " + "東京の天気 " * 8, f"答え {n} " + "晴れです " * 8) for n in range(3)]
    newest = counter.count(turns[-1][0]) + counter.count(turns[-1][1])
    budget = newest + slack
    async with client_with(database_url, history_max_tokens=budget) as small:
        for question, answer in turns:
            await save_turn(small, auth, chat, [user(question)], answer)
        result = await context(small, auth, chat, [user("next")], debug=True)
    loaded = result["debug"]["history"]
    if slack < 0:  # one token short: the newest answer alone still fits, its question does not
        assert pairs(result["messages"]) == pairs([assistant(turns[-1][1]), user("next")])
        assert loaded["loaded_tokens"] == counter.count(turns[-1][1])
    else:
        assert pairs(result["messages"]) == pairs(
            [user(turns[-1][0]), assistant(turns[-1][1]), user("next")]
        )
        assert loaded["loaded_tokens"] == newest


async def test_a_history_within_its_byte_bound_is_loaded_without_counting(
    database_url: str, auth: AuthFactory
) -> None:
    chat = new_chat()
    async with app_with(database_url) as application, client_of(application) as http:
        for n in range(3):
            await save_turn(http, auth, chat, [user(f"Question {n}?")], f"Answer {n}.")
        result = await context(http, auth, chat, [user("next")])
        assert result["history"]["loaded_messages"] == 6
        assert application.state.tokens.history.remembered == 0  # nothing was counted
        debug = await context(http, auth, chat, [user("next")], debug=True)
        assert application.state.tokens.history.remembered == 6  # debug reports the count
    assert debug["debug"]["history"]["loaded_tokens"] == sum(
        TokenCounter().count(text) for n in range(3) for text in (f"Question {n}?", f"Answer {n}.")
    )


async def test_a_count_stored_with_a_message_is_used_as_stored(
    app: FastAPI, database_url: str, auth: AuthFactory
) -> None:
    """Rows written before turn-save stopped counting carry their count: the load uses it."""
    chat = new_chat()
    async with client_with(database_url, history_max_tokens=1_000) as small:
        await save_turn(small, auth, chat, [user("Old question?")], "Old answer.")
        await save_turn(small, auth, chat, [user("New question?")], "New answer.")
        await execute(
            app,
            "UPDATE chat_messages SET tokens = 999"
            " WHERE chat_id = :chat AND content = 'Old answer.'",
            chat=chat,
        )
        result = await context(small, auth, chat, [user("next")], debug=True)
    # 999 + the newer messages exceed 1,000: the old answer (and what precedes it) is left out
    assert pairs(result["messages"]) == pairs(
        [user("New question?"), assistant("New answer."), user("next")]
    )


async def test_only_the_first_system_message_survives(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    chat = new_chat()
    first, second = system("First."), system("Second.")
    placeholder_system = system("From the placeholder.")
    question = user("Q")

    plain = await context(
        client,
        auth,
        chat,
        [first, question, second],
        placeholder_history=[placeholder_system, H1, A1],
    )
    assert pairs(plain["messages"]) == pairs([first, H1, A1, question])
    assert plain["system_prompt"] == "First."

    explicit = await context(client, auth, chat, [first, question], system_prompt="Given.")
    assert pairs(explicit["messages"]) == pairs([system("Given."), question])


async def test_debug_traces_every_history_decision(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    chat = new_chat()
    await save_turn(client, auth, chat, [Q0], "Paris.")

    result = await context(
        client, auth, chat, [SYS, H1, A1, Q1], history_mode="record_all", debug=True
    )

    debug = result["debug"]
    assert debug["mode"] == "record_all"
    assert debug["placeholder"] == {"given": False, "detected": True, "detected_by": "heuristic"}
    assert debug["history"]["load"] is False
    assert "placeholder history detected (heuristic)" in debug["history"]["reason"]
    assert debug["history"]["stored_messages_read"] == 0
    assert debug["memory"]["enabled"] is False
    assert [c["key"] for c in debug["memory"]["conditions"]] == [
        "company_flag",
        "space_setting",
        "web_search",
        "user_setting",
    ]
    assert "FEATURE_FLAG_ENABLE_CONTEXT_MEMORY_UN_22033" in debug["memory"]["reason"]
    assert debug["would_save"] == [
        {"role": "user", "source": "placeholder", "content": H1["content"]},
        {"role": "assistant", "source": "placeholder", "content": A1["content"]},
        {"role": "user", "source": "request", "content": Q1["content"]},
        {"role": "assistant", "source": "response", "content": None},
    ]
    assert debug["tokens"]["budget"] == 2000
    assert debug["tokens"]["profile"] is None

    quiet = await context(client, auth, chat, [Q1])
    assert quiet["debug"] is None
