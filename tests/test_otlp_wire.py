"""The OTLP wire encoder writes, byte for byte, what the SDK's OTLP encoder writes, whatever the
spans hold; its caches stay bounded; and the exporter built on it is what the service exports
with, posting payloads a collector decodes, with the SDK exporter's guards: a batch that cannot
be encoded or is over the size limit fails alone, a busy collector is retried, shutdown ends a
retry's wait, each batch is counted in the exporter metrics, and the SDK version it was checked
against is pinned."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Sequence
from importlib.metadata import version
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from app.kit import otlp_wire
from app.kit.otlp_wire import CHECKED_AGAINST, OtlpHttpSpanExporter, TraceRequestEncoder
from app.kit.tracing_sdk import exporters_from_environment
from tests.helpers.otlp_receiver import OtlpReceiver


def reference_encoding(spans: Sequence[ReadableSpan]) -> bytes:
    """The SDK encoder's bytes for `spans`: what `TraceRequestEncoder` must equal."""
    encoded: bytes = encode_spans(spans).SerializeToString()
    return encoded


class _Kept(SpanExporter):
    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS


@pytest.fixture
def kept() -> Iterator[tuple[TracerProvider, _Kept]]:
    exporter = _Kept()
    provider = TracerProvider(resource=Resource.create({"service.name": "wire-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


scalars = st.one_of(
    st.text(max_size=40),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.booleans(),
    st.floats(allow_nan=False),
)
attribute_values = st.one_of(
    scalars,
    st.lists(st.text(max_size=8), max_size=3),
    st.lists(st.integers(min_value=-(2**63), max_value=2**63 - 1), max_size=3),
)
attributes = st.dictionaries(st.text(min_size=1, max_size=12), attribute_values, max_size=6)
remote_parents = st.builds(
    lambda trace_id, span_id, remote: SpanContext(
        trace_id,
        span_id,
        is_remote=remote,
        trace_flags=TraceFlags(1),
        trace_state=TraceState([("vendor", "value")]) if remote else None,
    ),
    st.integers(min_value=1, max_value=2**128 - 1),
    st.integers(min_value=1, max_value=2**64 - 1),
    st.booleans(),
)
span_specs = st.lists(
    st.fixed_dictionaries(
        {
            "name": st.text(max_size=20),
            "kind": st.sampled_from(list(SpanKind)),
            "attributes": attributes,
            "events": st.lists(st.tuples(st.text(max_size=10), attributes), max_size=2),
            "links": st.lists(st.tuples(remote_parents, attributes), max_size=2),
            "status": st.sampled_from(
                [Status(StatusCode.UNSET), Status(StatusCode.OK), Status(StatusCode.ERROR, "no")]
            ),
            "parent": st.one_of(st.none(), remote_parents),
            "scope": st.sampled_from([("a", None, None), ("b", "1.0", "https://schema/1")]),
        }
    ),
    min_size=1,
    max_size=6,
)


def _record(provider: TracerProvider, specs: list[dict[str, Any]]) -> None:
    for spec in specs:
        name, version, schema_url = spec["scope"]
        tracer = provider.get_tracer(name, version, schema_url=schema_url)
        parent = spec["parent"]
        context = set_span_in_context(NonRecordingSpan(parent)) if parent is not None else None
        links = [
            Link(link_context, link_attributes) for link_context, link_attributes in spec["links"]
        ]
        with tracer.start_as_current_span(
            spec["name"],
            context=context,
            kind=spec["kind"],
            attributes=spec["attributes"],
            links=links,
        ) as span:
            for event_name, event_attributes in spec["events"]:
                span.add_event(event_name, event_attributes)
            span.set_status(spec["status"])


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(specs=span_specs)
def test_the_bytes_are_the_sdk_encoders_bytes(
    kept: tuple[TracerProvider, _Kept], specs: list[dict[str, Any]]
) -> None:
    provider, exporter = kept
    exporter.spans.clear()
    _record(provider, specs)
    encoder = TraceRequestEncoder()
    expected = reference_encoding(exporter.spans)
    assert encoder.encode(exporter.spans) == expected
    assert encoder.encode(exporter.spans) == expected  # again, from what it remembered


def test_what_it_remembers_stays_bounded(
    kept: tuple[TracerProvider, _Kept], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(otlp_wire, "_CACHE_LIMIT", 50)
    provider, exporter = kept
    tracer = provider.get_tracer("flood")
    encoder = TraceRequestEncoder()
    for n in range(40):  # a path per chat: 400 distinct attribute values
        for m in range(10):
            with tracer.start_as_current_span("POST", attributes={"url.path": f"/chats/{n}-{m}"}):
                pass
        assert encoder.encode(exporter.spans) == reference_encoding(exporter.spans)
        assert len(encoder._attributes) <= 50
        exporter.spans.clear()


def test_a_true_attribute_is_not_the_integer_one(kept: tuple[TracerProvider, _Kept]) -> None:
    """True == 1 in Python, with the same hash: what is remembered is kept apart by type."""
    provider, exporter = kept
    tracer = provider.get_tracer("types")
    for value in (1, True, 1.0, 0, False, 0.0):
        with tracer.start_as_current_span("s", attributes={"k": value}):
            pass
    encoder = TraceRequestEncoder()
    for span in exporter.spans:
        assert encoder.encode([span]) == reference_encoding([span])


def test_the_service_exports_with_it_and_a_collector_decodes_the_spans(
    kept: tuple[TracerProvider, _Kept],
) -> None:
    provider, exporter = kept
    tracer = provider.get_tracer("post")
    with tracer.start_as_current_span("POST /turns", kind=SpanKind.SERVER) as server:
        with tracer.start_as_current_span(
            "INSERT", kind=SpanKind.CLIENT, attributes={"db.system": "postgresql"}
        ):
            pass
        server.set_attribute("http.response.status_code", 202)
    with OtlpReceiver() as receiver:
        environ = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint}
        (otlp,) = exporters_from_environment(environ)
        assert isinstance(otlp, OtlpHttpSpanExporter)
        assert otlp.export(exporter.spans) is SpanExportResult.SUCCESS
        received = receiver.spans()
    assert [(span.name, span.kind) for _, span in received] == [("INSERT", 3), ("POST /turns", 2)]
    client, server_span = (span for _, span in received)
    assert client.parent_span_id == server_span.span_id
    assert {kv.key: kv.value.int_value for kv in server_span.attributes} == {
        "http.response.status_code": 202
    }


# --- the SDK exporter's guards ----------------------------------------------------------------


def test_the_exporter_was_checked_against_the_installed_sdk() -> None:
    installed = {package: version(package) for package in CHECKED_AGAINST}
    assert installed == CHECKED_AGAINST, (
        f"OtlpHttpSpanExporter was checked against {CHECKED_AGAINST}, not {installed}. "
        "OtlpHttpSpanExporter.export (app/kit/otlp_wire.py) repeats the SDK's "
        "OTLPSpanExporter.export() with its own encoder and uses the attributes that "
        "exporter's constructor builds: read the installed "
        "opentelemetry/exporter/otlp/proto/http/trace_exporter/__init__.py (and the HTTP "
        "client and exporter metrics in opentelemetry/exporter/otlp/common/), bring export() "
        "in line with what it now does, then update CHECKED_AGAINST."
    )


def _batch(provider: TracerProvider, exporter: _Kept, requests: int) -> list[ReadableSpan]:
    """`requests` traced requests' spans: a server span and two statement spans each."""
    tracer = provider.get_tracer("batch")
    exporter.spans.clear()
    for n in range(requests):
        with tracer.start_as_current_span(
            "POST /v1/chats/{chat_id}/turns",
            kind=SpanKind.SERVER,
            attributes={"http.route": "/v1/chats/{chat_id}/turns", "url.path": f"/v1/chats/{n}"},
        ):
            for statement in ("SELECT", "INSERT"):
                with tracer.start_as_current_span(
                    statement,
                    kind=SpanKind.CLIENT,
                    attributes={"db.system": "postgresql", "db.statement": f"{statement} 1"},
                ):
                    pass
    return list(exporter.spans)


def _unencodable(span: ReadableSpan) -> ReadableSpan:
    """`span` with an attribute value no OTLP `AnyValue` can hold (the SDK's span would have
    refused it; a span built by hand, as the redaction builds them, is not checked)."""
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes={"context_memory.odd": object()},  # type: ignore[dict-item]
        kind=span.kind,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


def test_a_batch_that_cannot_be_encoded_fails_alone_and_is_logged(
    kept: tuple[TracerProvider, _Kept], caplog: pytest.LogCaptureFixture
) -> None:
    provider, exporter = kept
    spans = _batch(provider, exporter, 3)
    with OtlpReceiver() as receiver:
        otlp = OtlpHttpSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces")
        with caplog.at_level(logging.ERROR, logger="app.kit.otlp_wire"):
            assert otlp.export([*spans, _unencodable(spans[0])]) is SpanExportResult.FAILURE
        assert "Failed to encode span batch" in caplog.text
        assert otlp.export(spans) is SpanExportResult.SUCCESS  # the next batch goes
        otlp.shutdown()
        assert [status for _, status in receiver.posts] == [200]
        assert len(receiver.spans()) == len(spans)


def test_a_batch_over_the_request_size_limit_is_dropped_whole(
    kept: tuple[TracerProvider, _Kept], caplog: pytest.LogCaptureFixture
) -> None:
    provider, exporter = kept
    spans = _batch(provider, exporter, 171)  # 513 spans
    size = len(TraceRequestEncoder().encode(spans))
    with OtlpReceiver() as receiver:
        endpoint = f"{receiver.endpoint}/v1/traces"
        over = OtlpHttpSpanExporter(endpoint=endpoint, max_request_size=size - 1)
        with caplog.at_level(logging.WARNING, logger="app.kit.otlp_wire"):
            assert over.export(spans) is SpanExportResult.FAILURE
        assert f"serialized size {size} bytes exceeds max_request_size {size - 1}" in caplog.text
        assert over.export(spans[:3]) is SpanExportResult.SUCCESS
        at = OtlpHttpSpanExporter(endpoint=endpoint, max_request_size=size)
        assert at.export(spans) is SpanExportResult.SUCCESS
        for otlp in (over, at):
            otlp.shutdown()
        assert len(receiver.posts) == 2
        assert len(receiver.spans()) == 3 + len(spans)


def test_a_busy_collector_is_asked_again_after_a_backoff(
    kept: tuple[TracerProvider, _Kept],
) -> None:
    provider, exporter = kept
    spans = _batch(provider, exporter, 2)
    with OtlpReceiver() as receiver:
        receiver.answer_next(503)
        otlp = OtlpHttpSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces")
        assert otlp.export(spans) is SpanExportResult.SUCCESS
        otlp.shutdown()
        (refused, refused_status), (accepted, accepted_status) = receiver.posts
        assert (refused_status, accepted_status) == (503, 200)
        assert accepted - refused >= 0.75  # the first backoff: 1 s, with 20 % jitter
        assert len(receiver.spans()) == len(spans)


def test_shutdown_ends_a_retrys_wait_and_later_batches_are_refused(
    kept: tuple[TracerProvider, _Kept],
) -> None:
    provider, exporter = kept
    spans = _batch(provider, exporter, 2)
    with OtlpReceiver() as receiver:
        receiver.answer_next(503, times=5, retry_after="20")
        otlp = OtlpHttpSpanExporter(endpoint=f"{receiver.endpoint}/v1/traces", timeout=60)
        results: list[SpanExportResult] = []
        exporting = threading.Thread(target=lambda: results.append(otlp.export(spans)))
        exporting.start()
        receiver.wait_for_posts(1)  # refused: the exporter now waits 20 s to try again
        asked = time.monotonic()
        otlp.shutdown()
        exporting.join(timeout=10)
        assert not exporting.is_alive()
        assert time.monotonic() - asked < 5
        assert results == [SpanExportResult.FAILURE]
        assert otlp.export(spans) is SpanExportResult.FAILURE
        assert [status for _, status in receiver.posts] == [503]


def _exported(reader: InMemoryMetricReader) -> dict[str | None, int]:
    """`otel.sdk.exporter.span.exported`'s count by `error.type` (None: exported)."""
    data = reader.get_metrics_data()
    assert data is not None
    counts: dict[str | None, int] = {}
    for resource_metrics in data.resource_metrics:
        for scope_metrics in resource_metrics.scope_metrics:
            for metric in scope_metrics.metrics:
                if metric.name == "otel.sdk.exporter.span.exported":
                    for point in metric.data.data_points:
                        error = (point.attributes or {}).get("error.type")
                        key = None if error is None else str(error)
                        counts[key] = counts.get(key, 0) + int(point.value)  # type: ignore[union-attr]
    return counts


def test_each_batch_is_counted_in_the_sdks_exporter_metrics(
    kept: tuple[TracerProvider, _Kept], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED", "true")
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    provider, exporter = kept
    spans = _batch(provider, exporter, 4)  # 12 spans
    size = len(TraceRequestEncoder().encode(spans))
    with OtlpReceiver() as receiver:
        otlp = OtlpHttpSpanExporter(
            endpoint=f"{receiver.endpoint}/v1/traces",
            max_request_size=size - 1,
            meter_provider=meters,
        )
        assert otlp.export(spans[:3]) is SpanExportResult.SUCCESS
        assert otlp.export(spans) is SpanExportResult.FAILURE
        assert otlp.export([_unencodable(spans[0])]) is SpanExportResult.FAILURE
        otlp.shutdown()
    assert _exported(reader) == {None: 3, "RequestPayloadTooLargeError": 12, "TypeError": 1}
    meters.shutdown()
