"""HTTP routes of the caller's own memory: read, edit, clear, history, diff, restore, export,
and the context-memory switch (`/v1/me/settings`, whose off deletes all of it).

Everything is scoped to the token's (company, user); there is no user id in any path. The ETag
of the profile is its version number, quoted; writes are conditional on it.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import APIRouter, Depends, Header, Path, Query, Request, Response, status

from app.auth import PrincipalDep
from app.db import SessionDep
from app.enablement import service as enablement
from app.pagination import Page, PageDep
from app.profiles import service, switch
from app.profiles.schemas import (
    MemoryExportOut,
    MemoryIn,
    MemoryOut,
    UserSettingsOut,
    UserSettingsPatch,
    UserSettingsUpdateOut,
    VersionDiffOut,
    VersionOut,
    VersionSummaryOut,
)
from app.profiles.versions import (
    VersionPolicy,
    WriteConditions,
    etag,
    is_not_modified,
    parse_entity_tags,
)

router = APIRouter(tags=["memory"])  # full paths, no prefix: metrics label by template
settings_router = APIRouter(tags=["settings"])

MAX_VERSION: Final = 2**31 - 1
MEMORY_PATH: Final = "/v1/me/memory"

IfMatch = Annotated[
    str | None,
    Header(description='The ETag of the current version, e.g. `"3"` (required to change it)'),
]
IfNoneMatch = Annotated[str | None, Header()]
VersionPath = Annotated[int, Path(ge=1, le=MAX_VERSION, description="A version number")]
AgainstQuery = Annotated[
    int | None,
    Query(ge=0, le=MAX_VERSION, description="Diff from this version (0: empty; default: previous)"),
]


async def _version_policy(request: Request) -> VersionPolicy:
    """Versions counted by the service's token counters, retained as the settings say."""
    state = request.app.state
    return VersionPolicy(state.tokens.stored, state.settings.memory_max_versions)


VersionPolicyDep = Annotated[VersionPolicy, Depends(_version_policy)]

Responses = dict[int | str, dict[str, Any]]
_NOT_FOUND: Responses = {
    404: {"description": "No memory profile (or not yours: there is no other)"}
}
# OpenAPI links: a written version can be read, diffed and restored by its number
VERSION_LINKS: Responses = {
    name: {
        "operationRef": f"#/paths/~1v1~1me~1memory~1versions~1{{n}}{suffix}",
        "parameters": {"n": "$response.body#/version"},
    }
    for name, suffix in (
        ("Version", "/get"),
        ("VersionDiff", "~1diff/get"),
        ("RestoreVersion", "~1restore/post"),
    )
}
_CONDITIONAL: Responses = {
    412: {"description": "The ETag is not the current version (re-read and retry)"},
    428: {"description": "A conditional header is required"},
}


@router.get(
    MEMORY_PATH,
    summary="Your memory profile (ETag = version)",
    response_model=MemoryOut,
    responses={304: {"description": "Unchanged since the ETag in If-None-Match"}, **_NOT_FOUND},
)
async def get_memory(
    principal: PrincipalDep,
    session: SessionDep,
    response: Response,
    if_none_match: IfNoneMatch = None,
) -> MemoryOut | Response:
    row = await service.read_memory(session, principal)
    if is_not_modified(row.version, parse_entity_tags(if_none_match)):
        return Response(
            status_code=status.HTTP_304_NOT_MODIFIED, headers={"ETag": etag(row.version)}
        )
    response.headers["ETag"] = etag(row.version)
    return MemoryOut.of(row)


@router.put(
    MEMORY_PATH,
    summary="Create (If-None-Match: *) or replace (If-Match) your memory profile",
    responses={
        200: {"description": "Replaced the profile (a new version)", "links": VERSION_LINKS},
        201: {
            "model": MemoryOut,
            "description": "Created the profile (its first version)",
            "links": VERSION_LINKS,
        },
        **_CONDITIONAL,
        409: {"description": "Context memory is turned off for you"},
        422: {"description": "Not a valid profile (see errors: body.content), or too large"},
    },
)
async def put_memory(
    body: MemoryIn,
    principal: PrincipalDep,
    *,
    session: SessionDep,
    response: Response,
    policy: VersionPolicyDep,
    if_match: IfMatch = None,
    if_none_match: IfNoneMatch = None,
) -> MemoryOut:
    outcome = await service.replace_memory(
        session,
        principal,
        body.content,
        WriteConditions(parse_entity_tags(if_match), parse_entity_tags(if_none_match)),
        policy=policy,
    )
    response.headers["ETag"] = etag(outcome.row.version)
    if outcome.created:
        response.status_code = status.HTTP_201_CREATED
        response.headers["Location"] = MEMORY_PATH
    return MemoryOut.of(outcome.row)


@router.delete(
    MEMORY_PATH,
    summary="Clear your memory profile and its history (your settings stay)",
    status_code=status.HTTP_204_NO_CONTENT,
    responses={**_NOT_FOUND, 412: _CONDITIONAL[412]},
)
async def delete_memory(
    principal: PrincipalDep, session: SessionDep, if_match: IfMatch = None
) -> Response:
    await service.clear_memory(session, principal, if_match=parse_entity_tags(if_match))
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.get(
    f"{MEMORY_PATH}/versions",
    summary="Your retained profile versions, newest first (no content)",
    responses=_NOT_FOUND,
)
async def list_versions(
    principal: PrincipalDep, session: SessionDep, page: PageDep
) -> Page[VersionSummaryOut]:
    return VersionSummaryOut.page(await service.list_versions(session, principal, page))


@router.get(
    f"{MEMORY_PATH}/versions/{{n}}",
    summary="One version: content and the operations that produced it",
    responses=_NOT_FOUND,
)
async def get_version(n: VersionPath, principal: PrincipalDep, session: SessionDep) -> VersionOut:
    return VersionOut.of_row(await service.read_version(session, principal, n))


@router.get(
    f"{MEMORY_PATH}/versions/{{n}}/diff",
    summary="Unified diff of version n against another (default: the previous one)",
    responses=_NOT_FOUND,
)
async def diff_version(
    n: VersionPath, principal: PrincipalDep, session: SessionDep, against: AgainstQuery = None
) -> VersionDiffOut:
    return VersionDiffOut.of(await service.diff_versions(session, principal, n, against))


@router.post(
    f"{MEMORY_PATH}/versions/{{n}}/restore",
    summary="Make version n's content the current profile again (a new version)",
    response_model=MemoryOut,
    status_code=status.HTTP_201_CREATED,
    responses={
        200: {"model": MemoryOut, "description": "Version n already is the current content"},
        201: {"description": "Restored as a new version", "links": VERSION_LINKS},
        **_NOT_FOUND,
        **_CONDITIONAL,
    },
)
async def restore_version(
    n: VersionPath,
    principal: PrincipalDep,
    *,
    session: SessionDep,
    response: Response,
    policy: VersionPolicyDep,
    if_match: IfMatch = None,
) -> MemoryOut:
    outcome = await service.restore_version(
        session, principal, n, if_match=parse_entity_tags(if_match), policy=policy
    )
    response.headers["ETag"] = etag(outcome.row.version)
    if outcome.written:
        response.headers["Location"] = f"{MEMORY_PATH}/versions/{outcome.row.version}"
    else:
        response.status_code = status.HTTP_200_OK
    return MemoryOut.of(outcome.row)


@router.get(
    f"{MEMORY_PATH}/export",
    summary="Everything the service holds about you, as one JSON document",
)
async def export_memory(principal: PrincipalDep, session: SessionDep) -> MemoryExportOut:
    return MemoryExportOut.of(await service.export_memory(session, principal))


# --- the switch (`settings`): off deletes the memory ------------------------------------------


@settings_router.get("/v1/me/settings", summary="Your context memory setting")
async def get_my_settings(principal: PrincipalDep, session: SessionDep) -> UserSettingsOut:
    return UserSettingsOut(context_memory=await enablement.read_user_setting(session, principal))


@settings_router.patch(
    "/v1/me/settings",
    summary="Turn your context memory on or off; off permanently deletes your memory",
)
async def patch_my_settings(
    body: UserSettingsPatch, principal: PrincipalDep, session: SessionDep
) -> UserSettingsUpdateOut:
    update = await switch.update_user_setting(session, principal, body.context_memory)
    return UserSettingsUpdateOut.of(update)
