"""The async client against the real app over ASGI: a whole chat turn, problem+json as typed
exceptions with the request id, pagination, and retries across 503s that save a turn once."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest
from context_memory_client import (
    CompanyIn,
    ConsolidationRequest,
    ContextRequest,
    Forbidden,
    MemoryPolicyIn,
    MessageIn,
    NotFound,
    PreconditionFailed,
    ResponseIn,
    RetryPolicy,
    ServiceUnavailable,
    TurnRequest,
    Unauthorized,
    Unprocessable,
)
from fastapi import FastAPI

from app.profiles.profile import Section
from tests.client.conftest import async_client_of, enable_memory
from tests.helpers.apps import COMPANY, OPERATOR, SPACE, SPACE_ADMIN, TokenFactory
from tests.helpers.profiles import memory_md

Scope = dict[str, Any]
FACT = "I work as a credit risk analyst at Helvetia Bank."


def turn(text: str, answer: str = "Noted.") -> TurnRequest:
    return TurnRequest(SPACE, [MessageIn("user", text)], ResponseIn(answer))


async def test_a_whole_turn_loads_context_saves_the_turn_and_reads_the_consolidated_memory(
    worker_app: FastAPI, make_token: TokenFactory
) -> None:
    transport = httpx.ASGITransport(worker_app)
    await enable_memory(transport, make_token)
    async with async_client_of(transport, lambda: make_token("alice", COMPANY)) as memory:
        assert (await memory.get_enablement(SPACE)).enabled
        context = await memory.load_context(
            "chat-1",
            ContextRequest(SPACE, [MessageIn("user", FACT)], system_prompt="Be helpful."),
        )
        assert context.memory.enabled
        assert not context.memory.injected
        assert context.messages[-1].content == FACT

        saved = await memory.save_turn("chat-1", turn(FACT, "Nice to meet you!"))
        assert saved.saved_messages == 2
        assert saved.consolidation.status == "queued"
        assert saved.consolidation.job_id is not None
        job = await memory.wait_for_job(saved.consolidation.job_id, timeout=30)
        assert job.status == "succeeded"
        assert job.version == 1

        profile = await memory.get_memory()
        assert "Helvetia Bank" in profile.content
        assert profile.version == 1
        assert await memory.get_memory_if_changed(profile.version) is None
        next_turn = await memory.load_context(
            "chat-1", ContextRequest(SPACE, [MessageIn("user", "Any advice?")], debug=True)
        )
        assert next_turn.memory.injected
        assert next_turn.system_prompt is not None
        assert "What I know about you" in next_turn.system_prompt
        assert next_turn.debug is not None
        assert next_turn.debug.memory.profile_version == 1

        explicit = await memory.consolidate(
            ConsolidationRequest(SPACE, "I prefer short answers.", "Sure."), wait=True
        )
        assert explicit.status == "succeeded"
        exported = await memory.export_memory()
        assert exported.profile is not None
        assert len(exported.versions) >= 1
        assert "chat-1" in [c.chat_id for c in exported.chats]


async def test_errors_arrive_as_typed_exceptions_carrying_the_request_id(
    app: FastAPI, make_token: TokenFactory
) -> None:
    async with async_client_of(app, make_token("alice", COMPANY)) as memory:
        with pytest.raises(NotFound) as missing:
            await memory.get_memory()
        assert missing.value.status == 404
        assert missing.value.request_id
        assert missing.value.type
        assert missing.value.title

        with pytest.raises(Unprocessable) as invalid:
            await memory.get_version(0)
        assert invalid.value.errors
        assert invalid.value.request_id

        with pytest.raises(Forbidden):
            await memory.get_space(SPACE)

        created = await memory.create_memory(memory_md({Section.IDENTITY: ["An analyst"]}))
        with pytest.raises(PreconditionFailed) as stale:
            await memory.replace_memory(created.content, if_match=created.version + 1)
        assert stale.value.status == 412

    async with async_client_of(app, "not-a-jwt") as stranger:
        with pytest.raises(Unauthorized) as refused:
            await stranger.get_me()
        assert refused.value.request_id


async def test_the_memory_policy_is_set_and_what_it_kept_out_is_listed(
    app: FastAPI, make_token: TokenFactory
) -> None:
    operator = async_client_of(app, make_token("olga", "platform", OPERATOR))
    user = async_client_of(app, make_token("alice", COMPANY))
    async with operator, user:
        await operator.create_company(CompanyIn(COMPANY))
        assert (await operator.get_memory_policy(COMPANY)).default
        policy = MemoryPolicyIn(
            secrets="drop",
            payment_cards="drop",
            bank_accounts="drop",
            national_ids="drop",
            email_addresses="redact",
            phone_numbers="drop",
            instructions="drop",
            recent_topics_days=30,
            inactive_memory_days=0,
        )
        saved = await operator.set_memory_policy(COMPANY, policy)
        assert (saved.default, saved.phone_numbers, saved.recent_topics_days) == (
            False,
            "drop",
            30,
        )

        with pytest.raises(Unprocessable) as refused:
            await user.create_memory(memory_md({Section.IDENTITY: ["Call me at +41 44 668 18 00"]}))
        assert refused.value.type.endswith(":memory-policy")
        assert "+41" not in str(refused.value.errors)
        created = await user.create_memory(memory_md({Section.IDENTITY: ["Mail a@example.com"]}))
        assert "[redacted: email]" in created.content
        [action] = [a async for a in user.iter_policy_actions(page_size=1)]
        assert (action.action, action.category, action.version) == (
            "redact",
            "email_addresses",
            created.version,
        )
        assert (await user.export_memory()).policy_actions == [action]


async def test_iterators_walk_every_page_of_versions_and_messages(
    app: FastAPI, make_token: TokenFactory
) -> None:
    transport = httpx.ASGITransport(app)
    await enable_memory(transport, make_token)
    async with async_client_of(transport, make_token("alice", COMPANY)) as memory:
        current = await memory.create_memory(memory_md({Section.IDENTITY: ["fact 0"]}))
        for n in range(1, 5):
            current = await memory.replace_memory(
                memory_md({Section.IDENTITY: [f"fact {n}"]}), if_match=current.version
            )
        first = await memory.list_versions(limit=2)
        assert len(first.items) == 2
        assert first.next_cursor is not None
        versions = [v.version async for v in memory.iter_versions(page_size=2)]
        assert versions == [5, 4, 3, 2, 1]
        diff = await memory.diff_version(5)
        assert diff.from_ == 4
        assert diff.to == 5
        assert "fact 4" in diff.diff

        for n in range(3):
            await memory.save_turn("chat-p", turn(f"question {n}", f"answer {n}"))
        messages = [m.content async for m in memory.iter_messages("chat-p", page_size=4)]
        assert sorted(messages) == sorted(
            [f"question {n}" for n in range(3)] + [f"answer {n}" for n in range(3)]
        )

    admin_token = make_token("sam", COMPANY, SPACE_ADMIN)
    async with async_client_of(transport, admin_token) as admin:
        assert (await admin.get_space(SPACE)).context_memory is True


class Unavailable:
    """The app behind a front that answers 503 + Retry-After to the first `failures` POSTs to
    a path ending in `suffix`, and records the Idempotency-Key of every such request."""

    def __init__(self, app: FastAPI, suffix: str, failures: int, retry_after: str = "1") -> None:
        self.app, self.suffix, self.failures, self.retry_after = app, suffix, failures, retry_after
        self.keys: list[str | None] = []

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and scope["path"].endswith(self.suffix):
            key = dict(scope["headers"]).get(b"idempotency-key")
            self.keys.append(key.decode() if key else None)
            if len(self.keys) <= self.failures:
                body = json.dumps(
                    {
                        "type": "about:blank",
                        "title": "Service Unavailable",
                        "status": 503,
                        "detail": "The database is unavailable.",
                        "request_id": "front",
                    }
                ).encode()
                await send(
                    {
                        "type": "http.response.start",
                        "status": 503,
                        "headers": [
                            (b"content-type", b"application/problem+json"),
                            (b"retry-after", self.retry_after.encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


async def test_a_turn_save_retried_across_503s_sends_one_key_and_saves_the_turn_once(
    app: FastAPI, make_token: TokenFactory
) -> None:
    front = Unavailable(app, "/turns", failures=2)
    transport = httpx.ASGITransport(front)  # type: ignore[arg-type]
    await enable_memory(httpx.ASGITransport(app), make_token)
    retry = RetryPolicy(max_attempts=4, jitter=0.0)
    async with async_client_of(transport, make_token("alice", COMPANY), retry) as memory:
        started = time.monotonic()
        saved = await memory.save_turn("chat-r", turn(FACT))
        elapsed = time.monotonic() - started
        assert saved.saved_messages == 2
        assert len(front.keys) == 3
        assert front.keys[0] is not None
        assert len(set(front.keys)) == 1, "every attempt carries the same Idempotency-Key"
        assert elapsed >= 2.0, "the client waited the Retry-After of each 503"
        page = await memory.list_messages("chat-r")
        assert len(page.items) == 2, "exactly one turn was saved"


async def test_a_caller_key_is_kept_and_a_503_past_the_last_attempt_is_raised(
    app: FastAPI, make_token: TokenFactory
) -> None:
    front = Unavailable(app, "/turns", failures=5, retry_after="0")
    transport = httpx.ASGITransport(front)  # type: ignore[arg-type]
    retry = RetryPolicy(max_attempts=3)
    async with async_client_of(transport, make_token("alice", COMPANY), retry) as memory:
        with pytest.raises(ServiceUnavailable) as unavailable:
            await memory.save_turn("chat-x", turn(FACT), idempotency_key="turn-42")
        assert unavailable.value.retry_after == 0
        assert unavailable.value.request_id == "front"
        assert front.keys == ["turn-42"] * 3


async def test_an_explicit_consolidation_is_not_repeated_after_a_503(
    app: FastAPI, make_token: TokenFactory
) -> None:
    front = Unavailable(app, "/consolidations", failures=1, retry_after="0")
    transport = httpx.ASGITransport(front)  # type: ignore[arg-type]
    async with async_client_of(transport, make_token("alice", COMPANY), RetryPolicy()) as memory:
        with pytest.raises(ServiceUnavailable):
            await memory.consolidate(ConsolidationRequest(SPACE, "hi", "hello"))
        assert len(front.keys) == 1
