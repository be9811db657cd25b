"""problem+json for every error, request ids, metrics, readiness, and the commit-before-response
guarantee of the per-request transaction."""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import text

from app.kit.config import Settings
from app.kit.deps import SessionDep
from app.main import create_app
from tests.helpers.apps import make_settings
from tests.helpers.db import admin_execute, admin_fetchval


class Probe(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(max_length=10)
    count: int = Field(ge=0)


def add_probe_routes(app: FastAPI) -> None:
    """Routes that exist only in these tests, to drive the error paths of real requests."""

    @app.post("/_probe/validate")
    async def validate(body: Probe) -> Probe:
        return body

    @app.get("/_probe/boom")
    async def boom() -> None:
        raise RuntimeError("secret internal detail")

    @app.post("/_probe/write", status_code=201)
    async def write(session: SessionDep) -> dict[str, str]:
        await session.execute(text("INSERT INTO commit_probe (value) VALUES ('written')"))
        return {"status": "written"}


@pytest.fixture
async def probe_app(database_url: str) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    settings = make_settings(database_url, max_body_bytes=2048)
    app = create_app(settings)
    add_probe_routes(app)
    async with LifespanManager(app):
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
        async with httpx.AsyncClient(transport=transport, base_url="http://t") as http:
            yield app, http


def assert_problem(response: httpx.Response, status: int) -> dict[str, object]:
    assert response.status_code == status
    assert response.headers["content-type"] == "application/problem+json"
    body: dict[str, object] = response.json()
    assert body["status"] == status
    assert {"type", "title", "detail", "request_id"} <= body.keys()
    assert body["request_id"] == response.headers["x-request-id"]
    return body


async def test_validation_error_names_the_fields(
    probe_app: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    _, http = probe_app
    response = await http.post("/_probe/validate", json={"name": "x" * 11, "count": -1, "x": 1})
    body = assert_problem(response, 422)
    fields = {error["field"] for error in body["errors"]}  # type: ignore[attr-defined]
    assert fields == {"body.name", "body.count", "body.x"}
    assert "xxxxxxxxxxx" not in response.text  # the offending input is not echoed back


async def test_malformed_json_is_422(probe_app: tuple[FastAPI, httpx.AsyncClient]) -> None:
    _, http = probe_app
    response = await http.post(
        "/_probe/validate", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert_problem(response, 422)


async def test_unknown_route_and_wrong_method(client: httpx.AsyncClient) -> None:
    assert_problem(await client.get("/v1/no-such-thing"), 404)
    response = await client.delete("/healthz")
    assert_problem(response, 405)
    assert response.headers["allow"] == "GET"


async def test_body_over_the_limit_is_413(probe_app: tuple[FastAPI, httpx.AsyncClient]) -> None:
    _, http = probe_app
    big = {"name": "n", "count": 1, "pad": "x" * 4096}
    assert_problem(await http.post("/_probe/validate", json=big), 413)

    async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: counted while streaming
        for _ in range(8):
            yield b" " * 512

    response = await http.post(
        "/_probe/validate", content=chunks(), headers={"content-type": "application/json"}
    )
    assert_problem(response, 413)


async def test_unexpected_error_is_500_without_trace(
    probe_app: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    _, http = probe_app
    response = await http.get("/_probe/boom", headers={"X-Request-ID": "req-abc.123"})
    body = assert_problem(response, 500)
    assert body["request_id"] == "req-abc.123"
    assert "secret internal detail" not in response.text
    assert "Traceback" not in response.text


async def test_request_id_is_generated_or_honoured(client: httpx.AsyncClient) -> None:
    generated = await client.get("/healthz")
    assert len(generated.headers["x-request-id"]) == 32
    honoured = await client.get("/healthz", headers={"X-Request-ID": "abc-123"})
    assert honoured.headers["x-request-id"] == "abc-123"
    unsafe = await client.get("/healthz", headers={"X-Request-ID": "bad id\twith spaces"})
    assert unsafe.headers["x-request-id"] != "bad id\twith spaces"


async def test_metrics_histogram_by_route_template(client: httpx.AsyncClient) -> None:
    await client.get("/v1/me")
    await client.get("/v1/nope/123")
    text_body = (await client.get("/metrics")).text
    assert 'http_request_duration_seconds_count{method="GET",route="/v1/me",status="401"}' in (
        text_body
    )
    assert 'route="unmatched",status="404"' in text_body


async def test_readyz_and_healthz(client: httpx.AsyncClient) -> None:
    assert (await client.get("/healthz")).json() == {"status": "ok"}
    ready = (await client.get("/readyz")).json()
    assert ready["status"] == "ready"
    assert ready["migration"] == ready["expected_migration"] is not None


async def test_readyz_refuses_when_migrations_lag(
    app: FastAPI, client: httpx.AsyncClient, database_url: str
) -> None:
    await admin_execute(database_url, "UPDATE alembic_version SET version_num = 'older'")
    try:
        response = await client.get("/readyz")
        assert_problem(response, 503)
        assert "older" in response.json()["detail"]
    finally:
        await admin_execute(
            database_url,
            f"UPDATE alembic_version SET version_num = '{app.state.head_revision}'",  # noqa: S608
        )


async def test_failed_commit_never_reaches_the_client_as_2xx(
    probe_app: tuple[FastAPI, httpx.AsyncClient], database_url: str
) -> None:
    """A constraint checked only at COMMIT fails after the route returned: the client must
    see an error, and nothing must be stored."""
    _, http = probe_app
    await admin_execute(
        database_url,
        "CREATE TABLE commit_probe (value text)",
        """CREATE FUNCTION commit_probe_reject() RETURNS trigger LANGUAGE plpgsql AS
           $$ BEGIN RAISE EXCEPTION 'rejected at commit'; END $$""",
        """CREATE CONSTRAINT TRIGGER commit_probe_deferred AFTER INSERT ON commit_probe
           DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION commit_probe_reject()""",
    )
    try:
        response = await http.post("/_probe/write")
        assert response.status_code == 500
        assert response.headers["content-type"] == "application/problem+json"
        assert await admin_fetchval(database_url, "SELECT count(*) FROM commit_probe") == 0
    finally:
        await admin_execute(
            database_url,
            "DROP TABLE commit_probe",
            "DROP FUNCTION commit_probe_reject()",
        )


async def test_successful_write_is_committed(
    probe_app: tuple[FastAPI, httpx.AsyncClient], database_url: str
) -> None:
    _, http = probe_app
    await admin_execute(database_url, "CREATE TABLE commit_probe (value text)")
    try:
        assert (await http.post("/_probe/write")).status_code == 201
        assert await admin_fetchval(database_url, "SELECT count(*) FROM commit_probe") == 1
    finally:
        await admin_execute(database_url, "DROP TABLE commit_probe")


def test_settings_refuse_the_dev_secret_outside_development() -> None:
    with pytest.raises(ValueError, match="development secret"):
        Settings(_env_file=None, environment="production")
    assert Settings(_env_file=None, environment="development").environment == "development"


def test_logs_are_json_lines_with_the_request_id() -> None:
    import io  # noqa: PLC0415
    import logging  # noqa: PLC0415

    import orjson  # noqa: PLC0415

    from app.kit.observability import JsonFormatter, _request_id  # noqa: PLC0415

    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("test.json-logs")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    token = _request_id.set("req-42")
    try:
        logger.info("request", extra={"method": "GET", "route": "/v1/me", "status": 200})
    finally:
        _request_id.reset(token)
        logger.removeHandler(handler)
    line = orjson.loads(stream.getvalue())
    assert line["msg"] == "request"
    assert line["request_id"] == "req-42"
    assert (line["method"], line["route"], line["status"]) == ("GET", "/v1/me", 200)
    assert line["level"] == "info"
