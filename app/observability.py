"""Request ids, JSON logs, Prometheus metrics and the ASGI middleware that ties them together."""

from __future__ import annotations

import contextvars
import logging
import re
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import Any

import orjson
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

_request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id", default=None)
_REQUEST_ID_PATTERN = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


def current_request_id() -> str | None:
    return _request_id.get()


class JsonFormatter(logging.Formatter):
    """One JSON object per line; carries the request id of the request being served."""

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
        for key in ("method", "path", "route", "status", "duration_ms", "job_id", "outcome"):
            value = record.__dict__.get(key)
            if value is not None:
                payload[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            payload["error"] = record.exc_info[0].__name__
            payload["trace"] = self.formatException(record.exc_info)
        return orjson.dumps(payload).decode()


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("uvicorn.access",):
        logging.getLogger(noisy).disabled = True
    for name in ("uvicorn", "uvicorn.error"):
        logging.getLogger(name).handlers[:] = []
        logging.getLogger(name).propagate = True


class Metrics:
    """The service's Prometheus metrics, in a registry of its own (one per app instance)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.request_latency = Histogram(
            "http_request_duration_seconds",
            "HTTP request latency by route template",
            ["method", "route", "status"],
            registry=self.registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.database_unavailable = Counter(
            "database_unavailable_total",
            "Requests answered 503 because the database was unreachable",
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "queue_depth", "Jobs waiting, by status", ["status"], registry=self.registry
        )
        self.queue_oldest_age = Gauge(
            "queue_oldest_age_seconds", "Age of the oldest queued job", registry=self.registry
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


ErrorRenderer = Callable[[BaseException], Awaitable[Message | None]]
access_logger = logging.getLogger("app.access")


class RequestContextMiddleware:
    """Request id in and out, latency by route template, access log, last-resort error page.

    Unexpected exceptions are rendered here (not by Starlette's outermost error middleware) so
    that even a 500 or a 503 carries the request id header and is counted in the metrics.
    """

    def __init__(
        self,
        app: ASGIApp,
        metrics: Metrics,
        render_error: Callable[[BaseException], Any],
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.render_error = render_error

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

        async def send_with_id(message: Message) -> None:
            nonlocal status, response_started
            if message["type"] == "http.response.start":
                response_started = True
                status = message["status"]
                headers = list(message.get("headers", []))
                headers.append((b"x-request-id", request_id.encode()))
                message = {**message, "headers": headers}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            if response_started:
                raise
            response = await self.render_error(exc)
            await response(scope, receive, send_with_id)
        finally:
            route = scope.get("route")
            template = getattr(route, "path", None) or "unmatched"
            elapsed = time.perf_counter() - started
            self.metrics.request_latency.labels(scope["method"], template, str(status)).observe(
                elapsed
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
