"""`POST /v1/me/memory/import`: a user sends back the document `GET /v1/me/memory/export`
answered (here, or on another deployment) and its profile becomes their memory, as one new
version written like their own `PUT`: the same checks, the same memory policy (strict, naming
the line), the same conditional headers, which are optional here."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import FastAPI

from app.portability.schemas import ExportedProfileIn, MemoryImportIn
from app.profiles.document import Section, parse
from app.profiles.schemas import MemoryExportOut, MemoryOut
from tests.helpers.apps import AuthFactory
from tests.helpers.memory import ME, put_memory, versions
from tests.helpers.profiles import bullets, memory_md
from tests.helpers.settings import patch_user_settings
from tests.helpers.snapshots import changed_tables, database_digest

IMPORT = f"{ME}/import"


async def _export(client: httpx.AsyncClient, headers: dict[str, str]) -> dict[str, Any]:
    response = await client.get(f"{ME}/export", headers=headers)
    assert response.status_code == 200, response.text
    document: dict[str, Any] = response.json()
    return document


async def test_a_users_export_becomes_their_memory_elsewhere(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    """Exported by alice of acme, imported by alice of initech (another deployment's company,
    here the same database): her profile, as a first version of her own there."""
    version = await put_memory(client, auth, memory_md({Section.WORK: ["Risk analyst"]}))
    await put_memory(
        client,
        auth,
        memory_md({Section.WORK: ["Head of risk"], Section.SKILLS: ["SQL"]}),
        version=version,
    )
    document = await _export(client, auth("alice", "acme"))
    there = auth("alice", "initech")

    imported = await client.post(IMPORT, json=document, headers=there)

    assert imported.status_code == 201, imported.text
    assert imported.headers["etag"] == '"1"'
    content = imported.json()["content"]
    assert bullets(content, "Work Context") == ["Head of risk"]
    assert bullets(content, "Skills & Expertise") == ["SQL"]
    assert parse(content).frontmatter.user_id == "alice"
    assert (await client.get(ME, headers=there)).json()["content"] == content
    history = await client.get(f"{ME}/versions", headers=there)
    assert [(v["version"], v["reason"]) for v in history.json()["items"]] == [(1, "user_edit")]


async def test_an_import_over_a_profile_is_a_new_version_and_the_same_one_is_none(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await put_memory(client, auth, memory_md({Section.WORK: ["Risk analyst"]}))
    saved = await _export(client, auth())
    await put_memory(client, auth, memory_md({Section.WORK: ["Something else"]}), version=1)

    restored = await client.post(IMPORT, json=saved, headers=auth())
    again = await client.post(IMPORT, json=saved, headers=auth())

    assert (restored.status_code, restored.json()["version"]) == (200, 3)
    assert bullets(restored.json()["content"], "Work Context") == ["Risk analyst"]
    assert (again.status_code, again.json()["version"]) == (200, 3)


async def test_conditional_headers_work_as_for_put(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await put_memory(client, auth, memory_md({Section.WORK: ["Risk analyst"]}))
    document = await _export(client, auth())
    document["profile"]["content"] = memory_md({Section.WORK: ["Imported"]})

    only_new = await client.post(IMPORT, json=document, headers={**auth(), "If-None-Match": "*"})
    stale = await client.post(IMPORT, json=document, headers={**auth(), "If-Match": '"7"'})
    current = await client.post(IMPORT, json=document, headers={**auth(), "If-Match": '"1"'})

    assert (only_new.status_code, stale.status_code, current.status_code) == (412, 412, 200)


async def test_what_cannot_be_imported_is_a_422_naming_it_in_the_export(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await put_memory(client, auth, memory_md({Section.WORK: ["Risk analyst"]}))
    document = await _export(client, auth())
    card = memory_md({Section.IDENTITY: ["Pays with card 4111 1111 1111 1111"]})
    cases = {
        "no profile": ({**document, "profile": None}, "body.profile", None),
        "not a profile": (
            {**document, "profile": {"content": "# Notes\n- x\n"}},
            "body.profile.content",
            None,
        ),
        "a card number": (
            {**document, "profile": {"content": card}},
            "body.profile.content",
            "memory_policy.payment_cards",
        ),
        "an unknown field": ({**document, "owner": "bob"}, "body.owner", None),
    }
    before = await database_digest(app)
    for name, (body, field, kind) in cases.items():
        response = await client.post(IMPORT, json=body, headers=auth())
        assert response.status_code == 422, (name, response.text)
        errors = response.json()["errors"]
        assert [error["field"] for error in errors] == [field], name
        if kind is not None:
            assert errors[0]["type"] == kind
            assert "4111" not in response.text
    assert changed_tables(before, await database_digest(app)) == []
    assert len(await versions(app)) == 1


async def test_an_opted_out_user_imports_nothing(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await put_memory(client, auth, memory_md({Section.WORK: ["Risk analyst"]}))
    document = await _export(client, auth())
    await patch_user_settings(client, auth, {"context_memory": False}, expect=200)

    response = await client.post(IMPORT, json=document, headers=auth())

    assert response.status_code == 409, response.text
    assert await versions(app) == []


def test_the_import_takes_the_export_document_as_it_is() -> None:
    """Every field the export writes is a field the import accepts, and nothing more."""
    assert set(MemoryImportIn.model_fields) == set(MemoryExportOut.model_fields)
    assert set(ExportedProfileIn.model_fields) == set(MemoryOut.model_fields)
