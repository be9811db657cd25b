"""The orchestrator's two calls per chat turn: load/inject before the model, save after it."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, Request, Response, status

from app.auth import PrincipalDep
from app.config import Settings
from app.conversations.schemas import ChatIdPath
from app.db import SessionDep
from app.tokens import TokenCounter
from app.turns import context, idempotency, save
from app.turns.schemas import ContextRequest, ContextResponse, TurnRequest, TurnSaved

router = APIRouter(tags=["turns"])


# Dependencies are `async def`: FastAPI runs plain `def` dependencies in a worker thread, a
# thread hop per dependency per request on the hot path.


async def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


_COUNTER = TokenCounter()


async def _token_counter() -> TokenCounter:
    """Counts history tokens once, at save time, with the offline encoding (no network)."""
    return _COUNTER


async def _idempotency_key(
    settings: Annotated[Settings, Depends(_settings)],
    key: Annotated[
        str | None,
        Header(
            alias=idempotency.HEADER,
            description="Replays the stored response of an identical earlier request "
            "(scoped to the caller, kept at least 24 h)",
        ),
    ] = None,
) -> str | None:
    return idempotency.check_key(key, settings.idempotency_key_max_length)


SettingsDep = Annotated[Settings, Depends(_settings)]
CounterDep = Annotated[TokenCounter, Depends(_token_counter)]
IdempotencyKeyDep = Annotated[str | None, Depends(_idempotency_key)]


@router.post(
    "/v1/chats/{chat_id}/context",
    summary="Load and inject: the final message list for the model call",
)
async def load_context(
    chat_id: ChatIdPath,
    body: ContextRequest,
    principal: PrincipalDep,
    *,
    session: SessionDep,
    settings: SettingsDep,
) -> ContextResponse:
    return await context.load_context(session, principal, chat_id, body, settings=settings)


@router.post(
    "/v1/chats/{chat_id}/turns",
    summary="Save a turn; queue its consolidation when context memory is active",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=TurnSaved,
    responses={
        201: {"model": TurnSaved, "description": "Saved; consolidation skipped (see reason)"},
        202: {"description": "Saved; consolidation queued"},
        409: {"description": "A request with this Idempotency-Key is in flight"},
    },
)
async def save_turn(
    chat_id: ChatIdPath,
    body: TurnRequest,
    principal: PrincipalDep,
    *,
    session: SessionDep,
    settings: SettingsDep,
    counter: CounterDep,
    idempotency_key: IdempotencyKeyDep,
) -> Response:
    outcome = await save.save_turn(
        session,
        principal,
        chat_id,
        body,
        idempotency_key=idempotency_key,
        settings=settings,
        counter=counter,
    )
    headers = {idempotency.REPLAYED_HEADER: "true"} if outcome.replayed else None
    return Response(
        outcome.body,
        status_code=outcome.status_code,
        media_type="application/json",
        headers=headers,
    )
