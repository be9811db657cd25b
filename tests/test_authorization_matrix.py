"""The authorization matrix: every route of the app, called by every kind of caller against the
owner's real objects, proves that nobody reaches another user's data.

Callers: the owner, another user of her company, its space admin, an operator, a user of another
company with the owner's very user id, that company's space admin, and every token of the JWT
rejection table (no token at all among them). Path parameters name the owner's objects (her
private chat, her newest version number, her queued and dead jobs, her company and space), and
non-owners also send the owner's id in query parameters and headers, and her Idempotency-Key.

Each response is judged by the route's declared policy (`ROUTE_POLICIES`) and by what it shows:
another user's canary anywhere (headers, body, problem details, base64url cursors, export,
diffs) or the owner's object ids is a leak; and every caller's requests leave every other user's
rows untouched. The one exception is the company export, an operator's: it shows everything of
the company it names, which must be there, and nothing of any other company. All violations are
collected into one report: route x caller: problem.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import orjson
from fastapi import FastAPI
from sqlalchemy import text

from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.portability.format import MEDIA_TYPE
from tests.helpers.apps import SPACE, AuthFactory
from tests.helpers.bad_tokens import CASES
from tests.helpers.db import sessions
from tests.helpers.portability import stream_of
from tests.helpers.settings import memory_policy_body
from tests.helpers.snapshots import changed_tables, database_digest, user_digest
from tests.helpers.tenants import (
    CALLERS,
    DATA_USERS,
    OWNER,
    PRIVATE_CHAT,
    SHARED_CHAT,
    SPACE_BUDGET,
    Caller,
    World,
    found_in,
    head_version,
    headers_of,
    profile_text,
    seed_world,
    turn_payload,
)
from tests.helpers.turns import user
from tests.test_route_policy import ROUTE_POLICIES, app_routes, challenge_of

Route = tuple[str, str]
POLICIES = frozenset(
    {"public", "user", "space_admin", "operator", "company_read", "company_operator"}
)
PROBLEM_JSON = "application/problem+json"
SPOOFED_QUERY = {"user_id": OWNER.sub, "company_id": OWNER.company}
SPOOFED_HEADERS = {"X-User-Id": OWNER.sub, "X-Company-Id": OWNER.company, "X-Forwarded-User": "a"}


def test_every_route_has_a_known_policy(app: FastAPI) -> None:
    """A route added without a row in ROUTE_POLICIES (or with a policy this matrix cannot
    judge) fails here, before the matrix would skip it."""
    routes = app_routes(app)
    missing = sorted(routes - ROUTE_POLICIES.keys())
    assert not missing, f"routes without a declared policy: {missing}"
    unknown = sorted((r, p) for r, p in ROUTE_POLICIES.items() if p not in POLICIES)
    assert not unknown, f"policies the authorization matrix does not know: {unknown}"


# --- what each route is sent --------------------------------------------------------------------


@dataclass(frozen=True)
class Call:
    """A caller's request, before the spoofed identity of non-owners is added."""

    body: object | None = None
    params: Mapping[str, str] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    content: bytes | None = None  # a body that is not JSON (sent as it is)


@dataclass(frozen=True)
class Context:
    app: FastAPI
    world: World
    caller: Caller | None

    @property
    def canary(self) -> str:
        return "anonymous" if self.caller is None else self.world.canary(self.caller)

    async def if_match(self) -> dict[str, str]:
        head = None if self.caller is None else await head_version(self.app, self.caller)
        return {"If-Match": f'"{head or 1}"'}


async def _no_body(_: Context) -> Call:
    return Call()


async def _page(_: Context) -> Call:
    return Call(params={"limit": "2"})  # small pages, so cursors appear


async def _dead_again(ctx: Context) -> Call:
    """Before a caller who may retry the owner's dead job does: the job dead again, as seeded
    (a caller before them retried it), so that each of them retries a dead job."""
    if operates_owners_company(ctx.caller):
        async with sessions(ctx.app)() as session, session.begin():
            await session.execute(
                text(
                    "UPDATE jobs SET status = 'dead', attempts = max_attempts"
                    " WHERE company_id = :c AND id = CAST(:id AS uuid)"
                ),
                {"c": OWNER.company, "id": ctx.world.owner_dead_job},
            )
    return Call()


async def _context(ctx: Context) -> Call:
    body = {"space_id": SPACE, "messages": [user(f"Hello from {ctx.canary}")], "debug": True}
    return Call(body=body)


async def _turn(ctx: Context) -> Call:
    """Non-owners reuse the owner's Idempotency-Key: scoped to the caller, it replays nothing."""
    mine = ctx.caller == OWNER
    key = f"matrix-{uuid.uuid4().hex}" if mine else ctx.world.owner_idempotency_key
    return Call(body=turn_payload(ctx.canary, 99), headers={"Idempotency-Key": key})


async def _put_memory(ctx: Context) -> Call:
    head = None if ctx.caller is None else await head_version(ctx.app, ctx.caller)
    condition = {"If-None-Match": "*"} if head is None else {"If-Match": f'"{head}"'}
    return Call(body={"content": profile_text(ctx.canary, 100)}, headers=condition)


async def _restore(ctx: Context) -> Call:
    return Call(headers=await ctx.if_match())


async def _consolidation(ctx: Context) -> Call:
    body = {"space_id": SPACE, "user": f"I work on {ctx.canary}", "assistant": "Noted."}
    return Call(body=body)


async def _my_setting(_: Context) -> Call:
    return Call(body={"context_memory": True})


async def _enablement(_: Context) -> Call:
    return Call(params={"space_id": SPACE})


async def _space_patch(_: Context) -> Call:
    return Call(body={"web_search": False})


async def _flag(_: Context) -> Call:
    return Call(body={"enabled": True})


async def _memory_policy(_: Context) -> Call:
    """The defaults: an operator's PUT changes nothing the other calls depend on."""
    return Call(body=memory_policy_body())


async def _rate_limits(_: Context) -> Call:
    """No overrides: the defaults, which the other calls run under."""
    return Call(body={})


async def _usage(_: Context) -> Call:
    """The report of the days around today, where the world's turns were counted."""
    today = datetime.now(UTC).date()
    return Call(params={"from": str(today - timedelta(days=1)), "to": str(today)})


async def _model_budget(_: Context) -> Call:
    """No budget, the default: an operator's PUT changes nothing the other calls depend on."""
    return Call(body={"monthly_tokens": None, "when_spent": "offline"})


async def _company_import(ctx: Context) -> Call:
    """A stream of the company of the path: the owner's, which holds data (409)."""
    flag = {
        "type": "feature_flag",
        "flag": FLAG_CONTEXT_MEMORY,
        "enabled": False,
        "updated_by_company_id": OWNER.company,
        "updated_by": ctx.canary,
    }
    return Call(content=stream_of(OWNER.company, flag), headers={"Content-Type": MEDIA_TYPE})


async def _memory_import(ctx: Context) -> Call:
    """The caller's own export document, carrying the caller's canary, with no condition."""
    return Call(body={"profile": {"content": profile_text(ctx.canary, 101)}})


async def _company(_: Context) -> Call:
    """A company of its own: registering it changes nothing of the owner's."""
    return Call(body={"company_id": f"matrix-{uuid.uuid4().hex[:12]}"})


async def _mcp_read_memory(_: Context) -> Call:
    """One JSON-RPC message, as an MCP client sends it: the caller's profile, read by a tool."""
    message = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "read_memory", "arguments": {}},
    }
    return Call(body=message, headers={"Accept": "application/json, text/event-stream"})


def _not_found(status: int, _: Any) -> str | None:
    return None if status == 404 else f"status {status} for the owner's object, not 404"


def _nothing_or_not_found(status: int, body: Any) -> str | None:
    """A chat the caller never used: gone (404) or an empty page of their own."""
    if status == 404 or (status == 200 and body.get("items") == []):
        return None
    return f"status {status} with items, for a chat only the owner has"


def _fresh_chat(status: int, body: Any) -> str | None:
    """Loading a chat id only the owner used: the caller's own chat, with no history."""
    if status == 200 and body["history"]["loaded_messages"] == 0:
        return None
    return f"status {status}, loaded history of a chat only the owner has"


@dataclass(frozen=True)
class Probe:
    """How the matrix calls a route and what a non-owner may get on a user route.

    `own`: statuses allowed to a non-owner on their own state, when the path names no object
    of the owner's alone (None: anything but 401/403/5xx). `owner_object`: the problem with the
    answer when the path names one (default: anything but 404). `creates`: the call creates
    what its path names, so the owner-only variants are not sent (they would become the
    caller's own objects).
    """

    call: Callable[[Context], Awaitable[Call]] = _no_body
    own: frozenset[int] | None = None
    owner_object: Callable[[int, Any], str | None] = _not_found
    creates: bool = False


def _statuses(*codes: int) -> frozenset[int]:
    return frozenset(codes)


PROBES: dict[Route, Probe] = {
    ("GET", "/v1/me"): Probe(own=_statuses(200)),
    ("POST", "/v1/chats/{chat_id}/context"): Probe(_context, _statuses(200), _fresh_chat),
    ("POST", "/v1/chats/{chat_id}/turns"): Probe(_turn, _statuses(201, 202), creates=True),
    ("GET", "/v1/chats/{chat_id}/messages"): Probe(
        _page, _statuses(200, 404), _nothing_or_not_found
    ),
    ("DELETE", "/v1/chats/{chat_id}"): Probe(own=_statuses(204, 404)),
    ("GET", "/v1/companies/{company_id}/audit-events"): Probe(_page),
    ("PUT", "/v1/companies/{company_id}/feature-flags/{flag}"): Probe(_flag),
    ("PUT", "/v1/companies/{company_id}/memory-policy"): Probe(_memory_policy),
    ("GET", "/v1/companies/{company_id}/usage"): Probe(_usage),
    ("PUT", "/v1/companies/{company_id}/model-budget"): Probe(_model_budget),
    ("PUT", "/v1/companies/{company_id}/rate-limits"): Probe(_rate_limits),
    ("PATCH", "/v1/spaces/{space_id}"): Probe(_space_patch),
    ("GET", "/v1/me/settings"): Probe(own=_statuses(200)),
    ("PATCH", "/v1/me/settings"): Probe(_my_setting, _statuses(200)),
    ("GET", "/v1/me/memory/enablement"): Probe(_enablement, _statuses(200)),
    ("GET", "/v1/me/memory"): Probe(own=_statuses(200, 404)),
    ("PUT", "/v1/me/memory"): Probe(_put_memory, _statuses(200, 201)),
    ("DELETE", "/v1/me/memory"): Probe(own=_statuses(204, 404)),
    ("GET", "/v1/me/memory/versions"): Probe(_page, _statuses(200, 404)),
    ("GET", "/v1/me/memory/versions/{n}"): Probe(own=_statuses(200, 404)),
    ("GET", "/v1/me/memory/versions/{n}/diff"): Probe(own=_statuses(200, 404)),
    ("POST", "/v1/me/memory/versions/{n}/restore"): Probe(_restore, _statuses(200, 201, 404)),
    ("GET", "/v1/me/memory/export"): Probe(own=_statuses(200)),
    ("POST", "/v1/me/memory/import"): Probe(_memory_import, _statuses(200, 201)),
    ("POST", "/v1/companies/{company_id}/import"): Probe(_company_import),
    ("GET", "/v1/me/memory/policy-actions"): Probe(_page, _statuses(200, 404)),
    ("POST", "/v1/me/memory/consolidations"): Probe(_consolidation, _statuses(202, 409)),
    ("GET", "/v1/companies/{company_id}/jobs"): Probe(_page),
    ("POST", "/v1/companies/{company_id}/jobs/{job_id}/retry"): Probe(_dead_again),
    ("POST", "/mcp"): Probe(_mcp_read_memory, _statuses(200)),
    ("POST", "/v1/companies"): Probe(_company),
    ("GET", "/v1/companies"): Probe(_page),
    ("GET", "/v1/companies/{company_id}/spaces"): Probe(_page),
    ("PUT", "/v1/companies/{company_id}/spaces/{space_id}/settings"): Probe(_space_patch),
}

SHOWS_OWN_DATA = frozenset(
    {
        ("GET", "/v1/me/memory"),
        ("GET", "/v1/me/memory/export"),
        ("GET", "/v1/me/memory/versions/{n}"),
        ("GET", "/v1/chats/{chat_id}/messages"),
        ("POST", "/mcp"),
    }
)
"""Routes where a seeded user must see their own canary: the positive control that makes the
absence of everyone else's meaningful."""

COMPANY_DATA = frozenset({("GET", "/v1/companies/{company_id}/export")})
"""Operator routes that return everything the company of the path holds (the owner's): its
users' data there is what they are for, and must be there; any other company's is a leak."""
OPERATOR_STATUS: dict[Route, int] = {
    ("POST", "/v1/companies/{company_id}/import"): 409,
    ("POST", "/v1/companies"): 201,
    ("DELETE", "/v1/companies/{company_id}"): 404,
    ("GET", "/v1/companies/{company_id}/offboarding"): 404,
}
"""An operator's status where it is not 200: the owner's company holds data, so an import
into it is refused; a company is registered (201); the offboarding is sent for a company never
registered (`PATH_VALUES`: offboarding the owner's would erase her), which, never offboarded,
has no receipt either."""
PATH_VALUES: dict[Route, dict[str, list[tuple[str, str]]]] = {
    ("DELETE", "/v1/companies/{company_id}"): {
        "company_id": [("a company never registered", "no-such-company")]
    },
}
"""Path values of a route where the owner's would destroy what the other calls judge."""


# --- where each route is sent -------------------------------------------------------------------

OWNER_ONLY = frozenset({"private chat", "owner-only version", "queued job", "dead job"})


@dataclass(frozen=True)
class Target:
    route: Route
    path: str
    variant: str

    @property
    def names_owner_only_object(self) -> bool:
        return any(part in OWNER_ONLY for part in self.variant.split(", "))

    def __str__(self) -> str:
        method, template = self.route
        return f"{method} {template}" + (f" [{self.variant}]" if self.variant else "")


def _path_values(world: World) -> dict[str, list[tuple[str, str]]]:
    """Each path parameter's values: the owner's real objects (and one shared by all)."""
    return {
        "chat_id": [("private chat", PRIVATE_CHAT), ("shared chat id", SHARED_CHAT)],
        "n": [("owner-only version", str(world.owner_top_version)), ("version 1", "1")],
        "job_id": [("queued job", world.owner_queued_job), ("dead job", world.owner_dead_job)],
        "company_id": [("owner's company", OWNER.company)],
        "space_id": [("owner's space", SPACE)],
        "flag": [("", FLAG_CONTEXT_MEMORY)],
        # a user the service holds nothing of: an erasure that would erase the owner's data
        # is judged by tests/control_plane, this one by its authorisation
        "user_id": [("a user with nothing stored", "nobody")],
    }


def targets(routes: set[Route], world: World) -> list[Target]:
    """Every route with every combination of its path values, in the order a phase sends
    them: reads, then writes, then deletes (the most specific path first)."""
    values = _path_values(world)
    rank = {"GET": 0, "DELETE": 2}
    found: list[Target] = []
    for method, template in sorted(routes, key=lambda r: (rank.get(r[0], 1), -len(r[1]), r)):
        names = [part[1:-1].split(":")[0] for part in template.split("/") if part[:1] == "{"]
        special = PATH_VALUES.get((method, template), {})
        options = [special.get(name, values.get(name, [("", "x")])) for name in names]
        for combination in itertools.product(*options):
            path = template
            for name, (_, value) in zip(names, combination, strict=True):
                path = path.replace(f"{{{name}}}", value, 1)
            variant = ", ".join(label for label, _ in combination if label)
            target = Target((method, template), path, variant)
            creates = PROBES.get(target.route, Probe()).creates
            if not (creates and target.names_owner_only_object):
                found.append(target)
    return found


# --- the judge ----------------------------------------------------------------------------------


def _json(response: httpx.Response) -> Any:
    try:
        return orjson.loads(response.content)
    except orjson.JSONDecodeError:
        return None


def _leaks(
    target: Target, caller: Caller | None, response: httpx.Response, world: World
) -> list[str]:
    policy = ROUTE_POLICIES[target.route]
    exported = _shows_the_company(target, caller)
    foreign = {
        f"the canary of {c} of {k}": v
        for (k, c), v in world.foreign_canaries(caller).items()
        if not (exported and k == OWNER.company)
    }
    problems = [f"shows {name}" for name in found_in(response, foreign)]
    if exported:
        if response.status_code == 200 and world.canary(OWNER) not in response.text:
            problems.append("the company's export misses the owner's data")
        return problems
    if caller != OWNER:
        secrets = {f"the owner's turn id {turn}": turn for turn in world.owner_turn_ids}
        operator_view = policy in {"operator", "company_operator"} and operates_owners_company(
            caller
        )
        if not operator_view:
            secrets |= {
                "the owner's queued job id": world.owner_queued_job,
                "the owner's dead job id": world.owner_dead_job,
            }
        problems += [f"shows {name}" for name in found_in(response, secrets)]
    return problems


def operates_owners_company(caller: Caller | None) -> bool:
    """A platform operator, or an operator of the owner's own company: the callers whose view
    of her company's jobs names her jobs, and who may send her dead job back."""
    if caller is None:
        return False
    return "operator" in caller.roles or (
        "company_operator" in caller.roles and caller.company == OWNER.company
    )


def _shows_the_company(target: Target, caller: Caller | None) -> bool:
    return target.route in COMPANY_DATA and caller is not None and "operator" in caller.roles


def _judge_unauthenticated(route: Route, response: httpx.Response) -> list[str]:
    if ROUTE_POLICIES[route] == "public":
        return [] if response.status_code == 200 else [f"status {response.status_code}, not 200"]
    problems = []
    if response.status_code != 401:
        problems.append(f"status {response.status_code}, not 401")
    if response.headers.get("www-authenticate") != challenge_of(route):
        problems.append(f"no `WWW-Authenticate: {challenge_of(route)}`")
    if response.headers.get("content-type") != PROBLEM_JSON:
        problems.append("not problem+json")
    return problems


def _judge_user_route(
    target: Target, caller: Caller, response: httpx.Response, body: Any
) -> list[str]:
    status = response.status_code
    if caller == OWNER:
        wanted = _statuses(200) if target.route[0] == "GET" else frozenset(range(200, 300))
        return [] if status in wanted else [f"owner got {status}"]
    problems = []
    probe = PROBES.get(target.route, Probe())
    if target.names_owner_only_object:
        problem = probe.owner_object(status, body)
        problems += [problem] if problem else []
    else:
        own = probe.own
        if (own is not None and status not in own) or status in (401, 403):
            problems.append(
                f"status {status} on the caller's own state, not one of {sorted(own or [])}"
            )
    if 200 <= status < 300 and isinstance(body, dict):
        for key, value in (("user_id", caller.sub), ("company_id", caller.company)):
            if key in body and body[key] != value:
                problems.append(f"answers as {key}={body[key]!r}, not the caller's {value!r}")
    return problems


def _judge_role_route(
    policy: str, target: Target, caller: Caller, response: httpx.Response, body: Any
) -> list[str]:
    status, roles = response.status_code, set(caller.roles)
    if policy == "space_admin":
        if "space_admin" not in roles:
            return [] if status == 403 else [f"status {status} without the role, not 403"]
        budget = SPACE_BUDGET.get(caller.company)
        shown = body.get("user_memory", {}).get("max_tokens") if isinstance(body, dict) else None
        if status != 200 or shown != budget:
            return [f"status {status}, budget {shown}: not the caller's own company's space"]
        return []
    if policy == "operator":
        if "operator" not in roles:
            return [] if status == 403 else [f"status {status} without the role, not 403"]
        retrying_queued = target.route[1].endswith("/retry") and "queued job" in target.variant
        wanted = 409 if retrying_queued else OPERATOR_STATUS.get(target.route, 200)
        return [] if status == wanted else [f"operator got {status}, not {wanted}"]
    if policy == "company_operator":
        retrying_queued = target.route[1].endswith("/retry") and "queued job" in target.variant
        if "operator" in roles:
            wanted = 409 if retrying_queued else OPERATOR_STATUS.get(target.route, 200)
        elif "company_operator" in roles and caller.company == OWNER.company:
            wanted = 409 if retrying_queued else 200
        elif "company_operator" in roles:
            wanted = 404
        else:
            wanted = 403
        return [] if status == wanted else [f"status {status}, not {wanted}"]
    # company_read: operators, or a space admin of that very company
    if "operator" in roles or ("space_admin" in roles and caller.company == OWNER.company):
        wanted = 200
    elif "space_admin" in roles:
        wanted = 404
    else:
        wanted = 403
    return [] if status == wanted else [f"status {status}, not {wanted}"]


def judge(
    target: Target, caller: Caller | None, response: httpx.Response, world: World
) -> list[str]:
    """What is wrong with this response to this caller (nothing: an empty list)."""
    policy = ROUTE_POLICIES[target.route]
    status = response.status_code
    problems = _leaks(target, caller, response, world)
    if status >= 500:
        return [*problems, f"status {status}"]
    if caller is None:
        return problems + _judge_unauthenticated(target.route, response)
    body = _json(response)
    if policy == "public":
        problems += [] if status == 200 else [f"status {status}, not 200"]
    elif policy == "user":
        problems += _judge_user_route(target, caller, response, body)
    else:
        problems += _judge_role_route(policy, target, caller, response, body)
    if (
        caller in DATA_USERS
        and target.route in SHOWS_OWN_DATA
        and not target.names_owner_only_object
        and world.canary(caller) not in response.text
    ):
        problems.append("the caller's own data is missing (the positive control)")
    return problems


# --- running it ---------------------------------------------------------------------------------


async def _send(
    client: httpx.AsyncClient, target: Target, call: Call, identity: dict[str, str], spoof: bool
) -> httpx.Response:
    params = {**(SPOOFED_QUERY if spoof else {}), **call.params}
    headers = {**(SPOOFED_HEADERS if spoof else {}), **call.headers, **identity}
    method, _ = target.route
    if call.content is not None:
        return await client.request(
            method, target.path, params=params, headers=headers, content=call.content
        )
    if call.body is None:
        return await client.request(method, target.path, params=params, headers=headers)
    return await client.request(method, target.path, params=params, headers=headers, json=call.body)


@dataclass
class Matrix:
    """One run: the app and its seeded world, the targets, and what was found."""

    app: FastAPI
    client: httpx.AsyncClient
    world: World
    routes: list[Target]
    violations: list[str] = field(default_factory=list)
    requests: int = 0
    probed: set[tuple[Route, str]] = field(default_factory=set)

    def record(self, target: Target, who: str, problems: list[str]) -> None:
        self.requests += 1
        self.probed.add((target.route, who))
        self.violations += [f"{target} x {who}: {problem}" for problem in problems]

    async def call(self, target: Target, caller: Caller | None) -> Call:
        return await PROBES.get(target.route, Probe()).call(Context(self.app, self.world, caller))

    async def run_unauthenticated(self) -> None:
        """Every bad token (and none) on every route, concurrently: nothing may change."""
        before = await database_digest(self.app)
        for case, make_headers in CASES:
            identity = make_headers()  # built once per case: some are slow to sign
            calls = [await self.call(target, None) for target in self.routes]
            responses = await asyncio.gather(
                *(
                    _send(self.client, target, call, identity, spoof=True)
                    for target, call in zip(self.routes, calls, strict=True)
                )
            )
            for target, response in zip(self.routes, responses, strict=True):
                self.record(
                    target, f"bad token ({case})", judge(target, None, response, self.world)
                )
        changed = changed_tables(before, await database_digest(self.app))
        if changed:
            self.violations.append(f"requests without a valid token changed tables: {changed}")

    async def run_caller(self, caller: Caller, identity: dict[str, str]) -> None:
        """The caller's requests, one after the other; no other user's rows may change."""
        others = [u for u in DATA_USERS if u.key != caller.key]
        before = {u.key: await user_digest(self.app, *u.key) for u in others}
        for target in self.routes:
            call = await self.call(target, caller)
            response = await _send(self.client, target, call, identity, spoof=caller != OWNER)
            self.record(target, caller.label, judge(target, caller, response, self.world))
        for other in others:
            changed = changed_tables(before[other.key], await user_digest(self.app, *other.key))
            if operates_owners_company(caller):  # may send the owner's dead job back
                changed = [table for table in changed if not table.startswith("jobs ")]
            if changed:
                self.violations.append(f"{caller.label} changed {other.label}'s rows: {changed}")


async def test_no_caller_reaches_another_users_data(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    started = time.monotonic()
    world = await seed_world(app, client, auth)
    undeclared = app_routes(app) - ROUTE_POLICIES.keys()
    judged = app_routes(app) - undeclared
    matrix = Matrix(app, client, world, targets(judged, world))
    matrix.violations += [f"{m} {p}: no declared policy, not judged" for m, p in sorted(undeclared)]
    await matrix.run_unauthenticated()
    for caller in CALLERS:
        await matrix.run_caller(caller, headers_of(auth, caller))

    who = [caller.label for caller in CALLERS] + [f"bad token ({case})" for case, _ in CASES]
    unprobed = {(route, w) for route in judged for w in who} - matrix.probed
    assert not unprobed, f"the matrix skipped: {sorted(unprobed)[:10]}"
    found = matrix.violations
    more = f"\n... and {len(found) - 80} more" if len(found) > 80 else ""
    assert not found, (
        f"{len(found)} violations in {matrix.requests} requests"
        f" ({time.monotonic() - started:.1f}s):\n" + "\n".join(found[:80]) + more
    )
