"""Moving a company under another id is refused: its export imported into a company other than
the exported one is a 422 naming the stream's company on its first line, and writes nothing
(the users' tokens, the folders' Root Group `root:<company>` and every record name the company,
so a company moves under its own id). Into its own id, on a deployment where it holds nothing,
it loads, and registers the company there."""

from __future__ import annotations

import httpx
from fastapi import FastAPI

from app.portability.repository import COMPANY_TABLES
from tests.helpers.apps import OPERATOR, AuthFactory, app_with, client_of
from tests.helpers.db import scalar, scratch_database
from tests.helpers.portability import export_of, import_into, seed_company
from tests.helpers.settings import register_company

PLATFORM = ("olga", "platform", OPERATOR)


async def held_by(app: FastAPI, company: str) -> int:
    total = 0
    for table in COMPANY_TABLES:
        total += await scalar(
            app,
            f"SELECT count(*) FROM {table.name} WHERE company_id = :c",  # noqa: S608
            c=company,
        )
    return total


async def test_an_export_imported_into_another_company_is_refused_and_writes_nothing(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await seed_company(app, client, auth, "acme", "CANARY-ACME")
    stream = await export_of(client, auth, "acme")
    await register_company(client, auth, "initech")
    held_by_acme = await held_by(app, "acme")

    response = await import_into(client, auth, "initech", stream)

    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    (error,) = response.json()["errors"]
    assert error["field"] == "body.lines.1.company_id"
    assert "'acme', not 'initech'" in error["message"]
    assert "moves under its own id" in error["message"]
    assert await held_by(app, "initech") == 0
    assert await held_by(app, "acme") == held_by_acme


async def test_an_import_into_its_own_id_elsewhere_registers_the_company(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, server_url: str
) -> None:
    await seed_company(app, client, auth, "acme", "CANARY-ACME")
    stream = await export_of(client, auth, "acme")
    async with (
        scratch_database(server_url, "cms_move") as url,
        app_with(url) as elsewhere,
        client_of(elsewhere) as there,
    ):
        unknown = await there.get("/v1/companies/acme", headers=auth(*PLATFORM))

        response = await import_into(there, auth, "acme", stream)

        assert unknown.status_code == 404
        assert response.status_code == 201, response.text
        read = await there.get("/v1/companies/acme", headers=auth(*PLATFORM))
        assert read.status_code == 200, read.text
        assert read.json()["origin"] == "import"
        assert read.json()["users_with_memory"] > 0
