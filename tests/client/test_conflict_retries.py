"""A 409 `conflict-retry` is retried like a 429, over real HTTP: the call succeeds after one
retry with the same Idempotency-Key, having waited the `Retry-After`; a plain conflict and a
quota-exceeded are raised at once; a call that is never repeated is not repeated for it either."""

from __future__ import annotations

import time

import pytest
from context_memory_client import (
    AsyncMemoryClient,
    Conflict,
    ConsolidationRequest,
    MemoryClient,
    MessageIn,
    ResponseIn,
    RetryableConflict,
    RetryPolicy,
    TurnRequest,
)

from tests.client.conftest import Answer, problem, served_front
from tests.helpers.apps import COMPANY, SPACE, TokenFactory

PATIENT = RetryPolicy(max_attempts=4, jitter=0.0)


def conflict_retry(retry_after: str = "1") -> Answer:
    body = problem("conflict-retry", 409, "Conflict, retry", retryable=True)
    return Answer(409, body, {"Retry-After": retry_after})


def turn(text: str = "I prefer short answers.") -> TurnRequest:
    return TurnRequest(SPACE, [MessageIn("user", text)], ResponseIn("Sure."))


def test_a_turn_save_answered_conflict_retry_is_sent_again_with_its_key_and_saved_once(
    database_url: str, make_token: TokenFactory
) -> None:
    with (
        served_front(database_url, make_token, "/turns", [conflict_retry("1")]) as (front, url),
        MemoryClient(url, make_token("alice", COMPANY), retry=PATIENT) as memory,
    ):
        started = time.monotonic()
        saved = memory.save_turn("chat-c", turn())
        elapsed = time.monotonic() - started
        assert saved.saved_messages == 2
        assert len(front.keys) == 2, "one conflict, then one retry the app answered"
        assert front.keys[0] is not None
        assert len(set(front.keys)) == 1, "the retry carries the same Idempotency-Key"
        assert elapsed >= 1.0, "the client waited the Retry-After of the conflict"
        assert len(memory.list_messages("chat-c").items) == 2, "the turn was saved once"


async def test_the_async_client_retries_a_conflict_retry_the_same_way(
    database_url: str, make_token: TokenFactory
) -> None:
    token = make_token("alice", COMPANY)
    with served_front(database_url, make_token, "/turns", [conflict_retry("0")]) as (front, url):
        async with AsyncMemoryClient(url, token, retry=PATIENT) as memory:
            saved = await memory.save_turn("chat-a", turn(), idempotency_key="turn-a")
            assert saved.saved_messages == 2
            assert front.keys == ["turn-a", "turn-a"]
            assert len((await memory.list_messages("chat-a")).items) == 2


def test_a_conflict_retry_past_the_last_attempt_is_raised_as_a_retryable_conflict(
    database_url: str, make_token: TokenFactory
) -> None:
    answers = [conflict_retry("0")] * 3
    with (
        served_front(database_url, make_token, "/turns", answers) as (front, url),
        MemoryClient(
            url, make_token("alice", COMPANY), retry=RetryPolicy(max_attempts=3)
        ) as memory,
        pytest.raises(RetryableConflict) as raised,
    ):
        memory.save_turn("chat-x", turn(), idempotency_key="turn-7")
    assert isinstance(raised.value, Conflict), "an `except Conflict` still catches it"
    assert raised.value.retryable is True
    assert raised.value.retry_after == 0
    assert raised.value.request_id == "front"
    assert front.keys == ["turn-7"] * 3


@pytest.mark.parametrize(
    ("slug", "title", "headers"),
    [
        ("conflict", "Conflict", {}),
        # a quota reached is not a race: waiting its Retry-After alone does not get past it
        ("quota-exceeded", "Quota exceeded", {"Retry-After": "1"}),
    ],
)
def test_a_conflict_that_is_not_retryable_is_raised_at_once(
    database_url: str, make_token: TokenFactory, slug: str, title: str, headers: dict[str, str]
) -> None:
    answers = [Answer(409, problem(slug, 409, title, retryable=False), headers)]
    with (
        served_front(database_url, make_token, "/turns", answers) as (front, url),
        MemoryClient(url, make_token("alice", COMPANY), retry=PATIENT) as memory,
        pytest.raises(Conflict) as raised,
    ):
        memory.save_turn("chat-p", turn())
    assert not isinstance(raised.value, RetryableConflict)
    assert raised.value.retryable is False
    assert raised.value.type == f"urn:context-memory:problem:{slug}"
    assert len(front.requests) == 1, "a conflict that is not retryable is never sent again"


def test_an_explicit_consolidation_answered_conflict_retry_is_not_repeated(
    database_url: str, make_token: TokenFactory
) -> None:
    with (
        served_front(database_url, make_token, "/consolidations", [conflict_retry("0")]) as (
            front,
            url,
        ),
        MemoryClient(url, make_token("alice", COMPANY), retry=PATIENT) as memory,
        pytest.raises(RetryableConflict) as raised,
    ):
        memory.consolidate(ConsolidationRequest(SPACE, "hi", "hello"))
    assert raised.value.retryable is True, "retryable, yet this call is never repeated"
    assert len(front.requests) == 1


def test_retry_conflicts_off_raises_the_first_conflict_retry(
    database_url: str, make_token: TokenFactory
) -> None:
    policy = RetryPolicy(max_attempts=4, retry_conflicts=False)
    with (
        served_front(database_url, make_token, "/turns", [conflict_retry("0")]) as (front, url),
        MemoryClient(url, make_token("alice", COMPANY), retry=policy) as memory,
        pytest.raises(RetryableConflict),
    ):
        memory.save_turn("chat-o", turn())
    assert len(front.requests) == 1
