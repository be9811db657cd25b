"""An OpenAI-compatible chat-completions server that answers the consolidation worker after a
fixed latency, for bench/worker_bench.py: the worker's throughput against a model of known speed.

It reads the worker's prompts just enough to give a valid answer: a user message that starts
with a first-person statement ("I ...", "I'm ...", "My ...", "Remind me ...") is a fact. The gate
call answers UPDATE when the exchanges hold a fact and NOOP otherwise; the operations call (JSON
mode) ADDs each fact, verbatim, to a section chosen by a keyword (the profile skips an ADD it
already holds), or answers NOOP. Any other call (rewrite, condensation) answers NOOP.

Every answer waits `latency_seconds` (`asyncio.sleep`), so the server holds any number of calls
at once; it counts the calls by kind and how many were in flight at the same time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import socket
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Self

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.profiles.document import Section

_FENCED = re.compile(r"^<([A-Za-z]+)([0-9]+)>\n(.*?)\n</\1\2>$", re.DOTALL | re.MULTILINE)
_STATEMENT_STARTS = ("I ", "I'm ", "My ", "Remind me ")
_SECTION_KEYWORDS = (
    ("prefer", Section.COMMUNICATION),
    ("remind me", Section.FOLLOWUPS),
    ("i use", Section.SKILLS),
    ("i work as", Section.IDENTITY),
)


def user_texts(prompt: str) -> list[str]:
    """The user's messages fenced in a consolidation prompt, in order."""
    return [match.group(3) for match in _FENCED.finditer(prompt) if match.group(1) == "U"]


def is_statement(text: str) -> bool:
    return text.startswith(_STATEMENT_STARTS)


def section_for(fact: str) -> Section:
    folded = fact.casefold()
    for keyword, section in _SECTION_KEYWORDS:
        if keyword in folded:
            return section
    return Section.WORK


def answer_for(body: dict[str, Any]) -> tuple[str, str]:
    """(kind, answer text) for one chat-completions request body. Kinds: `gate_update`,
    `gate_noop`, `operations_update`, `operations_noop`, `other`."""
    messages = body.get("messages") or []
    system = str(messages[0].get("content", "")) if messages else ""
    prompt = str(messages[-1].get("content", "")) if messages else ""
    facts = list(dict.fromkeys(text for text in user_texts(prompt) if is_statement(text)))
    if body.get("response_format"):
        if not facts:
            return "operations_noop", json.dumps({"decision": "NOOP"})
        operations = [{"op": "ADD", "section": section_for(f).value, "text": f} for f in facts]
        return "operations_update", json.dumps({"decision": "UPDATE", "operations": operations})
    if "UPDATE or NOOP" in system:
        return ("gate_update", "UPDATE") if facts else ("gate_noop", "NOOP")
    return "other", "NOOP"


@dataclass
class StubStats:
    """What the server saw since the last `reset`."""

    calls: Counter[str] = field(default_factory=Counter)
    in_flight: int = 0
    peak_in_flight: int = 0
    busy_seconds: float = 0.0
    """Sum of the calls' durations: divided by a wall time, the mean number in flight."""
    slowest_seconds: float = 0.0

    @property
    def total(self) -> int:
        return sum(self.calls.values())


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: Ctrl-C stays with the harness."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class FixedLatencyLLM:
    """The server on 127.0.0.1 (an ephemeral port), as a task of the running event loop."""

    def __init__(self, latency_seconds: float) -> None:
        self.latency_seconds = latency_seconds
        self.stats = StubStats()
        self._ids = 0
        self._port: int | None = None
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._app = Starlette(
            routes=[Route("/v1/chat/completions", self._chat_completions, methods=["POST"])]
        )

    @property
    def base_url(self) -> str:
        if self._port is None:
            raise RuntimeError("the stub model server is not started")
        return f"http://127.0.0.1:{self._port}/v1"

    def reset(self) -> StubStats:
        """Start counting afresh; returns what was counted so far."""
        seen, self.stats = self.stats, StubStats()
        return seen

    async def __aenter__(self) -> Self:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        config = uvicorn.Config(
            self._app,
            log_config=None,
            access_log=False,
            lifespan="off",
            ws="none",
            timeout_graceful_shutdown=2,
        )
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                sock.close()
                self._task.result()
                raise RuntimeError("the stub model server exited during startup")
            await asyncio.sleep(0.005)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await self._task
        self._server = self._task = None

    async def _chat_completions(self, request: Request) -> Response:
        started = time.perf_counter()
        stats = self.stats
        stats.in_flight += 1
        stats.peak_in_flight = max(stats.peak_in_flight, stats.in_flight)
        try:
            body = json.loads(await request.body())
            kind, text = answer_for(body if isinstance(body, dict) else {})
            await asyncio.sleep(self.latency_seconds)
            self._ids += 1
            prompt_chars = sum(len(str(m.get("content", ""))) for m in body.get("messages", []))
            completion = {
                "id": f"chatcmpl-bench-{self._ids}",
                "object": "chat.completion",
                "created": int(time.time()),
                "model": body.get("model") or "bench-model",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text, "refusal": None},
                        "finish_reason": "stop",
                        "logprobs": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_chars // 4,
                    "completion_tokens": max(1, len(text) // 4),
                    "total_tokens": prompt_chars // 4 + max(1, len(text) // 4),
                },
            }
            stats.calls[kind] += 1
            return JSONResponse(completion)
        finally:
            elapsed = time.perf_counter() - started
            stats.in_flight -= 1
            stats.busy_seconds += elapsed
            stats.slowest_seconds = max(stats.slowest_seconds, elapsed)
