"""The orchestrator's two calls per chat turn: load/inject before the model, save after it.

Both run on every chat turn, so they are `LeanRoute`s (app/lean_routes.py): the signatures
below document them as usual, and a fixed plan resolves them at request time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar

import orjson
from fastapi import APIRouter, Depends, Header, Request, Response, status

from app.auth import Principal, PrincipalDep, current_principal, principal_of
from app.config import Settings
from app.conversations.schemas import ChatIdPath
from app.db import Database, database
from app.lean_routes import LeanRoute, Provider
from app.tokens import TokenCounters
from app.turns import context, idempotency, save
from app.turns.schemas import ContextRequest, ContextResponse, TurnRequest, TurnSaved

# Dependencies are `async def`: FastAPI runs plain `def` dependencies in a worker thread.


async def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def _database(request: Request) -> Database:
    return database(request)


async def _tokens(request: Request) -> TokenCounters:
    tokens: TokenCounters = request.app.state.tokens
    return tokens


async def _idempotency_key(
    request: Request,
    _documented: Annotated[
        str | None,
        Header(
            alias=idempotency.HEADER,
            description="Replays the stored response of an identical earlier request "
            "(scoped to the caller, kept at least 24 h); 1 to 255 printable ASCII characters "
            "(or fewer, as the service is configured)",
            min_length=1,
            max_length=idempotency.STORED_KEY_MAX_LENGTH,
            pattern=idempotency.KEY_PATTERN,
        ),
    ] = None,
) -> str | None:
    """The request's Idempotency-Key (422 unless 1..N printable ASCII); read from the headers
    here, so the lean plan and FastAPI resolve it the same way."""
    settings: Settings = request.app.state.settings
    return idempotency.check_key(
        request.headers.get(idempotency.HEADER), settings.idempotency_key_max_length
    )


async def _principal(request: Request) -> Principal:
    return principal_of(request)


class TurnRoute(LeanRoute):
    providers: ClassVar[Mapping[Callable[..., Any], Provider]] = {
        current_principal: _principal,
        _settings: _settings,
        _database: _database,
        _tokens: _tokens,
        _idempotency_key: _idempotency_key,
    }


router = APIRouter(tags=["turns"], route_class=TurnRoute)

SettingsDep = Annotated[Settings, Depends(_settings)]
DatabaseDep = Annotated[Database, Depends(_database)]
TokensDep = Annotated[TokenCounters, Depends(_tokens)]
IdempotencyKeyDep = Annotated[str | None, Depends(_idempotency_key)]


# OpenAPI links: what a saved turn lets the client call next
CHAT_LINKS: dict[str, Any] = {
    "ChatMessages": {
        "operationRef": "#/paths/~1v1~1chats~1{chat_id}~1messages/get",
        "parameters": {"chat_id": "$request.path.chat_id"},
    },
    "DeleteChat": {
        "operationRef": "#/paths/~1v1~1chats~1{chat_id}/delete",
        "parameters": {"chat_id": "$request.path.chat_id"},
    },
}
QUEUED_TURN_LINKS: dict[str, Any] = {
    **CHAT_LINKS,
    "ConsolidationJob": {
        "operationRef": "#/paths/~1v1~1jobs~1{job_id}/get",
        "parameters": {"job_id": "$response.body#/consolidation/job_id"},
    },
}


@router.post(
    "/v1/chats/{chat_id}/context",
    summary="Load and inject: the final message list for the model call",
    response_model=ContextResponse,
)
async def load_context(
    chat_id: ChatIdPath,
    body: ContextRequest,
    principal: PrincipalDep,
    *,
    db: DatabaseDep,
    settings: SettingsDep,
    tokens: TokensDep,
) -> Response:
    call = context.ContextCall(principal, chat_id, body)
    document = await context.load_context(db, call, settings=settings, tokens=tokens)
    return Response(orjson.dumps(document), media_type="application/json")


@router.post(
    "/v1/chats/{chat_id}/turns",
    summary="Save a turn; queue its consolidation when context memory is active",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=TurnSaved,
    responses={
        201: {
            "model": TurnSaved,
            "description": "Saved; consolidation skipped (see reason)",
            "links": CHAT_LINKS,
        },
        202: {"description": "Saved; consolidation queued", "links": QUEUED_TURN_LINKS},
        409: {"description": "A request with this Idempotency-Key is in flight"},
    },
)
async def save_turn(
    chat_id: ChatIdPath,
    body: TurnRequest,
    principal: PrincipalDep,
    *,
    db: DatabaseDep,
    settings: SettingsDep,
    tokens: TokensDep,
    idempotency_key: IdempotencyKeyDep,
) -> Response:
    submission = save.TurnSubmission(principal, chat_id, body, idempotency_key)
    outcome = await save.save_turn(db, submission, settings=settings, tokens=tokens)
    headers = {idempotency.REPLAYED_HEADER: "true"} if outcome.replayed else None
    return Response(
        outcome.body,
        status_code=outcome.status_code,
        media_type="application/json",
        headers=headers,
    )
