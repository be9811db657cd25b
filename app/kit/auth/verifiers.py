"""Which token verifiers are active, as start-up logs them: never a secret or key material."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable

from app.kit.config import IssuerConfig, Settings

logger = logging.getLogger(__name__)


def verifier_lines(settings: Settings) -> list[str]:
    """One line per active token verifier, as start-up logs them: its issuer (`static` for
    the JWT_* key, with its `iss`), kind (`jwks`, `hmac`, `public-key`), algorithms, company
    rule, whether it is platform, and its role map. Never a secret or key material: keys are
    named by kind only. A static key that is off says so in a line of its own."""
    lines = [
        _verifier_line(settings, entry, f"issuer={entry.issuer}", "jwks", entry.algorithms)
        for entry in settings.auth_issuers
    ]
    hmac = [a for a in settings.jwt_algorithms if a.startswith("HS")]
    public = [a for a in settings.jwt_algorithms if not a.startswith("HS")]
    kinds = []
    if hmac and settings.static_hmac_enabled:
        kinds.append("hmac")
    if public and settings.jwt_public_key is not None:
        kinds.append("public-key")
    name = f"issuer=static ({settings.jwt_issuer})"
    if not kinds:
        return [
            *lines,
            f"token verifier {name}: off (the built-in development secret is not "
            "honoured outside ENVIRONMENT=development)",
        ]
    algorithms = [*(hmac if "hmac" in kinds else []), *(public if "public-key" in kinds else [])]
    return [
        *lines,
        _verifier_line(settings, settings.static_issuer, name, "+".join(kinds), algorithms),
    ]


def log_verifiers(settings: Settings) -> None:
    """Start-up: say which token checks are active (`verifier_lines`)."""
    for line in verifier_lines(settings):
        logger.info(line)


def _verifier_line(
    settings: Settings, entry: IssuerConfig, name: str, kind: str, algorithms: Iterable[str]
) -> str:
    if entry.company is not None:
        company = f"fixed {entry.company}"
    else:
        others = sorted(settings.owned_companies)
        company = f"claim {entry.company_claim}"
        if others:
            company += f" (not {', '.join(others)})"
    if entry.roles_claim is None:
        roles = "none"
    elif entry.role_map is None:
        roles = f"{entry.roles_claim} as named"
    else:
        roles = f"{entry.roles_claim} {json.dumps(entry.role_map, sort_keys=True)}"
    return (
        f"token verifier {name} kind={kind} algorithms={','.join(algorithms)} "
        f"company={company} platform={'yes' if entry.platform else 'no'} roles={roles}"
    )
