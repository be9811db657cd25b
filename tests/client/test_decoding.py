"""An answer is read strictly where leniency would make a value up: a missing required member is
an `UnexpectedResponse` naming it, never a `None` its type does not allow; a missing optional
member takes its default, and an unknown member or enumeration value is still accepted."""

from __future__ import annotations

import re
from typing import Any

import pytest
from context_memory_client import (
    ContextResponse,
    Me,
    MemoryClient,
    UnexpectedResponse,
    VersionSummaryOut,
)
from context_memory_client.codec import decode, decode_page

from tests.client.conftest import Answer, served_front
from tests.helpers.apps import COMPANY, TokenFactory

CONTEXT: dict[str, Any] = {
    "messages": [{"role": "user", "content": "hi"}],
    "system_prompt": None,
    "memory": {
        "enabled": True,
        "injected": False,
        "version": None,
        "tokens": None,
        "conditions": [],
        "reason": "no profile yet",
    },
    "history": {
        "mode": "auto",
        "placeholder_detected": False,
        "detected_by": None,
        "loaded": False,
        "loaded_messages": 0,
    },
}


def without(data: dict[str, Any], *path: str) -> dict[str, Any]:
    """A deep copy of `data` without the member at `path`."""
    if len(path) == 1:
        return {k: v for k, v in data.items() if k != path[0]}
    return {k: without(v, *path[1:]) if k == path[0] else v for k, v in data.items()}


def test_a_complete_answer_is_read_and_a_missing_optional_member_takes_its_default() -> None:
    context = decode(ContextResponse, {**CONTEXT, "added_by_a_newer_service": 1})
    assert context.debug is None, "`debug` is optional: absent, it is its default"
    assert context.memory.reason == "no profile yet"
    assert decode(Me, {"user_id": "a", "company_id": "c", "roles": ["brand-new-role"]}).roles


@pytest.mark.parametrize(
    ("data", "where"),
    [
        (without(CONTEXT, "history"), "ContextResponse: the required member 'history'"),
        # required and nullable: null is a value the service sends, absence is not
        (without(CONTEXT, "system_prompt"), "ContextResponse: the required member 'system_prompt'"),
        (
            without(CONTEXT, "memory", "version"),
            "ContextResponse.memory: the required member 'version'",
        ),
        (
            {**CONTEXT, "messages": [{"role": "user"}]},
            "ContextResponse.messages[0]: the required member 'content'",
        ),
        ({**CONTEXT, "memory": []}, "ContextResponse.memory: expected a JSON object, got list"),
        ({**CONTEXT, "messages": {}}, "ContextResponse.messages: expected a JSON array"),
        (["not", "an", "object"], "ContextResponse: expected a JSON object, got list"),
    ],
)
def test_an_answer_without_a_required_member_is_an_unexpected_response(
    data: Any, where: str
) -> None:
    with pytest.raises(UnexpectedResponse, match="^" + re.escape(where)):
        decode(ContextResponse, data)


def test_a_page_without_its_cursor_member_is_an_unexpected_response() -> None:
    with pytest.raises(UnexpectedResponse, match="the required member 'next_cursor'"):
        decode_page(VersionSummaryOut, {"items": []})
    assert decode_page(VersionSummaryOut, {"items": [], "next_cursor": None}).items == []


def test_the_client_raises_unexpected_response_for_a_success_missing_a_member(
    database_url: str, make_token: TokenFactory
) -> None:
    answers = [
        Answer(200, {"user_id": "alice", "company_id": COMPANY}),
        Answer(200, []),
        Answer(200, b"<html>a proxy's page</html>"),
    ]
    with (
        served_front(database_url, make_token, "/v1/me", answers) as (_, url),
        MemoryClient(url, make_token("alice", COMPANY)) as memory,
    ):
        with pytest.raises(
            UnexpectedResponse, match="^" + re.escape("Me: the required member 'roles'")
        ):
            memory.get_me()
        with pytest.raises(
            UnexpectedResponse, match="^" + re.escape("Me: expected a JSON object, got list")
        ):
            memory.get_me()
        with pytest.raises(UnexpectedResponse, match=r"^a 200 answer that is not JSON"):
            memory.get_me()
        assert memory.get_me().roles is not None, "the real answer has every member"
