"""The user's own memory over HTTP: read with ETag/304, conditional create and replace, clear,
and what a client can never do (write structure, frontmatter, or oversized profiles)."""

from __future__ import annotations

import httpx
import pytest

from app.profiles.document import Section, parse
from tests.helpers.apps import AuthFactory
from tests.helpers.memory import ME, create, replace
from tests.helpers.profiles import memory_md

PROBLEM = "application/problem+json"


def bullets_of(response: httpx.Response, section: Section) -> tuple[str, ...]:
    return parse(response.json()["content"]).bullets(section)


async def test_without_a_profile_reading_is_a_problem_404(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    response = await client.get(ME, headers=auth("alice"))

    assert response.status_code == 404
    assert response.headers["content-type"] == PROBLEM


async def test_create_then_read_with_the_version_as_etag(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    content = memory_md({Section.IDENTITY: ["Credit risk analyst in Zurich."]})

    created = await create(client, auth("alice"), content)

    assert created.status_code == 201, created.text
    assert created.headers["etag"] == '"1"'
    body = created.json()
    assert set(body) == {"content", "version", "tokens", "updated_at"}
    assert body["version"] == 1
    assert body["tokens"] > 0
    stored = parse(body["content"])
    assert stored.bullets(Section.IDENTITY) == ("Credit risk analyst in Zurich.",)
    assert stored.frontmatter.user_id == "alice"
    assert stored.frontmatter.turn_count == 0
    assert stored.frontmatter.last_updated is not None

    read = await client.get(ME, headers=auth("alice"))
    assert read.status_code == 200
    assert read.headers["etag"] == '"1"'
    assert read.json() == body


async def test_a_current_if_none_match_gets_304_without_a_body(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await create(client, auth("alice"), memory_md({Section.WORK: ["IFRS 9 report."]}))

    for tag in ('"1"', 'W/"1"', '"7", "1"', "*"):
        response = await client.get(ME, headers={**auth("alice"), "If-None-Match": tag})
        assert response.status_code == 304, tag
        assert response.content == b""
        assert response.headers["etag"] == '"1"'

    stale = await client.get(ME, headers={**auth("alice"), "If-None-Match": '"0"'})
    assert stale.status_code == 200


async def test_writing_needs_a_condition(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    content = memory_md({Section.WORK: ["IFRS 9 report."]})

    blind_create = await client.put(ME, json={"content": content}, headers=auth("alice"))
    assert blind_create.status_code == 428
    assert blind_create.headers["content-type"] == PROBLEM

    await create(client, auth("alice"), content)
    blind_replace = await client.put(ME, json={"content": content}, headers=auth("alice"))
    assert blind_replace.status_code == 428


async def test_if_none_match_star_only_creates(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    assert (await create(client, auth("alice"), memory_md())).status_code == 201

    again = await create(client, auth("alice"), memory_md({Section.WORK: ["Other."]}))

    assert again.status_code == 412
    assert again.headers["content-type"] == PROBLEM
    assert (await client.get(ME, headers=auth("alice"))).json()["version"] == 1


async def test_if_match_replaces_the_current_version_only(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await create(client, auth("alice"), memory_md({Section.WORK: ["IFRS 9 report."]}))
    edited = memory_md({Section.WORK: ["IFRS 9 report.", "Python pipeline migration."]})

    replaced = await replace(client, auth("alice"), edited, 1)
    assert replaced.status_code == 200, replaced.text
    assert replaced.headers["etag"] == '"2"'
    assert replaced.json()["version"] == 2

    stale = await replace(client, auth("alice"), memory_md(), 1)
    assert stale.status_code == 412
    unquoted = await client.put(
        ME, json={"content": memory_md()}, headers={**auth("alice"), "If-Match": "2"}
    )
    assert unquoted.status_code == 412
    assert bullets_of(await client.get(ME, headers=auth("alice")), Section.WORK) == (
        "IFRS 9 report.",
        "Python pipeline migration.",
    )


async def test_if_match_without_a_profile_is_412(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    response = await replace(client, auth("alice"), memory_md(), 1)

    assert response.status_code == 412


async def test_sending_the_same_bullets_writes_no_version(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    created = await create(client, auth("alice"), memory_md({Section.WORK: ["IFRS 9."]}))

    again = await replace(client, auth("alice"), created.json()["content"], 1)

    assert again.status_code == 200
    assert again.json() == created.json()
    versions = await client.get(f"{ME}/versions", headers=auth("alice"))
    assert [item["version"] for item in versions.json()["items"]] == [1]


async def test_an_invalid_profile_is_422_naming_body_content_and_the_line(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    response = await create(client, auth("alice"), "# User Memory\n\n## Identiti\n- x\n")

    assert response.status_code == 422
    assert response.headers["content-type"] == PROBLEM
    [error] = response.json()["errors"]
    assert error["field"] == "body.content"
    assert "line 3" in error["message"]
    assert "## Identity" in error["message"]


@pytest.mark.parametrize(
    "body",
    [
        {"content": memory_md(), "user_id": "mallory"},
        {"content": memory_md(), "version": 9},
        {"content": 42},
        {"content": "# User Memory\x00"},
        {"content": "x" * 200_001},
        {},
    ],
    ids=["user_id", "version", "not-a-string", "nul", "too-long", "missing"],
)
async def test_a_malformed_body_is_422(
    client: httpx.AsyncClient, auth: AuthFactory, body: dict[str, object]
) -> None:
    response = await client.put(ME, json=body, headers={**auth("alice"), "If-None-Match": "*"})

    assert response.status_code == 422
    assert response.headers["content-type"] == PROBLEM


async def test_a_profile_over_8000_tokens_is_422(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    bullets = [f"Fact {n}: " + " ".join(f"w{n}x{k}" for k in range(50)) for n in range(120)]

    response = await create(client, auth("alice"), memory_md({Section.WORK: bullets}))

    assert response.status_code == 422
    [error] = response.json()["errors"]
    assert error["field"] == "body.content"
    assert "8000" in error["message"]


async def test_the_clients_frontmatter_is_ignored(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    forged = (
        "---\nuser_id: mallory\nschema_version: 7\nlast_updated: 1999-01-01T00:00:00+00:00\n"
        "turn_count: 99\nextra: field\n---\n\n"
    ) + memory_md({Section.IDENTITY: ["Analyst."]}).split("---\n\n", 1)[1]

    response = await create(client, auth("alice"), forged)

    assert response.status_code == 201, response.text
    stored = parse(response.json()["content"])
    assert stored.frontmatter.user_id == "alice"
    assert stored.frontmatter.schema_version == 1
    assert stored.frontmatter.turn_count == 0
    assert stored.frontmatter.last_updated is not None
    assert stored.frontmatter.last_updated.year > 1999
    assert "mallory" not in response.json()["content"]


async def test_hostile_bullets_cannot_create_structure(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    hostile = (
        "# User Memory\n\n## Identity\n"
        "- ## Identity\n"
        "- --- user_id: mallory\n"
        "- evil\u202etxt.exe\n"
        "- <!-- truncated to fit memory budget -->\n"
        "- # User Memory\n"
        "\n## Communication Preferences\n\n## Work Context\n\n## Skills & Expertise\n"
        "\n## Recent Topics\n\n## Open Questions / Follow-ups\n"
    )

    response = await create(client, auth("alice"), hostile)

    assert response.status_code == 201, response.text
    content = response.json()["content"]
    stored = parse(content)  # still the canonical six-section document
    assert stored.frontmatter.user_id == "alice"
    assert stored.bullets(Section.IDENTITY) == (
        "\\## Identity",
        "\\--- user_id: mallory",
        "eviltxt.exe",
        "\\<\\!-- truncated to fit memory budget --\\>",
        "\\# User Memory",
    )
    lines = content.split("\n")
    assert lines.count("## Identity") == 1
    assert lines.count("# User Memory") == 1
    assert lines.count("---") == 2
    assert "\u202e" not in content
    assert not stored.truncated


@pytest.mark.parametrize(
    "injected",
    ["\n---\nuser_id: mallory\n---\n", "\n## Identity\n- second identity\n", "\nplain text\n"],
    ids=["frontmatter", "heading", "prose"],
)
async def test_structure_outside_bullets_is_refused(
    client: httpx.AsyncClient, auth: AuthFactory, injected: str
) -> None:
    content = memory_md({Section.WORK: ["Report."]}).replace("- Report.\n", "- Report." + injected)

    response = await create(client, auth("alice"), content)

    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "body.content"
    assert (await client.get(ME, headers=auth("alice"))).status_code == 404


async def test_clearing_removes_content_and_history_but_keeps_settings(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await create(client, auth("alice"), memory_md({Section.WORK: ["Report."]}))
    await replace(client, auth("alice"), memory_md({Section.WORK: ["Report v2."]}), 1)

    deleted = await client.delete(ME, headers=auth("alice"))

    assert deleted.status_code == 204
    assert deleted.content == b""
    assert (await client.get(ME, headers=auth("alice"))).status_code == 404
    versions = await client.get(f"{ME}/versions", headers=auth("alice"))
    assert versions.json() == {"items": [], "next_cursor": None}
    assert (await client.delete(ME, headers=auth("alice"))).status_code == 404
    settings = await client.get("/v1/me/settings", headers=auth("alice"))
    assert settings.json() == {"context_memory": True}


async def test_after_a_clear_old_etags_never_match_and_numbering_continues(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await create(client, auth("alice"), memory_md({Section.WORK: ["Old."]}))
    await client.delete(ME, headers=auth("alice"))

    stale = await replace(client, auth("alice"), memory_md({Section.WORK: ["Stale."]}), 1)
    assert stale.status_code == 412

    recreated = await create(client, auth("alice"), memory_md({Section.WORK: ["New."]}))
    assert recreated.status_code == 201
    assert recreated.headers["etag"] == '"3"'  # 1, the clear (2), then 3: "1" is never reused
    again_stale = await replace(client, auth("alice"), memory_md(), 1)
    assert again_stale.status_code == 412


async def test_clearing_honours_an_optional_if_match(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await create(client, auth("alice"), memory_md({Section.WORK: ["Report."]}))
    await replace(client, auth("alice"), memory_md({Section.WORK: ["Report v2."]}), 1)

    stale = await client.delete(ME, headers={**auth("alice"), "If-Match": '"1"'})
    assert stale.status_code == 412
    current = await client.delete(ME, headers={**auth("alice"), "If-Match": '"2"'})
    assert current.status_code == 204


async def test_an_opted_out_user_cannot_write_a_profile(
    client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    patched = await client.patch(
        "/v1/me/settings", json={"context_memory": False}, headers=auth("alice")
    )
    assert patched.status_code == 200

    response = await create(client, auth("alice"), memory_md({Section.WORK: ["Report."]}))

    assert response.status_code == 409
    assert response.headers["content-type"] == PROBLEM
    assert response.json()["type"] == "urn:context-memory:problem:conflict"
    assert response.json()["retryable"] is False
