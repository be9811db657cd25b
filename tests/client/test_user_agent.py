"""The client's version is said once, in client/pyproject.toml: `__version__` and the
`User-Agent` every request carries are read from the installed package's metadata."""

from __future__ import annotations

import tomllib

import context_memory_client
from context_memory_client import MemoryClient

from app.kit.config import PROJECT_ROOT
from tests.client.conftest import served_front
from tests.helpers.apps import COMPANY, TokenFactory

PYPROJECT = PROJECT_ROOT / "client" / "pyproject.toml"


def declared_version() -> str:
    version: str = tomllib.loads(PYPROJECT.read_text("utf-8"))["project"]["version"]
    return version


def test_the_package_version_is_the_one_client_pyproject_declares() -> None:
    assert context_memory_client.__version__ == declared_version(), (
        "the installed client is not the one client/pyproject.toml describes: reinstall it "
        "(`make` does when client/pyproject.toml changes)"
    )


def test_every_request_names_the_client_and_its_version_in_the_user_agent(
    database_url: str, make_token: TokenFactory
) -> None:
    with (
        served_front(database_url, make_token, "/v1/me", []) as (front, url),
        MemoryClient(url, make_token("alice", COMPANY)) as memory,
    ):
        memory.get_me()
    assert front.requests[0]["user-agent"] == f"context-memory-client/{declared_version()}"
