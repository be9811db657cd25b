"""A real OTLP/HTTP receiver for tests: accepts `POST /v1/traces` (protobuf, as a collector's
port 4318 does), keeps each request's `ExportTraceServiceRequest`, and answers 200, or what a
test told it to answer the next posts (`answer_next`: a busy collector's 503, say).

`OtlpReceiver` serves on 127.0.0.1 (ephemeral port) from a thread of its own, as the exporter
posts from its own thread too; `spans()` decodes everything received so far, `wait_for_posts`
waits for the exporter to have posted.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections import deque
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Self

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.trace.v1.trace_pb2 import Span


class OtlpReceiver:
    def __init__(self) -> None:
        self.requests: list[ExportTraceServiceRequest] = []
        self.paths: list[str] = []
        self.content_types: list[str] = []
        self.posts: list[tuple[float, int]] = []
        """Every post, kept or not: when it was read (`time.monotonic()`), the status answered."""
        self._answers: deque[tuple[int, dict[str, str]]] = deque()
        self._posted = threading.Condition()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = self.rfile.read(length)
                status, headers = receiver._next_answer()
                if status != 200:
                    receiver._posted_one(status)
                    self.send_response(status)
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                decoded = ExportTraceServiceRequest()
                decoded.ParseFromString(body)
                receiver.requests.append(decoded)
                receiver.paths.append(self.path)
                receiver.content_types.append(self.headers.get("Content-Type", ""))
                receiver._posted_one(200)  # before the answer: the exporter may look at once
                answer = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                """Quiet: the test reads what was received, not the access log."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def answer_next(self, status: int, *, times: int = 1, retry_after: str | None = None) -> None:
        """Answer the next `times` posts `status` (with `Retry-After` when given), without
        keeping what they carry; later posts get 200 again."""
        headers = {"Retry-After": retry_after} if retry_after is not None else {}
        self._answers.extend([(status, headers)] * times)

    def wait_for_posts(self, count: int, seconds: float = 10.0) -> None:
        """Until `count` posts have been read (failing the test after `seconds`)."""
        with self._posted:
            if not self._posted.wait_for(lambda: len(self.posts) >= count, seconds):
                raise AssertionError(f"{len(self.posts)} posts after {seconds} s, not {count}")

    def _next_answer(self) -> tuple[int, dict[str, str]]:
        try:
            return self._answers.popleft()
        except IndexError:
            return 200, {}

    def _posted_one(self, status: int) -> None:
        with self._posted:
            self.posts.append((time.monotonic(), status))
            self._posted.notify_all()

    def spans(self) -> list[tuple[dict[str, str], Span]]:
        """Every span received, with its resource's string attributes."""
        found: list[tuple[dict[str, str], Span]] = []
        for request in list(self.requests):
            for resource_spans in request.resource_spans:
                resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
                for scope_spans in resource_spans.scope_spans:
                    found.extend((resource, span) for span in scope_spans.spans)
        return found

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
