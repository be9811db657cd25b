"""Test helpers for the settings tests: set flags and spaces over HTTP, seed a user's memory
directly in the database, and read counts back."""

from __future__ import annotations

import uuid
from typing import Any

import httpx
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.auth import Principal
from app.enablement.decision import FLAG_ALLOW_WITH_WEB_SEARCH, FLAG_CONTEXT_MEMORY
from app.folders import service as folders
from app.profiles import service as profiles
from tests.conftest import AuthFactory

COMPANY = "acme"
OPERATOR = ("operator",)
SPACE_ADMIN = ("space_admin",)
PENDING = ("queued", "retrying", "running")
FINISHED = ("succeeded", "dead")


def sessions(app: FastAPI) -> async_sessionmaker[AsyncSession]:
    maker: async_sessionmaker[AsyncSession] = app.state.database.sessionmaker
    return maker


async def set_flag(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    flag: str,
    enabled: bool,
    company: str = COMPANY,
) -> None:
    response = await client.put(
        f"/v1/companies/{company}/feature-flags/{flag}",
        json={"enabled": enabled},
        headers=auth("olga", "platform", OPERATOR),
    )
    assert response.status_code == 200, response.text


async def enable_company(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    company: str = COMPANY,
    *,
    allow_with_web_search: bool = False,
) -> None:
    await set_flag(client, auth, FLAG_CONTEXT_MEMORY, True, company)
    if allow_with_web_search:
        await set_flag(client, auth, FLAG_ALLOW_WITH_WEB_SEARCH, True, company)


async def patch_space(
    client: httpx.AsyncClient,
    auth: AuthFactory,
    space_id: str,
    body: dict[str, Any],
    company: str = COMPANY,
) -> httpx.Response:
    return await client.patch(
        f"/v1/spaces/{space_id}", json=body, headers=auth("sam", company, SPACE_ADMIN)
    )


async def scalar(app: FastAPI, sql: str, **params: Any) -> Any:
    async with sessions(app)() as session:
        return (await session.execute(text(sql), params)).scalar_one()


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
