"""Every route of the service as a `Call`: method, path, query, body, headers, whether it may be
retried, and how to read the answer. The async and the sync client send the same calls."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import quote

import httpx

from context_memory_client.codec import decode, decode_page, encode
from context_memory_client.errors import UnexpectedResponse
from context_memory_client.models import (
    AuditEventOut,
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
    MemoryOut,
    MemoryPolicyIn,
    MemoryPolicyOut,
    OffboardingOut,
    Page,
    PolicyActionOut,
    Readiness,
    SpacePatch,
    SpaceSettingsOut,
    StoredMessageOut,
    TurnRequest,
    TurnSaved,
    UserErasureOut,
    UserSettingsOut,
    UserSettingsUpdateOut,
    VersionDiffOut,
    VersionOut,
    VersionSummaryOut,
)

T = TypeVar("T")
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


def load_context(chat_id: str, request: ContextRequest) -> Call[ContextResponse]:
    # A read: it stores nothing the caller could see twice, so it is retried like a GET.
    return Call(
        "POST", f"/v1/chats/{_seg(chat_id)}/context", _model(ContextResponse), json=encode(request)
    )


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


def get_me() -> Call[Me]:
    return Call("GET", "/v1/me", _model(Me))


def erase_me() -> Call[ErasureOut]:
    return Call("DELETE", "/v1/me", _model(ErasureOut))


def get_memory(if_none_match: int | None = None) -> Call[MemoryOut | None]:
    def parse(response: httpx.Response) -> MemoryOut | None:
        return None if response.status_code == 304 else decode(MemoryOut, _json(response))

    headers = {} if if_none_match is None else {"If-None-Match": etag(if_none_match)}
    return Call("GET", "/v1/me/memory", parse, headers=headers)


def put_memory(content: str, *, if_match: int | None) -> Call[MemoryOut]:
    # Conditional, so a repeat can never overwrite a newer version: at worst it gets a 412.
    headers = {"If-None-Match": "*"} if if_match is None else {"If-Match": etag(if_match)}
    return Call(
        "PUT", "/v1/me/memory", _model(MemoryOut), json={"content": content}, headers=headers
    )


def delete_memory(if_match: int | None = None) -> Call[None]:
    headers = {} if if_match is None else {"If-Match": etag(if_match)}
    return Call("DELETE", "/v1/me/memory", _nothing, headers=headers)


def list_versions(
    limit: int | None = None, cursor: str | None = None
) -> Call[Page[VersionSummaryOut]]:
    return Call(
        "GET", "/v1/me/memory/versions", _page(VersionSummaryOut), _page_params(limit, cursor)
    )


def get_version(n: int) -> Call[VersionOut]:
    return Call("GET", f"/v1/me/memory/versions/{_seg(n)}", _model(VersionOut))


def diff_version(n: int, against: int | None = None) -> Call[VersionDiffOut]:
    params: Params = {} if against is None else {"against": against}
    return Call("GET", f"/v1/me/memory/versions/{_seg(n)}/diff", _model(VersionDiffOut), params)


def restore_version(n: int, if_match: int | None = None) -> Call[MemoryOut]:
    headers = {} if if_match is None else {"If-Match": etag(if_match)}
    return Call(
        "POST",
        f"/v1/me/memory/versions/{_seg(n)}/restore",
        _model(MemoryOut),
        headers=headers,
        retryable=if_match is not None,
    )


def list_policy_actions(
    limit: int | None = None, cursor: str | None = None
) -> Call[Page[PolicyActionOut]]:
    return Call(
        "GET",
        "/v1/me/memory/policy-actions",
        _page(PolicyActionOut),
        _page_params(limit, cursor),
    )


def export_memory() -> Call[MemoryExportOut]:
    return Call("GET", "/v1/me/memory/export", _model(MemoryExportOut))


def get_settings() -> Call[UserSettingsOut]:
    return Call("GET", "/v1/me/settings", _model(UserSettingsOut))


def update_settings(context_memory: bool) -> Call[UserSettingsUpdateOut]:
    # Sets a value: repeating it changes nothing more.
    return Call(
        "PATCH",
        "/v1/me/settings",
        _model(UserSettingsUpdateOut),
        json={"context_memory": context_memory},
    )


def get_enablement(space_id: str) -> Call[DecisionOut]:
    return Call("GET", "/v1/me/memory/enablement", _model(DecisionOut), {"space_id": space_id})


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


def get_job(job_id: str) -> Call[JobView]:
    return Call("GET", f"/v1/jobs/{_seg(job_id)}", _model(JobView))


def list_messages(
    chat_id: str, limit: int | None = None, cursor: str | None = None
) -> Call[Page[StoredMessageOut]]:
    return Call(
        "GET",
        f"/v1/chats/{_seg(chat_id)}/messages",
        _page(StoredMessageOut),
        _page_params(limit, cursor),
    )


def delete_chat(chat_id: str) -> Call[None]:
    return Call("DELETE", f"/v1/chats/{_seg(chat_id)}", _nothing)


# --- space admins and operators ------------------------------------------------------------------


def get_space(space_id: str) -> Call[SpaceSettingsOut]:
    return Call("GET", f"/v1/spaces/{_seg(space_id)}", _model(SpaceSettingsOut))


def update_space(space_id: str, patch: SpacePatch) -> Call[SpaceSettingsOut]:
    return Call(
        "PATCH", f"/v1/spaces/{_seg(space_id)}", _model(SpaceSettingsOut), json=encode(patch)
    )


def list_feature_flags(company_id: str) -> Call[FeatureFlagsOut]:
    return Call("GET", f"/v1/companies/{_seg(company_id)}/feature-flags", _model(FeatureFlagsOut))


def set_feature_flag(company_id: str, flag: FeatureFlag, enabled: bool) -> Call[FeatureFlagOut]:
    return Call(
        "PUT",
        f"/v1/companies/{_seg(company_id)}/feature-flags/{_seg(flag)}",
        _model(FeatureFlagOut),
        json={"enabled": enabled},
    )


def get_memory_policy(company_id: str) -> Call[MemoryPolicyOut]:
    return Call("GET", f"/v1/companies/{_seg(company_id)}/memory-policy", _model(MemoryPolicyOut))


def set_memory_policy(company_id: str, policy: MemoryPolicyIn) -> Call[MemoryPolicyOut]:
    # The whole policy: repeating it changes nothing more.
    return Call(
        "PUT",
        f"/v1/companies/{_seg(company_id)}/memory-policy",
        _model(MemoryPolicyOut),
        json=encode(policy),
    )


def list_audit_events(
    company_id: str, limit: int | None = None, cursor: str | None = None
) -> Call[Page[AuditEventOut]]:
    return Call(
        "GET",
        f"/v1/companies/{_seg(company_id)}/audit-events",
        _page(AuditEventOut),
        _page_params(limit, cursor),
    )


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


def retry_job(company_id: str, job_id: str) -> Call[JobSummary]:
    return Call(
        "POST",
        f"/v1/companies/{_seg(company_id)}/jobs/{_seg(job_id)}/retry",
        _model(JobSummary),
        retryable=False,
    )


def get_user_memory_folder(company_id: str) -> Call[FolderOut]:
    return Call("GET", f"/v1/companies/{_seg(company_id)}/folders/user-memory", _model(FolderOut))


# --- the control plane: companies, offboarding, erasure requests --------------------------------


def list_companies(limit: int | None = None, cursor: str | None = None) -> Call[Page[CompanyOut]]:
    return Call("GET", "/v1/companies", _page(CompanyOut), _page_params(limit, cursor))


def create_company(company: CompanyIn) -> Call[CompanyOut]:
    # Sent again, it answers the registered record (200).
    return Call("POST", "/v1/companies", _model(CompanyOut), json=encode(company))


def get_company(company_id: str) -> Call[CompanyOut]:
    return Call("GET", f"/v1/companies/{_seg(company_id)}", _model(CompanyOut))


def offboard_company(company_id: str) -> Call[OffboardingOut]:
    # Sent again, it answers the same receipt.
    return Call("DELETE", f"/v1/companies/{_seg(company_id)}", _model(OffboardingOut))


def get_offboarding(company_id: str) -> Call[OffboardingOut]:
    return Call("GET", f"/v1/companies/{_seg(company_id)}/offboarding", _model(OffboardingOut))


def erase_company_user(company_id: str, user_id: str) -> Call[UserErasureOut]:
    # Sent again, it finds nothing and answers zeros.
    return Call(
        "DELETE",
        f"/v1/companies/{_seg(company_id)}/users/{_seg(user_id)}",
        _model(UserErasureOut),
    )


def list_company_spaces(
    company_id: str, limit: int | None = None, cursor: str | None = None
) -> Call[Page[SpaceSettingsOut]]:
    return Call(
        "GET",
        f"/v1/companies/{_seg(company_id)}/spaces",
        _page(SpaceSettingsOut),
        _page_params(limit, cursor),
    )


def get_company_space(company_id: str, space_id: str) -> Call[SpaceSettingsOut]:
    return Call(
        "GET",
        f"/v1/companies/{_seg(company_id)}/spaces/{_seg(space_id)}/settings",
        _model(SpaceSettingsOut),
    )


def set_company_space(company_id: str, space_id: str, patch: SpacePatch) -> Call[SpaceSettingsOut]:
    return Call(
        "PUT",
        f"/v1/companies/{_seg(company_id)}/spaces/{_seg(space_id)}/settings",
        _model(SpaceSettingsOut),
        json=encode(patch),
    )


# --- operations ----------------------------------------------------------------------------------


def health() -> Call[Health]:
    return Call("GET", "/healthz", _model(Health))


def ready() -> Call[Readiness]:
    return Call("GET", "/readyz", _model(Readiness))
