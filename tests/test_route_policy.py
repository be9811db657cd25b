"""Every route declares who may call it; this test fails for a route without a policy.

Policies:
- public:      no token needed (operations, docs)
- user:        any valid token; no token -> 401
- space_admin: role space_admin; no token -> 401, plain user -> 403
- operator:    role operator; no token -> 401, plain user -> 403
- company_read: operator, or a space_admin of that company (read-only); no token -> 401,
               plain user -> 403, space admin of another company -> 404
- company_operator: operator, or a company_operator of that company; no token -> 401, plain
               user or space admin -> 403, company operator of another company -> 404
"""

from __future__ import annotations

import re

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts

from tests.helpers.apps import AuthFactory

# (method, path template) -> policy. Add a row for every route you add.
ROUTE_POLICIES: dict[tuple[str, str], str] = {
    ("GET", "/healthz"): "public",
    ("GET", "/readyz"): "public",
    ("GET", "/metrics"): "public",
    ("GET", "/openapi.json"): "public",
    ("GET", "/docs"): "public",
    ("GET", "/docs/oauth2-redirect"): "public",
    ("GET", "/redoc"): "public",
    ("GET", "/docs/assets/swagger-ui-bundle.js"): "public",
    ("GET", "/docs/assets/swagger-ui.css"): "public",
    ("GET", "/docs/assets/redoc.standalone.js"): "public",
    ("GET", "/docs/assets/favicon.png"): "public",
    # the memory page holds no data: it calls /v1/me/* with the user's token
    ("GET", "/ui/memory"): "public",
    ("GET", "/ui/assets/memory.css"): "public",
    ("GET", "/ui/assets/memory.js"): "public",
    ("GET", "/ui/assets/signin.js"): "public",
    ("GET", "/ui/admin"): "public",
    ("GET", "/ui/assets/admin.css"): "public",
    ("GET", "/ui/assets/admin.js"): "public",
    ("GET", "/ui/config.json"): "public",
    # how MCP clients find where to sign in (RFC 9728): public by definition
    ("GET", "/.well-known/oauth-protected-resource"): "public",
    ("GET", "/.well-known/oauth-protected-resource/mcp"): "public",
    ("GET", "/v1/me"): "user",
    ("DELETE", "/v1/me"): "user",
    ("POST", "/v1/chats/{chat_id}/context"): "user",
    ("POST", "/v1/chats/{chat_id}/turns"): "user",
    ("GET", "/v1/chats/{chat_id}/messages"): "user",
    ("DELETE", "/v1/chats/{chat_id}"): "user",
    ("GET", "/v1/companies/{company_id}/feature-flags"): "company_operator",
    ("PUT", "/v1/companies/{company_id}/feature-flags/{flag}"): "company_operator",
    ("GET", "/v1/companies/{company_id}/audit-events"): "company_operator",
    ("GET", "/v1/companies/{company_id}/export"): "operator",
    ("POST", "/v1/companies/{company_id}/import"): "operator",
    ("GET", "/v1/companies/{company_id}/memory-policy"): "company_operator",
    ("PUT", "/v1/companies/{company_id}/memory-policy"): "company_operator",
    ("GET", "/v1/companies/{company_id}/usage"): "company_operator",
    ("GET", "/v1/companies/{company_id}/model-budget"): "company_operator",
    ("PUT", "/v1/companies/{company_id}/model-budget"): "company_operator",
    ("GET", "/v1/companies/{company_id}/rate-limits"): "company_operator",
    ("PUT", "/v1/companies/{company_id}/rate-limits"): "company_operator",
    ("GET", "/v1/spaces/{space_id}"): "space_admin",
    ("PATCH", "/v1/spaces/{space_id}"): "space_admin",
    ("GET", "/v1/me/settings"): "user",
    ("PATCH", "/v1/me/settings"): "user",
    ("GET", "/v1/me/memory/enablement"): "user",
    ("GET", "/v1/me/memory"): "user",
    ("PUT", "/v1/me/memory"): "user",
    ("DELETE", "/v1/me/memory"): "user",
    ("GET", "/v1/me/memory/versions"): "user",
    ("GET", "/v1/me/memory/versions/{n}"): "user",
    ("GET", "/v1/me/memory/versions/{n}/diff"): "user",
    ("POST", "/v1/me/memory/versions/{n}/restore"): "user",
    ("GET", "/v1/me/memory/export"): "user",
    ("POST", "/v1/me/memory/import"): "user",
    ("GET", "/v1/me/memory/policy-actions"): "user",
    ("GET", "/v1/companies/{company_id}/folders/user-memory"): "company_read",
    ("GET", "/v1/jobs/{job_id}"): "user",
    ("POST", "/v1/me/memory/consolidations"): "user",
    ("GET", "/v1/companies/{company_id}/jobs"): "company_operator",
    ("POST", "/v1/companies/{company_id}/jobs/{job_id}/retry"): "company_operator",
    ("POST", "/mcp"): "user",
    # the control plane: platform operators, and each company's own operators
    ("GET", "/v1/companies"): "operator",
    ("POST", "/v1/companies"): "operator",
    ("GET", "/v1/companies/{company_id}"): "company_operator",
    ("DELETE", "/v1/companies/{company_id}"): "operator",
    ("GET", "/v1/companies/{company_id}/offboarding"): "operator",
    ("DELETE", "/v1/companies/{company_id}/users/{user_id}"): "company_operator",
    ("GET", "/v1/companies/{company_id}/spaces"): "company_operator",
    ("GET", "/v1/companies/{company_id}/spaces/{space_id}/settings"): "company_operator",
    ("PUT", "/v1/companies/{company_id}/spaces/{space_id}/settings"): "company_operator",
}

# The `WWW-Authenticate` of a 401 where it says more than `Bearer`: /mcp names its resource
# metadata (RFC 9728 §5.1), from which MCP clients find where to sign in.
CHALLENGES: dict[tuple[str, str], str] = {
    ("POST", "/mcp"): (
        'Bearer resource_metadata="http://testserver/.well-known/oauth-protected-resource/mcp"'
    ),
}


def challenge_of(route: tuple[str, str]) -> str:
    """The challenge of the route's 401 to a client of `http://testserver`."""
    return CHALLENGES.get(route, "Bearer")


SAMPLE_PATH_VALUES = {
    "company_id": "acme",
    "space_id": "space-1",
    "chat_id": "chat-1",
    "job_id": "00000000-0000-0000-0000-000000000000",
    "flag": "FEATURE_FLAG_ENABLE_CONTEXT_MEMORY_UN_22033",
    "n": "1",
    "user_id": "bob",
}


def app_routes(app: FastAPI) -> set[tuple[str, str]]:
    routes: set[tuple[str, str]] = set()
    for context in iter_route_contexts(app.routes):
        methods = getattr(context.original_route, "methods", None) or set()
        for method in methods:
            if method != "HEAD":
                routes.add((method, str(context.path)))
    return routes


def concrete(path: str) -> str:
    return re.sub(r"\{(\w+)(:\w+)?\}", lambda m: SAMPLE_PATH_VALUES.get(m.group(1), "x"), path)


def test_every_route_has_a_policy(app: FastAPI) -> None:
    missing = app_routes(app) - ROUTE_POLICIES.keys()
    assert not missing, f"routes without a declared policy: {sorted(missing)}"
    stale = ROUTE_POLICIES.keys() - app_routes(app)
    assert not stale, f"policies for routes that no longer exist: {sorted(stale)}"


PROTECTED = sorted(key for key, policy in ROUTE_POLICIES.items() if policy != "public")


@pytest.mark.parametrize(("method", "path"), PROTECTED)
async def test_protected_routes_need_a_token(
    client: httpx.AsyncClient, method: str, path: str
) -> None:
    response = await client.request(method, concrete(path))
    assert response.status_code == 401
    assert response.headers["www-authenticate"] == challenge_of((method, path))
    assert response.headers["content-type"] == "application/problem+json"


ROLE_ROUTES = sorted(
    key
    for key, policy in ROUTE_POLICIES.items()
    if policy in {"space_admin", "operator", "company_read", "company_operator"}
)


@pytest.mark.parametrize(("method", "path"), ROLE_ROUTES)
async def test_role_routes_refuse_a_plain_user(
    client: httpx.AsyncClient, auth: AuthFactory, method: str, path: str
) -> None:
    response = await client.request(method, concrete(path), headers=auth("mallory", "acme"))
    assert response.status_code == 403


COMPANY_READ = sorted(k for k, p in ROUTE_POLICIES.items() if p == "company_read")


@pytest.mark.parametrize(("method", "path"), COMPANY_READ)
async def test_space_admin_of_another_company_gets_404(
    client: httpx.AsyncClient, auth: AuthFactory, method: str, path: str
) -> None:
    headers = auth("eve", "other-co", ("space_admin",))
    response = await client.request(method, concrete(path), headers=headers)
    assert response.status_code == 404


COMPANY_OPERATOR = sorted(k for k, p in ROUTE_POLICIES.items() if p == "company_operator")


@pytest.mark.parametrize(("method", "path"), COMPANY_OPERATOR)
async def test_a_company_operator_of_another_company_gets_404(
    client: httpx.AsyncClient, auth: AuthFactory, method: str, path: str
) -> None:
    headers = auth("eve", "other-co", ("company_operator",))
    response = await client.request(method, concrete(path), headers=headers)
    assert response.status_code == 404
    assert response.headers["content-type"] == "application/problem+json"


@pytest.mark.parametrize(("method", "path"), COMPANY_OPERATOR)
async def test_a_space_admin_is_no_company_operator(
    client: httpx.AsyncClient, auth: AuthFactory, method: str, path: str
) -> None:
    response = await client.request(
        method, concrete(path), headers=auth("sam", "acme", ("space_admin",))
    )
    assert response.status_code == 403


@pytest.mark.parametrize(
    ("method", "path"), sorted(k for k, p in ROUTE_POLICIES.items() if p == "public")
)
async def test_public_routes_answer_without_a_token(
    client: httpx.AsyncClient, method: str, path: str
) -> None:
    response = await client.request(method, concrete(path))
    assert response.status_code == 200
