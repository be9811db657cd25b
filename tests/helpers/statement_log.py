"""A pytest plugin that records every distinct SQL statement the service sends during the run,
for `tests/test_statement_routing.py` to check that each one can be routed by `company_id`.

Three places see the service's statements (those of the `Database` that `create_database`
builds, for the app factory, the worker and maintenance):

- the hot path's driver connections (`DriverPool`, `app/turns/`): asyncpg's query logger, added
  to every `DriverPool` created while the plugin is active;
- statements the service runs on the asyncpg connection under one of the engine's pooled
  connections (the queue's claim, `driver_transaction`): asyncpg's query logger, added to each
  connection the engine's pool opens, when it is the service's (`application_name`
  context-memory, which `create_database` sets; Alembic's connections are not);
- statements run through SQLAlchemy (requests' sessions, the worker, maintenance): the engine's
  `before_cursor_execute` event. asyncpg's query logger does not see these: the dialect runs
  them as prepared statements (`Connection.prepare`, then `fetch`), which asyncpg does not log.

Tests run statements of their own through the app's engine too (`tests/helpers/db.py`,
fixtures reading rows back): a statement counts only when the innermost frame of this project
that sent it is the service's code (`app/`), found by walking the caller's stack, across
SQLAlchemy's greenlet into the coroutine that awaited it. asyncpg calls its query loggers
later, off the caller's stack, so what they see all counts: the driver connections serve the
service's code only, and tests reach the engine's raw connections through SQLAlchemy, whose
prepared statements asyncpg does not log (an `executemany` of a test would count). Services
started as subprocesses (`python -m app serve`) are not seen.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import greenlet  # type: ignore[import-untyped]
import pytest
from sqlalchemy import Engine, event
from sqlalchemy.pool import Pool

from app.kit.config import PROJECT_ROOT
from app.kit.db import DriverPool

ROUTING_TEST = "tests/test_statement_routing.py"
SERVICE_APPLICATION_NAME = "context-memory"
_SERVICE_CODE = str(PROJECT_ROOT / "app") + "/"
_OTHER_PROJECT_CODE = tuple(
    str(PROJECT_ROOT / name) + "/" for name in ("tests", "migrations", "bench", "eval")
)
_THIS_FILE = str(Path(__file__).resolve())


@dataclass
class Sighting:
    """How often a statement was sent, and by which test first."""

    count: int
    first_test: str


class StatementLog:
    """Distinct statements (whitespace normalised) of the service, in first-seen order."""

    def __init__(self) -> None:
        self.sightings: dict[str, Sighting] = {}
        self.current_test = "(before the first test)"

    def record(self, sql: str) -> None:
        statement = normalise(sql)
        sighting = self.sightings.get(statement)
        if sighting is None:
            self.sightings[statement] = Sighting(1, self.current_test)
        else:
            sighting.count += 1

    def tests_seen(self) -> set[str]:
        return {sighting.first_test for sighting in self.sightings.values()}


LOG = StatementLog()


def normalise(sql: str) -> str:
    return " ".join(sql.split())


def _caller_frames() -> Iterator[FrameType]:
    """The frames of the running code, innermost first, continued in each parent greenlet:
    SQLAlchemy's async layer runs the synchronous engine in a child greenlet whose stack starts
    at the engine, while the code that awaited it waits in the parent."""
    frame: FrameType | None = sys._getframe(1)
    current: greenlet.greenlet | None = greenlet.getcurrent()
    while current is not None:
        while frame is not None:
            yield frame
            frame = frame.f_back
        current = current.parent
        frame = current.gr_frame if current is not None else None


def sent_by_service() -> bool:
    """True when the innermost frame of this project's code is the service's (`app/`)."""
    for frame in _caller_frames():
        path = frame.f_code.co_filename
        if path.startswith(_SERVICE_CODE):
            return True
        if path.startswith(_OTHER_PROJECT_CODE) and path != _THIS_FILE:
            return False
    return False


def _record_engine_statement(**event_args: Any) -> None:
    if sent_by_service():
        LOG.record(event_args["statement"])


def _record_driver_statement(query: Any) -> None:
    LOG.record(str(query.query))


def _log_raw_statements(dbapi_connection: Any, connection_record: Any) -> None:
    raw = dbapi_connection.driver_connection
    if getattr(raw.get_settings(), "application_name", None) == SERVICE_APPLICATION_NAME:
        raw.add_query_logger(_record_driver_statement)


def _logging_driver_pool(original: Callable[..., None]) -> Callable[..., None]:
    def init(self: DriverPool, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        self.add_query_logger(_record_driver_statement)

    return init


_patches = pytest.MonkeyPatch()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--statement-log",
        metavar="FILE",
        help="write the service's distinct SQL statements of this run to FILE (JSON)",
    )


def pytest_configure(config: pytest.Config) -> None:
    event.listen(Engine, "before_cursor_execute", _record_engine_statement, named=True)
    event.listen(Pool, "connect", _log_raw_statements)
    _patches.setattr(DriverPool, "__init__", _logging_driver_pool(DriverPool.__init__))


def pytest_unconfigure(config: pytest.Config) -> None:
    _patches.undo()
    event.remove(Pool, "connect", _log_raw_statements)
    event.remove(Engine, "before_cursor_execute", _record_engine_statement)
    target = config.getoption("--statement-log")
    if target:
        entries = [
            {"statement": text, "count": seen.count, "first_test": seen.first_test}
            for text, seen in LOG.sightings.items()
        ]
        Path(target).write_text(json.dumps(entries, indent=1) + "\n")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The routing check runs last, over the statements of every test before it."""
    items.sort(key=lambda item: item.nodeid.startswith(ROUTING_TEST))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    LOG.current_test = item.nodeid
    return (yield)
