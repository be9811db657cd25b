"""The OpenAI adapter against a real local OpenAI-compatible server: what it sends, how every
failure maps to a typed `ModelError`, that SDK retries are off, and engine selection."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from email.utils import formatdate
from typing import Any

import pytest
from pydantic import SecretStr

from app.kit.config import Settings
from app.kit.llm import (
    ChatModelConfigError,
    ChatRequest,
    ModelBadRequest,
    ModelError,
    ModelInvalidResponse,
    ModelOutputTruncated,
    ModelRateLimited,
    ModelRefused,
    ModelTimeout,
    ModelUnavailable,
    OpenAIChatModel,
    create_chat_model,
    parse_retry_after,
    resolve_model_name,
)
from tests.helpers.apps import make_settings
from tests.helpers.llm_stub import (
    ScriptStep,
    StubLLMServer,
    delay,
    llm_stub_fixture,  # noqa: F401 - registers fixture `llm_stub`
    malformed,
    refusal,
    reply,
    status,
)

SENTINEL = "SENTINEL-my-secret-diagnosis-4711"
REQUEST = ChatRequest(
    model="orchestrator-model-7",
    system=f"You maintain a memory profile. Current profile: {SENTINEL}",
    user=f"User said: {SENTINEL}",
    max_output_tokens=256,
)


def llm_settings(**overrides: Any) -> Settings:
    """Settings with every language-model knob explicit, so the environment cannot leak in."""
    values: dict[str, Any] = {
        "llm_provider": "auto",
        "openai_api_key": None,
        "openai_base_url": None,
        "azure_openai_endpoint": None,
        "azure_openai_api_version": None,
        "llm_timeout_seconds": 5.0,
    }
    values.update(overrides)
    return make_settings("postgresql://unused/unused", **values)


@pytest.fixture
async def model(llm_stub: StubLLMServer) -> AsyncIterator[OpenAIChatModel]:
    """The adapter built from settings the way the service builds it, pointed at the stub."""
    chat_model = create_chat_model(
        llm_settings(openai_base_url=llm_stub.base_url, llm_timeout_seconds=0.5)
    )
    assert isinstance(chat_model, OpenAIChatModel)
    async with chat_model:
        yield chat_model


async def fail(model: OpenAIChatModel, request: ChatRequest = REQUEST) -> ModelError:
    with pytest.raises(ModelError) as caught:
        await model.complete(request)
    error = caught.value
    # Nothing from the prompt or the server's echo of it: not the message, not a chained cause.
    assert SENTINEL not in str(error)
    assert SENTINEL not in repr(error)
    assert error.__cause__ is None
    assert error.__context__ is None or error.__suppress_context__
    return error


# --- success -------------------------------------------------------------------------------


async def test_reply_returns_text_and_usage_and_sends_the_requested_model(
    llm_stub: StubLLMServer, model: OpenAIChatModel
) -> None:
    llm_stub.script(reply("NOOP", tokens_in=321, tokens_out=4))

    result = await model.complete(REQUEST)

    assert (result.text, result.tokens_in, result.tokens_out) == ("NOOP", 321, 4)
    assert (result.model, result.finish_reason) == ("orchestrator-model-7", "stop")
    [sent] = llm_stub.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.model == "orchestrator-model-7"
    assert sent.messages == [
        {"role": "system", "content": REQUEST.system},
        {"role": "user", "content": REQUEST.user},
    ]
    assert sent.body["max_completion_tokens"] == 256
    assert "response_format" not in sent.body
    assert "stream" not in sent.body


async def test_json_mode_asks_for_a_json_object(
    llm_stub: StubLLMServer, model: OpenAIChatModel
) -> None:
    llm_stub.script(reply('{"operations": []}'))

    request = ChatRequest(
        model="gpt-4o-mini", system="s", user="u", max_output_tokens=64, json_mode=True
    )
    result = await model.complete(request)

    assert result.text == '{"operations": []}'
    assert llm_stub.requests[0].body["response_format"] == {"type": "json_object"}


async def test_result_names_the_model_that_answered_and_zero_tokens_without_usage(
    llm_stub: StubLLMServer, model: OpenAIChatModel
) -> None:
    llm_stub.script(reply("ok", usage=False, model="gpt-4o-mini-2024-07-18"))

    result = await model.complete(REQUEST)

    assert result.model == "gpt-4o-mini-2024-07-18"
    assert (result.tokens_in, result.tokens_out) == (0, 0)


async def test_api_key_is_sent_as_bearer_token(llm_stub: StubLLMServer) -> None:
    llm_stub.script(reply("ok"))
    settings = llm_settings(
        llm_provider="openai",
        openai_api_key=SecretStr("sk-test-123"),
        openai_base_url=llm_stub.base_url,
    )
    chat_model = create_chat_model(settings)
    assert isinstance(chat_model, OpenAIChatModel)
    async with chat_model:
        await chat_model.complete(REQUEST)

    assert llm_stub.requests[0].headers["authorization"] == "Bearer sk-test-123"


async def test_azure_endpoint_uses_deployment_path_api_version_and_api_key_header(
    llm_stub: StubLLMServer,
) -> None:
    llm_stub.script(reply("ok"))
    settings = llm_settings(
        openai_api_key=SecretStr("azure-key"),
        azure_openai_endpoint=llm_stub.root_url,
        azure_openai_api_version="2024-10-21",
    )
    chat_model = create_chat_model(settings)
    assert isinstance(chat_model, OpenAIChatModel)
    async with chat_model:
        result = await chat_model.complete(REQUEST)

    assert result.text == "ok"
    [sent] = llm_stub.requests
    assert sent.path == "/openai/deployments/orchestrator-model-7/chat/completions"
    assert sent.query == {"api-version": "2024-10-21"}
    assert sent.headers["api-key"] == "azure-key"
    assert "authorization" not in sent.headers


# --- failures: one request each, typed, retryable or not ------------------------------------


@pytest.mark.parametrize("code", [500, 502, 503])
async def test_server_error_is_unavailable_and_not_retried_by_the_sdk(
    llm_stub: StubLLMServer, model: OpenAIChatModel, code: int
) -> None:
    llm_stub.script(status(code, body={"error": {"message": f"crashed on {SENTINEL}"}}))

    error = await fail(model)

    assert isinstance(error, ModelUnavailable)
    assert (error.retryable, error.status_code, error.error_class) == (
        True,
        code,
        "model_unavailable",
    )
    assert len(llm_stub.requests) == 1


async def test_unscripted_request_is_answered_500_and_recorded(
    llm_stub: StubLLMServer, model: OpenAIChatModel
) -> None:
    error = await fail(model)

    assert isinstance(error, ModelUnavailable)
    assert "stub_script_exhausted" in str(error)
    assert len(llm_stub.requests) == 1


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "7"}, 7.0),
        ({"retry-after-ms": "1500", "Retry-After": "9"}, 1.5),
        ({}, None),
        ({"Retry-After": "soon"}, None),
    ],
)
async def test_rate_limit_carries_the_servers_retry_after(
    llm_stub: StubLLMServer,
    model: OpenAIChatModel,
    headers: dict[str, str],
    expected: float | None,
) -> None:
    llm_stub.script(status(429, headers=headers))

    error = await fail(model)

    assert isinstance(error, ModelRateLimited)
    assert (error.retryable, error.retry_after_seconds) == (True, expected)
    assert error.error_class == "model_rate_limited"
    assert len(llm_stub.requests) == 1


async def test_rate_limit_retry_after_as_http_date(
    llm_stub: StubLLMServer, model: OpenAIChatModel
) -> None:
    llm_stub.script(status(429, headers={"Retry-After": formatdate(time.time() + 30, usegmt=True)}))

    error = await fail(model)

    assert error.retry_after_seconds is not None
    assert 27 <= error.retry_after_seconds <= 31


async def test_unavailable_with_retry_after_carries_it(
    llm_stub: StubLLMServer, model: OpenAIChatModel
) -> None:
    llm_stub.script(status(503, headers={"Retry-After": "12"}))

    error = await fail(model)

    assert isinstance(error, ModelUnavailable)
    assert error.retry_after_seconds == 12.0


def test_retry_after_parsing_table() -> None:
    now = 1_700_000_000.0
    assert parse_retry_after({"retry-after": "2.5"}, now=now) == 2.5
    assert parse_retry_after({"retry-after": "-3"}, now=now) == 0.0
    assert parse_retry_after({"retry-after": "inf"}, now=now) is None
    assert parse_retry_after({"retry-after-ms": "250"}, now=now) == 0.25
    assert parse_retry_after({"retry-after": formatdate(now + 60, usegmt=True)}, now=now) == 60.0
    assert parse_retry_after({"retry-after": formatdate(now - 60, usegmt=True)}, now=now) == 0.0
    assert parse_retry_after({}, now=now) is None


async def test_slow_server_is_a_timeout_after_the_configured_seconds(
    llm_stub: StubLLMServer, model: OpenAIChatModel
) -> None:
    llm_stub.script(delay(2.0, then=reply("too late")))

    started = time.monotonic()
    error = await fail(model)
    elapsed = time.monotonic() - started

    assert isinstance(error, ModelTimeout)
    assert (error.retryable, error.error_class) == (True, "model_timeout")
    assert 0.4 <= elapsed < 1.5
    assert len(llm_stub.requests) == 1


async def test_refusal_is_refused_and_not_retryable(
    llm_stub: StubLLMServer, model: OpenAIChatModel
) -> None:
    llm_stub.script(refusal(f"I can't help with {SENTINEL}."))

    error = await fail(model)

    assert isinstance(error, ModelRefused)
    assert (error.retryable, error.error_class) == (False, "model_refused")


async def test_content_filter_is_refused(llm_stub: StubLLMServer, model: OpenAIChatModel) -> None:
    llm_stub.script(reply(f"partial {SENTINEL}", finish_reason="content_filter"))

    error = await fail(model)

    assert isinstance(error, ModelRefused)
    assert not error.retryable


async def test_length_finish_is_truncated_and_not_retryable(
    llm_stub: StubLLMServer, model: OpenAIChatModel
) -> None:
    llm_stub.script(reply(f'{{"operations": [{{"text": "{SENTINEL}', finish_reason="length"))

    error = await fail(model)

    assert isinstance(error, ModelOutputTruncated)
    assert (error.retryable, error.error_class) == (False, "model_output_truncated")
    assert "max_output_tokens=256" in str(error)


@pytest.mark.parametrize(
    ("code", "error_code"),
    [
        (400, "invalid_request_error"),
        (401, "invalid_api_key"),
        (403, "unsupported_country_region_territory"),
        (404, "model_not_found"),
        (422, None),
    ],
)
async def test_client_errors_are_bad_requests_and_not_retryable(
    llm_stub: StubLLMServer, model: OpenAIChatModel, code: int, error_code: str | None
) -> None:
    echo = {"error": {"message": f"cannot process: {SENTINEL}", "type": "x", "code": error_code}}
    llm_stub.script(status(code, body=echo))

    error = await fail(model)

    assert isinstance(error, ModelBadRequest)
    assert (error.retryable, error.status_code, error.error_class) == (
        False,
        code,
        "model_bad_request",
    )
    assert f"HTTP {code}" in str(error)
    if error_code:
        assert error_code in str(error)
    assert len(llm_stub.requests) == 1


async def test_plain_text_error_body_is_not_quoted(
    llm_stub: StubLLMServer, model: OpenAIChatModel
) -> None:
    llm_stub.script(status(400, body=f"bad prompt {SENTINEL}"))

    error = await fail(model)

    assert isinstance(error, ModelBadRequest)


async def test_request_timeout_status_is_a_timeout(
    llm_stub: StubLLMServer, model: OpenAIChatModel
) -> None:
    llm_stub.script(status(408))

    error = await fail(model)

    assert isinstance(error, ModelTimeout)
    assert error.retryable


@pytest.mark.parametrize(
    "step",
    [
        malformed(),
        malformed("<html><body>502 Bad Gateway</body></html>", "text/html"),
        malformed('{"object": "chat.completion"}'),
        malformed('{"choices": []}'),
        malformed('{"choices": ["not a choice"]}'),
    ],
    ids=["truncated-json", "html", "no-choices", "empty-choices", "bad-choice"],
)
async def test_body_that_is_not_a_completion_is_an_invalid_response(
    llm_stub: StubLLMServer, model: OpenAIChatModel, step: ScriptStep
) -> None:
    llm_stub.script(step)

    error = await fail(model)

    assert isinstance(error, ModelInvalidResponse)
    assert (error.retryable, error.error_class) == (True, "model_invalid_response")
    assert len(llm_stub.requests) == 1


async def test_connection_refused_is_unavailable() -> None:
    stub = StubLLMServer()
    await stub.start()
    await stub.stop()
    async with OpenAIChatModel(
        api_key=None, base_url=stub.base_url, timeout_seconds=2
    ) as chat_model:
        error = await fail(chat_model)

    assert isinstance(error, ModelUnavailable)
    assert error.retryable
    assert error.status_code is None
    assert stub.requests == []


def test_error_classes_are_distinct_and_say_whether_to_retry() -> None:
    table = {
        ModelTimeout: ("model_timeout", True),
        ModelUnavailable: ("model_unavailable", True),
        ModelRateLimited: ("model_rate_limited", True),
        ModelInvalidResponse: ("model_invalid_response", True),
        ModelRefused: ("model_refused", False),
        ModelOutputTruncated: ("model_output_truncated", False),
        ModelBadRequest: ("model_bad_request", False),
    }
    for cls, (name, retryable) in table.items():
        error = cls("boom")
        assert isinstance(error, ModelError)
        assert (error.error_class, error.retryable, error.retry_after_seconds) == (
            name,
            retryable,
            None,
        )


# --- engine selection ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("overrides", "expects_model"),
    [
        ({"llm_provider": "rules"}, False),
        ({"llm_provider": "rules", "openai_api_key": SecretStr("sk-x")}, False),
        ({"llm_provider": "auto"}, False),
        ({"llm_provider": "auto", "openai_base_url": "http://127.0.0.1:9/v1"}, True),
        ({"llm_provider": "auto", "openai_api_key": SecretStr("sk-x")}, True),
        (
            {
                "llm_provider": "auto",
                "openai_api_key": SecretStr("k"),
                "azure_openai_endpoint": "https://example.openai.azure.com",
                "azure_openai_api_version": "2024-10-21",
            },
            True,
        ),
        ({"llm_provider": "openai", "openai_base_url": "http://127.0.0.1:9/v1"}, True),
        ({"llm_provider": "openai", "openai_api_key": SecretStr("sk-x")}, True),
    ],
    ids=[
        "rules",
        "rules-ignores-key",
        "auto-unconfigured",
        "auto-base-url",
        "auto-key",
        "auto-azure",
        "openai-base-url",
        "openai-key",
    ],
)
async def test_engine_selection(overrides: dict[str, Any], expects_model: bool) -> None:
    chat_model = create_chat_model(llm_settings(**overrides))

    if not expects_model:
        assert chat_model is None
        return
    assert isinstance(chat_model, OpenAIChatModel)
    await chat_model.aclose()


@pytest.mark.parametrize(
    "overrides",
    [
        {"llm_provider": "openai"},
        {
            "azure_openai_endpoint": "https://example.openai.azure.com",
            "openai_api_key": SecretStr("k"),
        },
        {
            "azure_openai_endpoint": "https://example.openai.azure.com",
            "azure_openai_api_version": "v",
        },
        {
            "azure_openai_endpoint": "https://example.openai.azure.com",
            "azure_openai_api_version": "v",
            "openai_api_key": SecretStr("k"),
            "openai_base_url": "http://127.0.0.1:9/v1",
        },
    ],
    ids=["openai-unconfigured", "azure-without-version", "azure-without-key", "azure-and-base-url"],
)
def test_unworkable_configuration_fails_at_startup(overrides: dict[str, Any]) -> None:
    with pytest.raises(ChatModelConfigError):
        create_chat_model(llm_settings(**overrides))


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("AZURE_GPT_4o_2024_1120", "gpt-4o-2024-11-20"),
        ("gpt-4o-mini", "gpt-4o-mini"),
        ("my-azure-deployment", "my-azure-deployment"),
    ],
)
def test_model_identifiers_resolve_to_api_names(name: str, expected: str) -> None:
    assert resolve_model_name(name) == expected


async def test_a_connection_dropped_before_the_answer_is_unavailable() -> None:
    """A server that reads the request and closes the connection: no answer, not a timeout
    (the SDK's aiohttp transport reports it as one; `ModelUnavailable` says what happened)."""

    async def drop(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.close()

    server = await asyncio.start_server(drop, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with OpenAIChatModel(
            api_key=None, base_url=f"http://127.0.0.1:{port}/v1", timeout_seconds=5
        ) as chat_model:
            started = time.monotonic()
            error = await fail(chat_model)
    finally:
        server.close()
        await server.wait_closed()

    assert isinstance(error, ModelUnavailable)
    assert error.retryable
    assert time.monotonic() - started < 2
