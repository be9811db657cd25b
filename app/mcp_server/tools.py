"""The MCP server: the tools and the resource an assistant uses on its user's memory.

Every tool runs the same service function as the matching `/v1/me/*` route, with the same
access check, in one transaction of its own, as the principal of the bearer token of the HTTP
request that carried the call (`caller()`); no tool takes a user id. Domain errors become tool
errors (an `isError` result with the detail), so the assistant can read them and act.

Arguments are held to the same rules as the route's fields (the profile's `MemoryIn`, the
version numbers' range): what REST refuses with a 422 a tool refuses too, naming the argument,
before anything is read or written. The service would otherwise strip a NUL that REST refuses.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Annotated, Final, ParamSpec, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations
from opentelemetry.trace import Tracer
from pydantic import BaseModel, Field, ValidationError
from sqlalchemy.ext.asyncio import AsyncSession

from app.enablement import service as enablement
from app.enablement.schemas import DecisionOut
from app.kit.db.engine import Database
from app.kit.errors import (
    DomainError,
    NotFound,
    PreconditionFailed,
    PreconditionRequired,
)
from app.kit.pagination import DEFAULT_LIMIT, MAX_LIMIT, Page, PageRequest, decode_cursor
from app.kit.principal import Principal
from app.kit.schemas import Identifier
from app.kit.tracing import NO_TRACER
from app.mcp_server.errors import InvalidContentArgument
from app.profiles import service
from app.profiles.schemas import MemoryIn, VersionSummaryOut
from app.profiles.versions import EntityTags, VersionPolicy, WriteConditions
from app.rate_limits.limiter import RateLimiter
from app.rate_limits.policy import RouteClass

PROFILE_URI: Final = "memory://me/profile"
SERVER_NAME: Final = "context-memory"
INSTRUCTIONS: Final = (
    "The user's memory profile (memory.md): what you know about them. Read it with "
    "read_memory; to change it, send the whole edited content with the version you read to "
    "edit_memory. An edit against an older version is refused: read again and redo the edit."
)

_caller: ContextVar[Principal] = ContextVar("mcp_caller")


@asynccontextmanager
async def acting_as(principal: Principal) -> AsyncIterator[None]:
    """Run the MCP calls of one HTTP request as `principal` (the SDK hands each call the
    context of the request that carried it)."""
    token = _caller.set(principal)
    try:
        yield
    finally:
        _caller.reset(token)


def caller() -> Principal:
    """The verified principal of the current request; there is no call without one."""
    try:
        return _caller.get()
    except LookupError:
        raise RuntimeError("an MCP call outside an authenticated request") from None


class Memory(BaseModel):
    """The caller's memory profile; `version` is null (and `content` empty) before the first."""

    version: int | None = Field(description="Send it back to edit_memory as expected_version")
    content: str = Field(description="The memory.md document")
    updated_at: datetime | None = None


class Edit(BaseModel):
    version: int = Field(description="The version now current")
    written: bool = Field(description="False when the content equalled the current version's")
    content: str


class Diff(BaseModel):
    from_version: int = Field(description="0 is the empty document")
    to_version: int
    diff: str = Field(description="Unified diff")


Limit = Annotated[int, Field(ge=1, le=MAX_LIMIT, description="Page size")]
MAX_VERSION: Final = 2**31 - 1
VersionNumber = Annotated[int, Field(ge=1, le=MAX_VERSION)]

STALE_VERSION = (
    "Your memory changed since you read it: expected_version {expected} is not the current "
    "version. Call read_memory again, redo the edit on what it returns, and send that version."
)
ALREADY_EXISTS = (
    "You already have a memory profile: call read_memory and send its version as expected_version."
)


ARGUMENT_OF_FIELD: Final = {"query.cursor": "cursor"}
"""A route's field that a service names in its error -> the tool argument that carries it."""


def _tool_error(error: DomainError) -> ToolError:
    """The error's detail and offending fields, a route's field named as the tool's argument."""
    fields = "; ".join(
        f"{ARGUMENT_OF_FIELD.get(str(e['field']), e['field'])}: {e['message']}"
        for e in error.errors or ()
    )
    return ToolError(f"{error.detail} ({fields})" if fields else error.detail)


def _profile_content(content: str) -> str:
    """`content` held to the rules of `PUT /v1/me/memory`'s body (no NUL, its length), or a
    422 naming the argument; the value is never echoed back (it is the user's text)."""
    try:
        return MemoryIn.model_validate({"content": content}).content
    except ValidationError as exc:
        errors = [{"field": "content", "message": str(error["msg"])} for error in exc.errors()]
        raise InvalidContentArgument(errors) from None


def _conditions(expected_version: int | None) -> WriteConditions:
    """What `If-Match: "n"` (or, with no version, `If-None-Match: *`) says over HTTP."""
    if expected_version is None:
        return WriteConditions(if_none_match=EntityTags(True, frozenset(), frozenset()))
    tag = frozenset({str(expected_version)})
    return WriteConditions(if_match=EntityTags(False, tag, frozenset()))


def _admit_write(limiter: RateLimiter) -> None:
    """Count an edit against the caller's and the company's memory-write limits (REST's)."""
    principal = caller()
    verdict = limiter.check(RouteClass.MEMORY_WRITES, principal.company_id, principal.user_id)
    if not verdict.allowed:
        raise ToolError(
            "Over the rate limit of memory writes; nothing was written. Retry after "
            f"{verdict.retry_after_seconds} s."
        )


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _traced(tracer: Tracer, tool: Callable[_P, Awaitable[_R]]) -> Callable[_P, Awaitable[_R]]:
    """`tool` run in a span of its own (GenAI's `execute_tool`), named for the tool and
    carrying no argument; the signature the SDK reads its schema from is kept."""
    name = tool.__name__
    attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}

    @functools.wraps(tool)
    async def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with tracer.start_as_current_span(f"execute_tool {name}", attributes=attributes):
            return await tool(*args, **kwargs)

    return run


def _reported(tool: Callable[_P, Awaitable[_R]]) -> Callable[_P, Awaitable[_R]]:
    """`tool` with its domain errors turned into tool errors (`_tool_error`): an `isError`
    result the assistant reads, where REST would answer problem+json. A tool still catches
    the errors it answers otherwise (an empty page, a stale version) itself."""

    @functools.wraps(tool)
    async def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        try:
            return await tool(*args, **kwargs)
        except DomainError as exc:
            raise _tool_error(exc) from exc

    return run


def build_server(
    database: Database, policy: VersionPolicy, limiter: RateLimiter, tracer: Tracer = NO_TRACER
) -> MCPServer:
    """The MCP server of one app: its tools reach `database`, writes follow `policy` and
    count against the caller's and the company's memory-write rate limits, as REST's do;
    each call is a span of `tracer`."""
    server: MCPServer = MCPServer(SERVER_NAME, instructions=INSTRUCTIONS, version="0.1.0")
    read_only = ToolAnnotations(read_only_hint=True, open_world_hint=False)

    def served(tool: Callable[_P, Awaitable[_R]]) -> Callable[_P, Awaitable[_R]]:
        """Every tool: in its span, its domain errors reported to the assistant."""
        return _traced(tracer, _reported(tool))

    @asynccontextmanager
    async def transaction() -> AsyncIterator[AsyncSession]:
        async with database.sessionmaker() as session, session.begin():
            yield session

    async def head() -> Memory:
        try:
            async with transaction() as session:
                row = await service.read_memory(session, caller())
        except NotFound:
            return Memory(version=None, content="")
        return Memory(version=row.version, content=row.content, updated_at=row.created_at)

    @server.tool(annotations=read_only)
    @served
    async def read_memory() -> Memory:
        """Read your memory profile: its content and the version to edit it against."""
        return await head()

    @server.tool(annotations=ToolAnnotations(destructive_hint=False, open_world_hint=False))
    @served
    async def edit_memory(content: str, expected_version: VersionNumber | None) -> Edit:
        """Replace your memory profile with `content` (the whole memory.md), conditional on
        `expected_version`: the version read_memory returned (null when there was none)."""
        _admit_write(limiter)
        checked = _profile_content(content)
        try:
            async with transaction() as session:
                outcome = await service.replace_memory(
                    session, caller(), checked, _conditions(expected_version), policy=policy
                )
        except (PreconditionFailed, PreconditionRequired) as exc:
            stale = expected_version is None
            message = ALREADY_EXISTS if stale else STALE_VERSION.format(expected=expected_version)
            raise ToolError(message) from exc
        row = outcome.row
        return Edit(version=row.version, written=outcome.written, content=row.content)

    @server.tool(annotations=read_only)
    @served
    async def list_memory_versions(
        limit: Limit = DEFAULT_LIMIT, cursor: str | None = None
    ) -> Page[VersionSummaryOut]:
        """Your retained profile versions, newest first (without content); pass `next_cursor`
        back as `cursor` for the next page."""
        request = PageRequest(limit, decode_cursor(cursor) if cursor else None)
        try:
            async with transaction() as session:
                page = await service.list_versions(session, caller(), request)
        except NotFound:
            return Page[VersionSummaryOut](items=[], next_cursor=None)
        return VersionSummaryOut.page(page)

    @server.tool(annotations=read_only)
    @served
    async def diff_memory_versions(
        version: VersionNumber, against: Annotated[int, Field(ge=0, le=MAX_VERSION)] | None = None
    ) -> Diff:
        """Unified diff of `version` against `against` (default: the version before it; 0: the
        empty document)."""
        async with transaction() as session:
            diff = await service.diff_versions(session, caller(), version, against)
        return Diff(from_version=diff.from_version, to_version=diff.to_version, diff=diff.diff)

    @server.tool(annotations=read_only)
    @served
    async def read_memory_enablement(space_id: Identifier) -> DecisionOut:
        """Whether context memory is on for you in a space, with every condition that decides
        it (company flag, space setting, web search, your own setting)."""
        principal = caller()
        async with transaction() as session:
            context = await enablement.load_enablement(
                session, principal.company_id, space_id, principal.user_id
            )
        return DecisionOut.of(context.decision)

    @server.resource(
        PROFILE_URI,
        name="memory-profile",
        title="Your memory profile",
        description="What the assistant knows about you (memory.md); empty before the first",
        mime_type="text/markdown",
    )
    async def profile() -> str:
        return (await head()).content

    return server
