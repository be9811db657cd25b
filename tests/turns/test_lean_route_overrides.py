"""A lean route resolves its dependencies with its own providers, never through
`app.dependency_overrides`: an override it would ignore is refused when it is set (or, for a
dict assigned whole, when the app starts), and every other override keeps working."""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, ClassVar

import httpx
import pytest
from asgi_lifespan import LifespanManager
from fastapi import APIRouter, Depends, FastAPI, Request, Response
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from app.jobs.router import _job_id
from app.kit.auth.dependencies import _bearer_scheme, current_principal
from app.kit.lean_routes import IgnoredOverride, LeanRoute, Provider, guard_dependency_overrides
from app.main import create_app
from app.turns import router as turns_router
from app.usage.dependencies import usage_meter
from tests.helpers.apps import AuthFactory, make_settings
from tests.helpers.jobs import enqueue

# building the app connects to nothing: no database is needed until its lifespan runs
UNUSED_DATABASE = "postgresql://unused@127.0.0.1:1/unused"
CONTEXT, TURNS = "POST /v1/chats/{chat_id}/context", "POST /v1/chats/{chat_id}/turns"


async def _replacement() -> object:
    return object()


@pytest.mark.parametrize(
    ("dependency", "routes", "provider"),
    [
        (current_principal, (CONTEXT, TURNS), "app.turns.router._principal"),
        (_bearer_scheme, (CONTEXT, TURNS), "app.turns.router._principal"),
        (usage_meter, (CONTEXT, TURNS), "app.usage.dependencies.usage_meter"),
        (turns_router._tokens, (CONTEXT,), "app.turns.router._tokens"),
        (turns_router._idempotency_key, (TURNS,), "app.turns.router._idempotency_key"),
        (turns_router.limit_turns, (TURNS,), "app.rate_limits.dependency.provide"),
    ],
    ids=["principal", "bearer-scheme-under-it", "meter", "tokens", "idempotency-key", "limit"],
)
def test_overriding_a_lean_routes_dependency_is_refused_naming_route_and_provider(
    dependency: Callable[..., Any], routes: tuple[str, ...], provider: str
) -> None:
    app = create_app(make_settings(UNUSED_DATABASE))
    with pytest.raises(IgnoredOverride) as refused:
        app.dependency_overrides[dependency] = _replacement
    message = str(refused.value)
    for route in routes:
        assert route in message
    for other in {CONTEXT, TURNS} - set(routes):
        assert other not in message
    assert provider in message
    assert dependency not in app.dependency_overrides


Overrides = dict[Callable[..., Any], Callable[..., Any]]


def _merge_in_place(overrides: Overrides) -> None:
    overrides |= {current_principal: _replacement}


ADDING: dict[str, Callable[[Overrides], object]] = {
    "update": lambda overrides: overrides.update({current_principal: _replacement}),
    "setdefault": lambda overrides: overrides.setdefault(current_principal, _replacement),
    "in-place-or": _merge_in_place,
}


@pytest.mark.parametrize("how", ADDING)
def test_every_way_of_adding_an_override_is_guarded(how: str) -> None:
    overrides = create_app(make_settings(UNUSED_DATABASE)).dependency_overrides
    with pytest.raises(IgnoredOverride, match="current_principal"):
        ADDING[how](overrides)
    assert overrides == {}


async def test_an_app_whose_overrides_were_replaced_by_a_plain_dict_refuses_to_start() -> None:
    app = create_app(make_settings(UNUSED_DATABASE))
    app.dependency_overrides = {usage_meter: _replacement}  # bypasses the guarded dict
    with pytest.raises(IgnoredOverride, match=r"usage_meter\] would be ignored"):
        async with LifespanManager(app):
            pass


async def test_the_running_app_refuses_a_lean_override_and_obeys_any_other(
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    sessions: async_sessionmaker[AsyncSession],
) -> None:
    with pytest.raises(IgnoredOverride, match=r"/v1/chats/\{chat_id\}/turns"):
        app.dependency_overrides[current_principal] = _replacement
    [job_id] = await enqueue(sessions)
    assert (await client.get("/v1/jobs/not-a-job", headers=auth())).status_code == 404

    async def that_job() -> object:
        return job_id

    app.dependency_overrides[_job_id] = that_job
    try:
        response = await client.get("/v1/jobs/not-a-job", headers=auth())
    finally:
        del app.dependency_overrides[_job_id]
    assert response.status_code == 200, response.text
    assert response.json()["id"] == str(job_id)


class _Body(BaseModel):
    x: int


async def _value() -> int:
    return 1


async def _provide_value(request: Request) -> int:
    return 2


class _ValueRoute(LeanRoute):
    providers: ClassVar[dict[Callable[..., Any], Provider]] = {_value: _provide_value}


def test_a_lean_route_of_an_included_router_is_guarded_and_existing_overrides_checked() -> None:
    router = APIRouter(route_class=_ValueRoute)

    @router.post("/values")
    async def post_value(body: _Body, value: Annotated[int, Depends(_value)]) -> Response:
        return Response()

    app = FastAPI()
    app.include_router(router, prefix="/v2")
    app.dependency_overrides[_value] = _replacement  # a plain dict: nothing guards it yet
    with pytest.raises(IgnoredOverride, match=r"POST /values.*_provide_value"):
        guard_dependency_overrides(app)

    app.dependency_overrides = {}
    guard_dependency_overrides(app)
    with pytest.raises(IgnoredOverride):
        app.dependency_overrides[_value] = _replacement
