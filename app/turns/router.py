"""The orchestrator's two calls per chat turn: load/inject before the model, save after it.

Both run on every chat turn, so they are `LeanRoute`s (app/kit/lean_routes.py): the signatures
below document them as usual, and a fixed plan resolves them at request time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Annotated, Any, ClassVar, Final

import orjson
from fastapi import APIRouter, Body, Depends, Header, Request, Response, status

from app.conversations.schemas import ChatIdPath
from app.jobs.wakeup import JobSignal
from app.kit.api_tags import ORCHESTRATOR
from app.kit.auth.dependencies import PrincipalDep, current_principal, principal_of
from app.kit.config import Settings
from app.kit.db.engine import Database
from app.kit.deps import database
from app.kit.lean_routes import LeanRoute, Provider
from app.kit.principal import Principal
from app.kit.tokens import TokenCounters
from app.kit.tracing import current_traceparent
from app.rate_limits.dependency import lean_provider, rate_limited, remember_principal
from app.rate_limits.policy import RouteClass
from app.turns import context, idempotency, save
from app.turns.batching import TurnBatcher
from app.turns.schemas import ContextRequest, ContextResponse, TurnRequest, TurnSaved
from app.usage.dependencies import UsageMeterDep, usage_meter

# Dependencies are `async def`: FastAPI runs plain `def` dependencies in a worker thread.


async def _settings(request: Request) -> Settings:
    settings: Settings = request.app.state.settings
    return settings


async def _database(request: Request) -> Database:
    return database(request)


async def _batcher(request: Request) -> TurnBatcher:
    batcher: TurnBatcher = request.app.state.turn_batcher
    return batcher


async def _job_signal(request: Request) -> JobSignal:
    signal: JobSignal = request.app.state.job_signal
    return signal


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
    return remember_principal(request, await principal_of(request))


limit_context = rate_limited(RouteClass.CONTEXT)
limit_turns = rate_limited(RouteClass.TURNS)


class TurnRoute(LeanRoute):
    providers: ClassVar[Mapping[Callable[..., Any], Provider]] = {
        current_principal: _principal,
        _settings: _settings,
        _database: _database,
        _tokens: _tokens,
        _batcher: _batcher,
        _job_signal: _job_signal,
        _idempotency_key: _idempotency_key,
        usage_meter: usage_meter,
        limit_context: lean_provider(RouteClass.CONTEXT),
        limit_turns: lean_provider(RouteClass.TURNS),
    }


router = APIRouter(tags=[ORCHESTRATOR], route_class=TurnRoute)

SettingsDep = Annotated[Settings, Depends(_settings)]
DatabaseDep = Annotated[Database, Depends(_database)]
TokensDep = Annotated[TokenCounters, Depends(_tokens)]
BatcherDep = Annotated[TurnBatcher, Depends(_batcher)]
JobSignalDep = Annotated[JobSignal, Depends(_job_signal)]
IdempotencyKeyDep = Annotated[str | None, Depends(_idempotency_key)]


# Request examples, as Swagger UI's "Try it out" sends them: one chat turn of `alice` in
# `space-1` (`tests/test_openapi_examples.py` sends each to the app)
_FIRST_MESSAGE: Final = {
    "role": "user",
    "content": "I work as a credit risk analyst at Helvetia Bank.",
}
CONTEXT_EXAMPLES: Final[dict[str, Any]] = {
    "first_turn": {
        "summary": "The first turn of a chat",
        "value": {
            "space_id": "space-1",
            "system_prompt": "You are a helpful assistant.",
            "messages": [_FIRST_MESSAGE],
        },
    },
    "decision_trace": {
        "summary": "The same, with every decision the service takes (debug)",
        "value": {
            "space_id": "space-1",
            "history_mode": "auto",
            "system_prompt": "You are a helpful assistant.",
            "messages": [_FIRST_MESSAGE],
            "debug": True,
        },
    },
}
TURN_EXAMPLES: Final[dict[str, Any]] = {
    "answered_turn": {
        "summary": "The turn's input and the model's answer",
        "value": {
            "space_id": "space-1",
            "messages": [_FIRST_MESSAGE],
            "response": {"content": "Nice to meet you! How can I help with credit risk today?"},
            "language_model": "gpt-4o-mini",
        },
    },
}

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
    description="Called by the orchestrator before every model call, with the person's token: "
    "it sends the turn's input and gets back the messages to send to the model, the memory "
    'profile injected into the system prompt as "What I know about you" and the history the '
    "memory mode loads. Memory off for the person or the space is no error: the answer says "
    "why it was not injected; `debug: true` adds every decision taken.",
    response_model=ContextResponse,
)
async def load_context(
    chat_id: ChatIdPath,
    body: Annotated[ContextRequest, Body(openapi_examples=CONTEXT_EXAMPLES)],
    principal: PrincipalDep,
    _limited: Annotated[None, Depends(limit_context)],
    *,
    db: DatabaseDep,
    settings: SettingsDep,
    tokens: TokensDep,
    meter: UsageMeterDep,
) -> Response:
    call = context.ContextCall(principal, chat_id, body)
    document = await context.load_context(db, call, settings=settings, tokens=tokens)
    meter.context_served(principal.company_id)
    return Response(orjson.dumps(document), media_type="application/json")


@router.post(
    "/v1/chats/{chat_id}/turns",
    summary="Save a turn; queue its consolidation when context memory is active",
    description="Called by the orchestrator once the model has answered, with the person's "
    "token and the input it sent to `/context`: the exchange is stored as the memory mode "
    "says, and a consolidation of the profile is queued (202) when context memory is active, "
    "else 201 with the reason. An `Idempotency-Key` makes a retried call safe.",
    status_code=status.HTTP_202_ACCEPTED,
    response_model=TurnSaved,
    responses={
        201: {
            "model": TurnSaved,
            "description": "Saved; consolidation skipped (see reason)",
            "links": CHAT_LINKS,
        },
        202: {"description": "Saved; consolidation queued", "links": QUEUED_TURN_LINKS},
        409: {
            "description": "A request with this Idempotency-Key is in flight, or the memory "
            "was deleted meanwhile (`conflict-retry`: send it again); or a quota is reached "
            "(`quota-exceeded`)"
        },
    },
)
async def save_turn(
    chat_id: ChatIdPath,
    body: Annotated[TurnRequest, Body(openapi_examples=TURN_EXAMPLES)],
    principal: PrincipalDep,
    _limited: Annotated[None, Depends(limit_turns)],
    *,
    db: DatabaseDep,
    settings: SettingsDep,
    idempotency_key: IdempotencyKeyDep,
    meter: UsageMeterDep,
    batcher: BatcherDep,
    job_signal: JobSignalDep,
) -> Response:
    submission = save.TurnSubmission(
        principal, chat_id, body, idempotency_key, trace_parent=current_traceparent()
    )
    outcome = await save.save_turn(db, submission, settings=settings, batcher=batcher)
    if outcome.status_code == status.HTTP_202_ACCEPTED and not outcome.replayed:
        job_signal.poke()  # the idle workers claim it now, not at their next poll
    meter.turn_saved(principal.company_id, replayed=outcome.replayed)
    headers = {idempotency.REPLAYED_HEADER: "true"} if outcome.replayed else None
    return Response(
        outcome.body,
        status_code=outcome.status_code,
        media_type="application/json",
        headers=headers,
    )
