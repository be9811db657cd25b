"""The HTTP/1.1 protocol `serve` runs: uvicorn's httptools protocol, with the bounds on request
heads that uvicorn lacks (it waits as long as a client likes for a head, and buffers one of
any size before the app can refuse it).

- A connection whose request head has not completed REQUEST_HEADER_TIMEOUT_SECONDS after it
  opened, or after its previous response ended, is closed (with a 408 when part of a head
  had come): a client that trickles its headers (slowloris), or its body after the app has
  answered, holds a connection that long, not forever.
- A head over MAX_REQUEST_HEADER_BYTES, or with more than MAX_REQUEST_HEADERS fields, is
  answered 431 and the connection closed as soon as that is known, before the app sees it: a
  connection holds at most the limit plus one read of its head.

The app enforces the header limits and the body timeout itself (`app.kit.limits`), wherever it
runs; this adds what only the server sees. Why a subclass: uvicorn has no option for either
(`timeout_keep_alive` only runs between requests and any byte cancels it,
`h11_max_incomplete_event_size` is h11's alone), and `limit_concurrency` would let slow
clients take every slot. `tests/test_serve_slow_clients.py` holds it to uvicorn's pinned
version.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import orjson
from uvicorn.config import Config
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol
from uvicorn.server import ServerState

from app.kit.config import get_settings
from app.kit.errors import PROBLEM_BASE, PROBLEM_CONTENT_TYPE, HeaderFieldsTooLarge, RequestTimeout

logger = logging.getLogger("app.kit.http_protocol")

_REQUEST_LINE_TAIL = len(b" HTTP/1.1\r\n")
_LINGER_SECONDS = 2.0


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline and a size limit on each request head
    (the settings of the process, as its app reads them)."""

    def __init__(
        self,
        config: Config,
        server_state: ServerState,
        app_state: dict[str, Any],
        _loop: asyncio.AbstractEventLoop | None = None,
    ) -> None:
        super().__init__(config, server_state, app_state, _loop)
        settings = get_settings()
        self.head_timeout = settings.request_header_timeout_seconds
        self.max_head_bytes = settings.max_request_header_bytes
        self.max_headers = settings.max_request_headers
        self._head_timer: asyncio.TimerHandle | None = None
        self._reading_head = True  # the next bytes belong to a request head
        self._received = 0  # bytes received since the head began, while it is incomplete
        self._head_size = 0  # the head as parsed: request line and fields
        self._fields = 0
        self._refused = False

    # --- the deadline ------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        super().connection_lost(exc)

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # every request parsed so far is answered: the connection waits for the next head
        # (or for the rest of a body the app answered without reading)
        if not self.transport.is_closing() and self.cycle.response_complete:
            self._start_head_timer()

    def _start_head_timer(self) -> None:
        self._stop_head_timer()
        self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self._reading_head and self._received:
            detail = f"The request head did not arrive within {self.head_timeout:g} seconds."
            self._refuse(RequestTimeout.status, RequestTimeout.title, RequestTimeout.slug, detail)
            return
        self._refused = True
        self.transport.close()  # idle, or a body nobody reads any more: nothing to answer

    # --- the size ----------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        if self._reading_head:
            self._received += len(data)
        super().data_received(data)
        if self._reading_head and not self._refused and self._received > self.max_head_bytes:
            self._too_large(f"The request's header fields exceed {self.max_head_bytes} bytes.")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_size = 2  # the blank line that ends the head
        self._fields = 0

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        self._head_size += len(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields += 1
        self._head_size += len(name) + len(value) + 4  # "name: value\r\n"
        if self._fields <= self.max_headers:
            super().on_header(name, value)

    def on_headers_complete(self) -> None:
        self._reading_head = False
        self._stop_head_timer()
        line = len(self.parser.get_method()) + 1 + _REQUEST_LINE_TAIL
        if self._fields > self.max_headers:
            self._too_large(f"The request has more than {self.max_headers} header fields.")
        elif self._head_size + line > self.max_head_bytes:
            self._too_large(f"The request's header fields exceed {self.max_head_bytes} bytes.")
        else:
            super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._refused:
            super().on_body(body)

    def on_message_complete(self) -> None:
        if self._refused:
            return
        super().on_message_complete()
        self._reading_head = True
        self._received = 0

    def _too_large(self, detail: str) -> None:
        problem = HeaderFieldsTooLarge
        self._refuse(problem.status, problem.title, problem.slug, detail)

    def _refuse(self, status: int, title: str, slug: str, detail: str) -> None:
        """Answer problem+json (no request id: the app never saw the request) and close."""
        self._refused = True
        self._stop_head_timer()
        logger.info("refused a request head: %s %s", status, detail)
        body = orjson.dumps(
            {"type": PROBLEM_BASE + slug, "title": title, "status": status, "detail": detail}
        )
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head.append(name + b": " + value + b"\r\n")
        head.append(b"content-type: " + PROBLEM_CONTENT_TYPE.encode() + b"\r\n")
        head.append(b"content-length: " + str(len(body)).encode() + b"\r\n")
        head.append(b"connection: close\r\n\r\n")
        self.transport.write(b"".join([*head, body]))
        self._linger()

    def _linger(self) -> None:
        """Close once the answer is out, reading (and dropping) what the client still sends
        meanwhile: closing with its data unread would reset the connection, and the client
        would lose the answer before reading it."""
        if not self.transport.can_write_eof():
            self.transport.close()
            return
        self.transport.write_eof()
        self.loop.call_later(_LINGER_SECONDS, self.transport.close)
