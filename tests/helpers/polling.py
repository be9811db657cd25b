"""Waiting in a test for something another party does (a worker, a server, a session blocked on
a lock): poll its condition until it holds, with a deadline, rather than sleep a guessed time.

A guessed sleep is too short on a loaded machine (two test workers on two cores) and too long
everywhere else; a polled condition is as quick as the other party and fails with what it was
waiting for. Sleeps that are the behaviour under test (a client trickling bytes, a lease or a
token running out by the clock, a pause between the steps of a rotation) are not waits and stay.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

import pytest

T = TypeVar("T")

POLL_SECONDS = 0.02


@overload
async def wait_until(
    condition: Callable[[], Awaitable[T | None]],
    seconds: float = 30.0,
    *,
    what: str | Callable[[], str] = "the condition",
    every: float = POLL_SECONDS,
) -> T: ...


@overload
async def wait_until(
    condition: Callable[[], T | None],
    seconds: float = 30.0,
    *,
    what: str | Callable[[], str] = "the condition",
    every: float = POLL_SECONDS,
) -> T: ...


async def wait_until(
    condition: Callable[[], object],
    seconds: float = 30.0,
    *,
    what: str | Callable[[], str] = "the condition",
    every: float = POLL_SECONDS,
) -> object:
    """Call `condition` (a function or a coroutine function) every `every` seconds until it
    returns something true, and return that; fail the test, saying `what` (a callable is asked
    only then, for a log's tail, say) was not met, once `seconds` have passed."""
    deadline = time.monotonic() + seconds
    while True:
        outcome = condition()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return outcome
        if time.monotonic() >= deadline:
            pytest.fail(f"not within {seconds:g} s: {_describe(what)}")
        await asyncio.sleep(every)


def wait_until_sync(
    condition: Callable[[], T | None],
    seconds: float = 30.0,
    *,
    what: str | Callable[[], str] = "the condition",
    every: float = POLL_SECONDS,
) -> T:
    """`wait_until` for code that is not a coroutine (a thread, a synchronous test)."""
    deadline = time.monotonic() + seconds
    while True:
        outcome = condition()
        if outcome:
            return outcome
        if time.monotonic() >= deadline:
            pytest.fail(f"not within {seconds:g} s: {_describe(what)}")
        time.sleep(every)


def _describe(what: str | Callable[[], str]) -> str:
    return what if isinstance(what, str) else what()
