"""A user's memory in the service: the user's own edits over HTTP, memory seeded in the database
as the services store it, and what the database holds for a user read back."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import text

from app.folders import service as folders
from app.kit.principal import Principal
from app.profiles import service as profiles
from app.profiles.document import Frontmatter, Section, render, render_body
from tests.helpers.apps import COMPANY, USER, AuthFactory
from tests.helpers.db import rows, scalar, sessions
from tests.helpers.profiles import STORED_COUNTER, profile_of

ME = "/v1/me/memory"
PENDING = ("queued", "retrying", "running")
FINISHED = ("succeeded", "dead")


# --- the user's own edits over HTTP -------------------------------------------------------------


async def create(
    client: httpx.AsyncClient, headers: dict[str, str], content: str
) -> httpx.Response:
    """Create memory.md (If-None-Match: *)."""
    return await client.put(
        ME, json={"content": content}, headers={**headers, "If-None-Match": "*"}
    )


async def replace(
    client: httpx.AsyncClient, headers: dict[str, str], content: str, version: int
) -> httpx.Response:
    """Replace memory.md at `version` (If-Match)."""
    return await client.put(
        ME, json={"content": content}, headers={**headers, "If-Match": f'"{version}"'}
    )


async def put_memory(
    client: httpx.AsyncClient, auth: AuthFactory, content: str, *, version: int | None = None
) -> int:
    """The user's own edit (create without `version`, else replace it); the new version."""
    headers = auth(USER)
    if version is None:
        response = await create(client, headers, content)
    else:
        response = await replace(client, headers, content, version)
    assert response.status_code in (200, 201), response.text
    return int(response.json()["version"])


# --- memory seeded in the database --------------------------------------------------------------


async def seed_memory(
    app: FastAPI,
    user_id: str,
    company_id: str = COMPANY,
    *,
    versions: int = 3,
    job_statuses: tuple[str, ...] = PENDING + FINISHED,
    content: str = "# User Memory\n\n## Identity\n- secret project falcon\n",
) -> uuid.UUID:
    """A user's folder, memory.md, `versions` versions and one job per status; the folder id."""
    principal = Principal(user_id=user_id, company_id=company_id, roles=frozenset())
    async with sessions(app)() as session, session.begin():
        folder_id, _ = await folders.ensure_user_folder(session, principal)
        await profiles.ensure_memory_file(session, company_id, user_id, folder_id)
        for version in range(1, versions + 1):
            await session.execute(
                text(
                    "INSERT INTO memory_versions (company_id, user_id, version, content, sha256,"
                    " tokens, reason) VALUES (:c, :u, :v, :content, :sha, 10, 'consolidation')"
                ),
                {"c": company_id, "u": user_id, "v": version, "content": content, "sha": "0" * 64},
            )
        await session.execute(
            text(
                "UPDATE memory_files SET head_version = :v WHERE company_id = :c AND user_id = :u"
            ),
            {"c": company_id, "u": user_id, "v": versions},
        )
        for status in job_statuses:
            await session.execute(
                text(
                    "INSERT INTO jobs (company_id, id, user_id, kind, status, max_attempts)"
                    " VALUES (:c, :id, :u, 'consolidation', :s, 5)"
                ),
                {"c": company_id, "id": uuid.uuid4(), "u": user_id, "s": status},
            )
    return folder_id


async def seed_profile(
    app: FastAPI,
    user_id: str,
    bullets: dict[Section, list[str]],
    *,
    company: str = COMPANY,
    version: int = 1,
) -> str:
    """The user's folder (through the folders service), memory.md and one head version, stored
    as the profile service stores them (`tokens` of the body); returns the document."""
    frontmatter = Frontmatter(
        user_id=user_id, last_updated=datetime(2026, 11, 1, tzinfo=UTC), turn_count=1
    )
    profile = profile_of(bullets, frontmatter)
    document = render(profile)
    principal = Principal(user_id=user_id, company_id=company, roles=frozenset())
    async with sessions(app)() as session, session.begin():
        folder_id, _ = await folders.ensure_user_folder(session, principal)
        await profiles.ensure_memory_file(session, company, user_id, folder_id)
        await session.execute(
            text(
                "INSERT INTO memory_versions (company_id, user_id, version, content, sha256,"
                " tokens, reason) VALUES (:c, :u, :v, :content, :sha, :tokens, 'consolidation')"
            ),
            {
                "c": company,
                "u": user_id,
                "v": version,
                "content": document,
                "sha": "0" * 64,
                "tokens": STORED_COUNTER.count(render_body(profile)),
            },
        )
        await session.execute(
            text(
                "UPDATE memory_files SET head_version = :v WHERE company_id = :c AND user_id = :u"
            ),
            {"c": company, "u": user_id, "v": version},
        )
    return document


# --- read back ----------------------------------------------------------------------------------


async def versions(app: FastAPI, user: str = USER) -> list[Any]:
    """The user's stored versions, oldest first."""
    return await rows(
        app,
        "SELECT version, content, reason, operations, source_turn_ids, model, tokens_in,"
        " tokens_out, job_id, tokens FROM memory_versions WHERE company_id = 'acme'"
        " AND user_id = :u ORDER BY version",
        u=user,
    )


async def head_content(app: FastAPI, user: str = USER) -> str | None:
    found = await versions(app, user)
    return None if not found else str(found[-1].content)


async def root_folders(app: FastAPI, company: str = COMPANY) -> int:
    """How many `user-memory` root folders the company has (zero or one)."""
    sql = "SELECT count(*) FROM folders WHERE company_id = :c AND path = 'user-memory'"
    count: int = await scalar(app, sql, c=company)
    return count


async def memory_counts(app: FastAPI, user_id: str, company_id: str = COMPANY) -> dict[str, int]:
    """How many rows of each kind the database holds for the user."""
    params = {"c": company_id, "u": user_id, "path": f"user-memory/{user_id}"}
    where = "company_id = :c AND user_id = :u"
    return {
        "folders": await scalar(
            app, "SELECT count(*) FROM folders WHERE company_id = :c AND path = :path", **params
        ),
        "acl": await scalar(
            app,
            "SELECT count(*) FROM folder_acl a JOIN folders f"
            " ON f.company_id = a.company_id AND f.id = a.folder_id"
            " WHERE f.company_id = :c AND f.path = :path",
            **params,
        ),
        "files": await scalar(app, f"SELECT count(*) FROM memory_files WHERE {where}", **params),  # noqa: S608
        "versions": await scalar(
            app,
            f"SELECT count(*) FROM memory_versions WHERE {where}",  # noqa: S608
            **params,
        ),
        "pending_jobs": await scalar(
            app,
            f"SELECT count(*) FROM jobs WHERE {where}"  # noqa: S608
            " AND status IN ('queued', 'retrying', 'running')",
            **params,
        ),
        "finished_jobs": await scalar(
            app,
            f"SELECT count(*) FROM jobs WHERE {where} AND status IN ('succeeded', 'dead')",  # noqa: S608
            **params,
        ),
    }
