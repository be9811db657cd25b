"""Trusted-issuer settings: what start-up refuses (an issuer that could not be trusted, a
company with two sources, a weak or built-in secret), how AUTH_ISSUERS is read, and the
built-in secret outside development with AUTH_ISSUERS set (static HMAC tokens off)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import SecretStr, ValidationError

from app.kit.config import DEV_JWT_SECRET, Settings
from tests.helpers import bad_tokens
from tests.helpers.apps import TEST_JWT_SECRET, client_with
from tests.helpers.jwks_server import SigningKey, fake_issuer

ISSUER = "https://login.example.com/realm"


def entry(**overrides: Any) -> dict[str, Any]:
    """An AUTH_ISSUERS entry for ISSUER owning `acme`; an override of `None` removes a field."""
    base: dict[str, Any] = {"issuer": ISSUER, "audiences": ["context-memory"], "company": "acme"}
    base.update(overrides)
    return {name: value for name, value in base.items() if value is not None}


def load(**values: Any) -> Settings:
    """Settings as start-up reads them (no .env), in ENVIRONMENT=test with a real secret."""
    base: dict[str, Any] = {"environment": "test", "jwt_secret": SecretStr(TEST_JWT_SECRET)}
    return Settings(_env_file=None, **(base | values))


REFUSED: list[tuple[str, dict[str, Any]]] = [
    ("both company and company_claim", {"auth_issuers": [entry(company_claim="org")]}),
    ("neither company nor company_claim", {"auth_issuers": [entry(company=None)]}),
    ("the same issuer twice", {"auth_issuers": [entry(), entry(company="globex")]}),
    ("an http issuer off loopback", {"auth_issuers": [entry(issuer="http://login.example.com")]}),
    (
        "an http jwks_uri off loopback",
        {"auth_issuers": [entry(jwks_uri="http://keys.example.com/jwks")]},
    ),
    (
        "an http issuer on a host name that starts with 127.",
        {"auth_issuers": [entry(issuer="http://127.example.com")]},
    ),
    ("an issuer that is no URL", {"auth_issuers": [entry(issuer="login.example.com")]}),
    ("HS256 among an issuer's algorithms", {"auth_issuers": [entry(algorithms=["HS256"])]}),
    ("an issuer without audiences", {"auth_issuers": [entry(audiences=[])]}),
    (
        "a role_map value that is no service role",
        {"auth_issuers": [entry(roles_claim="roles", role_map={"admin": "superuser"})]},
    ),
    ("an unknown key in an entry", {"auth_issuers": [entry(tenant="acme")]}),
    ("JWT_ISSUER equal to an issuer", {"auth_issuers": [entry()], "jwt_issuer": ISSUER}),
    ("an HMAC secret of 31 bytes", {"jwt_secret": SecretStr("s" * 31)}),
    ("UI_OIDC_ISSUER without UI_OIDC_CLIENT_ID", {"ui_oidc_issuer": ISSUER}),
    ("UI_OIDC_CLIENT_ID without UI_OIDC_ISSUER", {"ui_oidc_client_id": "memory-page"}),
]


@pytest.mark.parametrize(("case", "values"), REFUSED, ids=[case for case, _ in REFUSED])
def test_start_up_refuses(case: str, values: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        load(**values)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/realm",
        "http://localhost:8080/realm",
        "http://[::1]:8080/realm",
        "https://login.example.com/realm",
    ],
)
def test_an_issuer_on_loopback_or_https_loads(url: str) -> None:
    settings = load(auth_issuers=[entry(issuer=url, jwks_uri=f"{url}/keys")])

    assert [issuer.issuer for issuer in settings.auth_issuers] == [url]


def test_an_http_issuer_off_loopback_loads_when_http_issuers_are_allowed() -> None:
    issuer = entry(issuer="http://login.internal", jwks_uri="http://keys.internal/jwks")

    settings = load(auth_issuers=[issuer], auth_allow_http_issuers=True)

    assert settings.auth_issuers[0].jwks_uri == "http://keys.internal/jwks"


def test_an_hmac_secret_of_32_bytes_loads() -> None:
    assert load(jwt_secret=SecretStr("s" * 32)).static_hmac_enabled


def test_auth_issuers_given_as_json_in_the_environment_loads(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("AUTH_ISSUERS", json.dumps([entry(), entry(issuer=f"{ISSUER}-2")]))

    settings = load()

    assert [issuer.issuer for issuer in settings.auth_issuers] == [ISSUER, f"{ISSUER}-2"]
    assert settings.owned_companies == {"acme"}


def test_auth_issuers_given_as_a_file_loads(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    path = tmp_path / "issuers.json"
    path.write_text(json.dumps([entry(company=None, company_claim="org")]), encoding="utf-8")
    monkeypatch.setenv("AUTH_ISSUERS", f"@{path}")

    settings = load()

    assert settings.auth_issuers[0].company_claim == "org"
    assert settings.owned_companies == frozenset()


def test_auth_issuers_naming_a_missing_file_is_a_settings_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    missing = tmp_path / "absent.json"
    monkeypatch.setenv("AUTH_ISSUERS", f"@{missing}")

    with pytest.raises(ValidationError, match=r"absent\.json"):
        load()


def test_auth_issuers_that_is_not_json_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AUTH_ISSUERS", "[{issuer: nope}]")

    with pytest.raises(ValidationError):
        load()


def test_outside_development_with_issuers_the_built_in_secret_loads_with_static_hmac_off() -> None:
    settings = Settings(_env_file=None, environment="production", auth_issuers=[entry()])

    assert settings.uses_development_jwt_secret
    assert not settings.static_hmac_enabled


def test_outside_development_without_issuers_the_built_in_secret_is_refused() -> None:
    with pytest.raises(ValidationError, match="JWT_SECRET"):
        Settings(_env_file=None, environment="production")


async def test_a_static_token_on_the_built_in_secret_is_refused_in_production_with_issuers(
    database_url: str,
) -> None:
    key = SigningKey.generate("RS256", "production")
    static = bad_tokens.signed(bad_tokens.claims(company_id="globex"), key=DEV_JWT_SECRET)
    with fake_issuer() as issuer:
        issuer.publish(key)
        async with client_with(
            database_url,
            environment="production",
            jwt_secret=SecretStr(DEV_JWT_SECRET),
            auth_issuers=[issuer.entry()],
        ) as http:
            refused = await http.get("/v1/me", headers={"Authorization": f"Bearer {static}"})
            issued = key.sign(issuer.claims())
            passed = await http.get("/v1/me", headers={"Authorization": f"Bearer {issued}"})

    assert refused.status_code == 401
    assert refused.json()["detail"] == "invalid token"
    assert passed.status_code == 200, passed.text  # the issuer's tokens still work
