"""A tiny OTLP/HTTP receiver for the bench's `tracing-10pct` variant: it accepts the exporter's
protobuf posts on 127.0.0.1, counts them and their bytes, and discards them (a collector's cost
is not ours to measure; the service's cost of exporting is)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar


class OtlpSink:
    """Started once per bench run (`endpoint()`), serving from a daemon thread."""

    _started: ClassVar[OtlpSink | None] = None

    def __init__(self) -> None:
        self.posts = 0
        self.received_bytes = 0
        sink = self

        class Handler(BaseHTTPRequestHandler):
            # keep-alive, as a collector answers: HTTP/1.0 would close the connection after
            # each export and charge the service a new TCP connection per batch
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                sink.received_bytes += len(self.rfile.read(length))
                sink.posts += 1
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                """Quiet: one line per export would drown the bench's output."""

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    @classmethod
    def endpoint(cls) -> OtlpSink:
        """The run's sink, started on first use."""
        if cls._started is None:
            cls._started = OtlpSink()
        return cls._started

    @classmethod
    def started(cls) -> OtlpSink | None:
        return cls._started


if __name__ == "__main__":  # a sink of its own process: its CPU is not the measured one's
    import sys

    sink = OtlpSink.endpoint()
    print(sink.url, flush=True)
    try:
        while sys.stdin.read(1):  # until the parent closes the pipe
            pass
    finally:
        print(f"{sink.posts} {sink.received_bytes}", flush=True)
