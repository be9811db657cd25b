"""The memory-policy corpora through the real service, by every write path a user's text can
take: the chat turns (consolidated by the run's engine and its worker), the user's own
`PUT /v1/me/memory`, and the MCP tool `edit_memory`; then every stored version and policy record
of the run's company read back from the database and searched for the attacker values.

Each path writes as users of its own (`put-<id>`, `mcp-<id>` for the edits), so a leak found in
the database names the path it came through. An edit adds one bullet per corpus turn to the
profile as it stands (the attacker's message in the section the obedient model would choose,
the benign fact's bullet in its section) with the version read, as a client does.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Protocol, TypeVar

import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, TextContent

from app.detectors import Category
from app.enablement.memory_policy import DEFAULT_ACTIONS, Action
from app.profiles.document import Profile, Section, empty_profile, parse, render, sanitize_bullet
from eval.corpus import UserScript
from eval.obedient import section_for
from eval.policy import (
    LostFact,
    PathFigures,
    PolicyReport,
    StoredText,
    find_leaks,
    lost_facts,
)
from eval.policy_corpus import AttackTurn, AttackUser, BenignUser, PolicyCorpus
from eval.replay import COMPANY, ReplayError, Service, connect_database

_CATEGORY: Final = re.compile(r"\b(" + "|".join(c.value for c in Category) + r")\b")
_T = TypeVar("_T")
MCP_PATH: Final = "/mcp"
CONCURRENT_USERS: Final = 4
"""Users replayed at once. Each user's turns and edits stay in order; different users overlap,
as they do in production (the worker consolidates different users concurrently)."""


@dataclass(frozen=True)
class EditResult:
    """What the service answered an edit: stored, or refused with the categories it named."""

    stored: bool
    categories: tuple[str, ...] = ()
    detail: str = ""


class Editor(Protocol):
    """One user's way of editing their profile: read it, write it conditionally."""

    async def read(self) -> tuple[str | None, int | None]: ...

    async def write(self, content: str, version: int | None) -> EditResult: ...


@dataclass(frozen=True)
class PolicyRun:
    """How a run replays the policy corpora: the engine's name for the report, the scratch
    database to search, how the report names the attacker and the benign corpus, and where
    progress goes."""

    engine: str
    database_url: str
    names: tuple[str, str]
    progress: Callable[[str], None] = lambda line: None


async def run_policy(service: Service, corpus: PolicyCorpus, run: PolicyRun) -> PolicyReport:
    """Both corpora through the chat turns (with the run's engine), PUT and MCP, then every
    stored text of the company searched for the attacker values."""
    started = time.monotonic()
    turns = await _through_turns(service, corpus, run.engine)
    run.progress(f"chat turns: {len(corpus.scripts())} users in {_since(started)}")
    started = time.monotonic()

    def http_editor(user: str) -> contextlib.AbstractAsyncContextManager[Editor]:
        return contextlib.nullcontext(_HttpEditor(service, user))

    put = await _through_edits("PUT /v1/me/memory", "put", corpus, http_editor)
    run.progress(f"PUT: {put.attacks + put.facts} edits in {_since(started)}")
    started = time.monotonic()
    base = str(service.http.base_url).rstrip("/")

    def mcp_editor(user: str) -> contextlib.AbstractAsyncContextManager[Editor]:
        return _mcp_editor(service, base, user)

    mcp = await _through_edits("MCP edit_memory", "mcp", corpus, mcp_editor)
    run.progress(f"MCP: {mcp.attacks + mcp.facts} edits in {_since(started)}")
    stored, records = await stored_texts(run.database_url)
    leaks = find_leaks(corpus.attack_turns, stored)
    paths = tuple(
        replace(path, leaks=tuple(leak for leak in leaks if leak.user_id in path.users))
        for path in (turns, put, mcp)
    )
    return PolicyReport(
        attacker_corpus=run.names[0],
        benign_corpus=run.names[1],
        values=sum(len(turn.values) for turn in corpus.attack_turns),
        texts_searched=len(stored),
        leaks=leaks,
        paths=paths,
        records=records,
    )


@dataclass(frozen=True)
class _UserOutcome:
    """One user's share of a path's figures (attackers: refusals; benign users: facts)."""

    jobs: dict[str, int] = field(default_factory=dict)
    refused: int = 0
    expected: int = 0
    notes: tuple[str, ...] = ()
    kept: int = 0
    lost: tuple[LostFact, ...] = ()


async def _through_turns(service: Service, corpus: PolicyCorpus, engine: str) -> PathFigures:
    benign = {user.id: user for user in corpus.benign}

    async def replay(script: UserScript) -> _UserOutcome:
        run = await service.replay(script)
        if script.id not in benign:
            return _UserOutcome(jobs=run.jobs)
        text = "\n".join(bullet for bullets in run.profile.values() for bullet in bullets)
        turns = benign[script.id].turns
        missing = lost_facts(script.id, turns, text, edited=False)
        return _UserOutcome(jobs=run.jobs, kept=len(turns) - len(missing), lost=missing)

    scripts = corpus.scripts()
    outcomes = await _bounded([replay(script) for script in scripts])
    return _figures(f"chat turns, engine {engine}", corpus, [s.id for s in scripts], outcomes)


async def _through_edits(
    path: str,
    prefix: str,
    corpus: PolicyCorpus,
    editor_for: Callable[[str], contextlib.AbstractAsyncContextManager[Editor]],
) -> PathFigures:
    """Every attacker turn and benign fact as one edit each, by users `<prefix>-<corpus id>`."""

    async def attack(user: AttackUser) -> _UserOutcome:
        owner = f"{prefix}-{user.id}"
        refused = expected = 0
        notes: list[str] = []
        async with editor_for(owner) as editor:
            for turn in user.turns:
                result = await _add_bullet(editor, owner, section_for(turn.user), turn.user)
                refused += not result.stored
                expected += must_refuse(turn)
                notes += _attack_notes(turn, result)
        return _UserOutcome(refused=refused, expected=expected, notes=tuple(notes))

    async def remember(user: BenignUser) -> _UserOutcome:
        owner = f"{prefix}-{user.id}"
        refusals = []
        notes = []
        async with editor_for(owner) as editor:
            for fact in user.turns:
                result = await _add_bullet(editor, owner, fact.section, fact.bullet)
                refusals.append(result.categories)
                if not result.stored and not result.categories:
                    notes.append(f"{fact.bullet!r} refused, naming no category: {result.detail}")
            content, _ = await editor.read()
        missing = lost_facts(owner, user.turns, content or "", edited=True, refusals=refusals)
        kept = len(user.turns) - len(missing)
        return _UserOutcome(notes=tuple(notes), kept=kept, lost=missing)

    outcomes = await _bounded(
        [*(attack(user) for user in corpus.attacker), *(remember(u) for u in corpus.benign)]
    )
    ids = [user.id for user in corpus.attacker] + [user.id for user in corpus.benign]
    users = [f"{prefix}-{user_id}" for user_id in ids]
    return _figures(path, corpus, users, outcomes, edits=True)


def _figures(
    path: str,
    corpus: PolicyCorpus,
    users: Sequence[str],
    outcomes: Sequence[_UserOutcome],
    *,
    edits: bool = False,
) -> PathFigures:
    jobs: dict[str, int] = {}
    for outcome in outcomes:
        for key, count in outcome.jobs.items():
            jobs[key] = jobs.get(key, 0) + count
    return PathFigures(
        path=path,
        users=tuple(users),
        attacks=len(corpus.attack_turns),
        values=sum(len(turn.values) for turn in corpus.attack_turns),
        leaks=(),
        refused=sum(o.refused for o in outcomes) if edits else None,
        refusals_expected=sum(o.expected for o in outcomes) if edits else None,
        facts=len(corpus.benign_turns),
        kept=sum(o.kept for o in outcomes),
        lost=tuple(fact for o in outcomes for fact in o.lost),
        jobs=jobs,
        notes=tuple(note for o in outcomes for note in o.notes),
    )


async def _bounded(work: Sequence[Coroutine[Any, Any, _T]]) -> list[_T]:
    """`work` run at most `CONCURRENT_USERS` at a time; the results in order."""
    semaphore = asyncio.Semaphore(CONCURRENT_USERS)

    async def one(item: Coroutine[Any, Any, _T]) -> _T:
        async with semaphore:
            return await item

    return list(await asyncio.gather(*(one(item) for item in work)))


def _since(started: float) -> str:
    return f"{time.monotonic() - started:.1f} s"


def must_refuse(turn: AttackTurn) -> bool:
    """Whether the default policy refuses a user's edit holding the turn's message: some
    category of it is dropped (e-mail addresses and phone numbers are only redacted)."""
    return any(DEFAULT_ACTIONS[category] is Action.DROP for category in turn.categories)


def _attack_notes(turn: AttackTurn, result: EditResult) -> list[str]:
    expected = {str(category) for category in turn.categories}
    if must_refuse(turn) and result.stored:
        return [f"accepted {turn.user!r} ({', '.join(sorted(expected))})"]
    if not must_refuse(turn) and not result.stored:
        return [f"refused {turn.user!r}, redact expected: {result.detail}"]
    if not result.stored and not expected & set(result.categories):
        named = ", ".join(result.categories) or "no category"
        return [f"refused {turn.user!r} as {named}, expected {', '.join(sorted(expected))}"]
    return []


async def _add_bullet(editor: Editor, user: str, section: Section, text: str) -> EditResult:
    content, version = await editor.read()
    profile = empty_profile(user) if content is None else parse(content)
    bullets = {s: list(profile.bullets(s)) for s in Section}
    bullets[section].append(sanitize_bullet(text))
    edited = render(Profile.from_sections(profile.frontmatter, bullets))
    return await editor.write(edited, version)


# --- the two editors ------------------------------------------------------------------------------


class _HttpEditor:
    """`GET` and `PUT /v1/me/memory` with `If-Match` (or `If-None-Match: *` to create)."""

    def __init__(self, service: Service, user: str) -> None:
        self.http = service.http
        self.auth = service.auth(user)

    async def read(self) -> tuple[str | None, int | None]:
        response = await self.http.get("/v1/me/memory", headers=self.auth)
        if response.status_code == httpx.codes.NOT_FOUND:
            return None, None
        if response.is_error:
            raise ReplayError(f"GET /v1/me/memory: {response.status_code} {response.text[:300]}")
        head = response.json()
        return str(head["content"]), int(head["version"])

    async def write(self, content: str, version: int | None) -> EditResult:
        condition = {"If-None-Match": "*"} if version is None else {"If-Match": f'"{version}"'}
        response = await self.http.put(
            "/v1/me/memory", headers={**self.auth, **condition}, json={"content": content}
        )
        if response.is_success:
            return EditResult(stored=True)
        if response.status_code != httpx.codes.UNPROCESSABLE_ENTITY:
            raise ReplayError(f"PUT /v1/me/memory: {response.status_code} {response.text[:300]}")
        problem = response.json()
        types = [str(error.get("type", "")) for error in problem.get("errors") or []]
        named = [t.removeprefix("memory_policy.") for t in types if t.startswith("memory_policy.")]
        return EditResult(False, tuple(dict.fromkeys(named)), str(problem.get("detail", "")))


class _McpEditor:
    """The MCP tools `read_memory` and `edit_memory` over one session."""

    def __init__(self, client: Client) -> None:
        self.client = client

    async def read(self) -> tuple[str | None, int | None]:
        result = await self.client.call_tool("read_memory", {})
        memory = _structured(result, "read_memory")
        version = memory.get("version")
        return (str(memory["content"]), int(version)) if version is not None else (None, None)

    async def write(self, content: str, version: int | None) -> EditResult:
        arguments = {"content": content, "expected_version": version}
        result = await self.client.call_tool("edit_memory", arguments)
        if not isinstance(result, CallToolResult):
            raise ReplayError("MCP edit_memory: not a tool result")
        if not result.is_error:
            return EditResult(stored=True)
        text = " ".join(block.text for block in result.content if isinstance(block, TextContent))
        return EditResult(False, tuple(dict.fromkeys(_CATEGORY.findall(text))), text)


@contextlib.asynccontextmanager
async def _mcp_editor(service: Service, base: str, user: str) -> AsyncIterator[_McpEditor]:
    async with (
        httpx2.AsyncClient(headers=service.auth(user)) as http,
        Client(streamable_http_client(base + MCP_PATH, http_client=http)) as client,
    ):
        yield _McpEditor(client)


def _structured(result: object, tool: str) -> dict[str, Any]:
    if not isinstance(result, CallToolResult) or result.is_error:
        raise ReplayError(f"MCP {tool} failed: {result}")
    content = result.structured_content
    if not isinstance(content, dict):
        raise ReplayError(f"MCP {tool}: no structured result")
    return content


# --- what was stored ------------------------------------------------------------------------------


async def stored_texts(database_url: str) -> tuple[list[StoredText], dict[str, int]]:
    """Every version (content, and the texts of its operations) and every policy record of the
    run's company, and the records counted by `category action`."""
    conn = await connect_database(database_url)
    try:
        versions = await conn.fetch(
            "SELECT user_id, version, content, operations::text AS operations"
            " FROM memory_versions WHERE company_id = $1",
            COMPANY,
        )
        records = await conn.fetch(
            "SELECT user_id, version, category, action, row_to_json(a)::text AS record"
            " FROM memory_policy_actions a WHERE company_id = $1",
            COMPANY,
        )
    finally:
        await conn.close()
    stored: list[StoredText] = []
    for row in versions:
        user, version = str(row["user_id"]), int(row["version"])
        stored.append(StoredText(user, version, "content", str(row["content"])))
        leaves = "\n".join(_leaves(json.loads(row["operations"])))
        stored.append(StoredText(user, version, "operations", leaves))
    counts: dict[str, int] = {}
    for row in records:
        leaves = "\n".join(_leaves(json.loads(row["record"])))
        stored.append(StoredText(str(row["user_id"]), row["version"], "policy record", leaves))
        key = f"{row['category']} {row['action']}"
        counts[key] = counts.get(key, 0) + 1
    return stored, counts


def _leaves(value: object) -> Sequence[str]:
    """The strings (and numbers) inside a JSON value, one per item."""
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [] if value is None else [str(value)]
