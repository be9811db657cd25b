"""Reading and deleting a user's stored chat history (`/v1/chats/{chat_id}`...)."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncSession

from app.conversations import repository
from app.conversations.errors import ChatNotFound
from app.conversations.schemas import StoredMessageOut
from app.kit.pagination import Page, PageRequest, page_of
from app.kit.principal import Principal


async def list_chat_messages(
    session: AsyncSession, principal: Principal, chat_id: str, page: PageRequest
) -> Page[StoredMessageOut]:
    """The caller's stored messages of the chat, oldest first, paged by id.

    An unknown chat is a 404, as for `delete_chat`: a chat is the caller's from their first
    saved turn until they delete it (or retention empties it), so a mistyped id is not mistaken
    for an empty chat, and a deleted chat reads as gone. Only an empty page costs the check.
    """
    after = page.integer("id") or 0
    rows = await repository.list_messages(
        session, principal, chat_id, after_id=after, limit=page.limit + 1
    )
    if not rows and not await repository.chat_exists(session, principal, chat_id):
        raise ChatNotFound
    items = [StoredMessageOut.model_validate(row) for row in rows]
    return page_of(items, page.limit, lambda item: {"id": item.id})


async def delete_chat(session: AsyncSession, principal: Principal, chat_id: str) -> None:
    """Delete the caller's messages and turns of the chat; 404 when the caller has none (an
    unknown chat, as for `list_chat_messages`).

    Consolidation jobs already queued for its turns stay queued; they find the turn gone.
    """
    if not await repository.delete_chat(session, principal.company_id, principal.user_id, chat_id):
        raise ChatNotFound
