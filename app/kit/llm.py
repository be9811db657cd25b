"""The language-model port and its OpenAI adapter; the only module that imports `openai`.

`ChatModel` is what the consolidation worker calls; `OpenAIChatModel` implements it with the
OpenAI SDK (`AsyncOpenAI`, or `AsyncAzureOpenAI` when `AZURE_OPENAI_ENDPOINT` is set) with the
SDK's own retries off, because the job queue owns retries. Every failure leaves as a typed
`ModelError` that says whether a retry can help and never quotes the prompt or the answer.

`create_chat_model(settings)` picks the engine:

    LLM_PROVIDER  configured (OPENAI_API_KEY, OPENAI_BASE_URL, AZURE_OPENAI_ENDPOINT)  result
    rules         anything                                                   None
    auto          none of them                                               None
    auto          any of them                                                OpenAIChatModel
    openai        any of them                                                OpenAIChatModel
    openai        none of them                                               ChatModelConfigError

`None` means "use the offline rule-based consolidator". `OPENAI_BASE_URL` alone is enough for a
local OpenAI-compatible server (vLLM, llama.cpp, Ollama); a placeholder key is sent then. With
Azure, `OPENAI_API_KEY` is the Azure key, `AZURE_OPENAI_API_VERSION` is required, and the model
name of a request is the deployment name.
"""

from __future__ import annotations

import email.utils
import json
import math
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC
from types import TracebackType
from typing import TYPE_CHECKING, ClassVar, Protocol, Self

from app.kit.config import Settings

# The SDK is imported where a client is built or an answer read, never at import: its models
# cost ~0.5 s and ~50 MB, which the API process (whose worker is off) never needs.
if TYPE_CHECKING:
    import openai
    from openai.types.chat import ChatCompletion, ChatCompletionMessageParam
    from openai.types.chat.completion_create_params import ResponseFormat

DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"
# Sent when only OPENAI_BASE_URL is configured: local compatible servers ignore the key, but the
# SDK refuses to build a client without one.
PLACEHOLDER_API_KEY = "no-key-configured"

# Identifiers from an error body (code, type, request id) or a model name may appear in our
# messages; anything else from the server is dropped because it may quote the prompt.
_SAFE_IDENTIFIER = re.compile(r"[A-Za-z0-9_.:/@+-]{1,100}")


# --- the port ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """One system + user exchange. `model` is chosen per call (space setting or default)."""

    model: str
    system: str
    user: str
    max_output_tokens: int
    json_mode: bool = False


@dataclass(frozen=True, slots=True)
class ChatUsage:
    """What the server billed for one answered completion, as it reported it: the model it says
    answered and the `usage` block's prompt and completion tokens (0 where it sent none)."""

    model: str
    tokens_in: int
    tokens_out: int


@dataclass(frozen=True, slots=True)
class ChatResult:
    """The answer text and its accounting. `model` is the model the server says answered."""

    text: str
    model: str
    tokens_in: int
    tokens_out: int
    finish_reason: str | None

    @property
    def usage(self) -> ChatUsage:
        return ChatUsage(self.model, self.tokens_in, self.tokens_out)


class ChatModel(Protocol):
    """A language model that answers one chat request; raises `ModelError` on failure."""

    async def complete(self, request: ChatRequest) -> ChatResult: ...


# --- typed failures ------------------------------------------------------------------------


class ModelError(Exception):
    """A model call failed. Messages name the failure, never the prompt or the answer.

    `retryable` tells the job queue whether the same request may succeed later;
    `retry_after_seconds` is the server's requested delay when it gave one; `error_class` is a
    short stable name for job records and metrics; `operator_message` is the fixed sentence a
    job record shows for the failure (the instance's `message` carries the details). `usage` is
    set when the server did answer with a completion (cut off, refused, or unreadable but with
    a `usage` block): that call was billed, and metering counts it.
    """

    error_class: ClassVar[str] = "model_error"
    retryable: ClassVar[bool] = False
    operator_message: ClassVar[str] = "The language model call failed."

    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        retry_after_seconds: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code
        self.retry_after_seconds = retry_after_seconds
        self.usage: ChatUsage | None = None


class ModelTimeout(ModelError):
    """No answer within the configured timeout (or the server answered 408)."""

    error_class = "model_timeout"
    operator_message = "The language model did not answer in time."
    retryable = True


class ModelUnavailable(ModelError):
    """Connection failed or the server answered 5xx (or 409, which the API uses for lock
    timeouts)."""

    error_class = "model_unavailable"
    operator_message = "The language model server was unreachable or failed."
    retryable = True


class ModelRateLimited(ModelError):
    """HTTP 429; `retry_after_seconds` from `retry-after-ms` or `Retry-After` when present."""

    error_class = "model_rate_limited"
    operator_message = "The language model server is rate-limiting requests."
    retryable = True


class ModelRefused(ModelError):
    """The model refused (`refusal` set) or the content filter stopped it."""

    error_class = "model_refused"
    operator_message = "The language model refused the consolidation request."
    retryable = False


class ModelOutputTruncated(ModelError):
    """The answer hit `max_output_tokens` (finish_reason "length"); retrying repeats it.

    `tokens_in` and `tokens_out` are the usage the server reported for the cut-off answer: the
    call was billed even though its answer is unusable."""

    error_class = "model_output_truncated"
    operator_message = "The language model's answer was cut off at its output limit."
    retryable = False
    tokens_in: int = 0
    tokens_out: int = 0


class ModelBadRequest(ModelError):
    """A 4xx other than 408/409/429: bad key, unknown model, rejected parameters."""

    error_class = "model_bad_request"
    operator_message = "The language model server rejected the request (key, model, options)."
    retryable = False


class ModelInvalidResponse(ModelError):
    """HTTP 200 whose body is not a chat completion (broken JSON, HTML, no choices).

    Retryable: it is a transport or gateway fault, not the model's answer, and the queue bounds
    the attempts. Well-formed completions whose *text* is unusable are the caller's concern.
    """

    error_class = "model_invalid_response"
    operator_message = "The language model server sent a response that is not a chat completion."
    retryable = True


class ChatModelConfigError(ValueError):
    """The language-model settings cannot work; raised at startup, not per call."""


# --- the OpenAI adapter --------------------------------------------------------------------


class OpenAIChatModel:
    """`ChatModel` over the OpenAI SDK. One HTTP client per instance; call `aclose()` at
    shutdown. SDK retries are off: one `complete` is exactly one HTTP request."""

    def __init__(  # noqa: PLR0913 - all by keyword, most optional
        self,
        *,
        api_key: str | None,
        base_url: str | None = None,
        timeout_seconds: float,
        azure_endpoint: str | None = None,
        azure_api_version: str | None = None,
        instrument_http_client: Callable[[object], None] | None = None,
    ) -> None:
        """`instrument_http_client` is handed the SDK's HTTP client before its first request
        (tracing: a span and a `traceparent` per request)."""
        import openai  # noqa: PLC0415 - the SDK's models cost ~50 MB: only where a model is used

        self._timeout_seconds = timeout_seconds
        self._client: openai.AsyncOpenAI
        if azure_endpoint:
            if base_url:
                raise ChatModelConfigError(
                    "OPENAI_BASE_URL and AZURE_OPENAI_ENDPOINT are mutually exclusive"
                )
            if not azure_api_version:
                raise ChatModelConfigError(
                    "AZURE_OPENAI_API_VERSION is required with AZURE_OPENAI_ENDPOINT"
                )
            if not api_key:
                raise ChatModelConfigError(
                    "OPENAI_API_KEY (the Azure key) is required with AZURE_OPENAI_ENDPOINT"
                )
            self._client = openai.AsyncAzureOpenAI(
                azure_endpoint=azure_endpoint,
                api_version=azure_api_version,
                api_key=api_key,
                timeout=timeout_seconds,
                max_retries=0,
                http_client=_http_client(instrument_http_client),
            )
        else:
            if not api_key and not base_url:
                raise ChatModelConfigError("OPENAI_API_KEY or OPENAI_BASE_URL is required")
            self._client = openai.AsyncOpenAI(
                api_key=api_key or PLACEHOLDER_API_KEY,
                base_url=base_url or DEFAULT_OPENAI_BASE_URL,
                timeout=timeout_seconds,
                max_retries=0,
                http_client=_http_client(instrument_http_client),
            )

    async def complete(self, request: ChatRequest) -> ChatResult:
        """Send one chat completion; raise a `ModelError` subclass on any failure.

        The SDK exception is suppressed (`from None`): its message can quote the server's error
        body, which may echo the prompt, and a chained cause would carry it into logs.
        """
        import openai  # noqa: PLC0415 - loaded by __init__ already
        from openai.types.chat import (  # noqa: PLC0415
            ChatCompletionSystemMessageParam,
            ChatCompletionUserMessageParam,
        )
        from openai.types.shared_params import ResponseFormatJSONObject  # noqa: PLC0415

        messages: list[ChatCompletionMessageParam] = [
            ChatCompletionSystemMessageParam(role="system", content=request.system),
            ChatCompletionUserMessageParam(role="user", content=request.user),
        ]
        response_format: ResponseFormat | openai.Omit = (
            ResponseFormatJSONObject(type="json_object") if request.json_mode else openai.omit
        )
        try:
            completion = await self._client.chat.completions.create(
                model=request.model,
                messages=messages,
                max_completion_tokens=request.max_output_tokens,
                response_format=response_format,
            )
        except openai.APIConnectionError as err:  # a timeout is one too
            if isinstance(err, openai.APITimeoutError) and not _refused_or_dropped(err):
                raise ModelTimeout(
                    f"no answer from the language model within {self._timeout_seconds:g} s"
                    f"{_for_model(request.model)}"
                ) from None
            raise ModelUnavailable(
                f"could not connect to the language model server{_for_model(request.model)}"
            ) from None
        except openai.APIStatusError as err:
            raise _status_error(err, request.model) from None
        except (openai.APIResponseValidationError, json.JSONDecodeError, UnicodeDecodeError):
            raise _invalid_response(request.model) from None
        except openai.OpenAIError as err:
            raise ModelError(
                f"the language model client failed ({type(err).__name__})"
                f"{_for_model(request.model)}"
            ) from None
        return _chat_result(completion, request)

    async def aclose(self) -> None:
        """Close the HTTP client and its pooled connections."""
        await self._client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()


def _refused_or_dropped(error: BaseException) -> bool:
    """Whether a timeout the SDK reports is a connection refused or dropped: its aiohttp
    transport reports every `aiohttp.ClientConnectionError` that is not a timeout as httpx's
    `ConnectTimeout` (a refused connection included), where httpcore's says `ConnectError`."""
    import aiohttp  # noqa: PLC0415 - the SDK's transport, loaded with it

    cause = error.__cause__
    while cause is not None:
        if isinstance(cause, aiohttp.ClientConnectionError):
            return not isinstance(cause, aiohttp.ServerTimeoutError | TimeoutError)
        cause = cause.__cause__
    return False


def _http_client(instrument: Callable[[object], None] | None) -> openai.DefaultAioHttpClient:
    """The SDK's own client with its defaults (limits, redirects; closed with the SDK's client)
    on aiohttp's transport rather than httpcore's: the same requests and answers at about
    0.5 ms less CPU per call (bench/model_client_cost.py), where the worker spends its time
    when a slow model keeps many calls in flight. Handed to `instrument` first, when given."""
    import openai  # noqa: PLC0415 - loaded by OpenAIChatModel already

    client = openai.DefaultAioHttpClient()
    if instrument is not None:
        instrument(client)
    return client


# Space settings name models by the platform's identifiers (the seed's default is
# `AZURE_GPT_4o_2024_1120`); the API wants its own model name. Unknown names pass unchanged,
# so a space may also name an API model (or an Azure deployment) directly.
MODEL_ALIASES: Mapping[str, str] = {"AZURE_GPT_4o_2024_1120": "gpt-4o-2024-11-20"}


def resolve_model_name(name: str) -> str:
    """The API model name for a space's or the orchestrator's model identifier."""
    return MODEL_ALIASES.get(name, name)


def create_chat_model(
    settings: Settings, instrument_http_client: Callable[[object], None] | None = None
) -> OpenAIChatModel | None:
    """The configured model, or None for the offline rule-based engine (see module table);
    `instrument_http_client` as `OpenAIChatModel` takes it."""
    if settings.llm_provider == "rules":
        return None
    api_key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
    configured = bool(api_key or settings.openai_base_url or settings.azure_openai_endpoint)
    if not configured:
        if settings.llm_provider == "openai":
            raise ChatModelConfigError(
                "LLM_PROVIDER=openai needs OPENAI_API_KEY, OPENAI_BASE_URL or AZURE_OPENAI_ENDPOINT"
            )
        return None
    return OpenAIChatModel(
        api_key=api_key,
        base_url=settings.openai_base_url,
        timeout_seconds=settings.llm_timeout_seconds,
        azure_endpoint=settings.azure_openai_endpoint,
        azure_api_version=settings.azure_openai_api_version,
        instrument_http_client=instrument_http_client,
    )


# --- mapping SDK results and errors --------------------------------------------------------


def _chat_result(completion: object, request: ChatRequest) -> ChatResult:
    """Read the first choice defensively: non-strict SDK parsing accepts any JSON shape."""
    from openai.types.chat import ChatCompletion, ChatCompletionMessage  # noqa: PLC0415
    from openai.types.chat.chat_completion import Choice  # noqa: PLC0415

    if not isinstance(completion, ChatCompletion):  # a non-JSON content type arrives as str
        raise _invalid_response(request.model)
    billed = _billed(completion, request)
    choices = getattr(completion, "choices", None)
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], Choice):
        raise _invalid_response(request.model, billed)
    message = getattr(choices[0], "message", None)
    if not isinstance(message, ChatCompletionMessage):
        raise _invalid_response(request.model, billed)
    finish_reason = getattr(choices[0], "finish_reason", None)
    if not isinstance(finish_reason, str):
        finish_reason = None
    refusal = getattr(message, "refusal", None)
    if (isinstance(refusal, str) and refusal) or finish_reason == "content_filter":
        refused = ModelRefused(
            f"the language model refused the request (finish_reason {_safe(finish_reason)})"
            f"{_for_model(request.model)}"
        )
        refused.usage = billed
        raise refused
    if finish_reason == "length":
        truncated = ModelOutputTruncated(
            f"the answer was cut off at max_output_tokens={request.max_output_tokens}"
            f"{_for_model(request.model)}"
        )
        truncated.tokens_in = billed.tokens_in
        truncated.tokens_out = billed.tokens_out
        truncated.usage = billed
        raise truncated
    content = getattr(message, "content", None)
    if content is not None and not isinstance(content, str):
        raise _invalid_response(request.model, billed)
    return ChatResult(
        text=content or "",
        model=billed.model,
        tokens_in=billed.tokens_in,
        tokens_out=billed.tokens_out,
        finish_reason=finish_reason,
    )


def _billed(completion: ChatCompletion, request: ChatRequest) -> ChatUsage:
    """The model the server says answered (else the one asked for) and its reported usage."""
    usage = getattr(completion, "usage", None)
    served_model = getattr(completion, "model", None)
    return ChatUsage(
        model=served_model if isinstance(served_model, str) and served_model else request.model,
        tokens_in=_token_count(usage, "prompt_tokens"),
        tokens_out=_token_count(usage, "completion_tokens"),
    )


def _invalid_response(model: str, billed: ChatUsage | None = None) -> ModelInvalidResponse:
    """`billed`: a completion without usable choices still counts when it reported usage."""
    invalid = ModelInvalidResponse(
        f"the language model server sent a body that is not a chat completion{_for_model(model)}"
    )
    if billed is not None and (billed.tokens_in or billed.tokens_out):
        invalid.usage = billed
    return invalid


def _token_count(usage: object, field: str) -> int:
    value = getattr(usage, field, None)
    return value if isinstance(value, int) and value >= 0 else 0


def _status_error(err: openai.APIStatusError, model: str) -> ModelError:
    status = err.status_code
    detail = f"HTTP {status}"
    reason = _safe(err.code) or _safe(err.type)
    if reason:
        detail += f" ({reason})"
    detail += _for_model(model)
    request_id = _safe(err.request_id)
    if request_id:
        detail += f", request id {request_id}"
    if status == 429:
        return ModelRateLimited(
            f"the language model server is rate-limiting: {detail}",
            status_code=status,
            retry_after_seconds=parse_retry_after(err.response.headers, now=time.time()),
        )
    if status >= 500 or status == 409:
        return ModelUnavailable(
            f"the language model server failed: {detail}",
            status_code=status,
            retry_after_seconds=parse_retry_after(err.response.headers, now=time.time()),
        )
    if status == 408:
        return ModelTimeout(f"the language model server timed out: {detail}", status_code=status)
    return ModelBadRequest(
        f"the language model server rejected the request: {detail}", status_code=status
    )


def parse_retry_after(headers: Mapping[str, str], *, now: float) -> float | None:
    """Seconds the server asks us to wait: `retry-after-ms`, else `Retry-After` as seconds or
    an HTTP-date (relative to `now`, never negative). None when absent or unreadable."""
    for name, divisor in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        raw = headers.get(name)
        if raw is None:
            continue
        try:
            seconds = float(raw) / divisor
        except ValueError:
            continue
        if math.isfinite(seconds):
            return max(seconds, 0.0)
    raw_date = headers.get("retry-after")
    if not raw_date:
        return None
    try:
        parsed = email.utils.parsedate_to_datetime(raw_date)
    except (TypeError, ValueError, IndexError):
        return None
    if parsed.tzinfo is None:  # "-0000" zone: UTC per RFC 5322
        parsed = parsed.replace(tzinfo=UTC)
    return max(parsed.timestamp() - now, 0.0)


def _safe(value: object) -> str | None:
    return value if isinstance(value, str) and _SAFE_IDENTIFIER.fullmatch(value) else None


def _for_model(model: str) -> str:
    safe = _safe(model)
    return f" for model {safe}" if safe else ""
