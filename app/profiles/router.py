"""HTTP routes of the caller's own memory: read, edit, clear, history, diff, restore, export,
what the company's memory policy kept out of it, and the context-memory switch
(`/v1/me/settings`, whose off deletes all of it).

Everything is scoped to the token's (company, user); there is no user id in any path. The ETag
of the profile is its version number, quoted; writes are conditional on it.
"""

from __future__ import annotations

from typing import Annotated, Any, Final

from fastapi import APIRouter, Body, Depends, Header, Path, Query, Request, Response, status

from app.enablement import service as enablement
from app.kit.api_tags import USER
from app.kit.auth.dependencies import PrincipalDep
from app.kit.deps import PageDep, SessionDep, database
from app.kit.pagination import Page
from app.kit.spool import ReadSlot, SpooledResponse, read_slots, send_timeout
from app.profiles import export, service, switch
from app.profiles.schemas import (
    MemoryExportOut,
    MemoryIn,
    MemoryOut,
    PolicyActionOut,
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
from app.rate_limits.dependency import rate_limited
from app.rate_limits.policy import RouteClass

router = APIRouter(tags=[USER])  # full paths, no prefix: metrics label by template
settings_router = APIRouter(tags=[USER])

MAX_VERSION: Final = 2**31 - 1
MEMORY_PATH: Final = "/v1/me/memory"

IfMatch = Annotated[
    str | None,
    Header(description='The ETag of the current version, e.g. `"3"` (required to change it)'),
]
IfNoneMatch = Annotated[str | None, Header()]
CreateIfNoneMatch = Annotated[
    str | None,
    Header(
        description="`*` to create the profile (only when there is none yet)",
        openapi_examples={"create": {"summary": "Create the first version", "value": "*"}},
    ),
]
VersionPath = Annotated[
    int,
    Path(
        ge=1,
        le=MAX_VERSION,
        description="A version number",
        openapi_examples={"first": {"summary": "The first version", "value": 1}},
    ),
]
AgainstQuery = Annotated[
    int | None,
    Query(ge=0, le=MAX_VERSION, description="Diff from this version (0: empty; default: previous)"),
]


# Request examples, as Swagger UI's "Try it out" sends them (`tests/test_openapi_examples.py`)
MEMORY_EXAMPLES: Final[dict[str, Any]] = {
    "profile": {
        "summary": "A whole profile in the memory.md format (every section, in order)",
        "value": {
            "content": "# User Memory\n\n"
            "## Identity\n- Name: Alice\n\n"
            "## Communication Preferences\n- Prefers concise answers with examples\n\n"
            "## Work Context\n- Credit risk analyst at Helvetia Bank\n\n"
            "## Skills & Expertise\n_(empty)_\n\n"
            "## Recent Topics\n_(empty)_\n\n"
            "## Open Questions / Follow-ups\n_(empty)_\n"
        },
    },
}
SETTINGS_EXAMPLES: Final[dict[str, Any]] = {
    "on": {"summary": "Turn context memory on", "value": {"context_memory": True}},
}


async def _version_policy(request: Request) -> VersionPolicy:
    """Versions counted by the service's token counters, retained as the settings say, what the
    memory policy did counted in the service's metrics, the company's users with memory
    bounded by their quota."""
    state = request.app.state
    return VersionPolicy(
        state.tokens.stored,
        state.settings.memory_max_versions,
        on_policy_actions=state.metrics.observe_memory_policy_actions,
        users_with_memory_quota=state.settings.quota_company_users_with_memory,
    )


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
    description="Called for the person, e.g. by a memory page or an assistant, to show what the "
    "service knows about them; the ETag is the version to send in `If-Match` when editing it.",
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
    dependencies=[Depends(rate_limited(RouteClass.MEMORY_WRITES))],
    summary="Create (If-None-Match: *) or replace (If-Match) your memory profile",
    description="Called for the person who edits their memory by hand (a memory page, an "
    "assistant): a new version with the whole profile. `If-None-Match: *` creates the first "
    'one; replacing needs `If-Match` with the current ETag (e.g. `"1"`), and no `If-None-Match`.',
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
    body: Annotated[MemoryIn, Body(openapi_examples=MEMORY_EXAMPLES)],
    principal: PrincipalDep,
    *,
    session: SessionDep,
    response: Response,
    policy: VersionPolicyDep,
    if_match: IfMatch = None,
    if_none_match: CreateIfNoneMatch = None,
) -> MemoryOut:
    outcome = await service.replace_memory(
        session,
        principal,
        body.content,
        WriteConditions(parse_entity_tags(if_match), parse_entity_tags(if_none_match)),
        policy=policy,
    )
    return replaced(outcome, response)


def replaced(outcome: service.WriteOutcome, response: Response) -> MemoryOut:
    """The answer to a write of the whole profile: its ETag, and 201 with its Location when
    the write created the profile."""
    response.headers["ETag"] = etag(outcome.row.version)
    if outcome.created:
        response.status_code = status.HTTP_201_CREATED
        response.headers["Location"] = MEMORY_PATH
    return MemoryOut.of(outcome.row)


@router.delete(
    MEMORY_PATH,
    dependencies=[Depends(rate_limited(RouteClass.MEMORY_WRITES))],
    summary="Clear your memory profile and its history (your settings stay)",
    description="Called for the person who wants their memory forgotten but memory left on: "
    "the profile and every version go, the settings stay, and a later write starts afresh.",
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
    description="Called for the person, e.g. by a memory page's history view: why and when "
    "each retained version was written, its size in tokens and its operation counts.",
    responses=_NOT_FOUND,
)
async def list_versions(
    principal: PrincipalDep, session: SessionDep, page: PageDep
) -> Page[VersionSummaryOut]:
    return VersionSummaryOut.page(await service.list_versions(session, principal, page))


@router.get(
    f"{MEMORY_PATH}/versions/{{n}}",
    summary="One version: content and the operations that produced it",
    description="Called for the person who looks back at an earlier state of their memory, "
    "before restoring it, say.",
    responses=_NOT_FOUND,
)
async def get_version(n: VersionPath, principal: PrincipalDep, session: SessionDep) -> VersionOut:
    return VersionOut.model_validate(await service.read_version(session, principal, n))


@router.get(
    f"{MEMORY_PATH}/versions/{{n}}/diff",
    summary="Unified diff of version n against another (default: the previous one)",
    description="Called for the person who wants to see what a consolidation or an edit "
    "changed in their memory.",
    responses=_NOT_FOUND,
)
async def diff_version(
    n: VersionPath, principal: PrincipalDep, session: SessionDep, against: AgainstQuery = None
) -> VersionDiffOut:
    return VersionDiffOut.of(await service.diff_versions(session, principal, n, against))


@router.post(
    f"{MEMORY_PATH}/versions/{{n}}/restore",
    dependencies=[Depends(rate_limited(RouteClass.MEMORY_WRITES))],
    summary="Make version n's content the current profile again (a new version)",
    description="Called for the person who undoes a change to their memory: version n's "
    "content becomes the head, as a new version, conditional on `If-Match`.",
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
    f"{MEMORY_PATH}/policy-actions",
    summary="What your company's memory policy kept out of your memory, newest first",
    description='Called for the person, e.g. by a memory page saying "2 things were not '
    'remembered: looked like a password or key; ...": each line a write did not keep '
    "(`drop`) or kept with a value hidden (`redact`), with when, where and why, never the "
    "value. Cleared with the memory.",
    responses=_NOT_FOUND,
)
async def list_policy_actions(
    principal: PrincipalDep, session: SessionDep, page: PageDep
) -> Page[PolicyActionOut]:
    return PolicyActionOut.page(await service.list_memory_policy_actions(session, principal, page))


class MemoryExportResponse(SpooledResponse):
    """The export's JSON document, read from its snapshot into a spool and sent from there
    (`export.py`); the snapshot, and with it the user's export lock, ends as soon as it is read
    or the response ends first."""

    media_type = "application/json"

    def __init__(
        self, stream: export.MemoryExportStream, slot: ReadSlot, *, send_timeout: float
    ) -> None:
        super().__init__(
            stream.write_to,
            stream.close,
            slot,
            send_timeout=send_timeout,
            what="a user's memory export",
        )


@router.get(
    f"{MEMORY_PATH}/export",
    dependencies=[Depends(rate_limited(RouteClass.EXPORTS))],
    summary="Everything the service holds about you, as one JSON document",
    description="Called for the person who asks for their data (a data-portability request): "
    "the profile with its versions, the settings, the stored chats, the jobs, the changes "
    "of their own setting and what the memory policy kept out, in one document.",
    response_model=MemoryExportOut,  # what the stream writes (the schema, not a check of it)
    responses={
        429: {
            "description": "Another export of yours is still running (one at a time), your "
            "company's exports are being read as many at once as one company may, or over a "
            "rate limit; retry after `Retry-After` seconds"
        },
        503: {
            "description": "The service is reading as many exports at once as it reads, or the "
            "database is unreachable; retry after `Retry-After` seconds"
        },
    },
)
async def export_memory(principal: PrincipalDep, request: Request) -> MemoryExportResponse:
    slot = export.take_slot(read_slots(request), principal)
    try:
        stream = await export.open_export(database(request), principal)
    except BaseException:
        slot.end()
        raise
    return MemoryExportResponse(stream, slot, send_timeout=send_timeout(request))


# --- the switch (`settings`): off deletes the memory ------------------------------------------


@settings_router.get(
    "/v1/me/settings",
    summary="Your context memory setting",
    description="Called by a settings page to show the person's context memory switch.",
)
async def get_my_settings(principal: PrincipalDep, session: SessionDep) -> UserSettingsOut:
    return UserSettingsOut(context_memory=await enablement.read_user_setting(session, principal))


@settings_router.patch(
    "/v1/me/settings",
    summary="Turn your context memory on or off; off permanently deletes your memory",
    description="Called when the person flips their context memory switch. Turning it off "
    "deletes their profile, its versions and pending jobs at once, and says what went.",
)
async def patch_my_settings(
    body: Annotated[UserSettingsPatch, Body(openapi_examples=SETTINGS_EXAMPLES)],
    principal: PrincipalDep,
    session: SessionDep,
) -> UserSettingsUpdateOut:
    update = await switch.update_user_setting(session, principal, body.context_memory)
    return UserSettingsUpdateOut.model_validate(update)
