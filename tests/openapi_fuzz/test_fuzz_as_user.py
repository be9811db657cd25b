"""schemathesis, every check and phase, as a plain user: the service answers exactly what its
OpenAPI says (tests/helpers/openapi_fuzz.py)."""

from __future__ import annotations

from typing import Any

import httpx
from fastapi import FastAPI

from tests.helpers.apps import COMPANY, AuthFactory
from tests.helpers.openapi_fuzz import fuzz_as


async def test_the_service_answers_exactly_what_its_openapi_says_to_user(
    client: httpx.AsyncClient, auth: AuthFactory, make_token: Any, fuzzed_app: FastAPI
) -> None:
    await fuzz_as(client, auth, make_token("alice", COMPANY, ()), fuzzed_app)
