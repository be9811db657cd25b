"""The static key (JWT_*) is an issuer like the others: its tokens act in a fixed company
(JWT_COMPANY) or the one a claim names (JWT_COMPANY_CLAIM, never one another issuer owns), its
roles pass through JWT_ROLE_MAP, and its `operator` is dropped and counted unless JWT_PLATFORM
says it is the platform's key (unset: in development only). Start-up logs one line per active
verifier, without a secret or key material."""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from fastapi import FastAPI
from pydantic import SecretStr, ValidationError

from app.kit.auth.mint import issue_token
from app.kit.auth.verifiers import verifier_lines
from app.kit.config import DEV_JWT_SECRET, PROJECT_ROOT, Settings
from app.kit.principal import Principal
from tests.helpers.apps import app_with, client_of
from tests.helpers.bad_tokens import claims, signed
from tests.helpers.jwks_server import FakeIssuer, SigningKey, fake_issuer
from tests.helpers.metrics import sample

# a real secret of the production deployment the tests stand for (not the built-in one)
PRODUCTION_SECRET = "production-secret-" + "p" * 40
STATIC_ISS = "context-memory-dev"


@pytest.fixture(scope="module")
def issuer_key() -> SigningKey:
    return SigningKey.generate("RS256", kid="company-key")


@pytest.fixture
def issuer(issuer_key: SigningKey) -> Iterator[FakeIssuer]:
    """A company issuer owning `acme`, as a production deployment trusts it."""
    with fake_issuer() as served:
        served.publish(issuer_key)
        yield served


@asynccontextmanager
async def production(
    database_url: str, issuer: FakeIssuer, **overrides: Any
) -> AsyncIterator[tuple[FastAPI, httpx.AsyncClient]]:
    """The app in ENVIRONMENT=production with AUTH_ISSUERS and a real JWT_SECRET; JWT_PLATFORM
    unset unless overridden."""
    values: dict[str, Any] = {
        "environment": "production",
        "jwt_secret": SecretStr(PRODUCTION_SECRET),
        "jwt_platform": None,
        "auth_issuers": [issuer.entry(company="acme")],
    }
    async with app_with(database_url, **(values | overrides)) as app, client_of(app) as http:
        yield app, http


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def static_token(**overrides: Any) -> str:
    """A static HS256 token signed with the production secret (`alice` of `acme` unless
    overridden)."""
    return signed(claims(**overrides), key=PRODUCTION_SECRET)


def dropped(app: FastAPI) -> float:
    return sample(app.state.metrics, "auth_roles_dropped_total", issuer=STATIC_ISS, role="operator")


def load(**values: Any) -> Settings:
    """Settings as start-up reads them (no .env): production with a real secret."""
    base: dict[str, Any] = {"environment": "production", "jwt_secret": SecretStr(PRODUCTION_SECRET)}
    return Settings(_env_file=None, **(base | values))


def cli_token(*arguments: str, **environment: str) -> tuple[str, str]:
    """What `python -m app token` prints with exactly `environment`: (the token, stderr)."""
    env = {"PATH": "/usr/bin:/bin", **environment}
    done = subprocess.run(
        [sys.executable, "-m", "app", "token", *arguments],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    return done.stdout.strip(), done.stderr


# --- operator: only from a platform static key ------------------------------------------------


async def test_in_production_with_issuers_the_cli_operator_token_is_no_master_key(
    database_url: str, issuer: FakeIssuer
) -> None:
    token, note = await asyncio.to_thread(
        cli_token,
        *("--sub", "eve", "--company", "globex", "--role", "operator"),
        ENVIRONMENT="production",
        JWT_SECRET=PRODUCTION_SECRET,
        AUTH_ISSUERS=f'[{{"issuer": "{issuer.url}", "audiences": ["x"], "company": "acme"}}]',
    )
    async with production(database_url, issuer) as (app, http):
        me = await http.get("/v1/me", headers=bearer(token))
        other = await http.get("/v1/companies/initech/feature-flags", headers=bearer(token))
        own = await http.get("/v1/companies/globex/feature-flags", headers=bearer(token))
        write = await http.put(
            "/v1/companies/initech/feature-flags/context_memory",
            json={"enabled": True},
            headers=bearer(token),
        )
        owned = await http.get("/v1/me", headers=bearer(static_token(roles=["operator"])))
        counted = dropped(app)

    assert "JWT_PLATFORM is off" in note  # the CLI says so when it prints the token
    assert me.status_code == 200, me.text
    assert me.json() == {"user_id": "eve", "company_id": "globex", "roles": []}
    assert (other.status_code, own.status_code, write.status_code) == (403, 403, 403)
    assert counted == 1  # counted when verified; the token cache answers the other calls
    assert owned.status_code == 401  # acme belongs to its issuer, whatever the static key says


async def test_a_static_key_configured_as_platform_is_an_operator(
    database_url: str, issuer: FakeIssuer
) -> None:
    token = static_token(sub="olga", company_id="platform", roles=["operator"])
    async with production(database_url, issuer, jwt_platform=True) as (app, http):
        me = await http.get("/v1/me", headers=bearer(token))
        flags = await http.get("/v1/companies/initech/feature-flags", headers=bearer(token))
        counted = dropped(app)

    assert me.json()["roles"] == ["operator"]
    assert flags.status_code == 200, flags.text
    assert counted == 0


async def test_jwt_platform_false_drops_operator_even_in_development(database_url: str) -> None:
    token = signed(claims(roles=["operator", "space_admin"]), key=DEV_JWT_SECRET)
    async with (
        app_with(
            database_url,
            environment="development",
            jwt_secret=SecretStr(DEV_JWT_SECRET),
            jwt_platform=False,
        ) as app,
        client_of(app) as http,
    ):
        me = await http.get("/v1/me", headers=bearer(token))

    assert me.json()["roles"] == ["space_admin"]
    assert dropped(app) == 1


async def test_in_development_the_built_in_secret_cli_operator_token_still_works(
    database_url: str,
) -> None:
    token, note = await asyncio.to_thread(
        cli_token,
        *("--sub", "alice", "--company", "acme", "--role", "operator"),
        ENVIRONMENT="development",
    )
    async with (
        app_with(
            database_url,
            environment="development",
            jwt_secret=SecretStr(DEV_JWT_SECRET),
            jwt_platform=None,
        ) as app,
        client_of(app) as http,
    ):
        me = await http.get("/v1/me", headers=bearer(token))
        flags = await http.get("/v1/companies/globex/feature-flags", headers=bearer(token))

    assert me.json() == {"user_id": "alice", "company_id": "acme", "roles": ["operator"]}
    assert flags.status_code == 200, flags.text
    assert note == ""


@pytest.mark.parametrize(
    ("environment", "platform"), [("development", True), ("test", False), ("production", False)]
)
def test_jwt_platform_unset_means_development_only(environment: str, platform: bool) -> None:
    settings = load(environment=environment)

    assert settings.jwt_platform is None
    assert settings.static_platform is platform
    assert settings.static_issuer.platform is platform


# --- company: fixed, or a claim -----------------------------------------------------------------


async def test_a_static_key_with_a_fixed_company_cannot_act_in_another_whatever_it_claims(
    database_url: str, issuer: FakeIssuer, issuer_key: SigningKey
) -> None:
    async with production(
        database_url,
        issuer,
        jwt_company="globex",
        auth_issuers=[issuer.entry(company=None, company_claim="org")],
    ) as (app, http):
        token = static_token(company_id="initech", org="initech", roles=["space_admin", "operator"])
        me = await http.get("/v1/me", headers=bearer(token))
        elsewhere = await http.get("/v1/companies/initech/feature-flags", headers=bearer(token))
        write = await http.put(
            "/v1/companies/initech/feature-flags/context_memory",
            json={"enabled": True},
            headers=bearer(token),
        )
        no_claim = await http.get("/v1/me", headers=bearer(static_token(company_id=None)))
        # the static key owns globex now: an issuer reading its company from a claim may not
        # name it
        stolen = await http.get(
            "/v1/me", headers=bearer(issuer_key.sign(issuer.claims(org="globex")))
        )
        theirs = await http.get(
            "/v1/me", headers=bearer(issuer_key.sign(issuer.claims(org="initech")))
        )

    assert me.status_code == 200, me.text
    assert me.json() == {"user_id": "alice", "company_id": "globex", "roles": ["space_admin"]}
    assert (elsewhere.status_code, write.status_code) == (403, 403)
    assert dropped(app) == 1
    assert no_claim.json()["company_id"] == "globex"  # a fixed company needs no claim
    assert stolen.status_code == 401
    assert theirs.json()["company_id"] == "initech"


async def test_the_company_comes_from_jwt_company_claim(
    database_url: str, issuer: FakeIssuer
) -> None:
    async with production(database_url, issuer, jwt_company_claim="org.id") as (_, http):
        nested = await http.get(
            "/v1/me", headers=bearer(static_token(company_id="acme", org={"id": "globex"}))
        )
        owned = await http.get("/v1/me", headers=bearer(static_token(org={"id": "acme"})))

    assert nested.json()["company_id"] == "globex"  # `company_id` means nothing here
    assert owned.status_code == 401


HOSTILE_COMPANY_CLAIMS: list[tuple[str, dict[str, Any]]] = [
    ("no company claim", {}),
    ("a company claim that is a number", {"org": 42}),
    ("a company claim that is a list", {"org": ["globex"]}),
    ("a company claim that is an object", {"org": {"id": "globex"}}),
    ("an empty company claim", {"org": ""}),
    ("a company claim of 129 characters", {"org": "c" * 129}),
    ("a company claim padded with spaces", {"org": " globex"}),
    ("a company claim with a control character", {"org": "glo\nbex"}),
    ("a company claim another issuer owns", {"org": "acme"}),
    ("roles that are a string", {"org": "globex", "roles": "operator"}),
    ("roles that are an object", {"org": "globex", "roles": {"operator": True}}),
]


@pytest.mark.parametrize(
    ("case", "extra"), HOSTILE_COMPANY_CLAIMS, ids=[case for case, _ in HOSTILE_COMPANY_CLAIMS]
)
async def test_a_hostile_static_token_under_a_company_claim_is_the_same_opaque_401(
    database_url: str, issuer: FakeIssuer, case: str, extra: dict[str, Any]
) -> None:
    token = signed({**claims(company_id="globex"), **extra}, key=PRODUCTION_SECRET)
    async with production(database_url, issuer, jwt_company_claim="org") as (_, http):
        response = await http.get("/v1/me", headers=bearer(token))

    assert response.status_code == 401, (case, response.text)
    assert response.json()["detail"] == "invalid token"


# --- roles: the role map ------------------------------------------------------------------------


async def test_only_mapped_roles_pass_and_a_mapped_operator_is_dropped_unless_platform(
    database_url: str, issuer: FakeIssuer
) -> None:
    role_map = {"memory-admin": "space_admin", "root": "operator"}
    token = static_token(company_id="globex", roles=["memory-admin", "root", "space_admin"])
    async with production(database_url, issuer, jwt_role_map=role_map) as (app, http):
        company_key = (await http.get("/v1/me", headers=bearer(token))).json()["roles"]
        counted = dropped(app)
    async with production(database_url, issuer, jwt_role_map=role_map, jwt_platform=True) as (
        _,
        http,
    ):
        platform_key = (await http.get("/v1/me", headers=bearer(token))).json()["roles"]

    assert company_key == ["space_admin"]
    assert counted == 1
    assert platform_key == ["operator", "space_admin"]


# --- settings -----------------------------------------------------------------------------------


REFUSED: list[tuple[str, dict[str, Any]]] = [
    ("both JWT_COMPANY and JWT_COMPANY_CLAIM", {"jwt_company": "a", "jwt_company_claim": "org"}),
    ("an empty JWT_COMPANY", {"jwt_company": ""}),
    ("a JWT_COMPANY of 129 characters", {"jwt_company": "c" * 129}),
    ("an empty JWT_COMPANY_CLAIM", {"jwt_company_claim": ""}),
    ("a JWT_ROLE_MAP value that is no service role", {"jwt_role_map": {"admin": "root"}}),
    ("a JWT_ROLE_MAP that is a list", {"jwt_role_map": ["operator"]}),
    ("a JWT_PLATFORM that is no boolean", {"jwt_platform": "maybe"}),
    (
        "HS512 with a secret shorter than 64 bytes",
        {"jwt_algorithms": ["HS512"], "jwt_secret": SecretStr("s" * 63)},
    ),
    (
        "HS384 with a secret shorter than 48 bytes",
        {"jwt_algorithms": ["HS256", "HS384"], "jwt_secret": SecretStr("s" * 47)},
    ),
]


@pytest.mark.parametrize(("case", "values"), REFUSED, ids=[case for case, _ in REFUSED])
def test_start_up_refuses(case: str, values: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        load(**values)


@pytest.mark.parametrize("value", ["{not json", '"operator"', '{"admin": "superuser"}'])
def test_a_hostile_jwt_role_map_in_the_environment_is_refused(
    monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("JWT_ROLE_MAP", value)

    with pytest.raises(ValidationError, match="jwt_role_map"):
        load()


def test_the_static_settings_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JWT_COMPANY_CLAIM", "org.id")
    monkeypatch.setenv("JWT_PLATFORM", "true")
    monkeypatch.setenv("JWT_ROLE_MAP", '{"memory-admin": "space_admin"}')

    rule = load().static_issuer

    assert (rule.issuer, rule.company, rule.company_claim) == (STATIC_ISS, None, "org.id")
    assert rule.platform
    assert rule.role_map == {"memory-admin": "space_admin"}
    assert load(jwt_algorithms=["HS512"], jwt_secret=SecretStr("s" * 64)).jwt_algorithms


# --- start-up: one line per active verifier -------------------------------------------------------


def key_pem() -> tuple[str, str]:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    private = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
        .decode()
    )
    return private, public


async def test_start_up_logs_one_line_per_active_verifier_and_no_secret(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    private_pem, public_pem = key_pem()
    with fake_issuer() as staff, fake_issuer() as customers:
        entries = [
            staff.entry(company="platform", platform=True, roles_claim="roles"),
            customers.entry(
                company=None,
                company_claim="org.id",
                roles_claim="groups",
                role_map={"admins": "space_admin"},
            ),
        ]
        caplog.set_level(logging.INFO, logger="app.kit.auth.verifiers")
        async with production(
            database_url,
            staff,
            auth_issuers=entries,
            jwt_algorithms=["HS256", "RS256"],
            jwt_public_key=SecretStr(public_pem),
            jwt_private_key=SecretStr(private_pem),
            jwt_company="globex",
            jwt_role_map={"memory-admin": "space_admin"},
        ):
            pass
    lines = [r.getMessage() for r in caplog.records if r.name == "app.kit.auth.verifiers"]

    assert lines == [
        f"token verifier issuer={staff.url} kind=jwks algorithms=RS256,ES256 "
        "company=fixed platform platform=yes roles=roles as named",
        f"token verifier issuer={customers.url} kind=jwks algorithms=RS256,ES256 "
        'company=claim org.id (not globex, platform) platform=no roles=groups {"admins": '
        '"space_admin"}',
        f"token verifier issuer=static ({STATIC_ISS}) kind=hmac+public-key "
        "algorithms=HS256,RS256 company=fixed globex platform=no "
        'roles=roles {"memory-admin": "space_admin"}',
    ]
    text = "\n".join(lines)
    assert PRODUCTION_SECRET not in text
    for pem in (public_pem, private_pem):
        body = "".join(pem.strip().splitlines()[1:-1])
        assert all(body[i : i + 16] not in text for i in range(0, len(body) - 16, 8))


def test_a_static_key_that_is_off_says_so() -> None:
    entry = {"issuer": "https://sso.example.com", "audiences": ["a"], "company_claim": "org"}
    settings = load(jwt_secret=SecretStr(DEV_JWT_SECRET), auth_issuers=[entry])

    assert verifier_lines(settings) == [
        "token verifier issuer=https://sso.example.com kind=jwks algorithms=RS256 "
        "company=claim org platform=no roles=none",
        f"token verifier issuer=static ({STATIC_ISS}): off (the built-in development secret "
        "is not honoured outside ENVIRONMENT=development)",
    ]
    assert DEV_JWT_SECRET not in "".join(verifier_lines(settings))


def test_the_development_default_is_a_claim_rule_and_a_platform_key() -> None:
    settings = load(environment="development", jwt_secret=SecretStr(DEV_JWT_SECRET))

    assert verifier_lines(settings) == [
        f"token verifier issuer=static ({STATIC_ISS}) kind=hmac algorithms=HS256 "
        "company=claim company_id platform=yes roles=roles as named"
    ]
    token = issue_token(settings, Principal("alice", "acme", frozenset({"operator"})))
    assert token.count(".") == 2


# --- the JWT library: what changed with PyJWT, and what did not -------------------------------


async def test_a_token_issued_a_few_seconds_ahead_of_our_clock_passes(
    database_url: str, issuer: FakeIssuer, issuer_key: SigningKey
) -> None:
    ahead = int(time.time()) + 5  # the provider's clock runs ahead; `iat` is not a deadline
    async with production(database_url, issuer) as (_, http):
        issued = await http.get("/v1/me", headers=bearer(issuer_key.sign(issuer.claims(iat=ahead))))
        static = await http.get("/v1/me", headers=bearer(static_token(company_id="x", iat=ahead)))

    assert (issued.status_code, static.status_code) == (200, 200), (issued.text, static.text)


async def test_an_rsa_key_under_2048_bits_is_refused(database_url: str, issuer: FakeIssuer) -> None:
    weak = SigningKey.generate("RS256", kid="weak", rsa_bits=1024)
    issuer.publish(weak)
    async with production(database_url, issuer) as (_, http):
        response = await http.get("/v1/me", headers=bearer(weak.sign(issuer.claims())))

    assert response.status_code == 401
    assert response.json()["detail"] == "invalid token"
