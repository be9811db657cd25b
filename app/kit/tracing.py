"""Tracing: the OpenTelemetry SDK as the standard `OTEL_*` variables configure it, off when
they configure nothing; what a span may carry, and the trace context a queued job keeps.

The switch (`tracing_requested`): on when `OTEL_TRACES_EXPORTER` names an exporter other than
`none`, or when an OTLP endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT`,
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`); off otherwise, and whenever `OTEL_SDK_DISABLED=true`.
Off, nothing is instrumented: the app is built with FastAPI's telemetry disabled, asyncpg is
not wrapped, and every span the service would start goes to a no-op tracer.

On, one `Tracing` per app: its tracer provider is built with the app (no thread, no exporter),
and `start()`, in the lifespan of each process (after `serve --workers N` spawned it), adds the
exporter and instruments asyncpg; `stop()` flushes and undoes both.

What leaves the process is redacted (`redacted`): span attributes are kept only under the keys
of `ALLOWED_ATTRIBUTES` (or the service's own `context_memory.` prefix), exception events keep
their type only and statuses lose their description. So no message text, profile line, SQL
parameter, header or token reaches an exporter, whatever an instrumentation adds.

The SDK's side of this (the exporters, the sampler, the redaction, the tracer provider, the
door, asyncpg's statements) is `app.kit.tracing_sdk`, imported when tracing is on: with tracing
off a process never loads the SDK, its resource detection or asyncpg's instrumentation.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Mapping, MutableMapping
from typing import TYPE_CHECKING, Any, Final

from opentelemetry import trace
from opentelemetry.trace import Link, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter

SERVICE: Final = "context-memory"
NO_TRACER: Final[Tracer] = trace.NoOpTracer()
"""What code that may trace holds when tracing is off (and by default)."""

UNTRACED_PATHS: Final = frozenset({"/metrics", "/healthz", "/readyz"})
"""Scraped or probed every few seconds: never a trace of their own."""

ALLOWED_ATTRIBUTES: Final = frozenset(
    {
        # HTTP server (FastAPI) and client (httpx) spans: never headers, never the query
        "http.request.method",
        "http.request.method_original",
        "http.response.status_code",
        "http.route",
        "url.scheme",
        "url.path",
        "server.address",
        "server.port",
        "network.protocol.version",
        "network.peer.address",
        "network.peer.port",
        "http.method",  # the older HTTP conventions the client instrumentation still writes
        "http.status_code",
        "http.scheme",
        "http.flavor",
        "error.type",
        # database statements (asyncpg): SQL text with placeholders, never parameter values
        "db.system",
        "db.system.name",
        "db.name",
        "db.namespace",
        "db.user",
        "db.statement",
        "db.query.text",
        "db.operation.name",
        "net.peer.name",
        "net.peer.port",
        "net.transport",
        # model calls and tools (GenAI semantic conventions), never prompts or answers
        "gen_ai.operation.name",
        "gen_ai.provider.name",
        "gen_ai.request.model",
        "gen_ai.request.max_tokens",
        "gen_ai.output.type",
        "gen_ai.response.model",
        "gen_ai.response.finish_reasons",
        "gen_ai.usage.input_tokens",
        "gen_ai.usage.output_tokens",
        "gen_ai.tool.name",
    }
)
OWN_PREFIX: Final = "context_memory."
"""The service's own attributes: ids, counts, versions and outcomes, never text."""

_EXPORTER_VARIABLES: Final = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")


class TracingConfigError(ValueError):
    """The `OTEL_*` variables ask for something this service cannot do; raised at startup."""


def tracing_requested(environ: Mapping[str, str]) -> bool:
    """Whether the standard variables ask for traces (the switch, see the module docstring)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = exporter_names(environ)
    if exporters:
        return exporters != ["none"]
    return any(environ.get(name, "").strip() for name in _EXPORTER_VARIABLES)


def exporter_names(environ: Mapping[str, str]) -> list[str]:
    raw = environ.get("OTEL_TRACES_EXPORTER", "")
    return [name.strip().lower() for name in raw.split(",") if name.strip()]


# --- the trace context a job keeps ------------------------------------------------------------

PROPAGATOR: Final = TraceContextTextMapPropagator()


def current_traceparent() -> str | None:
    """The W3C `traceparent` of the current span when it is sampled (what a queued job keeps
    to link its run to the turn), else None. With tracing off: one context lookup."""
    context = trace.get_current_span().get_span_context()
    if not context.trace_flags.sampled:
        return None
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier)
    return carrier.get("traceparent")


def links_to(traceparents: Iterable[str]) -> list[Link]:
    """A span link to each valid `traceparent` (others are skipped)."""
    links = []
    for traceparent in traceparents:
        context = trace.get_current_span(
            PROPAGATOR.extract({"traceparent": traceparent})
        ).get_span_context()
        if context.is_valid:
            links.append(Link(context))
    return links


def trace_ids() -> tuple[str, str] | None:
    """(trace id, span id) of the current span, in hex, when there is one that is sampled."""
    context = trace.get_current_span().get_span_context()
    if not context.trace_flags.sampled:
        return None
    return format(context.trace_id, "032x"), format(context.span_id, "016x")


# --- the process's tracing --------------------------------------------------------------------


class Tracing:
    """Off (`provider` None: no-op tracer, nothing instrumented) or on: an SDK tracer provider
    whose spans, redacted, go to the exporters `make_exporters` builds at `start()`."""

    def __init__(
        self,
        provider: TracerProvider | None,
        make_exporters: Callable[[], list[SpanExporter]] = list,
        *,
        batch: bool = True,
    ) -> None:
        self.provider = provider
        self.tracer: Tracer = NO_TRACER if provider is None else provider.get_tracer("app")
        self._make_exporters = make_exporters
        self._batch = batch
        self._started = False

    @classmethod
    def from_environment(cls, environ: Mapping[str, str] | None = None) -> Tracing:
        """As the `OTEL_*` variables say (see `tracing_requested`)."""
        env = os.environ if environ is None else environ
        if not tracing_requested(env):
            return cls(None)
        from app.kit import tracing_sdk  # noqa: PLC0415 - see the module's docstring

        tracing_sdk.exporters_from_environment(env)  # a configuration error fails the app
        return cls(
            tracing_sdk.tracer_provider(env), lambda: tracing_sdk.exporters_from_environment(env)
        )

    @classmethod
    def exporting_to(cls, exporter: SpanExporter) -> Tracing:
        """On, every span (redacted) handed to `exporter` as it ends: for tests."""
        from app.kit import tracing_sdk  # noqa: PLC0415

        return cls(tracing_sdk.tracer_provider({}), lambda: [exporter], batch=False)

    @property
    def enabled(self) -> bool:
        return self.provider is not None

    def door(self) -> Callable[[MutableMapping[str, Any]], bool] | None:
        """When on: whether a request is left untraced (see `TracedApp`)."""
        if self.provider is None:
            return None
        from app.kit import tracing_sdk  # noqa: PLC0415

        return tracing_sdk.door(self.provider.sampler)

    def start(self) -> None:
        """In each process, before it serves: the exporters, and asyncpg's statements."""
        if self.provider is None or self._started:
            return
        from app.kit import tracing_sdk  # noqa: PLC0415

        tracing_sdk.start(self.provider, self._make_exporters(), batch=self._batch)
        self._started = True

    def stop(self) -> None:
        """Flush what is left, and undo `start`."""
        if self.provider is None or not self._started:
            return
        from app.kit import tracing_sdk  # noqa: PLC0415

        tracing_sdk.stop(self.provider)
        self._started = False

    def instrument_http_client(self, client: object) -> None:
        """Trace the requests of an httpx2 client (the language model's), when on."""
        if self.provider is None:
            return
        from opentelemetry.instrumentation.httpx import HTTPX2ClientInstrumentor  # noqa: PLC0415

        HTTPX2ClientInstrumentor.instrument_client(client, tracer_provider=self.provider)  # type: ignore[arg-type]
