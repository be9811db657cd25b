"""One trace per chat turn: the orchestrator's `traceparent` through `/context`, `/turns` and
their statements, and, through a span link, the consolidation the turn queued with its model
calls and their tokens; exported in process and over OTLP/HTTP, with nothing of the user's in
any attribute. Built without `OTEL_*`, the app instruments nothing."""

from __future__ import annotations

import json
import logging
import secrets
import types
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from opentelemetry.instrumentation.asyncpg import _hydrate_span_from_args
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span as ProtoSpan
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from app.consolidation.kinds import KINDS
from app.consolidation.runner import worker_config
from app.jobs.worker import Worker
from app.kit.observability import JsonFormatter
from app.kit.tracing import Tracing
from app.kit.tracing_sdk import redacted
from app.main import create_app
from tests.helpers.apps import USER, AuthFactory, TokenFactory, client_of, make_settings
from tests.helpers.db import admin_connect, database_of, rows
from tests.helpers.jobs import job_row
from tests.helpers.llm_stub import StubLLMServer, reply
from tests.helpers.memory import put_memory
from tests.helpers.otlp_receiver import OtlpReceiver
from tests.helpers.settings import enable_company
from tests.helpers.worker import make_handler, wait_for

TRACE_ID = secrets.token_hex(16)
PARENT_ID = secrets.token_hex(8)
TRACEPARENT = f"00-{TRACE_ID}-{PARENT_ID}-01"

# what must never reach a span: the user's words, the model's, the profile's, the token's
MESSAGE_CANARY = "canary-message-7f3e9b"
ANSWER_CANARY = "canary-answer-2c81d4"
PROFILE_CANARY = "canary-profile-9a0b6e"
MODEL_CANARY = "canary-model-5d2f17"
PROFILE = f"""# User Memory

## Identity
- Works as a data engineer at {PROFILE_CANARY}.

## Communication Preferences
- Prefers concise answers.

## Work Context
- Migrating billing to Kafka.

## Skills & Expertise
- Knows Python.

## Recent Topics

## Open Questions / Follow-ups
"""
USER_TEXT = f"I work as a credit risk analyst at Helvetia Bank, codename {MESSAGE_CANARY}."
OPERATIONS_ANSWER = json.dumps(
    {
        "decision": "UPDATE",
        "operations": [
            {"op": "ADD", "section": "Work Context", "text": f"Credit risk at {MODEL_CANARY}."}
        ],
    }
)


@dataclass(frozen=True)
class SeenSpan:
    """A span as the exporter handed it on: ids in hex, attributes as plain values."""

    trace_id: str
    span_id: str
    parent_id: str | None
    name: str
    attributes: dict[str, Any]
    links: tuple[tuple[str, str], ...]
    texts: tuple[str, ...]
    """Every other string the span carries: event names and attributes, status."""


def seen_in_process(span: ReadableSpan) -> SeenSpan:
    context = span.context
    assert context is not None
    texts = [span.status.description or ""]
    for event in span.events:
        texts += [event.name, *(str(v) for v in (event.attributes or {}).values())]
    return SeenSpan(
        format(context.trace_id, "032x"),
        format(context.span_id, "016x"),
        None if span.parent is None else format(span.parent.span_id, "016x"),
        span.name,
        dict(span.attributes or {}),
        tuple(
            (format(link.context.trace_id, "032x"), format(link.context.span_id, "016x"))
            for link in span.links
        ),
        tuple(texts),
    )


def _plain(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_plain(item) for item in value.array_value.values)
    return getattr(value, kind) if kind else None


def seen_over_otlp(span: ProtoSpan) -> SeenSpan:
    texts = [span.status.message]
    for event in span.events:
        texts += [event.name, *(str(_plain(a.value)) for a in event.attributes)]
    return SeenSpan(
        span.trace_id.hex(),
        span.span_id.hex(),
        span.parent_span_id.hex() or None,
        span.name,
        {a.key: _plain(a.value) for a in span.attributes},
        tuple((link.trace_id.hex(), link.span_id.hex()) for link in span.links),
        tuple(texts),
    )


@pytest.fixture
async def traced_app(
    database_url: str, llm_stub: StubLLMServer, request: pytest.FixtureRequest
) -> AsyncIterator[FastAPI]:
    """The app with its in-process worker on the model stub, traced as the test says."""
    tracing: Tracing = request.param()
    settings = make_settings(
        database_url,
        llm_provider="openai",
        openai_base_url=llm_stub.base_url,
        consolidation_prefilter=False,  # the gate is asked, then the operations call
        worker_enabled=True,
        worker_poll_seconds=0.05,
    )
    application = create_app(settings, tracing)
    async with LifespanManager(application):
        yield application


async def one_consolidated_turn(
    app: FastAPI, auth: AuthFactory, make_token: TokenFactory, llm_stub: StubLLMServer
) -> str:
    """Memory on with a profile, then one chat turn as the orchestrator makes it (with its
    `traceparent`), consolidated by the worker through the model stub; the bearer token."""
    llm_stub.script(
        reply("UPDATE", tokens_in=211, tokens_out=3),
        reply(OPERATIONS_ANSWER, tokens_in=377, tokens_out=41),
    )
    token = make_token(USER)
    headers = {"Authorization": f"Bearer {token}", "traceparent": TRACEPARENT}
    messages = [{"role": "user", "content": USER_TEXT}]
    async with client_of(app) as client:
        await enable_company(client, auth)
        await put_memory(client, auth, PROFILE)
        context = await client.post(
            "/v1/chats/chat-1/context",
            json={"space_id": "space-1", "messages": messages},
            headers=headers,
        )
        assert context.status_code == 200, context.text
        saved = await client.post(
            "/v1/chats/chat-1/turns",
            json={
                "space_id": "space-1",
                "messages": messages,
                "response": {"content": f"Noted, {ANSWER_CANARY}."},
                "language_model": "gpt-4o-mini",
            },
            headers=headers,
        )
        assert saved.status_code == 202, saved.text
        # a query string is the user's too: a cursor they pasted, say
        listed = await client.get(
            "/v1/chats/chat-1/messages", params={"cursor": MESSAGE_CANARY}, headers=headers
        )
        assert listed.status_code == 422, listed.text
    job_id = saved.json()["consolidation"]["job_id"]

    async def consolidated() -> bool:
        return bool((await job_row(app, job_id)).status == "succeeded")

    await wait_for(consolidated)
    assert (await job_row(app, job_id)).version == 2
    return token


def assert_one_trace_per_turn(spans: Sequence[SeenSpan], canaries: Sequence[str]) -> None:
    """The turn's trace, and the consolidation's through its link, as an operator follows it."""
    turn = [span for span in spans if span.trace_id == TRACE_ID]
    by_name = {span.name: span for span in turn}
    context = by_name["POST /v1/chats/{chat_id}/context"]
    saved = by_name["POST /v1/chats/{chat_id}/turns"]
    assert context.parent_id == saved.parent_id == PARENT_ID  # the orchestrator's span
    assert saved.attributes["http.response.status_code"] == 202
    statements = [span for span in turn if span.attributes.get("db.system") == "postgresql"]
    assert {span.parent_id for span in statements} >= {context.span_id, saved.span_id}
    assert all("$1" in str(s.attributes.get("db.statement", "$1")) for s in statements)

    (run,) = [span for span in spans if span.name == "job consolidation"]
    assert (TRACE_ID, saved.span_id) in run.links  # the turn that queued it
    assert run.trace_id != TRACE_ID  # one run may serve several turns: a trace of its own
    assert run.attributes["context_memory.job.outcome"] == "updated"
    job = {span.name: span for span in spans if span.trace_id == run.trace_id}
    assert job["claim"].parent_id == run.span_id
    assert job["write version"].attributes["context_memory.profile.version"] == 2
    assert {"memory policy", "model budget", "read snapshot", "decide"} <= set(job)
    calls = {
        span.attributes["context_memory.model_call.kind"]: span.attributes
        for span in spans
        if span.trace_id == run.trace_id and span.name.startswith("chat ")
    }
    assert calls["gate"]["gen_ai.usage.input_tokens"] == 211
    assert calls["gate"]["gen_ai.usage.output_tokens"] == 3
    assert calls["operations"]["gen_ai.usage.input_tokens"] == 377
    assert calls["operations"]["gen_ai.usage.output_tokens"] == 41
    assert calls["operations"]["gen_ai.request.model"] == "gpt-4o-mini"
    assert calls["operations"]["gen_ai.operation.name"] == "chat"
    chat_ids = {
        s.span_id for s in spans if s.trace_id == run.trace_id and s.name.startswith("chat ")
    }
    http_calls = [s for s in spans if s.trace_id == run.trace_id and s.name == "POST"]
    assert {s.parent_id for s in http_calls} == chat_ids  # the model server's requests
    assert {s.attributes["http.status_code"] for s in http_calls} == {200}
    assert [s for s in spans if s.trace_id == run.trace_id and "db.system" in s.attributes]

    for span in spans:
        carried = [span.name, *span.texts, *(str(v) for v in span.attributes.values())]
        for canary in canaries:
            assert not any(canary in text for text in carried), (canary, span.name)


def _canaries(token: str, app: FastAPI) -> list[str]:
    secret = app.state.settings.jwt_secret.get_secret_value()
    return [MESSAGE_CANARY, ANSWER_CANARY, PROFILE_CANARY, MODEL_CANARY, token, secret]


def in_process() -> Tracing:
    return Tracing.exporting_to(EXPORTER)


EXPORTER = InMemorySpanExporter()


@pytest.mark.parametrize("traced_app", [in_process], indirect=True)
async def test_one_turn_is_one_trace_linked_to_its_consolidation_and_its_model_calls(
    traced_app: FastAPI,
    auth: AuthFactory,
    make_token: TokenFactory,
    llm_stub: StubLLMServer,
) -> None:
    EXPORTER.clear()
    token = await one_consolidated_turn(traced_app, auth, make_token, llm_stub)

    spans = [seen_in_process(span) for span in EXPORTER.get_finished_spans()]
    assert_one_trace_per_turn(spans, _canaries(token, traced_app))
    # the model server was asked within the run's trace
    run_trace = next(s.trace_id for s in spans if s.name == "job consolidation")
    assert all(r.headers["traceparent"].split("-")[1] == run_trace for r in llm_stub.requests)


RECEIVER = OtlpReceiver()


def over_otlp() -> Tracing:
    return Tracing.from_environment(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": RECEIVER.endpoint,
            "OTEL_SERVICE_NAME": "context-memory-under-test",
            "OTEL_TRACES_SAMPLER": "parentbased_always_on",
        }
    )


@pytest.fixture
def receiver() -> Callable[[], None]:
    RECEIVER.requests.clear()
    return RECEIVER.requests.clear


@pytest.fixture(scope="module", autouse=True)
def _receiving() -> Any:
    with RECEIVER:
        yield


@pytest.mark.parametrize("traced_app", [over_otlp], indirect=True)
async def test_the_same_trace_reaches_a_collector_over_otlp_http(
    traced_app: FastAPI,
    auth: AuthFactory,
    make_token: TokenFactory,
    llm_stub: StubLLMServer,
    receiver: Callable[[], None],
) -> None:
    token = await one_consolidated_turn(traced_app, auth, make_token, llm_stub)
    traced_app.state.tracing.provider.force_flush()

    received = RECEIVER.spans()
    assert {resource["service.name"] for resource, _ in received} == {"context-memory-under-test"}
    assert set(RECEIVER.paths) == {"/v1/traces"}
    assert set(RECEIVER.content_types) == {"application/x-protobuf"}
    spans = [seen_over_otlp(span) for _, span in received]
    assert_one_trace_per_turn(spans, _canaries(token, traced_app))


def _wrapped(function: object) -> bool:
    """An instrumentation's wrapper stands in for the driver's plain function."""
    return type(function) is not types.FunctionType


async def test_without_otel_variables_nothing_wraps_the_app_or_the_driver(
    database_url: str, auth: AuthFactory
) -> None:
    app = create_app(make_settings(database_url), Tracing.from_environment({}))
    async with LifespanManager(app), client_of(app) as client:
        await enable_company(client, auth)
        response = await client.post(
            "/v1/chats/chat-1/context",
            json={"space_id": "space-1", "messages": [{"role": "user", "content": "Hi"}]},
            headers={**auth(), "traceparent": TRACEPARENT},
        )
        assert response.status_code == 200
        assert not app.state.tracing.enabled
        # FastAPI's own telemetry is off: no tracer provider, no span, no metrics, no logs
        assert app._native_telemetry.enabled() is False
        layers = []
        layer: Any = app.middleware_stack
        while layer is not None:
            layers.append(type(layer).__module__)
            layer = getattr(layer, "app", None)
        assert not [module for module in layers if module.startswith("opentelemetry")]
        assert not _wrapped(asyncpg.connection.Connection.fetchrow)
        assert not _wrapped(asyncpg.connection.Connection.execute)
        assert not _wrapped(asyncpg.prepared_stmt.PreparedStatement.fetch)
    # and no trace id in the problem answers
    async with LifespanManager(app), client_of(app) as client:
        refused = await client.get("/v1/me", headers={"traceparent": TRACEPARENT})
        assert refused.status_code == 401
        assert "trace_id" not in refused.json()


@pytest.mark.parametrize("traced_app", [in_process], indirect=True)
async def test_a_traced_problem_and_its_latency_name_the_trace(traced_app: FastAPI) -> None:
    async with client_of(traced_app) as client:
        refused = await client.get("/v1/me", headers={"traceparent": TRACEPARENT})
        scraped = await client.get(
            "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        plain = await client.get("/metrics")
    assert refused.status_code == 401
    assert refused.json()["trace_id"] == TRACE_ID
    assert refused.json()["request_id"] == refused.headers["x-request-id"]
    assert _wrapped(asyncpg.connection.Connection.fetchrow)  # while the app runs
    # the exemplar of the request's latency bucket, on the OpenMetrics exposition only
    assert scraped.headers["content-type"].startswith("application/openmetrics-text")
    exemplars = [
        line
        for line in scraped.text.splitlines()
        if line.startswith("http_request_duration_seconds_bucket") and 'route="/v1/me"' in line
    ]
    assert any(f'# {{trace_id="{TRACE_ID}"}}' in line for line in exemplars), exemplars
    assert plain.headers["content-type"].startswith("text/plain")
    assert TRACE_ID not in plain.text


async def test_the_driver_is_unwrapped_once_a_traced_app_stopped(database_url: str) -> None:
    app = create_app(make_settings(database_url), Tracing.exporting_to(InMemorySpanExporter()))
    async with LifespanManager(app):
        assert _wrapped(asyncpg.connection.Connection.fetchrow)
    assert not _wrapped(asyncpg.connection.Connection.fetchrow)


async def test_a_statement_span_is_the_instrumentations_own_name_and_attributes(
    server_url: str,
) -> None:
    """The statements of a sampled trace get the span name and attributes asyncpg's
    instrumentation gives them (worked out once per statement, then remembered), and a
    failing statement's span says it failed."""
    exporter = InMemorySpanExporter()
    tracing = Tracing.exporting_to(exporter)
    tracing.start()
    statements = ["SELECT 1", "/* why */ WITH x AS (SELECT 2 AS n) SELECT n FROM x", "  select 3"]
    try:
        conn = await admin_connect(server_url)
        try:
            with tracing.tracer.start_as_current_span("request"):
                for _ in range(2):  # the second time from what was remembered
                    for statement in statements:
                        await conn.fetchval(statement)
                with pytest.raises(asyncpg.DivisionByZeroError):
                    await conn.fetchval("SELECT 1 / 0")
            expected = {
                statement: _hydrate_span_from_args(conn, statement, None)
                for statement in statements
            }
        finally:
            await conn.close()
    finally:
        tracing.stop()
    spans = [span for span in exporter.get_finished_spans() if span.name != "request"]
    assert [span.name for span in spans] == ["SELECT", "WITH", "select"] * 2 + ["SELECT"]
    for span, statement in zip(spans, statements * 2, strict=False):
        assert dict(span.attributes or {}) == expected[statement]
        assert span.status.status_code is StatusCode.UNSET
    assert spans[-1].status.status_code is StatusCode.ERROR


def test_openapi_problem_field_trace_id_is_optional() -> None:
    spec = create_app(make_settings("postgresql+asyncpg://unused/unused")).openapi()
    problem = spec["components"]["schemas"]["Problem"]
    assert "trace_id" in problem["properties"]
    assert "trace_id" not in problem["required"]


def test_a_span_leaves_the_process_with_its_allowed_attributes_only() -> None:
    """What instrumentations may add when configured to (parameters, headers, prompts) and
    what an exception says are dropped; ids, SQL text and token counts stay."""
    exporter = InMemorySpanExporter()
    tracing = Tracing.exporting_to(exporter)
    tracing.start()
    try:
        with tracing.tracer.start_as_current_span(
            "SELECT",
            attributes={
                "db.statement": "SELECT 1 WHERE $1",
                "db.statement.parameters": f"('{MESSAGE_CANARY}',)",
                "http.request.header.authorization": "Bearer secret-token",
                "url.query": f"q={MESSAGE_CANARY}",
                "gen_ai.input.messages": PROFILE_CANARY,
                "gen_ai.usage.input_tokens": 12,
                "context_memory.job.count": 2,
            },
        ) as span:
            span.record_exception(ValueError(f"bad value {MESSAGE_CANARY}"))
            span.set_status(StatusCode.ERROR, f"failed on {MESSAGE_CANARY}")
    finally:
        tracing.stop()
    (exported,) = exporter.get_finished_spans()
    assert dict(exported.attributes or {}) == {
        "db.statement": "SELECT 1 WHERE $1",
        "gen_ai.usage.input_tokens": 12,
        "context_memory.job.count": 2,
    }
    (event,) = exported.events
    assert dict(event.attributes or {}) == {"exception.type": "ValueError"}
    assert exported.status.status_code is StatusCode.ERROR
    assert exported.status.description is None


def _leaks_alone(channel: str) -> Callable[[Any], None]:
    """One way a span may carry a canary, the only one on an otherwise clean span."""

    def leak(span: Any) -> None:
        if channel == "attribute":
            span.set_attribute("gen_ai.input.messages", MESSAGE_CANARY)
        elif channel == "event":
            span.record_exception(ValueError(MESSAGE_CANARY))
        elif channel == "status":
            span.set_status(StatusCode.ERROR, MESSAGE_CANARY)
        elif channel == "link":
            span.add_link(span.get_span_context(), {"note": MESSAGE_CANARY})

    return leak


@pytest.mark.parametrize("channel", ["attribute", "event", "status", "link"])
def test_each_way_a_span_may_carry_text_is_redacted_on_its_own(channel: str) -> None:
    """The redaction leaves a clean span as it is (no copy): one dirty channel alone must
    still get it copied and cleaned."""
    exporter = InMemorySpanExporter()
    tracing = Tracing.exporting_to(exporter)
    tracing.start()
    try:
        with tracing.tracer.start_as_current_span(
            "SELECT", attributes={"db.statement": "SELECT 1", "context_memory.jobs": 1}
        ) as span:
            _leaks_alone(channel)(span)
    finally:
        tracing.stop()
    (exported,) = exporter.get_finished_spans()
    assert MESSAGE_CANARY not in repr(
        (
            dict(exported.attributes or {}),
            [dict(e.attributes or {}) for e in exported.events],
            [dict(link.attributes or {}) for link in exported.links],
            exported.status.description,
        )
    )
    assert dict(exported.attributes or {}) == {"db.statement": "SELECT 1", "context_memory.jobs": 1}


def test_a_clean_span_leaves_as_it_ended() -> None:
    clean = ReadableSpan(
        "SELECT", attributes={"db.statement": "SELECT 1", "db.system": "postgresql"}
    )
    assert redacted(clean) is clean  # nothing to take away: not copied
    dirty = ReadableSpan("SELECT", attributes={"db.statement": "SELECT 1", "user.note": "x"})
    assert dict(redacted(dirty).attributes or {}) == {"db.statement": "SELECT 1"}


async def test_a_coalesced_turn_adds_its_trace_and_the_run_links_to_both_turns(
    database_url: str, auth: AuthFactory
) -> None:
    """Past the quota of waiting jobs the second turn joins the first one's job: the job keeps
    both turns' trace contexts, and its one run links to both traces."""
    exporter = InMemorySpanExporter()
    tracing = Tracing.exporting_to(exporter)
    app = create_app(make_settings(database_url, quota_user_queued_jobs=1), tracing)
    traces = [secrets.token_hex(16), secrets.token_hex(16)]
    async with LifespanManager(app), client_of(app) as client:
        await enable_company(client, auth)
        job_ids = set()
        for n, trace_id in enumerate(traces):
            saved = await client.post(
                "/v1/chats/chat-1/turns",
                json={
                    "space_id": "space-1",
                    "messages": [{"role": "user", "content": f"I live in Berlin, turn {n}."}],
                    "response": {"content": "Noted."},
                },
                headers={**auth(), "traceparent": f"00-{trace_id}-{PARENT_ID}-01"},
            )
            assert saved.status_code == 202, saved.text
            job_ids.add(saved.json()["consolidation"]["job_id"])
        (job_id,) = job_ids  # one job for both turns
        (stored,) = await rows(
            app, "SELECT trace_context FROM jobs WHERE id = :id", id=uuid.UUID(job_id)
        )
        assert [parent.split("-")[1] for parent in stored.trace_context] == traces

        handler, metrics, settings = make_handler(app)
        worker = Worker(
            database_of(app).engine,
            dict.fromkeys(KINDS, handler),
            worker_config(settings),
            metrics,
            tracer=tracing.tracer,
        )
        assert await worker.run_once() is not None

    (run,) = [span for span in exporter.get_finished_spans() if span.name == "job consolidation"]
    assert [format(link.context.trace_id, "032x") for link in run.links] == traces
    saved_spans = {
        format(span.context.trace_id, "032x"): format(span.context.span_id, "016x")
        for span in exporter.get_finished_spans()
        if span.name == "POST /v1/chats/{chat_id}/turns" and span.context is not None
    }
    assert [format(link.context.span_id, "016x") for link in run.links] == [
        saved_spans[trace_id] for trace_id in traces
    ]


async def test_an_untraced_turn_leaves_the_job_without_trace_context(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    saved = await client.post(
        "/v1/chats/chat-1/turns",
        json={
            "space_id": "space-1",
            "messages": [{"role": "user", "content": "I live in Berlin."}],
            "response": {"content": "Noted."},
        },
        headers={**auth(), "traceparent": TRACEPARENT},
    )
    assert saved.status_code == 202
    job_id = uuid.UUID(saved.json()["consolidation"]["job_id"])
    (stored,) = await rows(app, "SELECT trace_context FROM jobs WHERE id = :id", id=job_id)
    assert stored.trace_context is None


def test_a_log_line_names_the_span_in_progress_when_sampled() -> None:
    tracing = Tracing.exporting_to(InMemorySpanExporter())
    record = logging.LogRecord("app.worker", logging.INFO, __file__, 1, "job finished", (), None)
    formatter = JsonFormatter()
    assert "trace_id" not in json.loads(formatter.format(record))
    with tracing.tracer.start_as_current_span("job consolidation") as span:
        line = json.loads(formatter.format(record))
    context = span.get_span_context()
    assert line["trace_id"] == format(context.trace_id, "032x")
    assert line["span_id"] == format(context.span_id, "016x")


# a fixed span id (W3C's example), not PARENT_ID: the ids of the tests below must be the same
# in every process that collects them (pytest-xdist's workers compare their collections)
HOSTILE_PARENT_ID = "00f067aa0ba902b7"
HOSTILE_TRACEPARENTS = [
    "",
    "garbage",
    "00-" + "0" * 32 + "-" + HOSTILE_PARENT_ID + "-01",  # an all-zero trace id is invalid
    "00-" + "f" * 32 + "-" + "0" * 16 + "-01",  # so is an all-zero span id
    "ff-" + "a" * 32 + "-" + HOSTILE_PARENT_ID + "-01",  # version ff is forbidden
    "00-" + "A" * 32 + "-" + HOSTILE_PARENT_ID + "-01",  # upper-case hex is not W3C's
    "00-" + "a" * 32 + "-" + HOSTILE_PARENT_ID + "-01'; DROP TABLE jobs; --",
    "00-" + "a" * 4096 + "-" + HOSTILE_PARENT_ID + "-01",
    "00-" + "a" * 32 + "-" + HOSTILE_PARENT_ID + "-01\u00e9",
]


@pytest.mark.parametrize("hostile", HOSTILE_TRACEPARENTS)
async def test_a_hostile_traceparent_is_a_fresh_trace_and_never_reaches_the_job(
    database_url: str, auth: AuthFactory, hostile: str
) -> None:
    """A malformed `traceparent` (as any client may send) is ignored: the turn is saved, its
    trace is a new one, and what the job keeps is the service's own well-formed traceparent,
    never the header's text."""
    exporter = InMemorySpanExporter()
    app = create_app(make_settings(database_url), Tracing.exporting_to(exporter))
    async with LifespanManager(app), client_of(app) as client:
        await enable_company(client, auth)
        saved = await client.post(
            "/v1/chats/chat-1/turns",
            json={
                "space_id": "space-1",
                "messages": [{"role": "user", "content": "I live in Berlin."}],
                "response": {"content": "Noted."},
            },
            headers={name.encode(): value.encode() for name, value in auth().items()}
            | {b"traceparent": hostile.encode()},
        )
        assert saved.status_code == 202, saved.text
        job_id = uuid.UUID(saved.json()["consolidation"]["job_id"])
        (stored,) = await rows(app, "SELECT trace_context FROM jobs WHERE id = :id", id=job_id)
    (kept,) = stored.trace_context
    version, trace_id, span_id, flags = kept.split("-")
    assert (version, len(trace_id), len(span_id)) == ("00", 32, 16)
    assert int(flags, 16) & 1  # sampled
    assert trace_id != "0" * 32
    assert trace_id not in hostile
    spans = exporter.get_finished_spans()
    (server,) = [s for s in spans if s.name.startswith("POST /v1/chats/")]
    assert server.parent is None  # not a child of anything the header named
    assert format(server.context.trace_id, "032x") == trace_id
