"""The memory-policy corpora through the real service, by every write path a user's text can
take: the chat turns (consolidated by the run's engine and its worker), the user's own
`PUT /v1/me/memory`, the MCP tool `edit_memory`, a restore of an old version, the user's import
of their memory export and an operator's company import; then every stored version and policy
record of the run's companies read back from the database and every user's memory export from
the API, and searched for the attacker values.

Each path writes as users of its own (`put-<id>`, `mcp-<id>`, `restore-<id>`, `import-<id>`,
`company-<id>`), so a leak found names the path it came through. An edit adds one bullet per
corpus turn to the profile as it stands (the attacker's message in the section the obedient
model would choose, the benign fact's bullet in its section) with the version read, as a client
does: a refused edit stores nothing, so one refusal never hides another value. A restore brings
back a version written while the company allowed everything (every value of the user at once:
a restore drops bullets alone); those seed versions are not searched. A company import carries
each user's history as an obedient model would have written it, into a company of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any, Final, Protocol, TypeVar

import httpx
import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult, TextContent

from app.consolidation.rules import Exchange
from app.detectors import Category
from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.enablement.memory_policy import DEFAULT_ACTIONS, Action
from app.portability.format import MEDIA_TYPE, header_line
from app.portability.kinds import RECORD_TYPES
from app.profiles.document import (
    Operation,
    OpKind,
    Profile,
    Section,
    apply,
    empty_profile,
    parse,
    render,
    sanitize_bullet,
)
from app.profiles.versions import content_sha256
from eval.corpus import UserScript
from eval.import_stream import user_memory_records
from eval.obedient import obedient_operations, section_for
from eval.policy import (
    LostFact,
    PathFigures,
    PolicyReport,
    StoredText,
    class_figures,
    find_leaks,
    lost_facts,
)
from eval.policy_corpus import AttackTurn, AttackUser, BenignUser, PolicyCorpus
from eval.replay import COMPANY, OPERATOR, ReplayError, Service, connect_database

_CATEGORY: Final = re.compile(r"\b(" + "|".join(c.value for c in Category) + r")\b")
_T = TypeVar("_T")
MCP_PATH: Final = "/mcp"
CONCURRENT_USERS: Final = 8
"""Users replayed at once. Each user's turns and edits stay in order; different users overlap,
as they do in production (the worker consolidates different users concurrently)."""
PATHS: Final = ("chat", "put", "mcp", "restore", "import", "company")
"""The write paths, as `PolicyRun.paths` names them."""
IMPORTED: Final = "eval-imported"
"""The company the company import loads, empty before it."""
SEED_VERSIONS: Final = 2
"""Versions of a `restore-` user written while everything was allowed, not searched."""
INTRO: Final = "Joined the pilot group of the new assistant."
HARMLESS: Final = "Reviews the profile monthly."
_START: Final = datetime(2026, 10, 1, 8, 0, tzinfo=UTC)


@dataclass(frozen=True)
class EditResult:
    """What the service answered an edit: stored (with the head it wrote, which a redaction
    may have changed), or refused with the categories it named."""

    stored: bool
    categories: tuple[str, ...] = ()
    detail: str = ""
    head: tuple[str | None, int | None] = (None, None)


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
    paths: tuple[str, ...] = PATHS
    burst: bool = False
    """Each user's chat turns in one burst (`PolicyCorpus.scripts`) rather than paced."""


async def run_policy(service: Service, corpus: PolicyCorpus, run: PolicyRun) -> PolicyReport:
    """The corpora through every path of `run.paths`, then every stored text of both
    companies and every user's export searched for the attacker values."""
    base = str(service.http.base_url).rstrip("/")

    def http_editor(user: str) -> contextlib.AbstractAsyncContextManager[Editor]:
        return contextlib.nullcontext(_HttpEditor(service, user))

    def mcp_editor(user: str) -> contextlib.AbstractAsyncContextManager[Editor]:
        return _mcp_editor(service, base, user)

    def import_editor(user: str) -> contextlib.AbstractAsyncContextManager[Editor]:
        return contextlib.nullcontext(_ImportEditor(service, user))

    steps: dict[str, Callable[[], Coroutine[Any, Any, PathFigures]]] = {
        "chat": lambda: _through_turns(service, corpus, run.engine, burst=run.burst),
        "put": lambda: _through_edits("PUT /v1/me/memory", "put", corpus, http_editor),
        "mcp": lambda: _through_edits("MCP edit_memory", "mcp", corpus, mcp_editor),
        "restore": lambda: _through_restore(service, corpus),
        "import": lambda: _through_edits(
            "POST /v1/me/memory/import", "import", corpus, import_editor
        ),
        "company": lambda: _through_company_import(service, corpus),
    }
    figures = []
    for name in run.paths:
        started = time.monotonic()
        path = await steps[name]()
        run.progress(f"{path.path}: {len(path.users)} users in {_since(started)}")
        figures.append(path)
    started = time.monotonic()
    stored, records = await stored_texts(run.database_url)
    if "company" in run.paths:
        imported, imported_records = await stored_texts(run.database_url, IMPORTED)
        stored += imported
        records = {
            k: records.get(k, 0) + imported_records.get(k, 0) for k in {*records, *imported_records}
        }
    stored += await exported_texts(service, [user for path in figures for user in path.users])
    stored = [text for text in stored if not _seed(text)]
    run.progress(f"read back: {len(stored)} stored texts in {_since(started)}")
    leaks = find_leaks(corpus.attack_turns, stored)
    leaks += find_leaks(corpus.missed_turns, stored, missed=True)
    paths = tuple(
        replace(path, leaks=tuple(leak for leak in leaks if leak.user_id in path.users))
        for path in figures
    )
    return PolicyReport(
        attacker_corpus=run.names[0],
        benign_corpus=run.names[1],
        values=sum(len(turn.values) for turn in corpus.attack_turns),
        texts_searched=len(stored),
        leaks=leaks,
        paths=paths,
        records=records,
        classes=class_figures(corpus.attack_turns, corpus.missed_turns, paths),
        missed_values=sum(len(turn.values) for turn in corpus.missed_turns),
    )


def _seed(text: StoredText) -> bool:
    """A version the restore path wrote while everything was allowed (not the path's doing)."""
    return (
        text.user_id.startswith("restore-")
        and text.version is not None
        and text.version <= SEED_VERSIONS
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


async def _through_turns(
    service: Service, corpus: PolicyCorpus, engine: str, *, burst: bool
) -> PathFigures:
    benign = {user.id: user for user in corpus.benign}

    async def replay(script: UserScript) -> _UserOutcome:
        run = await service.replay(script)
        if script.id not in benign:
            return _UserOutcome(jobs=run.jobs)
        text = "\n".join(bullet for bullets in run.profile.values() for bullet in bullets)
        turns = benign[script.id].turns
        missing = lost_facts(script.id, turns, text, edited=False)
        return _UserOutcome(jobs=run.jobs, kept=len(turns) - len(missing), lost=missing)

    scripts = corpus.scripts(burst=burst)
    outcomes = await _bounded([replay(script) for script in scripts])
    name = f"chat turns, engine {engine}" + ", in bursts" * burst
    return _figures(name, corpus, [s.id for s in scripts], outcomes)


async def _through_edits(
    path: str,
    prefix: str,
    corpus: PolicyCorpus,
    editor_for: Callable[[str], contextlib.AbstractAsyncContextManager[Editor]],
) -> PathFigures:
    """Every attacker turn as one edit, by users `<prefix>-<corpus id>`; each benign user's
    facts as one edit, or, when that is refused, one edit each. Each edit is based on the head
    the last stored edit answered (read once at the start)."""

    async def attack(user: AttackUser) -> _UserOutcome:
        owner = f"{prefix}-{user.id}"
        refused = expected = 0
        notes: list[str] = []
        missed = user in corpus.known_misses  # measured, not judged
        async with editor_for(owner) as editor:
            head = await editor.read()
            for turn in user.turns:
                added = [(section_for(turn.user), turn.user)]
                result = await _add_bullets(editor, owner, head, added)
                head = result.head if result.stored else head
                if not missed:
                    refused += not result.stored
                    expected += must_refuse(turn)
                    notes += _attack_notes(turn, result)
        return _UserOutcome(refused=refused, expected=expected, notes=tuple(notes))

    async def remember(user: BenignUser) -> _UserOutcome:
        owner = f"{prefix}-{user.id}"
        refusals: list[tuple[str, ...]] = []
        notes = []
        async with editor_for(owner) as editor:
            head = await editor.read()
            facts = [(fact.section, fact.bullet) for fact in user.turns]
            result = await _add_bullets(editor, owner, head, facts)
            if result.stored:
                head = result.head
            else:
                for fact in user.turns:
                    result = await _add_bullets(editor, owner, head, [(fact.section, fact.bullet)])
                    head = result.head if result.stored else head
                    refusals.append(result.categories)
                    if not result.stored and not result.categories:
                        note = f"{fact.bullet!r} refused, naming no category: {result.detail}"
                        notes.append(note)
            content, _ = head
        missing = lost_facts(owner, user.turns, content or "", edited=True, refusals=refusals)
        kept = len(user.turns) - len(missing)
        return _UserOutcome(notes=tuple(notes), kept=kept, lost=missing)

    outcomes = await _bounded(
        [*(attack(user) for user in corpus.attackers), *(remember(u) for u in corpus.benign)]
    )
    ids = [user.id for user in corpus.attackers] + [user.id for user in corpus.benign]
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


async def _add_bullets(
    editor: Editor,
    user: str,
    head: tuple[str | None, int | None],
    added: Sequence[tuple[Section, str]],
) -> EditResult:
    """`head` with the `added` bullets, written conditionally on its version."""
    content, version = head
    profile = empty_profile(user) if content is None else parse(content)
    bullets = {s: list(profile.bullets(s)) for s in Section}
    for section, text in added:
        bullets[section].append(sanitize_bullet(text))
    edited = render(Profile.from_sections(profile.frontmatter, bullets))
    return await editor.write(edited, version)


# --- restore and the company import ---------------------------------------------------------------


async def _through_restore(service: Service, corpus: PolicyCorpus) -> PathFigures:
    """Per user `restore-<id>`: version 1 holding every attacker message (or benign fact) of
    the user as a bullet, written while the company allowed every category; version 2 without
    them; then, under the company's policy again, version 1 restored."""
    operator = service.auth(OPERATOR, "operator")
    policy_path = f"/v1/companies/{COMPANY}/memory-policy"
    kept = await service.call("GET", policy_path, operator)
    fields = [c.value for c in Category] + ["recent_topics_days", "inactive_memory_days"]
    allow_all = {
        **{c.value: Action.ALLOW.value for c in Category},
        "recent_topics_days": 0,
        "inactive_memory_days": 0,
    }
    await service.call("PUT", policy_path, operator, json=allow_all)
    bullets: dict[str, list[tuple[Section, str]]] = {
        **{u.id: [(section_for(t.user), t.user) for t in u.turns] for u in corpus.attackers},
        **{u.id: [(t.section, t.bullet) for t in u.turns] for u in corpus.benign},
    }

    async def seed(user_id: str) -> None:
        editor = _HttpEditor(service, f"restore-{user_id}")
        owner = f"restore-{user_id}"
        by_section: dict[Section, list[str]] = {section: [] for section in Section}
        for section, text in bullets[user_id]:
            by_section[section].append(sanitize_bullet(text))
        for content in (
            render(Profile.from_sections(empty_profile(owner).frontmatter, by_section)),
            render(Profile.from_sections(empty_profile(owner).frontmatter, _harmless())),
        ):
            _, version = await editor.read()
            written = await editor.write(content, version)
            if not written.stored:
                raise ReplayError(f"restore seed of {owner} refused: {written.detail}")

    try:
        await _bounded([seed(user_id) for user_id in bullets])
    finally:
        await service.call("PUT", policy_path, operator, json={name: kept[name] for name in fields})
    benign = {user.id: user for user in corpus.benign}

    async def restore(user_id: str) -> _UserOutcome:
        owner = f"restore-{user_id}"
        auth = {**service.auth(owner), "If-Match": f'"{SEED_VERSIONS}"'}
        await service.call("POST", "/v1/me/memory/versions/1/restore", auth)
        if user_id not in benign:
            return _UserOutcome()
        head = await service.call("GET", "/v1/me/memory", service.auth(owner))
        turns = benign[user_id].turns
        missing = lost_facts(owner, turns, str(head["content"]), edited=True)
        return _UserOutcome(kept=len(turns) - len(missing), lost=missing)

    outcomes = await _bounded([restore(user_id) for user_id in bullets])
    users = [f"restore-{user_id}" for user_id in bullets]
    return _figures("restore of a version", corpus, users, outcomes)


def _harmless() -> dict[Section, list[str]]:
    return {section: [HARMLESS] if section is Section.COMMUNICATION else [] for section in Section}


async def _through_company_import(service: Service, corpus: PolicyCorpus) -> PathFigures:
    """One company stream into the empty company `IMPORTED`: per attacker `company-<id>`, an
    intro and then a version per turn as the obedient model writes it (every sentence a bullet,
    the message a Recent Topic with its digits joined); per benign user, a version with the
    user's facts as bullets of their sections."""
    histories: list[tuple[str, list[dict[str, Any]]]] = []
    for attacker in corpus.attackers:
        owner = f"company-{attacker.id}"
        history = _History(owner)
        history.write([Operation(OpKind.ADD, Section.IDENTITY, text=INTRO)], "user_edit")
        for turn in attacker.turns:
            exchange = Exchange(turn.user, turn.assistant, history.clock)
            history.write(obedient_operations([exchange]))
        histories.append((owner, history.versions))
    for user in corpus.benign:
        owner = f"company-{user.id}"
        history = _History(owner)
        added = [Operation(OpKind.ADD, turn.section, text=turn.bullet) for turn in user.turns]
        history.write(added, "user_edit")
        histories.append((owner, history.versions))
    lines = _company_stream(histories)
    response = await service.http.post(
        f"/v1/companies/{IMPORTED}/import",
        content=lines,
        headers={**service.auth(OPERATOR, "operator"), "Content-Type": MEDIA_TYPE},
    )
    if response.status_code != httpx.codes.CREATED:
        raise ReplayError(f"company import: {response.status_code} {response.text[:300]}")

    async def facts(user: BenignUser) -> _UserOutcome:
        owner = f"company-{user.id}"
        head = await service.call("GET", "/v1/me/memory", service.auth(owner, company=IMPORTED))
        content = "" if head is None else str(head["content"])
        missing = lost_facts(owner, user.turns, content, edited=True)
        return _UserOutcome(kept=len(user.turns) - len(missing), lost=missing)

    outcomes = [_UserOutcome() for _ in corpus.attackers]
    outcomes += await _bounded([facts(user) for user in corpus.benign])
    return _figures("company import", corpus, [owner for owner, _ in histories], outcomes)


@dataclass
class _History:
    """One user's versions as a source deployment without the policy stored them."""

    user_id: str
    clock: datetime = _START
    profile: Profile | None = None
    versions: list[dict[str, Any]] = field(default_factory=list)

    def write(self, operations: Sequence[Operation], reason: str = "consolidation") -> None:
        self.clock += timedelta(hours=1)
        before = self.profile or empty_profile(self.user_id)
        self.profile = apply(before, operations, self.clock)
        content = render(self.profile)
        self.versions.append(
            {
                "type": "memory_version",
                "user_id": self.user_id,
                "version": len(self.versions) + 1,
                "content": content,
                "sha256": content_sha256(content),
                "tokens": 1,
                "reason": reason,
                "operations": [op.to_json() for op in operations],
                "source_turn_ids": [],
                "model": "gpt-4o-mini" if reason == "consolidation" else None,
                "created_at": self.clock.isoformat(),
            }
        )


def _company_stream(histories: Sequence[tuple[str, list[dict[str, Any]]]]) -> bytes:
    """The company export stream of `histories`: the context-memory flag on, the default
    memory policy, the user-memory folders with their ACLs, each user's memory file and
    versions."""
    stamp = {"updated_by_company_id": "platform", "updated_by": OPERATOR}
    records: list[dict[str, Any]] = [
        {
            "type": "feature_flag",
            "flag": FLAG_CONTEXT_MEMORY,
            "enabled": True,
            "updated_at": _START.isoformat(),
            **stamp,
        },
        {
            "type": "memory_policy",
            "actions": {
                category.value: action.value for category, action in DEFAULT_ACTIONS.items()
            },
            "recent_topics_days": 0,
            "inactive_memory_days": 0,
            "updated_at": _START.isoformat(),
            **stamp,
        },
        *user_memory_records(IMPORTED, histories),
    ]
    counts: dict[str, int] = {}
    for record in records:
        counts[record["type"]] = counts.get(record["type"], 0) + 1
    header = header_line(IMPORTED, _START, RECORD_TYPES)
    body = b"".join(json.dumps(record).encode() + b"\n" for record in records)
    end = json.dumps({"type": "end", "counts": counts}).encode() + b"\n"
    return header + body + end


# --- the editors ----------------------------------------------------------------------------------


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
        return _answered("PUT /v1/me/memory", response)


def _answered(call: str, response: httpx.Response) -> EditResult:
    """An edit's answer: stored, or a 422 refusal with the categories its errors name."""
    if response.is_success:
        head = response.json()
        return EditResult(stored=True, head=(str(head["content"]), int(head["version"])))
    if response.status_code != httpx.codes.UNPROCESSABLE_ENTITY:
        raise ReplayError(f"{call}: {response.status_code} {response.text[:300]}")
    problem = response.json()
    types = [str(error.get("type", "")) for error in problem.get("errors") or []]
    named = [t.removeprefix("memory_policy.") for t in types if t.startswith("memory_policy.")]
    return EditResult(False, tuple(dict.fromkeys(named)), str(problem.get("detail", "")))


class _ImportEditor(_HttpEditor):
    """`GET /v1/me/memory`, and `POST /v1/me/memory/import` of an export document holding the
    edited profile, conditional on the version read."""

    async def write(self, content: str, version: int | None) -> EditResult:
        condition = {"If-None-Match": "*"} if version is None else {"If-Match": f'"{version}"'}
        response = await self.http.post(
            "/v1/me/memory/import",
            headers={**self.auth, **condition},
            json={"profile": {"content": content, "version": version}},
        )
        return _answered("POST /v1/me/memory/import", response)


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
            edit = _structured(result, "edit_memory")
            return EditResult(stored=True, head=(str(edit["content"]), int(edit["version"])))
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


async def stored_texts(
    database_url: str, company: str = COMPANY
) -> tuple[list[StoredText], dict[str, int]]:
    """Every version (content, and the texts of its operations) and every policy record of
    `company`, and the records counted by `category action`."""
    conn = await connect_database(database_url)
    try:
        versions = await conn.fetch(
            "SELECT user_id, version, content, operations::text AS operations"
            " FROM memory_versions WHERE company_id = $1",
            company,
        )
        records = await conn.fetch(
            "SELECT user_id, version, category, action, row_to_json(a)::text AS record"
            " FROM memory_policy_actions a WHERE company_id = $1",
            company,
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


async def exported_texts(service: Service, users: Sequence[str]) -> list[StoredText]:
    """What each user's `GET /v1/me/memory/export` holds of their memory: the profile, every
    version (content and operations) and every policy record, one text each (the export's
    chats are what the user wrote in them, not memory)."""

    async def export(user: str) -> list[StoredText]:
        company = IMPORTED if user.startswith("company-") else COMPANY
        document = await service.call(
            "GET", "/v1/me/memory/export", service.auth(user, company=company)
        )
        profile = document["profile"]
        found = []
        if profile is not None:
            found.append(
                StoredText(user, int(profile["version"]), "export profile", profile["content"])
            )
        found += (
            StoredText(user, int(item["version"]), "export version", "\n".join(_leaves(item)))
            for item in document["versions"]
        )
        found += (
            StoredText(user, item.get("version"), "export policy record", "\n".join(_leaves(item)))
            for item in document["policy_actions"]
        )
        return found

    exports = await _bounded([export(user) for user in users])
    return [text for found in exports for text in found]
