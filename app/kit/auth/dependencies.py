"""The caller of a request and its role checks, as FastAPI dependencies over the verifier
(`app/kit/auth/verify.py`), which the app holds in `app.state.token_verifier`."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from app.kit.auth.verify import TokenVerifier
from app.kit.deps import CompanyIdPath
from app.kit.errors import ForeignCompany, RoleRequired, Unauthorized
from app.kit.principal import COMPANY_OPERATOR_ROLE, PLATFORM_ROLE, Principal


def _bearer_token(request: Request) -> str:
    header = request.headers.get("authorization")
    if not header:
        raise Unauthorized
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token or " " in token.strip():
        raise Unauthorized
    return token.strip()


_bearer_scheme = HTTPBearer(
    auto_error=False,
    bearerFormat="JWT",
    description="A JWT issued by your identity provider, with `sub`, `company_id`, `exp`, `iss` "
    "and `aud` (and optional `roles`). In Swagger UI's Authorize, paste the token alone, "
    "without `Bearer `; `make run` prints a development one.",
)


async def principal_of(request: Request) -> Principal:
    """The verified caller of `request` (401 for a missing, malformed or invalid token)."""
    verifier: TokenVerifier = request.app.state.token_verifier
    return await verifier.verify(_bearer_token(request))


async def current_principal(
    request: Request,
    _documented: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer_scheme)],
) -> Principal:
    """The verified caller. The header is parsed here, strictly; HTTPBearer only documents it."""
    return await principal_of(request)


PrincipalDep = Annotated[Principal, Depends(current_principal)]


ROLE_CHECKS: set[Callable[..., Any]] = set()
"""Dependencies that may refuse the caller's role (403); the published contract says so for
every route that depends on one."""

_Dependency = TypeVar("_Dependency", bound=Callable[..., Any])


def role_check(dependency: _Dependency) -> _Dependency:
    """Register `dependency` as a role check (it raises `Forbidden`)."""
    ROLE_CHECKS.add(dependency)
    return dependency


def require_role(role: str) -> Callable[[Principal], Coroutine[Any, Any, Principal]]:
    """Dependency: the caller must hold `role` (403 otherwise)."""

    @role_check
    async def dependency(principal: PrincipalDep) -> Principal:
        if not principal.has_role(role):
            raise RoleRequired(role)
        return principal

    return dependency


def require_operator_or_company_admin(
    principal: Principal, company_id: str, *, space_admin_may_read: bool = False
) -> None:
    """Company routes: operators may act on any company; a space admin only reads their own.

    A space admin naming another company gets 404 (no existence oracle).
    """
    if principal.has_role("operator"):
        return
    if space_admin_may_read and principal.has_role("space_admin"):
        if principal.company_id != company_id:
            raise ForeignCompany
        return
    raise RoleRequired("operator")


def require_company_operator(principal: Principal, company_id: str) -> None:
    """Company operations: a platform operator acts on any company, a company operator on their
    own company only; a company operator naming another company gets 404 (no existence oracle),
    anyone else 403."""
    if principal.has_role(PLATFORM_ROLE):
        return
    if principal.has_role(COMPANY_OPERATOR_ROLE):
        if principal.company_id != company_id:
            raise ForeignCompany
        return
    raise RoleRequired(PLATFORM_ROLE, COMPANY_OPERATOR_ROLE)


@role_check
async def _company_operator(company_id: CompanyIdPath, principal: PrincipalDep) -> Principal:
    require_company_operator(principal, company_id)
    return principal


CompanyOperatorDep = Annotated[Principal, Depends(_company_operator)]
"""A company's routes that its own operators use as platform operators do: flags, memory
policy, rate limits, model budget, usage, jobs, the audit log, spaces and erasure requests."""
PlatformOperatorDep = Annotated[Principal, Depends(require_role(PLATFORM_ROLE))]
"""Routes across companies, or that move a company's data (list, register, offboard, export
and import a company): platform operators only."""
