"""Tracing's side in the web framework: FastAPI's own telemetry as `Tracing` says, and the app
class that asks the door (app.kit.tracing_sdk) before it. Apart from app/kit/tracing.py so that
a process that serves no HTTP (the worker) traces without loading FastAPI."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

from fastapi import FastAPI
from fastapi.telemetry import TelemetryConfig
from starlette.types import Receive, Scope, Send

from app.kit.tracing import Tracing


def fastapi_telemetry(tracing: Tracing) -> TelemetryConfig:
    """FastAPI's own telemetry: the server span of each request when on (nothing else:
    metrics are Prometheus', logs are ours, and no span per dependency); entirely off
    otherwise, which leaves one constant check per request."""
    return {
        "tracer_provider": tracing.provider,
        "tracing": tracing.enabled,
        "metrics": False,
        "logs": False,
        "operation_spans": False,
        "auto_configure": False,
        "exclude": None,  # `TracedApp` asks the door before FastAPI's telemetry runs
    }


class TracedApp(FastAPI):
    """FastAPI, with the door in front of its telemetry: a request the door leaves untraced
    reaches the app marked as one FastAPI's telemetry must not observe (its own mark, the one
    its `exclude` hook sets), so FastAPI skips its telemetry as it does with tracing off."""

    door: Callable[[MutableMapping[str, Any]], bool] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        door = self.door
        if door is not None and scope["type"] == "http" and door(scope):
            scope["fastapi.telemetry"] = None
        await super().__call__(scope, receive, send)
