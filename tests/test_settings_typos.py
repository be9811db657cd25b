"""A variable under a settings prefix that names no setting (`JWT_AUDENCE`) is a warning at
start-up, one log line each, naming the closest setting and never the value; a correct name, a
variable under no settings prefix, and one that something else reads on purpose are not."""

from __future__ import annotations

import ast
import logging
import re

import orjson
import pytest
from asgi_lifespan import LifespanManager

from app.kit.config import (
    PROJECT_ROOT,
    READ_ELSEWHERE,
    setting_names,
    setting_prefixes,
    unknown_settings,
    warn_unknown_settings,
)
from app.kit.observability import JsonFormatter
from app.main import create_app
from tests.helpers.apps import make_settings

SECRET_VALUE = "s3cret-value-that-must-not-be-logged"
CONFIG_LOGGER = "app.kit.config"


def config_warnings(caplog: pytest.LogCaptureFixture, *variables: str) -> list[logging.LogRecord]:
    """The warnings of the settings check (about `variables` only, when given: the environment
    the tests run in is not theirs to choose)."""
    return [
        r
        for r in caplog.records
        if r.name == CONFIG_LOGGER
        and r.levelno == logging.WARNING
        and (not variables or r.__dict__.get("variable") in variables)
    ]


async def test_a_started_app_warns_once_about_a_mistyped_variable(
    database_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JWT_AUDENCE", SECRET_VALUE)
    caplog.set_level(logging.WARNING, logger=CONFIG_LOGGER)
    async with LifespanManager(create_app(make_settings(database_url))):
        pass

    [record] = config_warnings(caplog, "JWT_AUDENCE", "JWT_AUDIENCE")
    line = JsonFormatter().format(record)
    assert "JWT_AUDENCE" in record.getMessage()
    assert "did you mean JWT_AUDIENCE?" in record.getMessage()
    assert orjson.loads(line) | {"ts": None} == {
        "ts": None,
        "level": "warning",
        "logger": CONFIG_LOGGER,
        "msg": "JWT_AUDENCE is set in the environment but names no setting; did you mean "
        "JWT_AUDIENCE?",
        "variable": "JWT_AUDENCE",
        "suggestion": "JWT_AUDIENCE",
    }
    assert SECRET_VALUE not in caplog.text
    assert SECRET_VALUE not in line


async def test_a_started_app_says_nothing_of_a_correct_variable(
    database_url: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("JWT_AUDIENCE", "context-memory")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "context-memory")  # the OpenTelemetry SDK's
    caplog.set_level(logging.WARNING, logger=CONFIG_LOGGER)
    async with LifespanManager(create_app(make_settings(database_url))):
        pass

    assert config_warnings(caplog, "JWT_AUDIENCE", "OTEL_SERVICE_NAME") == []


def test_the_prefixes_come_from_the_settings() -> None:
    prefixes = setting_prefixes()
    assert {"DB_", "JWT_", "LLM_", "WORKER_", "AUTH_", "RATE_", "QUOTA_"} <= prefixes
    for prefix in prefixes:
        assert any(name.startswith(prefix) for name in setting_names()), prefix
    assert "OTEL_" not in prefixes
    assert "TEST_" not in prefixes


def test_only_names_under_a_settings_prefix_that_no_setting_has_are_flagged() -> None:
    environ = {
        "JWT_AUDENCE": SECRET_VALUE,  # a typo
        "jwt_secrt": SECRET_VALUE,  # names are case-insensitive, reported as written
        "DB_NOTHING_LIKE_IT": "1",  # nothing close
        "JWT_AUDIENCE": "ok",
        "db_pool_size": "5",
        "DATABASE_URL": "postgresql://localhost/db",
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318",
        "TEST_DATABASE_URL": "postgresql://localhost/test",
        "PATH": "/usr/bin",
        "OPENAI_ORG_ID": "org",
        "WORKER_SERVICE_HOST": "10.0.0.7",  # Kubernetes' link to a service named `worker`
        "WORKER_PORT": "tcp://10.0.0.7:9100",
        "WORKER_PORT_9100_TCP_ADDR": "10.0.0.7",
    }
    assert unknown_settings(environ) == [
        ("DB_NOTHING_LIKE_IT", None),
        ("JWT_AUDENCE", "JWT_AUDIENCE"),
        ("jwt_secrt", "JWT_SECRET"),
    ]


def test_a_port_variable_is_a_service_link_only_with_a_service_address() -> None:
    assert unknown_settings({"WORKER_PORT": "9100"}) == [("WORKER_PORT", None)]
    assert unknown_settings({"WORKER_METRIC_PORT": "9100"}) == [
        ("WORKER_METRIC_PORT", "WORKER_METRICS_PORT")
    ]


@pytest.mark.parametrize(
    "name",
    ["JWT_", "JWT_\u00e9\u00e8", "JWT_" + "X" * 10_000, "JWT_AUDIENCE\n", "LLM_MODEL =x"],
    ids=["bare-prefix", "non-ascii", "very-long", "newline", "spaces"],
)
def test_hostile_names_are_reported_without_their_value(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=CONFIG_LOGGER)
    assert warn_unknown_settings({name: SECRET_VALUE + "\n" + SECRET_VALUE}) == [name]
    [record] = config_warnings(caplog)
    assert record.__dict__["variable"] == name
    assert SECRET_VALUE not in caplog.text
    assert SECRET_VALUE not in JsonFormatter().format(record)


# names the service's own code reads from the environment: `os.environ[...]`, `.get(...)`,
# `getenv(...)`, and the tuples of names a module keeps for such reads
_ENV_NAME = re.compile(r"^[A-Z][A-Z0-9]*(_[A-Z0-9]+)+$")


def names_read_from_the_environment() -> set[str]:
    found: set[str] = set()
    for path in (PROJECT_ROOT / "app").rglob("*.py"):
        source = path.read_text(encoding="utf-8")
        if "environ" not in source and "getenv" not in source:
            continue
        found |= {
            node.value
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and _ENV_NAME.match(node.value)
        }
    return found


def test_nothing_the_service_reads_from_the_environment_is_flagged() -> None:
    read = names_read_from_the_environment()
    assert {"DATABASE_URL", "API_WORKERS", "OTEL_TRACES_EXPORTER"} <= read
    assert unknown_settings(dict.fromkeys(read, "x")) == []
    assert unknown_settings(dict.fromkeys(READ_ELSEWHERE, "x")) == []
