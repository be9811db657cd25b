"""A company moved between deployments: exported from one database, imported into an empty
company of a second database, exported again, holds exactly the same records (apart from the
snapshot's time and the audit events of the export and import themselves), and what users see
there is what they saw here."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests.helpers.apps import AuthFactory, app_with, client_of
from tests.helpers.db import rows, scratch_database
from tests.helpers.memory import ME
from tests.helpers.portability import (
    export_of,
    import_into,
    normalised,
    records,
    seed_company,
)

ACME, GLOBEX = "acme", "globex"


@pytest.fixture
async def second_deployment(server_url: str) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """Another deployment: an app on a database of its own, migrated, empty."""
    async with (
        scratch_database(server_url, "cms_import") as url,
        app_with(url) as application,
        client_of(application) as http,
    ):
        yield application, http


async def test_a_company_exported_and_imported_elsewhere_exports_the_same(
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    second_deployment: tuple[FastAPI, httpx.AsyncClient],
) -> None:
    await seed_company(app, client, auth, ACME, "CANARY-ACME")
    await seed_company(app, client, auth, GLOBEX, "CANARY-GLOBEX")
    first = await export_of(client, auth, ACME)

    kinds = {record["type"] for record in records(first)}
    assert kinds >= {
        "header",
        "feature_flag",
        "memory_policy",
        "space",
        "user_settings",
        "folder",
        "folder_acl",
        "memory_file",
        "memory_policy_action",
        "memory_version",
        "turn",
        "message",
        "audit_event",
        "end",
    }
    assert b"CANARY-ACME" in first
    assert b"CANARY-GLOBEX" not in first
    assert b"globex" not in first  # nor any id of the other company

    target, other = second_deployment
    imported = await import_into(other, auth, ACME, first)
    assert imported.status_code == 201, imported.text
    second = await export_of(other, auth, ACME)

    assert normalised(second) == normalised(first)
    versions = await rows(
        target, "SELECT count(*) AS n FROM memory_versions WHERE company_id = 'acme'"
    )
    assert versions[0].n == 5
    alice = auth("alice", ACME)
    for path in (
        ME,
        f"{ME}/versions",
        f"{ME}/versions/5",
        f"{ME}/policy-actions",
        "/v1/chats/chat-1/messages",
        "/v1/me/memory/enablement?space_id=space-1",
    ):
        here, there = await client.get(path, headers=alice), await other.get(path, headers=alice)
        assert (there.status_code, _own_ids_out(there.json())) == (
            here.status_code,
            _own_ids_out(here.json()),
        ), path


def _own_ids_out(body: Any) -> Any:
    """A page of chat messages without their ids: each deployment numbers the messages it
    stores (an import too; on a Citus cluster from the sequence range of the node that writes
    them), in the order they were saved."""
    if isinstance(body, dict) and isinstance(body.get("items"), list):
        items = [
            {k: v for k, v in item.items() if k != "id"} if "turn_id" in item else item
            for item in body["items"]
        ]
        return body | {"items": items}
    return body
