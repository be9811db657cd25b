"""The app served for real: uvicorn on 127.0.0.1 (an ephemeral port) as a task of the test's
event loop, its lifespan run by uvicorn, for clients that speak HTTP themselves."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Iterator

import uvicorn
from fastapi import FastAPI

from tests.helpers.polling import wait_until

START_SECONDS = 60.0  # the app's lifespan included, on a loaded machine


class _Server(uvicorn.Server):
    """uvicorn without signal handlers: Ctrl-C must stay with pytest."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


@contextlib.asynccontextmanager
async def served(app: FastAPI) -> AsyncIterator[str]:
    """Serve `app` (lifespan included) until the block ends; yields `http://127.0.0.1:<port>`."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    try:
        async with served_on(sock, app):
            yield f"http://127.0.0.1:{port}"
    finally:
        sock.close()


@contextlib.asynccontextmanager
async def served_on(sock: socket.socket, app: FastAPI) -> AsyncIterator[None]:
    """Serve `app` (lifespan included) on the bound `sock` until the block ends: for a test
    that must know the service's URL before it configures the app."""
    config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        lifespan="on",
        ws="none",
        timeout_graceful_shutdown=2,
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]))

    def started() -> bool:
        if task.done():
            task.result()
            raise RuntimeError("the app exited during startup")
        return server.started

    try:
        await wait_until(started, START_SECONDS, what="the app serving", every=0.005)
        yield
    finally:
        server.should_exit = True
        await task
