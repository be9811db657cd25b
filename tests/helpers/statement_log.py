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

Under pytest-xdist each worker records the statements of the tests it runs. When it ends it
hands them to the controller (xdist's `workeroutput`), which merges every worker's; when the
routing module ran on any of them, the controller runs that module's `RUN_WIDE_CHECKS` over the
merged statements after the last test, and reports a failure as a failed test of the module
(`RUN_WIDE_TEST`), so the run fails. `--statement-log FILE` then writes the merged statements.
"""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

import greenlet  # type: ignore[import-untyped]
import pytest
from sqlalchemy import Engine, event
from sqlalchemy.pool import Pool

from app.kit.config import PROJECT_ROOT
from app.kit.db.driver_pool import DriverPool

ROUTING_TEST = "tests/test_statement_routing.py"
ROUTING_MODULE = "tests.test_statement_routing"
RUN_WIDE_TEST = "statements of every worker"
WORKER_OUTPUT_KEY = "statement_log"
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
    if target and not hasattr(config, "workerinput"):  # under xdist the controller writes it
        sightings = merge(_RUN.worker_logs) if _RUN.worker_logs else LOG.sightings
        entries = [
            {"statement": text, "count": seen.count, "first_test": seen.first_test}
            for text, seen in sightings.items()
        ]
        Path(target).write_text(json.dumps(entries, indent=1) + "\n")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The routing check runs last, over the statements of every test before it."""
    items.sort(key=lambda item: item.nodeid.startswith(ROUTING_TEST))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    LOG.current_test = item.nodeid
    _RUN.ran_routing_module |= item.nodeid.startswith(ROUTING_TEST)
    return (yield)


# --- under pytest-xdist: each worker's statements, checked together by the controller ----------


@dataclass
class WorkerLog:
    """What one worker hands the controller: its statements as (text, count, first test)."""

    worker: str
    ran_routing_module: bool
    statements: list[tuple[str, int, str]]


@dataclass
class _Run:
    ran_routing_module: bool = False  # in this process (a worker, or a run without xdist)
    worker_logs: list[WorkerLog] = field(default_factory=list)  # the controller's
    checked: str = ""  # the controller's summary of its check


_RUN = _Run()


def merge(logs: list[WorkerLog]) -> dict[str, Sighting]:
    """The workers' statements as one log: counts added up, the first test named with its
    worker (`tests/x.py::test_y [gw1]`), statements in the order the workers are given."""
    merged: dict[str, Sighting] = {}
    for log in logs:
        for text, count, first_test in log.statements:
            seen = merged.get(text)
            if seen is None:
                merged[text] = Sighting(count, f"{first_test} [{log.worker}]")
            else:
                seen.count += count
    return merged


def run_wide_failures(sightings: Mapping[str, Sighting]) -> list[str]:
    """What the routing module's `RUN_WIDE_CHECKS` find wrong with `sightings`."""
    module = importlib.import_module(ROUTING_MODULE)
    checks: tuple[Callable[[Mapping[str, Sighting]], list[str]], ...] = module.RUN_WIDE_CHECKS
    return [failure for check in checks for failure in check(sightings)]


def pytest_sessionfinish(session: pytest.Session) -> None:
    """A worker's statements go to the controller with the rest of its `workeroutput`."""
    output: dict[str, Any] | None = getattr(session.config, "workeroutput", None)
    if output is not None:
        output[WORKER_OUTPUT_KEY] = {
            "ran_routing_module": _RUN.ran_routing_module,
            "statements": [
                [text, seen.count, seen.first_test] for text, seen in LOG.sightings.items()
            ],
        }


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: object | None) -> None:
    """The controller keeps each finished worker's statements (a crashed worker has none to
    hand over; xdist fails the run for the crash)."""
    output = getattr(node, "workeroutput", {}).get(WORKER_OUTPUT_KEY)
    if output is not None:
        statements = [
            (str(text), int(count), str(first)) for text, count, first in output["statements"]
        ]
        _RUN.worker_logs.append(
            WorkerLog(str(node.gateway.id), bool(output["ran_routing_module"]), statements)
        )


@pytest.hookimpl(wrapper=True)
def pytest_runtestloop(session: pytest.Session) -> Iterator[None]:
    """On the controller, once every worker is done: the run-wide check, reported as one more
    test of the routing module when it fails (which fails the run)."""
    result = yield
    logs = _RUN.worker_logs
    if logs and any(log.ran_routing_module for log in logs):
        sightings = merge(logs)
        try:
            failures = run_wide_failures(sightings)
        except Exception as error:
            failures = [f"the run-wide check could not run: {error!r}"]
        workers = ", ".join(sorted(log.worker for log in logs))
        _RUN.checked = f"{len(sightings)} distinct statement(s) of workers {workers}"
        if failures:
            _report_run_wide_failure(session, failures, len(sightings))
    return result


def _report_run_wide_failure(session: pytest.Session, failures: list[str], total: int) -> None:
    report = pytest.TestReport(
        nodeid=f"{ROUTING_TEST}::{RUN_WIDE_TEST}",
        location=(ROUTING_TEST, None, RUN_WIDE_TEST),
        keywords={},
        outcome="failed",
        longrepr=(
            f"{len(failures)} finding(s) over the {total} distinct statement(s) of every worker"
            " (scope them, or add an exemption with its reason):\n\n" + "\n\n".join(failures)
        ),
        when="call",
    )
    session.config.hook.pytest_runtest_logreport(report=report)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _RUN.checked:
        terminalreporter.write_line(
            f"statement routing, checked over the whole run: {_RUN.checked}"
        )
