"""Every route of the service as a `Call`: method, path, query, body, headers, whether it may be
retried, and how to read the answer. The async and the sync client send the same calls.

Each function says which operation of `openapi.yaml` it sends with `@operation(method, path)`
(`OPERATIONS` collects them): tests/client/test_operation_coverage.py fails on an operation
that no call declares, and on a call whose request is not the operation it declares."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date
from typing import Any, Generic, ParamSpec, TypeVar
from urllib.parse import quote

import httpx

from context_memory_client.codec import decode, decode_page, encode
from context_memory_client.errors import UnexpectedResponse
from context_memory_client.models import (
    AuditEventOut,
    CompanyImportOut,
    CompanyIn,
    CompanyOut,
    ConsolidationRequest,
    ContextRequest,
    ContextResponse,
    DecisionOut,
    ErasureOut,
    FeatureFlag,
    FeatureFlagOut,
    FeatureFlagsOut,
    FolderOut,
    Health,
    JobStatus,
    JobSummary,
    JobView,
    Me,
    MemoryExportOut,
    MemoryImportIn,
    MemoryOut,
    MemoryPolicyIn,
    MemoryPolicyOut,
    ModelBudgetIn,
    ModelBudgetOut,
    OffboardingOut,
    Page,
    PolicyActionOut,
    RateLimitsIn,
    RateLimitsOut,
    Readiness,
    SpacePatch,
    SpaceSettingsOut,
    StoredMessageOut,
    TurnRequest,
    TurnSaved,
    UsageReportOut,
    UserErasureOut,
    UserSettingsOut,
    UserSettingsUpdateOut,
    VersionDiffOut,
    VersionOut,
    VersionSummaryOut,
)

T = TypeVar("T")
P = ParamSpec("P")
NDJSON = "application/x-ndjson"
Params = dict[str, str | int | float | bool]


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request, built once: every retry sends exactly these headers (the same
    `Idempotency-Key` included)."""

    method: str
    path: str
    parse: Callable[[httpx.Response], T]
    params: Params = field(default_factory=dict)
    json: Any = None
    headers: dict[str, str] = field(default_factory=dict)
    retryable: bool = True
    content: bytes | None = None
    """A body that is not JSON (then `headers` names its `Content-Type`)."""


OPERATIONS: dict[str, tuple[str, str]] = {}
"""Each call function's name: the operation it sends, as `(method, path template)` of
`openapi.yaml`."""


def operation(method: str, path: str) -> Callable[[Callable[P, Call[T]]], Callable[P, Call[T]]]:
    """Declare the operation of `openapi.yaml` (`"GET"`, `"/v1/jobs/{job_id}"`) that the
    decorated call function sends; the function itself is returned unchanged."""

    def declare(function: Callable[P, Call[T]]) -> Callable[P, Call[T]]:
        OPERATIONS[function.__name__] = (method, path)
        return function

    return declare


def _seg(value: str | int) -> str:
    return quote(str(value), safe="")


def _json(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError as exc:
        kind = response.headers.get("content-type", "no content type")
        raise UnexpectedResponse(
            f"a {response.status_code} answer that is not JSON ({kind})"
        ) from exc


def _model(cls: type[T]) -> Callable[[httpx.Response], T]:
    return lambda response: decode(cls, _json(response))


def _page(cls: type[T]) -> Callable[[httpx.Response], Page[T]]:
    return lambda response: decode_page(cls, _json(response))


def _nothing(response: httpx.Response) -> None:
    return None


def _page_params(limit: int | None, cursor: str | None, **extra: str | None) -> Params:
    params: Params = {k: v for k, v in extra.items() if v is not None}
    if limit is not None:
        params["limit"] = limit
    if cursor is not None:
        params["cursor"] = cursor
    return params


def etag(version: int) -> str:
    """The entity tag of a profile version (`"3"`)."""
    return f'"{version}"'


# --- the orchestrator's two calls ----------------------------------------------------------------


@operation("POST", "/v1/chats/{chat_id}/context")
def load_context(chat_id: str, request: ContextRequest) -> Call[ContextResponse]:
    # A read: it stores nothing the caller could see twice, so it is retried like a GET.
    return Call(
        "POST", f"/v1/chats/{_seg(chat_id)}/context", _model(ContextResponse), json=encode(request)
    )


@operation("POST", "/v1/chats/{chat_id}/turns")
def save_turn(
    chat_id: str, request: TurnRequest, idempotency_key: str | None = None
) -> Call[TurnSaved]:
    key = idempotency_key or uuid.uuid4().hex
    return Call(
        "POST",
        f"/v1/chats/{_seg(chat_id)}/turns",
        _model(TurnSaved),
        json=encode(request),
        headers={"Idempotency-Key": key},
    )


# --- the user ------------------------------------------------------------------------------------


@operation("GET", "/v1/me")
def get_me() -> Call[Me]:
    return Call("GET", "/v1/me", _model(Me))


@operation("DELETE", "/v1/me")
def erase_me() -> Call[ErasureOut]:
    return Call("DELETE", "/v1/me", _model(ErasureOut))


@operation("GET", "/v1/me/memory")
def get_memory(if_none_match: int | None = None) -> Call[MemoryOut | None]:
    def parse(response: httpx.Response) -> MemoryOut | None:
        return None if response.status_code == 304 else decode(MemoryOut, _json(response))

    headers = {} if if_none_match is None else {"If-None-Match": etag(if_none_match)}
    return Call("GET", "/v1/me/memory", parse, headers=headers)


@operation("PUT", "/v1/me/memory")
def put_memory(content: str, *, if_match: int | None) -> Call[MemoryOut]:
    # Conditional, so a repeat can never overwrite a newer version: at worst it gets a 412.
    headers = {"If-None-Match": "*"} if if_match is None else {"If-Match": etag(if_match)}
    return Call(
        "PUT", "/v1/me/memory", _model(MemoryOut), json={"content": content}, headers=headers
    )


@operation("DELETE", "/v1/me/memory")
def delete_memory(if_match: int | None = None) -> Call[None]:
    headers = {} if if_match is None else {"If-Match": etag(if_match)}
    return Call("DELETE", "/v1/me/memory", _nothing, headers=headers)


@operation("GET", "/v1/me/memory/versions")
def list_versions(
    limit: int | None = None, cursor: str | None = None
) -> Call[Page[VersionSummaryOut]]:
    return Call(
        "GET", "/v1/me/memory/versions", _page(VersionSummaryOut), _page_params(limit, cursor)
    )


@operation("GET", "/v1/me/memory/versions/{n}")
def get_version(n: int) -> Call[VersionOut]:
    return Call("GET", f"/v1/me/memory/versions/{_seg(n)}", _model(VersionOut))


@operation("GET", "/v1/me/memory/versions/{n}/diff")
def diff_version(n: int, against: int | None = None) -> Call[VersionDiffOut]:
    params: Params = {} if against is None else {"against": against}
    return Call("GET", f"/v1/me/memory/versions/{_seg(n)}/diff", _model(VersionDiffOut), params)


@operation("POST", "/v1/me/memory/versions/{n}/restore")
def restore_version(n: int, if_match: int | None = None) -> Call[MemoryOut]:
    headers = {} if if_match is None else {"If-Match": etag(if_match)}
    return Call(
        "POST",
        f"/v1/me/memory/versions/{_seg(n)}/restore",
        _model(MemoryOut),
        headers=headers,
        retryable=if_match is not None,
    )


@operation("GET", "/v1/me/memory/policy-actions")
def list_policy_actions(
    limit: int | None = None, cursor: str | None = None
) -> Call[Page[PolicyActionOut]]:
    return Call(
        "GET",
        "/v1/me/memory/policy-actions",
        _page(PolicyActionOut),
        _page_params(limit, cursor),
    )


@operation("GET", "/v1/me/memory/export")
def export_memory() -> Call[MemoryExportOut]:
    return Call("GET", "/v1/me/memory/export", _model(MemoryExportOut))


@operation("POST", "/v1/me/memory/import")
def import_memory(
    document: MemoryImportIn, *, if_match: int | None = None, if_none_match: bool = False
) -> Call[MemoryOut]:
    # Conditional (over version `if_match`, or only when there is no profile yet), it is safe
    # to repeat; without a condition a repeat would write a second version.
    headers = {} if if_match is None else {"If-Match": etag(if_match)}
    if if_none_match:
        headers["If-None-Match"] = "*"
    return Call(
        "POST",
        "/v1/me/memory/import",
        _model(MemoryOut),
        json=encode(document),
        headers=headers,
        retryable=bool(headers),
    )


@operation("GET", "/v1/me/settings")
def get_settings() -> Call[UserSettingsOut]:
    return Call("GET", "/v1/me/settings", _model(UserSettingsOut))


@operation("PATCH", "/v1/me/settings")
def update_settings(context_memory: bool) -> Call[UserSettingsUpdateOut]:
    # Sets a value: repeating it changes nothing more.
    return Call(
        "PATCH",
        "/v1/me/settings",
        _model(UserSettingsUpdateOut),
        json={"context_memory": context_memory},
    )


@operation("GET", "/v1/me/memory/enablement")
def get_enablement(space_id: str) -> Call[DecisionOut]:
    return Call("GET", "/v1/me/memory/enablement", _model(DecisionOut), {"space_id": space_id})


@operation("POST", "/v1/me/memory/consolidations")
def consolidate(
    request: ConsolidationRequest, wait: bool = False, timeout: float | None = None
) -> Call[JobView]:
    params: Params = {"wait": "true"} if wait else {}
    if timeout is not None:
        params["timeout"] = timeout
    return Call(
        "POST",
        "/v1/me/memory/consolidations",
        _model(JobView),
        params,
        json=encode(request),
        retryable=False,  # no idempotency key: a repeat would queue the exchange twice
    )


@operation("GET", "/v1/jobs/{job_id}")
def get_job(job_id: str) -> Call[JobView]:
    return Call("GET", f"/v1/jobs/{_seg(job_id)}", _model(JobView))


@operation("GET", "/v1/chats/{chat_id}/messages")
def list_messages(
    chat_id: str, limit: int | None = None, cursor: str | None = None
) -> Call[Page[StoredMessageOut]]:
    return Call(
        "GET",
        f"/v1/chats/{_seg(chat_id)}/messages",
        _page(StoredMessageOut),
        _page_params(limit, cursor),
    )


@operation("DELETE", "/v1/chats/{chat_id}")
def delete_chat(chat_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/chats/{_seg(chat_id)}", _nothing)


# --- space admins and operators ------------------------------------------------------------------


@operation("GET", "/v1/spaces/{space_id}")
def get_space(space_id: str) -> Call[SpaceSettingsOut]:
    return Call("GET", f"/v1/spaces/{_seg(space_id)}", _model(SpaceSettingsOut))


@operation("PATCH", "/v1/spaces/{space_id}")
def update_space(space_id: str, patch: SpacePatch) -> Call[SpaceSettingsOut]:
    return Call(
        "PATCH", f"/v1/spaces/{_seg(space_id)}", _model(SpaceSettingsOut), json=encode(patch)
    )


@operation("GET", "/v1/companies/{company_id}/feature-flags")
def list_feature_flags(company_id: str) -> Call[FeatureFlagsOut]:
    return Call("GET", f"/v1/companies/{_seg(company_id)}/feature-flags", _model(FeatureFlagsOut))


@operation("PUT", "/v1/companies/{company_id}/feature-flags/{flag}")
def set_feature_flag(company_id: str, flag: FeatureFlag, enabled: bool) -> Call[FeatureFlagOut]:
    return Call(
        "PUT",
        f"/v1/companies/{_seg(company_id)}/feature-flags/{_seg(flag)}",
        _model(FeatureFlagOut),
        json={"enabled": enabled},
    )


@operation("GET", "/v1/companies/{company_id}/memory-policy")
def get_memory_policy(company_id: str) -> Call[MemoryPolicyOut]:
    return Call("GET", f"/v1/companies/{_seg(company_id)}/memory-policy", _model(MemoryPolicyOut))


@operation("PUT", "/v1/companies/{company_id}/memory-policy")
def set_memory_policy(company_id: str, policy: MemoryPolicyIn) -> Call[MemoryPolicyOut]:
    # The whole policy: repeating it changes nothing more.
    return Call(
        "PUT",
        f"/v1/companies/{_seg(company_id)}/memory-policy",
        _model(MemoryPolicyOut),
        json=encode(policy),
    )


@operation("GET", "/v1/companies/{company_id}/audit-events")
def list_audit_events(
    company_id: str, limit: int | None = None, cursor: str | None = None
) -> Call[Page[AuditEventOut]]:
    return Call(
        "GET",
        f"/v1/companies/{_seg(company_id)}/audit-events",
        _page(AuditEventOut),
        _page_params(limit, cursor),
    )


@operation("GET", "/v1/companies/{company_id}/jobs")
def list_company_jobs(
    company_id: str,
    status: JobStatus | None = None,
    limit: int | None = None,
    cursor: str | None = None,
) -> Call[Page[JobSummary]]:
    return Call(
        "GET",
        f"/v1/companies/{_seg(company_id)}/jobs",
        _page(JobSummary),
        _page_params(limit, cursor, status=status),
    )


@operation("POST", "/v1/companies/{company_id}/jobs/{job_id}/retry")
def retry_job(company_id: str, job_id: str) -> Call[JobSummary]:
    return Call(
        "POST",
        f"/v1/companies/{_seg(company_id)}/jobs/{_seg(job_id)}/retry",
        _model(JobSummary),
        retryable=False,
    )


@operation("GET", "/v1/companies/{company_id}/folders/user-memory")
def get_user_memory_folder(company_id: str) -> Call[FolderOut]:
    return Call("GET", f"/v1/companies/{_seg(company_id)}/folders/user-memory", _model(FolderOut))


@operation("GET", "/v1/companies/{company_id}/rate-limits")
def get_rate_limits(company_id: str) -> Call[RateLimitsOut]:
    return Call("GET", f"/v1/companies/{_seg(company_id)}/rate-limits", _model(RateLimitsOut))


@operation("PUT", "/v1/companies/{company_id}/rate-limits")
def set_rate_limits(company_id: str, limits: RateLimitsIn) -> Call[RateLimitsOut]:
    # The whole set of overrides: repeating it changes nothing more.
    return Call(
        "PUT",
        f"/v1/companies/{_seg(company_id)}/rate-limits",
        _model(RateLimitsOut),
        json=encode(limits),
    )


@operation("GET", "/v1/companies/{company_id}/usage")
def get_usage(company_id: str, from_: date | str, to: date | str) -> Call[UsageReportOut]:
    return Call(
        "GET",
        f"/v1/companies/{_seg(company_id)}/usage",
        _model(UsageReportOut),
        {"from": str(from_), "to": str(to)},
    )


@operation("GET", "/v1/companies/{company_id}/model-budget")
def get_model_budget(company_id: str) -> Call[ModelBudgetOut]:
    return Call("GET", f"/v1/companies/{_seg(company_id)}/model-budget", _model(ModelBudgetOut))


@operation("PUT", "/v1/companies/{company_id}/model-budget")
def set_model_budget(company_id: str, budget: ModelBudgetIn) -> Call[ModelBudgetOut]:
    # The whole budget: repeating it changes nothing more.
    return Call(
        "PUT",
        f"/v1/companies/{_seg(company_id)}/model-budget",
        _model(ModelBudgetOut),
        json=encode(budget),
    )


def _bytes(response: httpx.Response) -> bytes:
    return response.content


@operation("GET", "/v1/companies/{company_id}/export")
def export_company(company_id: str) -> Call[bytes]:
    return Call(
        "GET",
        f"/v1/companies/{_seg(company_id)}/export",
        _bytes,
        headers={"Accept": NDJSON},
    )


@operation("POST", "/v1/companies/{company_id}/import")
def import_company(company_id: str, stream: bytes) -> Call[CompanyImportOut]:
    # Safe to repeat: the same stream sent again to the company it was imported into answers
    # the first import's outcome (`replayed`) and writes nothing.
    return Call(
        "POST",
        f"/v1/companies/{_seg(company_id)}/import",
        _model(CompanyImportOut),
        headers={"Content-Type": NDJSON},
        content=stream,
    )


# --- the control plane: companies, offboarding, erasure requests --------------------------------


@operation("GET", "/v1/companies")
def list_companies(limit: int | None = None, cursor: str | None = None) -> Call[Page[CompanyOut]]:
    return Call("GET", "/v1/companies", _page(CompanyOut), _page_params(limit, cursor))


@operation("POST", "/v1/companies")
def create_company(company: CompanyIn) -> Call[CompanyOut]:
    # Sent again, it answers the registered record (200).
    return Call("POST", "/v1/companies", _model(CompanyOut), json=encode(company))


@operation("GET", "/v1/companies/{company_id}")
def get_company(company_id: str) -> Call[CompanyOut]:
    return Call("GET", f"/v1/companies/{_seg(company_id)}", _model(CompanyOut))


@operation("DELETE", "/v1/companies/{company_id}")
def offboard_company(company_id: str) -> Call[OffboardingOut]:
    # Sent again, it answers the same receipt.
    return Call("DELETE", f"/v1/companies/{_seg(company_id)}", _model(OffboardingOut))


@operation("GET", "/v1/companies/{company_id}/offboarding")
def get_offboarding(company_id: str) -> Call[OffboardingOut]:
    return Call("GET", f"/v1/companies/{_seg(company_id)}/offboarding", _model(OffboardingOut))


@operation("DELETE", "/v1/companies/{company_id}/users/{user_id}")
def erase_company_user(company_id: str, user_id: str) -> Call[UserErasureOut]:
    # Sent again, it finds nothing and answers zeros.
    return Call(
        "DELETE",
        f"/v1/companies/{_seg(company_id)}/users/{_seg(user_id)}",
        _model(UserErasureOut),
    )


@operation("GET", "/v1/companies/{company_id}/spaces")
def list_company_spaces(
    company_id: str, limit: int | None = None, cursor: str | None = None
) -> Call[Page[SpaceSettingsOut]]:
    return Call(
        "GET",
        f"/v1/companies/{_seg(company_id)}/spaces",
        _page(SpaceSettingsOut),
        _page_params(limit, cursor),
    )


@operation("GET", "/v1/companies/{company_id}/spaces/{space_id}/settings")
def get_company_space(company_id: str, space_id: str) -> Call[SpaceSettingsOut]:
    return Call(
        "GET",
        f"/v1/companies/{_seg(company_id)}/spaces/{_seg(space_id)}/settings",
        _model(SpaceSettingsOut),
    )


@operation("PUT", "/v1/companies/{company_id}/spaces/{space_id}/settings")
def set_company_space(company_id: str, space_id: str, patch: SpacePatch) -> Call[SpaceSettingsOut]:
    return Call(
        "PUT",
        f"/v1/companies/{_seg(company_id)}/spaces/{_seg(space_id)}/settings",
        _model(SpaceSettingsOut),
        json=encode(patch),
    )


# --- operations ----------------------------------------------------------------------------------


@operation("GET", "/healthz")
def health() -> Call[Health]:
    return Call("GET", "/healthz", _model(Health))


@operation("GET", "/readyz")
def ready() -> Call[Readiness]:
    return Call("GET", "/readyz", _model(Readiness))
