"""The OpenTelemetry SDK's side of tracing (`app.kit.tracing`, whose docstring says when it is
on and what leaves): the exporters, the sampler, the redaction of every span that leaves, the
tracer provider, the door in front of FastAPI's telemetry and asyncpg's statements.

Imported by `Tracing` only when tracing is on: the SDK, its resource detection (psutil) and
asyncpg's instrumentation (packaging, wrapt) cost a process ~4 MB and ~0.1 s of start-up that it
does not need with tracing off.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, MutableMapping, Sequence
from contextvars import ContextVar
from typing import Any, ClassVar, Final

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.instrumentation._semconv import _report_new
from opentelemetry.instrumentation.asyncpg import AsyncPGInstrumentor, _hydrate_span_from_args
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import Event, ReadableSpan, Span, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace import sampling as sdk_sampling
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import Link, SpanKind, Status, StatusCode
from opentelemetry.util.types import Attributes

from app.kit.tracing import (
    ALLOWED_ATTRIBUTES,
    OWN_PREFIX,
    PROPAGATOR,
    SERVICE,
    UNTRACED_PATHS,
    TracingConfigError,
    exporter_names,
)

_PROTOCOL_VARIABLES: Final = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")


def exporters_from_environment(environ: Mapping[str, str]) -> list[SpanExporter]:
    """The span exporters `OTEL_TRACES_EXPORTER` names (`otlp` when unset): OTLP over
    HTTP/protobuf, configured by the `OTEL_EXPORTER_OTLP_*` variables (the SDK's exporter with
    a faster encoder, `app.kit.otlp_wire`), and `console`."""
    from app.kit.otlp_wire import OtlpHttpSpanExporter  # noqa: PLC0415

    exporters: list[SpanExporter] = []
    for name in exporter_names(environ) or ["otlp"]:
        if name == "otlp":
            protocol = next(
                (environ[v].strip() for v in _PROTOCOL_VARIABLES if environ.get(v, "").strip()),
                "http/protobuf",
            )
            if protocol != "http/protobuf":
                raise TracingConfigError(
                    f"OTLP protocol {protocol!r} is not supported: use http/protobuf "
                    "(the collector's port 4318)"
                )
            exporters.append(OtlpHttpSpanExporter(endpoint=_traces_endpoint(environ)))
        elif name == "console":
            exporters.append(ConsoleSpanExporter())
        elif name != "none":
            raise TracingConfigError(
                f"OTEL_TRACES_EXPORTER={name!r} is not supported: use otlp, console or none"
            )
    return exporters


def _traces_endpoint(environ: Mapping[str, str]) -> str | None:
    """The OTLP/HTTP traces URL: the signal's own, else the base endpoint + `/v1/traces`
    (None: the exporter's default, a collector on localhost)."""
    own = environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "").strip()
    if own:
        return own
    base = environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "").strip()
    return f"{base.rstrip('/')}/v1/traces" if base else None


# --- sampling ---------------------------------------------------------------------------------

_SAMPLERS: Final[Mapping[str, Callable[[float], Sampler]]] = {
    "always_on": lambda _: sdk_sampling.ALWAYS_ON,
    "always_off": lambda _: sdk_sampling.ALWAYS_OFF,
    "parentbased_always_on": lambda _: sdk_sampling.DEFAULT_ON,
    "parentbased_always_off": lambda _: sdk_sampling.DEFAULT_OFF,
    "traceidratio": sdk_sampling.TraceIdRatioBased,
    "parentbased_traceidratio": sdk_sampling.ParentBasedTraceIdRatio,
}


def sampler_from(environ: Mapping[str, str]) -> Sampler:
    """`OTEL_TRACES_SAMPLER` (default `parentbased_always_on`) with `OTEL_TRACES_SAMPLER_ARG`
    (the ratio, default 1.0); a name or ratio the SDK would ignore is refused at startup."""
    name = environ.get("OTEL_TRACES_SAMPLER", "").strip().lower() or "parentbased_always_on"
    make = _SAMPLERS.get(name)
    if make is None:
        raise TracingConfigError(
            f"OTEL_TRACES_SAMPLER={name!r} is not supported: use one of {', '.join(_SAMPLERS)}"
        )
    raw = environ.get("OTEL_TRACES_SAMPLER_ARG", "").strip() or "1.0"
    try:
        ratio = float(raw)
    except ValueError:
        ratio = -1.0
    if not 0.0 <= ratio <= 1.0:
        raise TracingConfigError(f"OTEL_TRACES_SAMPLER_ARG={raw!r} is not a ratio in [0, 1]")
    return make(ratio)


class ServiceSampler(Sampler):
    """The configured sampler (`OTEL_TRACES_SAMPLER`), with two rules for a span that would
    start a trace:

    - a client span (a database statement, an outgoing HTTP call) never starts one: statements
      join the request or job they serve, and the worker's idle polls, heartbeats and
      housekeeping leave no traces;
    - a job's span, whose trace links to the turns that queued it, is sampled when any of those
      turns was: a turn sampled at 10 % still leads to its consolidation.
    """

    def __init__(self, configured: Sampler) -> None:
        self.configured = configured

    def should_sample(  # noqa: PLR0913, PLR0917 - the SDK's signature
        self,
        parent_context: Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        trace_state: trace.TraceState | None = None,
    ) -> SamplingResult:
        parent = trace.get_current_span(parent_context).get_span_context()
        if not parent.is_valid:
            if kind is SpanKind.CLIENT:
                return SamplingResult(Decision.DROP)
            if links and any(link.context.trace_flags.sampled for link in links):
                return SamplingResult(Decision.RECORD_AND_SAMPLE, attributes)
        return self.configured.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"ServiceSampler{{{self.configured.get_description()}}}"


# --- redaction --------------------------------------------------------------------------------


def allowed_attribute(key: str) -> bool:
    return key in ALLOWED_ATTRIBUTES or key.startswith(OWN_PREFIX)


def _all_allowed(attributes: Attributes) -> bool:
    keys = attributes.keys() if attributes else ()
    return ALLOWED_ATTRIBUTES.issuperset(keys) or all(allowed_attribute(k) for k in keys)


def _kept(attributes: Attributes) -> dict[str, Any]:
    return {k: v for k, v in (attributes or {}).items() if allowed_attribute(k)}


def redacted(span: ReadableSpan) -> ReadableSpan:
    """`span` as it may leave the process: allowed attributes only, exception events with
    their type only (their message may quote a value), no status description, links without
    attributes. A span with nothing to take away (the common case: a request's server span, a
    statement's span) leaves as it is."""
    if (
        not span.events
        and not span.links
        and span.status.description is None
        and _all_allowed(span.attributes)
    ):
        return span
    events = [
        Event(
            event.name,
            {k: v for k, v in (event.attributes or {}).items() if k == "exception.type"},
            event.timestamp,
        )
        for event in span.events
    ]
    links = [Link(link.context) for link in span.links]
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=_kept(span.attributes),
        events=events,
        links=links,
        kind=span.kind,
        status=Status(span.status.status_code),
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )


class RedactingSpanProcessor(SpanProcessor):
    """Hands `redacted` spans to the exporting processor it wraps."""

    def __init__(self, exporting: SpanProcessor) -> None:
        self.exporting = exporting

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.exporting.on_start(span, parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        self.exporting.on_end(redacted(span))

    def shutdown(self) -> None:
        self.exporting.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.exporting.force_flush(timeout_millis)


# --- the provider -----------------------------------------------------------------------------


def _resource(environ: Mapping[str, str]) -> Resource:
    """`OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME`, the service's name by default."""
    detected = Resource.create()
    name = environ.get("OTEL_SERVICE_NAME", "").strip() or str(
        detected.attributes.get(SERVICE_NAME, "")
    )
    if not name or name.startswith("unknown_service"):
        name = SERVICE
    return detected.merge(Resource({SERVICE_NAME: name}))


def tracer_provider(environ: Mapping[str, str]) -> TracerProvider:
    """The provider `Tracing` holds when tracing is on (no exporter yet: `start`)."""
    return TracerProvider(
        sampler=ServiceSampler(sampler_from(environ)),
        resource=_resource(environ),
        shutdown_on_exit=False,
        id_generator=_DoorIds(),
    )


def start(provider: TracerProvider, exporters: Sequence[SpanExporter], *, batch: bool) -> None:
    """`Tracing.start()`: each exporter behind a redacting processor, and asyncpg's statements."""
    for exporter in exporters:
        exporting = BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter)
        provider.add_span_processor(RedactingSpanProcessor(exporting))
    _SampledStatements().instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]


def stop(provider: TracerProvider) -> None:
    """`Tracing.stop()`: asyncpg as it was, and what is left flushed."""
    _SampledStatements().uninstrument()  # type: ignore[no-untyped-call]
    provider.shutdown()


# --- head sampling at the door ----------------------------------------------------------------
#
# FastAPI's telemetry builds a request's server span, its attributes, the propagated context and
# wrapped send/receive callables even when the sampler then drops the span: about 130 µs of a
# turn-save's CPU, and asyncpg's instrumentation as much again for the statements of a request
# nobody will see. So the sampler is asked first, at the door (`TracedApp`, before any of that
# work, and before FastAPI so much as walks its middleware stack to look for another
# instrumentation), with the request's propagated parent and a trace id drawn here; a request
# it drops is not instrumented at all, and one it keeps gets a server span with that same trace
# id (`_DoorIds`), so the SDK's own sampling of that span decides as the door did.


_DOOR_TRACE_ID: ContextVar[int | None] = ContextVar("door_trace_id", default=None)


class _DoorIds(RandomIdGenerator):
    """Random ids, except the next trace id of a request the door let in: the one it sampled."""

    def generate_trace_id(self) -> int:
        drawn = _DOOR_TRACE_ID.get()
        if drawn is None:
            return super().generate_trace_id()
        _DOOR_TRACE_ID.set(None)
        return drawn


def _traceparent_carrier(scope: MutableMapping[str, Any]) -> dict[str, str]:
    return {
        name.decode("latin-1"): value.decode("latin-1")
        for name, value in scope.get("headers", ())
        if name in (b"traceparent", b"tracestate")
    }


def door(sampler: Sampler) -> Callable[[MutableMapping[str, Any]], bool]:
    """True (not instrumented) for the untraced paths and for a request the sampler drops."""

    def excluded(scope: MutableMapping[str, Any]) -> bool:
        if scope.get("path") in UNTRACED_PATHS:
            return True
        parent = PROPAGATOR.extract(_traceparent_carrier(scope))
        trace_id = _DOOR_IDS.generate_trace_id()
        decision = sampler.should_sample(parent, trace_id, "door", SpanKind.SERVER).decision
        if decision is Decision.DROP:
            return True
        if not trace.get_current_span(parent).get_span_context().is_valid:
            _DOOR_TRACE_ID.set(trace_id)  # the server span starts the trace: with this id
        return False

    return excluded


_DOOR_IDS = RandomIdGenerator()


_STATEMENTS_REMEMBERED: Final = 512


class _SampledStatements(AsyncPGInstrumentor):
    """asyncpg's instrumentation, for the statements of a sampled trace only. `ServiceSampler`
    never lets a statement start a trace, so outside a recording span the instrumentation
    would build a span that is dropped (after matching a regular expression over the whole
    statement and hydrating its attributes): the statement runs without it instead.

    In a sampled trace, a statement's span name and attributes are the instrumentation's own
    (`_hydrate_span_from_args`), worked out once per statement and connection target and then
    remembered: the service's statements are a fixed set, and working them out splits the
    whole SQL text into words for its first one (~25 µs a statement of the turn-save)."""

    _remembered: ClassVar[dict[tuple[Any, ...], tuple[str, dict[str, Any]]]] = {}

    async def _do_execute(self, func: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        if not trace.get_current_span().is_recording():
            return await func(*args, **kwargs)
        if self.capture_parameters or not args or not isinstance(args[0], str) or not args[0]:
            return await super()._do_execute(func, instance, args, kwargs)  # type: ignore[no-untyped-call]
        name, attributes = self._statement(instance, args[0])
        assert self._tracer is not None  # instrumented
        # a statement's span has no children: started without becoming the current span
        # (no context to attach and detach), ended as the instrumentation's would be
        span = self._tracer.start_span(name, kind=SpanKind.CLIENT, attributes=attributes)
        try:
            return await func(*args, **kwargs)
        except BaseException as error:
            span.record_exception(error)
            span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
            if _report_new(self._semconv_opt_in_mode):
                span.set_attribute("error.type", type(error).__qualname__)
            raise
        finally:
            span.end()

    def _statement(self, connection: Any, query: str) -> tuple[str, dict[str, Any]]:
        params = getattr(connection, "_params", None)
        address = getattr(connection, "_addr", None)
        key = (query, getattr(params, "database", None), getattr(params, "user", None), address)
        known = self._remembered.get(key)
        if known is None:
            words = self._leading_comment_remover.sub("", query).split(maxsplit=1)
            name = words[0] if words else ""  # as the instrumentation names it
            attributes = _hydrate_span_from_args(
                connection, query, None, semconv_opt_in_mode=self._semconv_opt_in_mode
            )
            if len(self._remembered) >= _STATEMENTS_REMEMBERED:
                self._remembered.clear()
            known = self._remembered[key] = (name, attributes)
        return known

    async def _do_cursor_execute(self, func: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        if not trace.get_current_span().is_recording():
            return await func(*args, **kwargs)
        return await super()._do_cursor_execute(func, instance, args, kwargs)  # type: ignore[no-untyped-call]

    async def _do_prepared_execute(self, func: Any, instance: Any, args: Any, kwargs: Any) -> Any:
        if not trace.get_current_span().is_recording():
            return await func(*args, **kwargs)
        return await super()._do_prepared_execute(func, instance, args, kwargs)  # type: ignore[no-untyped-call]
