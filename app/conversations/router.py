"""Routes of the stored chat history: list a chat's messages, delete a chat."""

from __future__ import annotations

from fastapi import APIRouter, Response, status

from app.conversations import service
from app.conversations.schemas import ChatIdPath, StoredMessageOut
from app.kit.api_tags import ORCHESTRATOR
from app.kit.auth.dependencies import PrincipalDep
from app.kit.deps import PageDep, SessionDep
from app.kit.pagination import Page

router = APIRouter(tags=[ORCHESTRATOR])


_UNKNOWN_CHAT = (
    "A chat is yours from your first saved turn in it until you delete it (or retention "
    "empties it); reading or deleting any other chat id is a 404, never an empty success."
)


@router.get(
    "/v1/chats/{chat_id}/messages",
    summary="The caller's stored messages of a chat, oldest first (cursor paginated)",
    description="Called by the orchestrator when it shows a conversation again (say, the "
    "person reopens it), with the person's token. " + _UNKNOWN_CHAT,
    responses={404: {"description": "The caller has no such chat"}},
)
async def list_chat_messages(
    chat_id: ChatIdPath, principal: PrincipalDep, session: SessionDep, page: PageDep
) -> Page[StoredMessageOut]:
    return await service.list_chat_messages(session, principal, chat_id, page)


@router.delete(
    "/v1/chats/{chat_id}",
    summary="Delete the caller's stored history of a chat",
    description="Called by the orchestrator when the person deletes the conversation, with "
    "their token; the memory profile is not touched. " + _UNKNOWN_CHAT,
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses={404: {"description": "The caller has no such chat"}},
)
async def delete_chat(chat_id: ChatIdPath, principal: PrincipalDep, session: SessionDep) -> None:
    await service.delete_chat(session, principal, chat_id)
