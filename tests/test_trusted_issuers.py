"""Trusted OpenID issuers: tokens verified with keys from the issuer's JWKS, claims read with the
issuer's paths, roles confined to what the issuer may grant, keys cached, refreshed on an unknown
`kid` and kept while the provider is down. The hostile tokens are in test_hostile_issuer_tokens;
the same behaviour against a real provider in tests/identity/."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import FastAPI

from app.kit.auth.verify import TokenVerifier, claim_at, role_names
from app.kit.jwks import KeyStore, cache_seconds
from app.main import create_app
from tests.helpers.apps import client_of, make_settings
from tests.helpers.jwks_server import FakeIssuer, SigningKey, fake_issuer

ZITADEL_ROLES = "urn:zitadel:iam:org:project:roles"


@pytest.fixture
def issuer() -> Iterator[FakeIssuer]:
    with fake_issuer() as served:
        yield served


@pytest.fixture(scope="module")
def rsa_key() -> SigningKey:
    return SigningKey.generate("RS256", kid="rsa-1")


@pytest.fixture(scope="module")
def ec_key() -> SigningKey:
    return SigningKey.generate("ES256", kid="ec-1")


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@asynccontextmanager
async def trusting(
    database_url: str,
    entries: list[dict[str, Any]],
    *,
    clock: FakeClock | None = None,
    **overrides: Any,
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """An app trusting `entries` (its lifespan fetches their keys) and a client of it."""
    settings = make_settings(database_url, auth_issuers=entries, **overrides)
    app = create_app(settings)
    if clock is not None:
        metrics = app.state.metrics
        app.state.token_verifier = TokenVerifier(
            settings,
            keys=KeyStore(settings, clock=clock, on_fetch=metrics.observe_jwks_fetch),
            on_role_dropped=metrics.observe_role_dropped,
        )
    async with LifespanManager(app), client_of(app) as http:
        yield app, http


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def me(http: httpx.AsyncClient, token: str) -> httpx.Response:
    return await http.get("/v1/me", headers=bearer(token))


def metric(app: FastAPI, name: str, **labels: str) -> float:
    value = app.state.metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else float(value)


# --- verification ---------------------------------------------------------------------------


@pytest.mark.parametrize("alg", ["RS256", "ES256"])
async def test_a_token_of_a_trusted_issuer_reaches_me_with_the_mapped_identity(
    database_url: str, issuer: FakeIssuer, rsa_key: SigningKey, ec_key: SigningKey, alg: str
) -> None:
    issuer.publish(rsa_key)
    issuer.publish(ec_key)
    key = rsa_key if alg == "RS256" else ec_key
    entry = issuer.entry(roles_claim="groups", role_map={"memory-admins": "space_admin"})
    async with trusting(database_url, [entry]) as (_, http):
        token = key.sign(issuer.claims(sub="u-42", groups=["memory-admins", "staff"]))
        response = await me(http, token)
    assert response.status_code == 200, response.text
    assert response.json() == {"user_id": "u-42", "company_id": "acme", "roles": ["space_admin"]}


async def test_keys_come_from_discovery_unless_a_jwks_uri_is_configured(
    database_url: str, issuer: FakeIssuer, rsa_key: SigningKey
) -> None:
    issuer.publish(rsa_key)
    async with trusting(database_url, [issuer.entry(jwks_uri=issuer.jwks_uri)]) as (_, http):
        assert (await me(http, rsa_key.sign(issuer.claims()))).status_code == 200
    assert issuer.requests["/.well-known/openid-configuration"] == 0
    async with trusting(database_url, [issuer.entry()]) as (_, http):
        assert (await me(http, rsa_key.sign(issuer.claims()))).status_code == 200
    assert issuer.requests["/.well-known/openid-configuration"] == 1


async def test_a_discovery_document_naming_another_issuer_yields_no_keys(
    database_url: str, issuer: FakeIssuer, rsa_key: SigningKey
) -> None:
    issuer.publish(rsa_key)
    issuer.discovery_issuer = "https://evil.example"
    async with trusting(database_url, [issuer.entry()]) as (app, http):
        assert (await me(http, rsa_key.sign(issuer.claims()))).status_code == 401
        assert issuer.jwks_fetches == 0
        assert metric(app, "auth_jwks_fetches_total", issuer=issuer.url, outcome="error") >= 1


# --- claims: user, company, roles -------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "claims", "expected"),
    [
        pytest.param(
            {"company": None, "company_claim": "org.id"},
            {"org": {"id": "globex"}},
            ("alice", "globex", []),
            id="company-from-a-nested-claim",
        ),
        pytest.param(
            {"company": None, "company_claim": "tid", "user_claim": "oid"},
            {"tid": "t-1", "oid": "object-7"},
            ("object-7", "t-1", []),
            id="user-and-tenant-from-other-claims",
        ),
        pytest.param(
            {"roles_claim": "realm_access.roles"},
            {"realm_access": {"roles": ["space_admin", "offline_access"]}},
            ("alice", "acme", ["space_admin"]),
            id="nested-roles-without-a-map-pass-only-service-roles",
        ),
        pytest.param(
            {"roles_claim": ZITADEL_ROLES, "role_map": {"memory-admin": "space_admin"}},
            {ZITADEL_ROLES: {"memory-admin": {"org-1": "acme.example"}, "viewer": {}}},
            ("alice", "acme", ["space_admin"]),
            id="a-whole-key-with-colons-holding-an-object-of-roles",
        ),
        pytest.param(
            {"roles_claim": "https://acme.example/roles", "role_map": {"admins": "space_admin"}},
            {"https://acme.example/roles": ["admins"]},
            ("alice", "acme", ["space_admin"]),
            id="a-namespaced-claim-with-dots",
        ),
        pytest.param(
            {"roles_claim": "roles", "role_map": {"admins": "space_admin"}},
            {"roles": ["space_admin", "operator"]},
            ("alice", "acme", []),
            id="with-a-map-only-mapped-roles-pass",
        ),
        pytest.param(
            {"company": None, "company_claim": "org"},
            {"org": "globex", "company_id": "acme"},
            ("alice", "globex", []),
            id="company-id-claim-means-nothing-to-an-issuer",
        ),
        pytest.param(
            {},
            {"company_id": "globex"},
            ("alice", "acme", []),
            id="a-fixed-company-whatever-the-claims-say",
        ),
    ],
)
async def test_claims_are_read_with_the_issuers_paths(  # noqa: PLR0917
    database_url: str,
    issuer: FakeIssuer,
    rsa_key: SigningKey,
    entry: dict[str, Any],
    claims: dict[str, Any],
    expected: tuple[str, str, list[str]],
) -> None:
    issuer.publish(rsa_key)
    async with trusting(database_url, [issuer.entry(**entry)]) as (_, http):
        response = await me(http, rsa_key.sign(issuer.claims(**claims)))
    assert response.status_code == 200, response.text
    user, company, roles = expected
    assert response.json() == {"user_id": user, "company_id": company, "roles": roles}


def test_claim_paths_prefer_a_whole_key_and_roles_come_in_three_shapes() -> None:
    claims = {"a.b": 1, "a": {"b": 2, "c": {"d": 3}}}
    assert claim_at(claims, "a.b") == 1
    assert claim_at(claims, "a.c.d") == 3
    assert claim_at(claims, "a.x") is None
    assert claim_at(claims, "a.b.c") is None
    assert role_names(["x", "y"]) == ["x", "y"]
    assert role_names({"x": {}, "y": 1}) == ["x", "y"]
    assert role_names("x") == ["x"]
    assert role_names(None) == []
    assert role_names(7) is None
    assert role_names(["x", 7]) is None


# --- confinement -------------------------------------------------------------------------------


async def test_a_company_issuer_cannot_grant_operator_and_the_drop_is_counted(
    database_url: str, issuer: FakeIssuer, rsa_key: SigningKey
) -> None:
    issuer.publish(rsa_key)
    entry = issuer.entry(roles_claim="roles", role_map={"admin": "space_admin", "root": "operator"})
    async with trusting(database_url, [entry]) as (app, http):
        token = rsa_key.sign(issuer.claims(roles=["admin", "root"]))
        response = await me(http, token)
        assert response.json()["roles"] == ["space_admin"]
        labels = {"issuer": issuer.url, "role": "operator"}
        assert metric(app, "auth_roles_dropped_total", **labels) == 1
        # an operator route is out of reach, for any company
        flags = await http.get("/v1/companies/globex/feature-flags", headers=bearer(token))
        assert flags.status_code == 403
        own = await http.get("/v1/companies/acme/feature-flags", headers=bearer(token))
        assert own.status_code == 403


async def test_a_platform_issuer_grants_operator(
    database_url: str, issuer: FakeIssuer, rsa_key: SigningKey
) -> None:
    issuer.publish(rsa_key)
    entry = issuer.entry(
        company="platform", roles_claim="roles", role_map={"root": "operator"}, platform=True
    )
    async with trusting(database_url, [entry]) as (app, http):
        token = rsa_key.sign(issuer.claims(roles=["root"]))
        assert (await me(http, token)).json()["roles"] == ["operator"]
        flags = await http.get("/v1/companies/globex/feature-flags", headers=bearer(token))
        assert flags.status_code == 200
        assert metric(app, "auth_roles_dropped_total", issuer=issuer.url, role="operator") == 0


async def test_a_claimed_company_that_another_issuer_owns_is_refused(
    database_url: str, rsa_key: SigningKey
) -> None:
    with fake_issuer() as owner, fake_issuer() as shared:
        owner.publish(rsa_key)
        shared.publish(rsa_key)
        entries = [owner.entry(company="acme"), shared.entry(company=None, company_claim="org")]
        async with trusting(database_url, entries) as (_, http):
            assert (await me(http, rsa_key.sign(owner.claims()))).status_code == 200
            other = await me(http, rsa_key.sign(shared.claims(org="globex")))
            assert other.json()["company_id"] == "globex"
            stolen = await me(http, rsa_key.sign(shared.claims(org="acme")))
            assert stolen.status_code == 401


# --- keys: rotation, flood, outage, cache lifetime ---------------------------------------------


async def test_a_rotation_causes_no_401_and_concurrent_new_kids_share_one_fetch(
    database_url: str, issuer: FakeIssuer, rsa_key: SigningKey
) -> None:
    issuer.publish(rsa_key)
    # the interval is 0 so that the rotation's fetch is not held back by the start-up fetch a
    # moment earlier; in production minutes pass between them
    async with trusting(database_url, [issuer.entry()], auth_jwks_refresh_interval_seconds=0) as (
        _,
        http,
    ):
        assert (await me(http, rsa_key.sign(issuer.claims()))).status_code == 200
        fetches = issuer.jwks_fetches
        new_key = issuer.publish(SigningKey.generate("RS256", kid="rsa-2"))
        tokens = [new_key.sign(issuer.claims(sub=f"user-{n}")) for n in range(20)]
        answers = await asyncio.gather(*(me(http, token) for token in tokens))
        assert [answer.status_code for answer in answers] == [200] * 20
        assert issuer.jwks_fetches == fetches + 1
        issuer.withdraw(rsa_key)
        assert (await me(http, new_key.sign(issuer.claims(sub="after")))).status_code == 200


async def test_a_rotation_right_after_start_up_is_not_held_back_by_the_start_up_fetch(
    database_url: str, issuer: FakeIssuer, rsa_key: SigningKey
) -> None:
    issuer.publish(rsa_key)
    async with trusting(
        database_url, [issuer.entry()], auth_jwks_refresh_interval_seconds=3600
    ) as (_, http):
        assert issuer.jwks_fetches == 1  # start-up
        new_key = issuer.publish(SigningKey.generate("RS256", kid="rsa-3"))
        assert (await me(http, new_key.sign(issuer.claims()))).status_code == 200
        assert issuer.jwks_fetches == 2
        # the unknown-kid budget of the interval is spent: an invented kid costs no fetch
        invented = SigningKey.generate("RS256", kid="invented")
        assert (await me(http, invented.sign(issuer.claims()))).status_code == 401
        assert issuer.jwks_fetches == 2


async def test_keys_are_kept_while_the_provider_is_down(
    database_url: str, issuer: FakeIssuer, rsa_key: SigningKey
) -> None:
    issuer.publish(rsa_key)
    clock = FakeClock()
    async with trusting(
        database_url, [issuer.entry()], clock=clock, auth_jwks_max_stale_seconds=3600
    ) as (app, http):
        issuer.down = True
        clock.now += 1800  # the cached keys expired (max-age 300) and the provider is gone
        assert (await me(http, rsa_key.sign(issuer.claims(sub="bob")))).status_code == 200
        assert (await http.get("/readyz")).status_code == 200
        clock.now += 1801  # older than AUTH_JWKS_MAX_STALE_SECONDS
        not_ready = await http.get("/readyz")
        assert not_ready.status_code == 503
        assert issuer.url in not_ready.json()["detail"]
        assert (await me(http, rsa_key.sign(issuer.claims(sub="carol")))).status_code == 200
        issuer.down = False
        clock.now += 60  # past the refresh interval: readyz tries again
        assert (await http.get("/readyz")).status_code == 200
        assert metric(app, "auth_jwks_fetches_total", issuer=issuer.url, outcome="error") >= 1


async def test_expired_keys_are_refreshed_in_the_background_after_max_age(
    database_url: str, issuer: FakeIssuer, rsa_key: SigningKey
) -> None:
    issuer.publish(rsa_key)
    issuer.cache_control = "public, max-age=120"
    clock = FakeClock()
    async with trusting(database_url, [issuer.entry()], clock=clock) as (app, http):
        assert issuer.jwks_fetches == 1
        clock.now += 100
        assert (await me(http, rsa_key.sign(issuer.claims(sub="a")))).status_code == 200
        assert issuer.jwks_fetches == 1  # still fresh
        clock.now += 30
        assert (await me(http, rsa_key.sign(issuer.claims(sub="b")))).status_code == 200
        keys = app.state.token_verifier.keys.of(issuer.url)
        await keys.refresh()  # waits for the background fetch the request started
        assert issuer.jwks_fetches == 2


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (None, 600),
        ("max-age=120", 120),
        ("public, max-age=7200, must-revalidate", 7200),
        ("max-age=5", 60),
        ("max-age=99999999", 86_400),
        ("no-store", 60),
        ("no-cache, max-age=3000", 60),
        ("max-age=abc", 600),
    ],
)
def test_the_jwks_lifetime_is_its_max_age_within_bounds(header: str | None, expected: int) -> None:
    assert cache_seconds(header, default=600, lowest=60, highest=86_400) == expected


async def test_a_verified_issuer_token_is_not_verified_again(
    database_url: str, issuer: FakeIssuer, rsa_key: SigningKey
) -> None:
    issuer.publish(rsa_key)
    async with trusting(database_url, [issuer.entry()]) as (app, http):
        token = rsa_key.sign(issuer.claims())
        assert (await me(http, token)).status_code == 200
        issuer.down = True
        issuer.withdraw(rsa_key)
        assert (await me(http, token)).status_code == 200
        assert app.state.token_verifier.cached_tokens == 1
