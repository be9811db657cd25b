"""Trusted OpenID issuers against a real OpenID Provider (oidc-provider, run by Node): access
tokens obtained by the authorization code flow with PKCE reach `/v1/me` as the user, company
and roles the issuer's entry of AUTH_ISSUERS maps them to, and a live key rotation at the
provider refuses no valid token.

Two providers play two identity providers: a company's own (Keycloak-like: the company and the
roles in claims) and the platform's (Zitadel-like: one fixed company, project roles as an
object, allowed to grant `operator`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import jwt
import pytest
from fastapi import FastAPI

from tests.helpers.apps import app_with, client_of
from tests.helpers.identity_provider import (
    IdentityProvider,
    IdentityProviderError,
    OAuthClient,
    identity_provider_fixture,  # noqa: F401 - the `identity_provider` fixture
    public_client,
)
from tests.helpers.metrics import sample
from tests.helpers.polling import wait_until

ZITADEL_ROLES = "urn:zitadel:iam:org:project:roles"


def claims_of(token: str) -> dict[str, Any]:
    """The claims of `token`, read without verifying it."""
    claims: dict[str, Any] = jwt.decode(token, options={"verify_signature": False})
    return claims


PLATFORM_COMPANY = "acme"

COMPANY_ACCOUNTS: dict[str, dict[str, Any]] = {
    "dana": {"org": {"id": "globex"}, "realm_access": {"roles": ["memory-admin", "viewer"]}},
    "olga": {
        "org": {"id": "globex"},
        "realm_access": {"roles": ["platform-operator", "memory-admin"]},
    },
    "sam": {"org": {"id": "globex"}, "realm_access": {"roles": ["space_admin", "operator", "x"]}},
    "mallory": {"org": {"id": PLATFORM_COMPANY}, "realm_access": {"roles": ["memory-admin"]}},
}
PLATFORM_ACCOUNTS: dict[str, dict[str, Any]] = {
    # the org claim is not where this issuer's company comes from: it is ignored
    "zoe": {"org": {"id": "globex"}, ZITADEL_ROLES: {"admin": {"2894": "acme.example"}}},
    "pat": {ZITADEL_ROLES: {"support": {"2894": "acme.example"}, "admin": {}}},
}

SPA_ORIGIN = "http://127.0.0.1:8765"
SPA_CLIENT = OAuthClient("memory-page", f"{SPA_ORIGIN}/ui/memory")


@pytest.fixture(scope="module")
async def company_idp() -> AsyncIterator[IdentityProvider]:
    spa = public_client(SPA_CLIENT.client_id, [SPA_CLIENT.redirect_uri])
    async with IdentityProvider(accounts=COMPANY_ACCOUNTS, clients=[spa]) as provider:
        yield provider


@pytest.fixture(scope="module")
async def platform_idp() -> AsyncIterator[IdentityProvider]:
    async with IdentityProvider(accounts=PLATFORM_ACCOUNTS) as provider:
        yield provider


def company_entry(idp: IdentityProvider, **fields: Any) -> dict[str, Any]:
    entry: dict[str, Any] = {
        "company_claim": "org.id",
        "roles_claim": "realm_access.roles",
        "role_map": {"memory-admin": "space_admin", "platform-operator": "operator"},
    }
    return idp.issuer_entry(**{**entry, **fields})


def platform_entry(idp: IdentityProvider) -> dict[str, Any]:
    return idp.issuer_entry(
        company=PLATFORM_COMPANY,
        roles_claim=ZITADEL_ROLES,
        role_map={"admin": "space_admin", "support": "operator"},
        platform=True,
    )


@asynccontextmanager
async def service(
    database_url: str, *issuers: dict[str, Any], **overrides: Any
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The service trusting `issuers` (it fetches their keys as it starts)."""
    async with (
        app_with(database_url, auth_issuers=list(issuers), **overrides) as app,
        client_of(app) as http,
    ):
        yield app, http


async def me(http: httpx.AsyncClient, token: str) -> httpx.Response:
    return await http.get("/v1/me", headers={"Authorization": f"Bearer {token}"})


# --- who the token says the caller is -------------------------------------------------------


@pytest.mark.parametrize("alg", ["RS256", "ES256"])
async def test_tokens_signed_with_rs256_and_es256_reach_me_as_the_mapped_user_company_and_roles(
    database_url: str, company_idp: IdentityProvider, alg: str
) -> None:
    token = await company_idp.access_token("dana", alg=alg)
    assert jwt.get_unverified_header(token)["alg"] == alg
    async with service(database_url, company_entry(company_idp)) as (_, http):
        response = await me(http, token)
    assert response.status_code == 200
    assert response.json() == {"user_id": "dana", "company_id": "globex", "roles": ["space_admin"]}


async def test_an_issuer_with_a_fixed_company_puts_its_users_there_whatever_their_claims_say(
    database_url: str, platform_idp: IdentityProvider
) -> None:
    token = await platform_idp.access_token("zoe", alg="ES256")
    assert claims_of(token)["org"] == {"id": "globex"}
    async with service(database_url, platform_entry(platform_idp)) as (_, http):
        response = await me(http, token)
    assert response.json()["company_id"] == PLATFORM_COMPANY


async def test_zitadel_project_roles_given_as_an_object_are_mapped_by_their_keys(
    database_url: str, platform_idp: IdentityProvider
) -> None:
    token = await platform_idp.access_token("zoe")
    async with service(database_url, platform_entry(platform_idp)) as (_, http):
        response = await me(http, token)
    assert response.json() == {"user_id": "zoe", "company_id": "acme", "roles": ["space_admin"]}


async def test_without_a_role_map_only_names_that_are_service_roles_pass(
    database_url: str, company_idp: IdentityProvider
) -> None:
    entry = company_entry(company_idp, role_map=None, platform=True)
    token = await company_idp.access_token("sam")
    async with service(database_url, entry) as (_, http):
        response = await me(http, token)
    assert response.json()["roles"] == ["operator", "space_admin"]


async def test_a_token_for_another_audience_is_refused(
    database_url: str, company_idp: IdentityProvider
) -> None:
    token = await company_idp.access_token("dana", audience="another-service")
    assert claims_of(token)["aud"] == "another-service"
    async with service(database_url, company_entry(company_idp)) as (_, http):
        assert (await me(http, token)).status_code == 401


async def test_a_token_signed_with_an_algorithm_its_issuer_entry_does_not_list_is_refused(
    database_url: str, company_idp: IdentityProvider
) -> None:
    token = await company_idp.access_token("dana", alg="RS256")
    entry = company_entry(company_idp, algorithms=["ES256"])
    async with service(database_url, entry) as (_, http):
        assert (await me(http, token)).status_code == 401


# --- confinement ------------------------------------------------------------------------------


async def test_a_company_issuer_cannot_make_anyone_operator_and_the_dropped_role_is_counted(
    database_url: str, company_idp: IdentityProvider
) -> None:
    token = await company_idp.access_token("olga")
    assert "platform-operator" in claims_of(token)["realm_access"]["roles"]
    async with service(database_url, company_entry(company_idp)) as (app, http):
        response = await me(http, token)
        dropped = sample(
            app.state.metrics,
            "auth_roles_dropped_total",
            issuer=company_idp.issuer,
            role="operator",
        )
    assert response.json() == {"user_id": "olga", "company_id": "globex", "roles": ["space_admin"]}
    assert dropped == 1


async def test_the_platform_issuer_can_make_someone_operator(
    database_url: str, company_idp: IdentityProvider, platform_idp: IdentityProvider
) -> None:
    token = await platform_idp.access_token("pat")
    issuers = (company_entry(company_idp), platform_entry(platform_idp))
    async with service(database_url, *issuers) as (_, http):
        response = await me(http, token)
    assert response.json() == {
        "user_id": "pat",
        "company_id": PLATFORM_COMPANY,
        "roles": ["operator", "space_admin"],
    }


async def test_a_company_claimed_by_one_issuer_but_owned_by_another_is_refused(
    database_url: str, company_idp: IdentityProvider, platform_idp: IdentityProvider
) -> None:
    token = await company_idp.access_token("mallory")
    issuers = (company_entry(company_idp), platform_entry(platform_idp))
    async with service(database_url, *issuers) as (_, http):
        refused = await me(http, token)
        # the same issuer's tokens for a company nobody owns still pass
        accepted = await me(http, await company_idp.access_token("dana"))
    assert refused.status_code == 401
    assert accepted.status_code == 200


# --- key rotation -----------------------------------------------------------------------------


async def test_a_live_key_rotation_under_load_refuses_no_valid_token(
    database_url: str, company_idp: IdentityProvider
) -> None:
    """Six callers sign in and call /v1/me with each new token at once, without pause, while
    the provider publishes a new key, signs with it and withdraws the old one."""
    alg = "RS256"
    outcomes: list[tuple[str, int]] = []  # (kid, status) of every token's first request
    rotated = asyncio.Event()

    async def caller(http: httpx.AsyncClient, login: str) -> None:
        after_rotation = 0
        while after_rotation < 3:
            token = await company_idp.access_token(login, alg=alg)
            kid = str(jwt.get_unverified_header(token)["kid"])
            outcomes.append((kid, (await me(http, token)).status_code))
            after_rotation += rotated.is_set()

    # The default refresh interval (30 s): the JWKS fetched as the service started a moment ago
    # does not hold back the fetch that the new key's first token needs.
    async with service(database_url, company_entry(company_idp)) as (_, http):
        fetches_before = await company_idp.jwks_requests()
        async with asyncio.TaskGroup() as callers:
            logins = ["dana", "olga"] * 3
            for login in logins:
                callers.create_task(caller(http, login))
            # under way: as many answers as callers, all with the old key, before the rotation
            await wait_until(lambda: len(outcomes) >= len(logins), what="the callers' answers")
            rotation = await company_idp.rotate(alg, pause=0.5)
            rotated.set()
        fetches = await company_idp.jwks_requests() - fetches_before

    statuses = [status for _, status in outcomes]
    kids = {kid for kid, _ in outcomes}
    assert statuses.count(200) == len(statuses), (
        f"refused: {statuses.count(401)} of {len(statuses)}"
    )
    assert {rotation.old_kid, rotation.new_kid} <= kids
    assert [key.kid for key in await company_idp.keys() if key.alg == alg] == [rotation.new_kid]
    assert 1 <= fetches <= 3  # one for the new key, not one per request


async def test_a_token_of_a_withdrawn_key_is_refused_once_the_keys_are_fetched_again(
    database_url: str, company_idp: IdentityProvider
) -> None:
    old_token = await company_idp.access_token("dana", alg="ES256")
    # the new key's token triggers the fetch that drops the withdrawn key
    async with service(database_url, company_entry(company_idp)) as (_, http):
        await company_idp.rotate("ES256")
        new_token = await company_idp.access_token("dana", alg="ES256")
        assert (await me(http, new_token)).status_code == 200
        assert (await me(http, old_token)).status_code == 401


# --- the provider itself, as the memory page's sign-in uses it --------------------------------


async def test_a_browser_application_redeems_its_code_from_its_own_origin(
    database_url: str, company_idp: IdentityProvider
) -> None:
    async with httpx.AsyncClient(base_url=company_idp.issuer) as http:
        preflight = await http.options(
            "/token",
            headers={"Origin": SPA_ORIGIN, "Access-Control-Request-Method": "POST"},
        )
        discovery = await http.get(
            "/.well-known/openid-configuration", headers={"Origin": SPA_ORIGIN}
        )
    token = await company_idp.access_token("dana", client=SPA_CLIENT, origin=SPA_ORIGIN)
    assert preflight.headers["access-control-allow-origin"] == SPA_ORIGIN
    assert discovery.headers["access-control-allow-origin"] == SPA_ORIGIN
    assert claims_of(token)["client_id"] == SPA_CLIENT.client_id
    async with service(database_url, company_entry(company_idp)) as (_, service_http):
        assert (await me(service_http, token)).json()["user_id"] == "dana"


async def test_the_token_endpoint_refuses_a_browser_application_on_a_foreign_origin(
    company_idp: IdentityProvider,
) -> None:
    with pytest.raises(IdentityProviderError, match="not allowed"):
        await company_idp.access_token("dana", client=SPA_CLIENT, origin="http://evil.example")


async def test_the_sign_in_page_loads_nothing_from_outside_the_provider(
    company_idp: IdentityProvider,
) -> None:
    query = {
        "client_id": SPA_CLIENT.client_id,
        "redirect_uri": SPA_CLIENT.redirect_uri,
        "response_type": "code",
        "scope": "openid",
        "code_challenge": "E9Melhoa2OwvFrEMTJguCHaoeK1t8URWbuGJSstw-cM",
        "code_challenge_method": "S256",
    }
    async with httpx.AsyncClient(follow_redirects=True) as browser:
        page = await browser.get(f"{company_idp.issuer}/auth", params=query)
    assert page.status_code == 200
    assert 'name="login"' in page.text
    assert not re.search(r"""(url\(|src=|href=)["']?https?://(?!127\.0\.0\.1)""", page.text)


async def test_a_client_registered_while_the_provider_runs_can_sign_in(
    identity_provider: IdentityProvider,
) -> None:
    client = OAuthClient("late-page", "http://127.0.0.1:8766/ui/memory")
    await identity_provider.register_client(public_client(client.client_id, [client.redirect_uri]))
    await identity_provider.add_account("eve", {"org": {"id": "initech"}})
    token = await identity_provider.access_token(
        "eve", client=client, origin="http://127.0.0.1:8766"
    )
    claims = claims_of(token)
    assert (claims["client_id"], claims["sub"], claims["org"]) == (
        "late-page",
        "eve",
        {"id": "initech"},
    )


async def test_the_jwks_carries_the_max_age_it_is_given(company_idp: IdentityProvider) -> None:
    await company_idp.set_jwks_max_age(7)
    try:
        async with httpx.AsyncClient() as http:
            response = await http.get(company_idp.jwks_uri)
    finally:
        await company_idp.set_jwks_max_age(300)
    assert response.headers["cache-control"] == "max-age=7"
    assert {key["kid"] for key in response.json()["keys"]} == {
        key.kid for key in await company_idp.keys()
    }
    assert all("d" not in key for key in response.json()["keys"])  # public halves only
