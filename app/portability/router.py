"""HTTP routes of a company's data in and out (operators: the NDJSON export and its import into
an empty company), and a user's import of their own memory export."""

from __future__ import annotations

import re
from typing import Annotated, Any, Final

from fastapi import APIRouter, Body, Depends, Header, Request, Response, status

from app.kit.api_tags import OPERATOR, USER
from app.kit.auth.dependencies import PlatformOperatorDep, PrincipalDep
from app.kit.deps import CompanyIdPath, SessionDep, company_id_path, database
from app.kit.spool import ReadSlot, SpooledResponse, read_slots, send_timeout, spooled_body
from app.portability import export, importer, memory_import
from app.portability.export import CompanySnapshot
from app.portability.format import MEDIA_TYPE
from app.portability.schemas import CompanyImportOut, MemoryImportIn
from app.profiles.router import MEMORY_PATH, VERSION_LINKS, VersionPolicyDep, replaced
from app.profiles.schemas import MemoryOut
from app.profiles.versions import WriteConditions, parse_entity_tags
from app.rate_limits.dependency import rate_limited
from app.rate_limits.policy import RouteClass

router = APIRouter()  # full paths, no prefix: metrics label by template; a tag per caller

REPLAYED_HEADER: Final = "Idempotent-Replayed"
COMPANY_IMPORT: Final = re.compile(r"/v1/companies/[^/]+/import")
"""The import's path, which has a body limit of its own (`IMPORT_MAX_BYTES`, read as it arrives)."""


ImportedCompany = Annotated[
    str, company_id_path("initech", "A company this deployment holds nothing of")
]
IfMatch = Annotated[
    str | None,
    Header(description='Import only over this version, e.g. `"3"` (else 412)'),
]
IfNoneMatch = Annotated[
    str | None,
    Header(description="`*`: import only when you have no profile yet (else 412)"),
]

# The request examples, as Swagger UI's "Try it out" sends them (`tests/test_openapi_examples.py`)
_STREAM_EXAMPLE: Final = "\n".join(
    [
        '{"type":"header","format":"context-memory.company-export","version":1,'
        '"company_id":"initech","exported_at":"2026-12-01T09:00:00+00:00",'
        '"record_types":["feature_flag","space"]}',
        '{"type":"feature_flag","flag":"FEATURE_FLAG_ENABLE_CONTEXT_MEMORY_UN_22033",'
        '"enabled":true,"updated_at":"2026-11-30T08:00:00+00:00",'
        '"updated_by_company_id":"platform","updated_by":"olga"}',
        '{"type":"space","space_id":"space-1","context_memory":true,"web_search":false,'
        '"use_orchestrator_language_model":true,"language_model":"AZURE_GPT_4o_2024_1120",'
        '"max_tokens":2000,"updated_at":"2026-11-30T08:05:00+00:00",'
        '"updated_by_company_id":"initech","updated_by":"sam"}',
        '{"type":"end","counts":{"feature_flag":1,"space":1}}',
        "",
    ]
)
_IMPORT_BODY: Final[dict[str, Any]] = {
    "required": True,
    "description": "An export stream of this very company (`GET .../export`), as it was sent",
    "content": {
        MEDIA_TYPE: {
            "schema": {"type": "string", "description": "NDJSON (docs/portability.md)"},
            "examples": {
                "stream": {
                    "summary": "A small company: its flag and one space",
                    "value": _STREAM_EXAMPLE,
                }
            },
        }
    },
}
_EXPORT_RESPONSE: Final[dict[int | str, dict[str, Any]]] = {
    200: {
        "description": "The company as NDJSON: a header line, the records, a trailer line with "
        "the counts (a stream without its trailer was cut short)",
        "content": {
            MEDIA_TYPE: {
                "schema": {"type": "string"},
                "example": _STREAM_EXAMPLE.replace("initech", "acme"),
            }
        },
    },
    429: {
        "description": "The company's exports are being read as many at once as one company "
        "may, or over a rate limit; retry after `Retry-After` seconds (nothing was audited)"
    },
    503: {
        "description": "The service is reading as many exports at once as it reads, or the "
        "database is unreachable; retry after `Retry-After` seconds"
    },
}
_PROFILE_EXAMPLE: Final = (
    "---\nuser_id: alice\nschema_version: 1\nlast_updated: 2026-11-30T12:00:00Z\n"
    "turn_count: 3\n---\n\n# User Memory\n\n"
    "## Identity\n- Name: Alice\n\n"
    "## Communication Preferences\n- Prefers concise answers with examples\n\n"
    "## Work Context\n- Credit risk analyst at Helvetia Bank\n\n"
    "## Skills & Expertise\n_(empty)_\n\n"
    "## Recent Topics\n_(empty)_\n\n"
    "## Open Questions / Follow-ups\n_(empty)_\n"
)
MEMORY_IMPORT_EXAMPLES: Final[dict[str, Any]] = {
    "export": {
        "summary": "A memory export as it was downloaded (only profile.content is read)",
        "value": {
            "user_id": "alice",
            "company_id": "acme",
            "exported_at": "2026-11-30T12:05:00Z",
            "settings": {"context_memory": True},
            "profile": {
                "content": _PROFILE_EXAMPLE,
                "version": 3,
                "tokens": 41,
                "updated_at": "2026-11-30T12:00:00Z",
            },
            "versions": [],
            "chats": [],
            "jobs": [],
            "audit_events": [],
            "policy_actions": [],
        },
    },
}


class SnapshotResponse(SpooledResponse):
    """The export's NDJSON, read from its snapshot into a spool and sent from there; the
    snapshot ends as soon as it is read, or the response ends first (failed, or the client
    gone)."""

    media_type = MEDIA_TYPE

    def __init__(self, snapshot: CompanySnapshot, slot: ReadSlot, *, send_timeout: float) -> None:
        name = re.sub(r"[^A-Za-z0-9._-]", "_", snapshot.company_id)
        super().__init__(
            snapshot.write_to,
            snapshot.close,
            slot,
            send_timeout=send_timeout,
            what="a company export",
            headers={
                "Content-Disposition": f'attachment; filename="{name}.ndjson"',
                "Cache-Control": "no-store",
            },
        )


# --- operator -----------------------------------------------------------------------------------


@router.get(
    "/v1/companies/{company_id}/export",
    dependencies=[Depends(rate_limited(RouteClass.EXPORTS))],
    tags=[OPERATOR],
    summary="Everything held for the company, as an NDJSON stream (one snapshot)",
    description="Called by an operator moving a company to another deployment (or keeping a "
    "copy): flags, memory policy, spaces, user settings, folders and ACLs, every user's "
    "profile with its retained versions and their provenance, chats with turns and messages, "
    "and the audit trail, read from one consistent snapshot and streamed as it is read. The "
    "one admin route that returns memory content and chat text: it is audited "
    "(`company.exported`). Format: docs/portability.md.",
    response_class=SnapshotResponse,
    status_code=status.HTTP_200_OK,
    responses=_EXPORT_RESPONSE,
)
async def export_company(
    company_id: CompanyIdPath, operator: PlatformOperatorDep, session: SessionDep, request: Request
) -> SnapshotResponse:
    slot = read_slots(request).take(company_id)  # refused: nothing audited
    try:
        snapshot = await export.start_export(session, database(request), operator, company_id)
    except BaseException:
        slot.end()
        raise
    return SnapshotResponse(snapshot, slot, send_timeout=send_timeout(request))


@router.post(
    "/v1/companies/{company_id}/import",
    dependencies=[Depends(rate_limited(RouteClass.MEMORY_WRITES))],
    tags=[OPERATOR],
    summary="Load an export stream into this empty company (all or nothing)",
    description="Called by an operator on the deployment a company moves to: the stream of "
    "`GET .../export`, received whole (up to IMPORT_MAX_BYTES) before it is loaded in one "
    "transaction into this company, which must hold nothing yet (409), with every profile "
    "version passing the company's memory policy. Sending the same stream again answers the "
    "first import's outcome (200) and writes nothing.",
    status_code=status.HTTP_201_CREATED,
    openapi_extra={"requestBody": _IMPORT_BODY},
    responses={
        200: {"model": CompanyImportOut, "description": "This stream was imported before"},
        201: {"description": "Imported"},
        409: {"description": "The company already holds data (from elsewhere)"},
        413: {"description": "The stream is over IMPORT_MAX_BYTES"},
        422: {"description": "A line that cannot be loaded (`errors` names it); nothing was"},
    },
)
async def import_company(
    company_id: ImportedCompany,
    operator: PlatformOperatorDep,
    *,
    session: SessionDep,
    request: Request,
    response: Response,
    policy: VersionPolicyDep,
) -> CompanyImportOut:
    # received whole before the transaction opens: a slow sender holds a file, not a connection
    async with spooled_body(request.stream()) as body:
        outcome = await importer.import_company(session, operator, company_id, body, policy)
    if outcome.replayed:
        response.status_code = status.HTTP_200_OK
        response.headers[REPLAYED_HEADER] = "true"
    return CompanyImportOut.model_validate(outcome)


# --- the user -----------------------------------------------------------------------------------


@router.post(
    f"{MEMORY_PATH}/import",
    dependencies=[Depends(rate_limited(RouteClass.MEMORY_WRITES))],
    tags=[USER],
    summary="Make the profile of your memory export your memory (a new version)",
    description="Called for the person who brings their memory along from another deployment "
    "(or back from a saved copy): the document `GET /v1/me/memory/export` answered, sent as it "
    "is. Its profile becomes your memory as one new version, as if you had written it with "
    "`PUT` (the same checks and memory policy); its versions, chats and settings are not "
    "imported. `If-Match` / `If-None-Match: *` are optional here.",
    status_code=status.HTTP_200_OK,
    responses={
        200: {"description": "Replaced your profile (or it already was this)"},
        201: {
            "model": MemoryOut,
            "description": "Created your profile (its first version)",
            "links": VERSION_LINKS,
        },
        409: {"description": "Context memory is turned off for you"},
        412: {"description": "If-Match is not the current version, or If-None-Match failed"},
        422: {"description": "Not a valid profile, one your company does not allow, or none"},
        428: {"description": "If-None-Match names a version: replacing one needs If-Match"},
    },
)
async def import_my_memory(
    body: Annotated[MemoryImportIn, Body(openapi_examples=MEMORY_IMPORT_EXAMPLES)],
    principal: PrincipalDep,
    *,
    session: SessionDep,
    response: Response,
    policy: VersionPolicyDep,
    if_match: IfMatch = None,
    if_none_match: IfNoneMatch = None,
) -> MemoryOut:
    outcome = await memory_import.import_own_memory(
        session,
        principal,
        body.profile.content,
        WriteConditions(
            parse_entity_tags(_given(if_match)), parse_entity_tags(_given(if_none_match))
        ),
        policy=policy,
    )
    return replaced(outcome, response)


def _given(header: str | None) -> str | None:
    """A conditional header as sent; an empty one is no condition."""
    return header if header is not None and header.strip() else None
