"""Request ids, JSON logs, Prometheus metrics and the ASGI middleware that ties them together;
log lines and latency exemplars name the trace they belong to when tracing is on."""

from __future__ import annotations

import contextvars
import logging
import os
import re
import sys
import time
import tomllib
import uuid
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, Protocol, TypedDict

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from app.kit.schemas import IDENTIFIER_PATTERN
from app.kit.tracing import trace_ids

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
_REQUEST_ID_PATTERN = re.compile(IDENTIFIER_PATTERN)
RATE_LIMIT_HEADERS_KEY = "context_memory.rate_limit_headers"
"""The ASGI scope key under which a rate-limited route leaves its `RateLimit-Policy` and
`RateLimit` header fields, added to its answer by `RequestContextMiddleware`."""


def current_request_id() -> str | None:
    return _request_id.get()


# the structured fields a log call may pass in `extra`, written when present
_FIELDS = (
    "method",
    "path",
    "route",
    "status",
    "duration_ms",
    "job_id",
    "outcome",
    "variable",
    "suggestion",
)


class JsonFormatter(logging.Formatter):
    """One JSON object per line; carries the request id of the request being served, and the
    trace and span ids of the span in progress when it is sampled."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        request_id = _request_id.get()
        if request_id:
            payload["request_id"] = request_id
        traced = trace_ids()
        if traced is not None:
            payload["trace_id"], payload["span_id"] = traced
        for key in _FIELDS:
            value = record.__dict__.get(key)
            if value is not None:
                payload[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            payload["error"] = record.exc_info[0].__name__
            payload["trace"] = self.formatException(record.exc_info)
        return orjson.dumps(payload).decode()


class TextFormatter(logging.Formatter):
    """Short lines for a person at a terminal: `10:17:27 GET /v1/me 200 3.5 ms`, or the time,
    the level when it is not INFO, and the message."""

    def format(self, record: logging.LogRecord) -> str:
        clock = datetime.fromtimestamp(record.created, UTC).strftime("%H:%M:%S")
        if record.name == access_logger.name and "status" in record.__dict__:
            fields = record.__dict__
            line = (
                f"{clock} {fields.get('method')} {fields.get('path')} {fields.get('status')} "
                f"{fields.get('duration_ms')} ms"
            )
        else:
            level = "" if record.levelno == logging.INFO else f"{record.levelname} "
            line = f"{clock} {level}{record.getMessage()}"
        if record.exc_info and record.exc_info[0] is not None:
            line = f"{line}\n{self.formatException(record.exc_info)}"
        return line


class _DropMessages(logging.Filter):
    """Drops a library's start-up lines that say nothing a reader of the log needs."""

    def __init__(self, *prefixes: str) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefixes)


class _DropLoggedErrors(logging.Filter):
    """Drops the server's traceback of an exception that ended a response on purpose and was
    logged already by whoever raised it (its class says `logged = True`: an export's client cut
    off for reading too slowly, a body cut by a failed read)."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not getattr(error, "logged", False)


# Library chatter at INFO that is not worth a line: Alembic's per-run preamble (its "Running
# upgrade" lines stay) and its plugins' set-up on import (imported when migrations first run,
# after logging is configured), uvicorn's "Waiting for application startup.", the MCP SDK's
# session manager. The embedded PostgreSQL's own chatter goes to a file of its own
# (app.kit.embedded_pg).
_QUIET_MESSAGES: dict[str, tuple[str, ...]] = {
    "alembic.runtime.migration": ("Context impl", "Will assume"),
    "alembic.runtime.plugins": ("setup plugin",),
    "uvicorn.error": ("Waiting for application startup",),
}
_QUIET_LOGGERS = ("mcp.server.streamable_http_manager",)


def configure_logging(level: str, log_format: str = "json") -> None:
    """Logs on stderr: JSON lines, or short text lines (`auto`: text on a terminal)."""
    text = log_format == "text" or (log_format == "auto" and sys.stderr.isatty())
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(TextFormatter() if text else JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access",):
        logging.getLogger(noisy).disabled = True
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True
    for name, prefixes in _QUIET_MESSAGES.items():
        target = logging.getLogger(name)
        target.filters[:] = [f for f in target.filters if not isinstance(f, _DropMessages)]
        target.addFilter(_DropMessages(*prefixes))
    server = logging.getLogger("uvicorn.error")
    server.filters[:] = [f for f in server.filters if not isinstance(f, _DropLoggedErrors)]
    server.addFilter(_DropLoggedErrors())
    for name in _QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))


class PolicyJudgement(Protocol):
    """What the memory policy did about one finding: its category and the action (by name)."""

    @property
    def category(self) -> str: ...

    @property
    def action(self) -> str: ...


DISTRIBUTION = "context-memory-service"
BUILD_COMMIT_VARIABLE = "BUILD_COMMIT"
"""The commit the image was built from: the Dockerfile's build argument of the same name."""


PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _package_version() -> str:
    """The installed package's version; in the image, which runs the source without installing
    it, the version of the pyproject.toml copied beside it; else `unknown`."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    try:
        version = tomllib.loads(PYPROJECT.read_text("utf-8"))["project"]["version"]
    except (OSError, KeyError, tomllib.TOMLDecodeError):
        return "unknown"
    return str(version)


def build_labels(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """(version, commit) of the running build: the package's version, and the commit that
    `BUILD_COMMIT` names (set at image build), each `unknown` when there is none."""
    version = _package_version()
    commit = (os.environ if environ is None else environ).get(BUILD_COMMIT_VARIABLE, "").strip()
    return version, commit or "unknown"


class QueueGauges(TypedDict):
    """The queue figures of the whole database (`app.jobs.repository.QueueStats`)."""

    depth: dict[str, int]
    oldest_age_seconds: float


class Metrics:
    """The service's Prometheus metrics, in a registry of its own (one per app instance)."""

    def __init__(self, environ: Mapping[str, str] | None = None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.build_info = Gauge(
            "build_info",
            "Always 1: the version and commit of the build this process runs",
            ["version", "commit"],
            registry=self.registry,
        )
        self.build_info.labels(*build_labels(environ)).set(1)
        self.worker_heartbeat = Gauge(
            "worker_last_heartbeat_timestamp_seconds",
            "When this process's consolidation worker last reported (Unix time), every "
            "max(5 x WORKER_POLL_SECONDS, 5) seconds; 0 in a process that runs no worker",
            registry=self.registry,
        )
        self.request_latency = Histogram(
            "http_request_duration_seconds",
            "HTTP request latency by route template",
            ["method", "route", "status"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.rate_limited = Counter(
            "rate_limited_requests_total",
            "Requests refused (429) by a rate limit, by the limit that refused them",
            ["policy"],
            registry=self.registry,
        )
        self.jwks_fetches = Counter(
            "auth_jwks_fetches_total",
            "JWKS fetches of the trusted issuers, by issuer and outcome (ok, error)",
            ["issuer", "outcome"],
            registry=self.registry,
        )
        self.roles_dropped = Counter(
            "auth_roles_dropped_total",
            "Roles in tokens that their issuer may not grant (operator from a company issuer), "
            "by issuer and role; the caller does not get them",
            ["issuer", "role"],
            registry=self.registry,
        )
        self.database_unavailable = Counter(
            "database_unavailable_total",
            "Requests answered 503 because the database was unreachable",
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "queue_depth",
            "Jobs waiting in the whole database, by status (every worker exports the same "
            "figure: aggregate with max, not sum)",
            ["status"],
            registry=self.registry,
        )
        self.queue_oldest_age = Gauge(
            "queue_oldest_age_seconds",
            "Age of the oldest queued job in the whole database (every worker exports it)",
            registry=self.registry,
        )
        self.jobs = Counter(
            "jobs_total",
            "Finished job attempts by kind and outcome",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.consolidation_operations = Counter(
            "consolidation_operations_total",
            "Profile operations applied by kind",
            ["op"],
            registry=self.registry,
        )
        self.consolidations = Counter(
            "consolidations_total",
            "Consolidation results (noop or updated)",
            ["result"],
            registry=self.registry,
        )
        self.model_tokens = Counter(
            "model_tokens_total",
            "Language-model tokens by direction",
            ["direction"],
            registry=self.registry,
        )
        self.model_calls = Counter(
            "model_calls_total",
            "Language-model calls by call kind (gate, operations, rewrite, condensation) and "
            "outcome (noop, update, truncated, invalid, error)",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.model_prompt_tokens = Counter(
            "model_prompt_tokens_total",
            "Prompt tokens the model server reported, by call kind",
            ["kind"],
            registry=self.registry,
        )
        self.model_completion_tokens = Counter(
            "model_completion_tokens_total",
            "Completion tokens the model server reported, by call kind",
            ["kind"],
            registry=self.registry,
        )
        self.model_output_limit_tokens = Counter(
            "model_output_limit_tokens_total",
            "Output tokens requested (max_completion_tokens), summed by call kind",
            ["kind"],
            registry=self.registry,
        )
        self.consolidation_prefilter = Counter(
            "consolidation_prefilter_total",
            "Consolidations by the pre-filter's decision: noop (no model call), operations "
            "(the gate skipped), gate",
            ["decision"],
            registry=self.registry,
        )
        self.condensations = Counter(
            "condensations_total", "Condensation runs", registry=self.registry
        )
        self.truncations = Counter(
            "truncations_total", "Hard truncations of a profile", registry=self.registry
        )
        self.rebases = Counter(
            "rebases_total",
            "Consolidations re-run because the profile moved",
            registry=self.registry,
        )
        self.memory_policy_actions = Counter(
            "memory_policy_actions_total",
            "What the company's memory policy did at profile writes, per finding in a new or "
            "changed bullet: by category and action (drop, redact, allow; a user's edit refused "
            "for a dropped category counts as drop)",
            ["category", "action"],
            registry=self.registry,
        )
        self.memory_retention = Counter(
            "memory_retention_total",
            "What the companies' memory retention removed, by kind: topics_dropped (Recent "
            "Topics bullets), versions_written (retention versions), memories_erased (idle "
            "memories)",
            ["kind"],
            registry=self.registry,
        )
        self.model_budget_used_ratio = Gauge(
            "model_budget_used_ratio",
            "Share of the company's monthly model token budget used this month (1 and more: "
            "spent), as the worker last read it; companies with a budget only",
            ["company_id"],
            registry=self.registry,
        )
        self.model_budget_threshold_crossed = Counter(
            "model_budget_threshold_crossed_total",
            "Companies whose monthly model budget use crossed a threshold (0.8, 1.0): once per "
            "company and month across all processes",
            ["threshold"],
            registry=self.registry,
        )
        self.turn_save_batch_turns = Histogram(
            "turn_save_batch_turns",
            "Turns written by each statement of the common turn-save (group commit)",
            registry=self.registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128),
        )
        self.usage_flush_failures = Counter(
            "usage_flush_failures_total",
            "Flushes of the in-memory usage counts (turns saved, contexts served) the database "
            "refused; the counts are kept for the next flush",
            registry=self.registry,
        )

    def observe_worker_report(self, queue: QueueGauges | None) -> None:
        """A worker's periodic report: its heartbeat, and the queue figures it read (None when
        the database did not answer; the gauges keep their last value)."""
        self.worker_heartbeat.set_to_current_time()
        if queue is not None:
            for status, depth in queue["depth"].items():
                self.queue_depth.labels(status).set(depth)
            self.queue_oldest_age.set(queue["oldest_age_seconds"])

    def observe_jwks_fetch(self, issuer: str, outcome: str) -> None:
        self.jwks_fetches.labels(issuer, outcome).inc()

    def observe_memory_policy_actions(self, judgements: Iterable[PolicyJudgement]) -> None:
        for judgement in judgements:
            self.memory_policy_actions.labels(judgement.category, judgement.action).inc()

    def observe_role_dropped(self, issuer: str, role: str) -> None:
        self.roles_dropped.labels(issuer, role).inc()


ErrorRenderer = Callable[[BaseException], Awaitable[Message | None]]
access_logger = logging.getLogger("app.access")
CLIENT_CLOSED_REQUEST = 499
"""The status logged and counted for a request whose client went away before it was answered
(nginx's convention; never sent)."""


class RequestContextMiddleware:
    """Request id in and out, latency by route template, access log, last-resort error page.

    Unexpected exceptions are rendered here (not by Starlette's outermost error middleware) so
    that even a 500 or a 503 carries the request id header and is counted in the metrics.

    A client that disconnects before its answer began (mid-body, say) is counted and logged as
    499, and whatever the app raised for want of the body is not an error of the service: no
    500, no traceback, no answer (nobody would read it).

    With `exemplars` (tracing on), a sampled request's latency carries its trace id as the
    exemplar of its histogram bucket (shown on the OpenMetrics exposition of `/metrics`).
    """

    def __init__(
        self,
        app: ASGIApp,
        metrics: Metrics,
        render_error: Callable[[BaseException], Any],
        *,
        exemplars: bool = False,
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.render_error = render_error
        self.exemplars = exemplars

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        incoming = _header(scope, b"x-request-id")
        request_id = (
            incoming if incoming and _REQUEST_ID_PATTERN.match(incoming) else uuid.uuid4().hex
        )
        token = _request_id.set(request_id)
        started = time.perf_counter()
        status = 500
        response_started = False
        client_gone = False

        async def receive_watched() -> Message:
            nonlocal client_gone
            message = await receive()
            if message["type"] == "http.disconnect" and not response_started:
                client_gone = True
            return message

        async def send_with_id(message: Message) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                response_started = True
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                # a rate-limited route's state (`app.rate_limits.dependency`), on any answer
                headers.extend(scope.get(RATE_LIMIT_HEADERS_KEY, ()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive_watched, send_with_id)
        except Exception as exc:
            if client_gone:
                pass  # the app failed on the body that never came: nobody is left to answer
            elif response_started:
                raise
            else:
                response = await self.render_error(exc)
                await response(scope, receive, send_with_id)
        finally:
            if client_gone:
                status = CLIENT_CLOSED_REQUEST
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            elapsed = time.perf_counter() - started
            traced = trace_ids() if self.exemplars else None
            self.metrics.request_latency.labels(scope["method"], template, str(status)).observe(
                elapsed, None if traced is None else {"trace_id": traced[0]}
            )
            access_logger.info(
                "request",
                extra={
                    "method": scope["method"],
                    "path": scope["path"],
                    "route": template,
                    "status": status,
                    "duration_ms": round(elapsed * 1000, 2),
                },
            )
            _request_id.reset(token)


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key == name:
            try:
                return str(value.decode("latin-1"))
            except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes every byte
                return None
    return None
