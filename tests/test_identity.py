"""Who-am-I and the CLI token: identity comes only from the verified token."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx

from app.kit.config import PROJECT_ROOT
from tests.helpers.apps import TEST_JWT_SECRET, AuthFactory, TokenFactory


async def test_me_reports_the_token_identity(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    response = await client.get("/v1/me", headers=auth("alice", "acme", ("operator",)))
    assert response.status_code == 200
    assert response.json() == {"user_id": "alice", "company_id": "acme", "roles": ["operator"]}


async def test_unknown_roles_are_dropped(
    client: httpx.AsyncClient, make_token: TokenFactory
) -> None:
    token = make_token("alice", "acme", ("operator", "superuser"))
    response = await client.get("/v1/me", headers={"Authorization": f"Bearer {token}"})
    assert response.json()["roles"] == ["operator"]


async def test_cli_token_is_accepted(client: httpx.AsyncClient) -> None:
    env = {"JWT_SECRET": TEST_JWT_SECRET, "PATH": "/usr/bin:/bin", "ENVIRONMENT": "test"}
    result = await asyncio.to_thread(
        subprocess.run,
        [
            sys.executable,
            "-m",
            "app",
            "token",
            "--sub",
            "alice",
            "--company",
            "acme",
            "--role",
            "space_admin",
        ],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    token = result.stdout.strip()
    response = await client.get("/v1/me", headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 200
    assert response.json() == {"user_id": "alice", "company_id": "acme", "roles": ["space_admin"]}
