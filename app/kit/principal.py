"""Who the caller is, as the verified token says (`app/kit/auth/verify.py` verifies it): a plain
value, free of the token library and the web framework, so the worker and the services take it
without either."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

KNOWN_ROLES = frozenset({"space_admin", "company_operator", "operator"})
PLATFORM_ROLE: Final = "operator"
COMPANY_OPERATOR_ROLE: Final = "company_operator"
"""An operator of the token's own company only: its users' erasure requests, its spaces and its
record; a company's own issuer may grant it (it is no `operator`, which acts on any company)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who the verified token says the caller is."""

    user_id: str
    company_id: str
    roles: frozenset[str]

    def has_role(self, role: str) -> bool:
        return role in self.roles
