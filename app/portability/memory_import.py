"""A user's import of their own memory export: the export's profile becomes the head of the
caller's memory, as one new version written exactly as the user's own `PUT /v1/me/memory`
(reason `user_edit`, the same memory policy, strict: a bullet the policy drops refuses the
import with a 422 naming its line).

Only the profile is imported. The export's versions stay history of where it was taken (they
would clash with this memory's own numbering); chats, jobs and settings are not the memory.
"""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from app.kit.errors import Unprocessable
from app.kit.principal import Principal
from app.profiles import repository as profile_repository
from app.profiles import service as profiles
from app.profiles.service import WriteOutcome
from app.profiles.switch import lock_user_memory
from app.profiles.versions import (
    CONTENT_FIELD,
    VersionPolicy,
    WriteConditions,
    etag,
    parse_entity_tags,
)

PROFILE_CONTENT_FIELD = "body.profile.content"


async def import_own_memory(
    session: AsyncSession,
    principal: Principal,
    content: str,
    conditions: WriteConditions,
    *,
    policy: VersionPolicy,
) -> WriteOutcome:
    """Replace (or create) the caller's profile with `content`, an export's profile.

    `If-Match` / `If-None-Match: *` work as for `PUT`; without either, the import replaces
    whatever the head is at the time (the user's lock held from the head's read to the write,
    so no consolidation slips in between). Frontmatter and ids of the export are not read.
    """
    if conditions.if_match is None and conditions.if_none_match is None:
        await lock_user_memory(session, principal.company_id, principal.user_id)
        state = await profile_repository.select_head_state(
            session, principal.company_id, principal.user_id
        )
        head = None if state is None or state.row is None else state.row.version
        conditions = WriteConditions(
            if_match=None if head is None else parse_entity_tags(etag(head)),
            if_none_match=parse_entity_tags("*") if head is None else None,
        )
    try:
        return await profiles.replace_memory(session, principal, content, conditions, policy=policy)
    except Unprocessable as exc:
        raise _located(exc) from None


def _located(error: Unprocessable) -> Unprocessable:
    """The same 422 with the profile's fields named where the import's body has them."""
    errors = [
        {**item, "field": PROFILE_CONTENT_FIELD} if item.get("field") == CONTENT_FIELD else item
        for item in error.errors or ()
    ]
    return type(error)(error.detail, errors=errors, headers=error.headers)
