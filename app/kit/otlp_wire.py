"""OTLP/HTTP trace payloads written straight in protobuf's wire format, for the exporter.

The OTLP exporter's own encoder builds a protobuf message object per span, attribute and value
before serialising them: about 55 µs per span here, in the exporting thread, whose CPU a traced
request pays for in throughput (a sampled turn-save has three spans). This encoder writes the
same `ExportTraceServiceRequest` bytes field by field, in field-number order as protobuf itself
does, and remembers what repeats from span to span: the resource and scope headers, and every
attribute's encoded key and value (a statement's SQL, the route, the database's address). Its
output is compared byte for byte with the SDK encoder's in `tests/test_otlp_wire.py`.

Field numbers are those of opentelemetry-proto's `trace/v1/trace.proto`,
`common/v1/common.proto`, `resource/v1/resource.proto` and
`collector/trace/v1/trace_service.proto`.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from typing import Any, Final

from opentelemetry.exporter.otlp.proto.http._common import RequestPayloadTooLargeError
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.metrics import MeterProvider
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.semconv.attributes.http_attributes import HTTP_RESPONSE_STATUS_CODE
from opentelemetry.trace import SpanContext

_logger = logging.getLogger(__name__)

_VARINT: Final = 0
_I64: Final = 1
_LEN: Final = 2
_I32: Final = 5

_HAS_IS_REMOTE: Final = 0x100  # SpanFlags.SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE: Final = 0x200  # SpanFlags.SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK

_CACHE_LIMIT: Final = 4096
"""Encoded attributes remembered; the cache starts over past this many (ids and paths vary)."""


def _varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64  # int64 as protobuf writes it: ten bytes of two's complement
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _tag(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _bytes_field(field: int, payload: bytes) -> bytes:
    """A length-delimited field (string, bytes or message), written even when empty."""
    return _tag(field, _LEN) + _varint(len(payload)) + payload


def _text_field(field: int, value: str | None) -> bytes:
    """A proto3 string: nothing when empty."""
    return _bytes_field(field, value.encode()) if value else b""


def _uint_field(field: int, value: int) -> bytes:
    return _tag(field, _VARINT) + _varint(value) if value else b""


_FIXED64: Final = struct.Struct("<Q")
_FIXED32: Final = struct.Struct("<I")
_DOUBLE: Final = struct.Struct("<d")


def _any_value(value: Any) -> bytes:
    """An `AnyValue` message's body, as the SDK encoder's `_encode_value` builds it (its
    fields are a oneof: written even when they hold the default)."""
    if value is None:
        return b""
    if isinstance(value, bool):
        return _tag(2, _VARINT) + (b"\x01" if value else b"\x00")
    if isinstance(value, str):
        return _bytes_field(1, value.encode())
    if isinstance(value, int):
        return _tag(3, _VARINT) + _varint(value)
    if isinstance(value, float):
        return _tag(4, _I64) + _DOUBLE.pack(value)
    if isinstance(value, bytes):
        return _bytes_field(7, value)
    if isinstance(value, Sequence):
        values = b"".join(_bytes_field(1, _any_value(v)) for v in value)
        return _bytes_field(5, values)
    if isinstance(value, Mapping):
        pairs = b"".join(_bytes_field(1, _key_value(str(k), v)) for k, v in value.items())
        return _bytes_field(6, pairs)
    raise TypeError(f"invalid attribute value type {type(value).__name__}")


def _key_value(key: str, value: Any) -> bytes:
    return _text_field(1, key) + _bytes_field(2, _any_value(value))


class TraceRequestEncoder:
    """Encodes a batch of spans as one `ExportTraceServiceRequest`; one per exporter (its
    caches are not shared between threads: the batch processor exports from one)."""

    def __init__(self) -> None:
        self._attributes: dict[tuple[int, str, type, Any], bytes] = {}
        self._resources: dict[int, tuple[Resource, bytes]] = {}
        self._scopes: dict[tuple[Any, ...], bytes] = {}

    def encode(self, spans: Sequence[ReadableSpan]) -> bytes:
        # grouped as the SDK encoder groups them: by resource, then scope, in order of arrival
        groups: dict[int, tuple[Resource, dict[tuple[Any, ...], list[bytes]]]] = {}
        scopes: dict[tuple[Any, ...], InstrumentationScope | None] = {}
        for span in spans:
            resource = span.resource
            entry = groups.get(id(resource))
            if entry is None:
                entry = groups[id(resource)] = (resource, {})
            scope = span.instrumentation_scope or None
            scope_key = _scope_key(scope)
            scopes.setdefault(scope_key, scope)
            entry[1].setdefault(scope_key, []).append(self._span(span))
        resource_spans = []
        for resource, by_scope in groups.values():
            scope_spans = b"".join(
                _bytes_field(
                    2,
                    self._scope(key, scopes[key])
                    + b"".join(_bytes_field(2, span) for span in encoded)
                    + _text_field(3, key[2]),
                )
                for key, encoded in by_scope.items()
            )
            body = self._resource(resource) + scope_spans + _text_field(3, resource.schema_url)
            resource_spans.append(_bytes_field(1, body))
        return b"".join(resource_spans)

    def _span(self, span: ReadableSpan) -> bytes:
        context = span.get_span_context()
        assert context is not None  # an ended SDK span always has one
        parent = span.parent
        parts = [
            _bytes_field(1, context.trace_id.to_bytes(16, "big")),
            _bytes_field(2, context.span_id.to_bytes(8, "big")),
            _text_field(3, _trace_state(context)),
        ]
        if parent is not None:
            parts.append(_bytes_field(4, parent.span_id.to_bytes(8, "big")))
        parts.append(_text_field(5, span.name))
        parts.append(_uint_field(6, span.kind.value + 1))  # the SDK's kinds start at 0, OTLP's at 1
        if span.start_time:
            parts.append(_tag(7, _I64) + _FIXED64.pack(span.start_time))
        if span.end_time:
            parts.append(_tag(8, _I64) + _FIXED64.pack(span.end_time))
        parts.append(self._attribute_fields(9, span.attributes))
        parts.append(_uint_field(10, span.dropped_attributes))
        for event in span.events:
            event_body = b"".join(
                (
                    _tag(1, _I64) + _FIXED64.pack(event.timestamp) if event.timestamp else b"",
                    _text_field(2, event.name),
                    self._attribute_fields(3, event.attributes),
                    _uint_field(4, event.dropped_attributes),
                )
            )
            parts.append(_bytes_field(11, event_body))
        parts.append(_uint_field(12, span.dropped_events))
        for link in span.links:
            link_body = b"".join(
                (
                    _bytes_field(1, link.context.trace_id.to_bytes(16, "big")),
                    _bytes_field(2, link.context.span_id.to_bytes(8, "big")),
                    self._attribute_fields(4, link.attributes),
                    _uint_field(5, link.dropped_attributes),
                    _tag(6, _I32) + _FIXED32.pack(_flags(link.context)),
                )
            )
            parts.append(_bytes_field(13, link_body))
        parts.append(_uint_field(14, span.dropped_links))
        status = span.status
        parts.append(
            _bytes_field(
                15, _text_field(2, status.description) + _uint_field(3, status.status_code.value)
            )
        )
        parts.append(_tag(16, _I32) + _FIXED32.pack(_flags(parent)))
        return b"".join(parts)

    def _attribute_fields(self, field: int, attributes: Mapping[str, Any] | None) -> bytes:
        if not attributes:
            return b""
        tag = _tag(field, _LEN)
        cache = self._attributes
        parts = []
        for key, value in attributes.items():
            try:
                cache_key = (field, key, type(value), value)  # the field: the tag is kept too
                encoded = cache.get(cache_key)
            except TypeError:  # a sequence value: not hashable, not remembered
                cache_key, encoded = None, None
            if encoded is None:
                pair = _key_value(key, value)
                encoded = tag + _varint(len(pair)) + pair
                if cache_key is not None:
                    if len(cache) >= _CACHE_LIMIT:
                        cache.clear()
                    cache[cache_key] = encoded
            parts.append(encoded)
        return b"".join(parts)

    def _resource(self, resource: Resource) -> bytes:
        known = self._resources.get(id(resource))
        if known is not None and known[0] is resource:
            return known[1]
        encoded = _bytes_field(
            1, b"".join(_bytes_field(1, _key_value(k, v)) for k, v in resource.attributes.items())
        )
        self._resources[id(resource)] = (resource, encoded)
        return encoded

    def _scope(self, key: tuple[Any, ...], scope: InstrumentationScope | None) -> bytes:
        encoded = self._scopes.get(key)
        if encoded is None:
            body = b""
            if scope is not None:
                body = (
                    _text_field(1, scope.name)
                    + _text_field(2, scope.version)
                    + b"".join(
                        _bytes_field(3, _key_value(k, v))
                        for k, v in (scope.attributes or {}).items()
                    )
                )
            encoded = self._scopes[key] = _bytes_field(1, body)
        return encoded


def _scope_key(scope: InstrumentationScope | None) -> tuple[Any, ...]:
    if scope is None:
        return (None, None, None, ())
    attributes = tuple(sorted((scope.attributes or {}).items(), key=lambda kv: kv[0]))
    return (scope.name, scope.version, scope.schema_url, attributes)


def _trace_state(context: SpanContext) -> str | None:
    state = context.trace_state
    return ",".join(f"{k}={v}" for k, v in state.items()) if state else None


def _flags(parent: SpanContext | None) -> int:
    return (
        _HAS_IS_REMOTE | _IS_REMOTE if parent is not None and parent.is_remote else _HAS_IS_REMOTE
    )


CHECKED_AGAINST: Final = {
    "opentelemetry-sdk": "1.45.1",
    "opentelemetry-exporter-otlp-proto-http": "1.45.1",
    "opentelemetry-exporter-otlp-common": "0.66b1",
}
"""The SDK's packages whose `OTLPSpanExporter.export()` (and the HTTP client and metrics it
uses) `OtlpHttpSpanExporter.export` was last read against; `tests/test_otlp_wire.py` fails
when another version is installed, until the two have been compared again."""


class OtlpHttpSpanExporter(OTLPSpanExporter):
    """The SDK's OTLP/HTTP exporter (its endpoint, headers, TLS, compression and timeout as the
    `OTEL_EXPORTER_OTLP_*` variables and its arguments configure them, its retries, its
    shutdown), encoding with `TraceRequestEncoder`.

    `export` is the SDK's `export()` with the encoder swapped, step for step: a batch after
    `shutdown()` is refused; a batch that fails to encode is logged and reported as a failure
    (the exporting thread carries on); a payload over `max_request_size` (64 MiB by default) is
    dropped whole, as the SDK drops it; the rest goes to the SDK's HTTP client, which retries
    429, 502, 503 and 504 (and a lost connection) with exponential backoff or the answer's
    `Retry-After` within the timeout, and stops waiting when the exporter shuts down; each
    batch is counted in the SDK's exporter metrics (`otel.sdk.exporter.span.exported`,
    `otel.sdk.exporter.operation.duration`, with `error.type` on a failure) when
    `OTEL_PYTHON_SDK_INTERNAL_METRICS_ENABLED=true`.

    The SDK offers no public way to change its encoder, so this reaches the attributes its
    constructor builds (`_client`, `_metrics`, `_max_request_size`, `_shutdown`): hence
    `CHECKED_AGAINST`.
    """

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        timeout: float | None = None,
        max_request_size: int | None = None,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        super().__init__(
            endpoint=endpoint,
            timeout=timeout,
            max_request_size=max_request_size,
            meter_provider=meter_provider,
        )
        self._encoder = TraceRequestEncoder()

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            _logger.warning("Exporter already shutdown, ignoring batch")
            return SpanExportResult.FAILURE
        with self._metrics.export_operation(len(spans)) as result:
            try:
                payload = self._encoder.encode(spans)
            except Exception as error:  # a span that cannot be encoded fails its batch only
                _logger.error("Failed to encode span batch: %s", error)
                result.error = error
                return SpanExportResult.FAILURE
            if 0 < self._max_request_size < len(payload):
                _logger.warning(
                    "Dropping span batch: serialized size %d bytes exceeds max_request_size "
                    "%d bytes.",
                    len(payload),
                    self._max_request_size,
                )
                result.error = RequestPayloadTooLargeError(
                    f"Serialized span request size {len(payload)} bytes exceeds "
                    f"max_request_size {self._max_request_size} bytes."
                )
                return SpanExportResult.FAILURE
            sent = self._client.export(payload)
            if not sent.success:
                result.error = sent.error
                result.error_attrs = (
                    {HTTP_RESPONSE_STATUS_CODE: sent.status_code}
                    if sent.status_code is not None
                    else None
                )
                return SpanExportResult.FAILURE
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        """The SDK's: later batches are refused, a retry's wait ends, the connections close."""
        super().shutdown()  # type: ignore[no-untyped-call]
