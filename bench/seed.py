"""Seeding of the benchmark's two scratch databases, set-based (`bench/run_bench.py` imports it).

The reference (`appbench`) is seeded with its docstring's SQL (`REFERENCE_SEED`), with the scale
as `$1`. Ours (`cms_bench`, migrated to head) holds the same shape of data:

- through the app's services, once: the company's context-memory flag and its `user-memory`
  root folder with the Root Group's ACL;
- per user, with one `INSERT ... SELECT generate_series` each (`_USER_ROWS`, `_VERSION_ROWS`):
  the `user-memory/user-{n}` folder (parent the root, not inheriting), its two ACL entries
  (the owner's READ and WRITE, from `acl.user_folder_entries`), the `memory.md` row (skip
  ingestion, hidden in chat) with head version 1, and version 1: a valid profile document of
  ~8 KB / ~1,800 stored tokens (`profile_document`), its sha256 computed by PostgreSQL;
- per user, one chat of 10 turns / 20 messages written with COPY, as the turn-save writes them
  (one turn row per user + assistant pair, messages in id order, tokens stored). The contents are
  byte-for-byte the reference seed's (`message_content`: 16 md5 hex digests, 512 chars).

Two things would cost minutes at 100,000 users if done per row, and are not:

- Profiles: a document is rendered once per template (`ProfileTemplates`: one per topic
  rotation, `user % 8`), with a marker where the user's number goes; PostgreSQL substitutes the
  number. The stored `tokens` (the body, `STORED`) are counted once per template
  and number of digits: the cl100k pre-tokenizer splits text by character class only, and every
  run of 1-3 digits is one token (checked), so any other number of the same length gives the
  same count.
- Message tokens: tiktoken needs ~200 µs per 512-char hex text here (400 s for 2,000,000
  messages). `hex_tokens` gets the same count from the same pre-tokenization: on hex text the
  pieces are the maximal runs of a-f (each BPE-encoded on its own; counts cached per run) and
  the digit runs, cut into chunks of at most 3 digits (one token each). Worker processes
  compute contents and counts, chunk by chunk, and stream them to COPY.

`check_ours` verifies the result: sampled users' rows against rows written for the same users
by the app's own services in a scratch company (column by column, without ids and timestamps),
stored documents and tokens against the real renderer and counter, messages against
`message_content` and the counter, and row counts; `check_against_reference` compares sampled
chats with the reference database's messages.
"""

from __future__ import annotations

import asyncio
import binascii
import functools
import hashlib
import importlib
import itertools
import multiprocessing
import os
import random
import signal
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import asyncpg
from sqlalchemy import text

from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.folders import service as folders
from app.folders.acl import ROOT_FOLDER, user_folder_entries, user_folder_path
from app.kit.config import Settings, to_asyncpg_url
from app.kit.db.engine import create_database
from app.kit.db.migrations import run_migrations
from app.kit.principal import Principal
from app.kit.tokens import TokenCounters
from app.profiles import repository as profiles
from app.profiles import service as profile_service
from app.profiles.document import SECTIONS, Frontmatter, Profile, parse, render
from app.profiles.versions import (
    ExpectedHead,
    VersionSource,
    content_sha256,
    count_tokens,
)

STORED = TokenCounters().stored
"""The counter the service stores tokens with (`TokenCounters.stored`)."""

COMPANY, SPACE = "bench-co", "space-1"
CHECK_COMPANY = "bench-seed-check"  # scratch company of `check_ours`, deleted afterwards
HISTORY_MESSAGES = 20  # stored messages per chat, as in the reference seed
DEFAULT_BUDGET = 2000  # the default space budget: every profile must fit, to be injected whole

# The reference app's seed (its docstring), with the scale as $1 instead of 10000.
REFERENCE_SEED = (
    "create table profile(user_id int primary key, version int not null default 1,"
    " body text not null, updated_at timestamptz not null default now())",
    "insert into profile(user_id, body)"
    " select g, (select string_agg(md5(g::text || ':' || i::text), '')"
    " from generate_series(1,256) i) from generate_series(1,$1::int) g",
    "create table messages(id bigserial primary key, conversation_id bigint not null,"
    " role text not null, content text not null,"
    " created_at timestamptz not null default now())",
    "insert into messages(conversation_id, role, content)"
    " select c, case when m % 2 = 0 then 'user' else 'assistant' end,"
    " (select string_agg(md5(c::text || ':' || m::text || ':' || i::text), '')"
    " from generate_series(1,16) i)"
    " from generate_series(1,$1::int) c, generate_series(1,20) m",
    "create index messages_conv_id on messages(conversation_id, id)",
    "create table jobs(id bigserial primary key, kind text not null,"
    " conversation_id bigint not null, status text not null default 'queued',"
    " created_at timestamptz not null default now())",
)


def user_id(user: int) -> str:
    return f"user-{user}"


def context_chat(user: int) -> str:
    return f"chat-{user}"


def turns_chat(user: int) -> str:
    """Turn-saves go to a chat of their own, so the measured loads keep reading 20 messages."""
    return f"turns-{user}"


# --- the reference ------------------------------------------------------------------------------


async def seed_reference(dsn: str, users: int) -> None:
    """The reference's docstring SQL at `users`, then VACUUM ANALYZE."""
    conn = await asyncpg.connect(dsn)
    try:
        for statement in REFERENCE_SEED:
            if "$1" in statement:
                await conn.execute(statement, users)
            else:
                await conn.execute(statement)
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


# --- profiles -----------------------------------------------------------------------------------

_TOPICS = (
    "Kubernetes rollouts",
    "PostgreSQL indexing",
    "quarterly planning",
    "hiring loops",
    "incident reviews",
    "TypeScript migrations",
    "budget forecasts",
    "API design",
)
_LAST_UPDATED = datetime(2026, 11, 1, tzinfo=UTC)
_MARKER = "USERNUMBER"  # where a template holds the user's number (letters: no digit run)


def _profile(number: str, variant: int) -> Profile:
    """6 sections x 9 bullets of ~140 chars naming user `number`; topics rotate by `variant`."""
    bullets = {
        section: [
            f"Note {n} for user {number} on {_TOPICS[(variant + n + s) % len(_TOPICS)]}: prefers "
            "short, concrete answers with one worked example, then the trade-offs spelled out "
            f"(context {n * 7 + s})."
            for n in range(9)
        ]
        for s, section in enumerate(SECTIONS)
    }
    frontmatter = Frontmatter(user_id=user_id_of(number), last_updated=_LAST_UPDATED, turn_count=12)
    return Profile.from_sections(frontmatter, bullets)


def user_id_of(number: str) -> str:
    return f"user-{number}"


def profile_of(user: int) -> Profile:
    """User `user`'s seeded profile, built the slow way (what the templates must reproduce)."""
    return _profile(str(user), user % len(_TOPICS))


def profile_document(user: int) -> tuple[str, int]:
    """User `user`'s memory.md (a valid document of ~8 KB) and its stored tokens (of the body,
    as the profile service counts them, ~1,800), rendered and counted the slow way."""
    profile = profile_of(user)
    return render(profile), count_tokens(profile, STORED)


@dataclass(frozen=True)
class ProfileTemplates:
    """Every user's document and tokens from `len(_TOPICS)` rendered templates.

    `documents[v]` is the document of the users with `user % 8 == v`, `_MARKER` standing for the
    user's number; `tokens[v * digits + d - 1]` its stored tokens for numbers of `d` digits.
    """

    digits: int
    documents: tuple[str, ...]
    tokens: tuple[int, ...]

    @classmethod
    def build(cls, users: int) -> ProfileTemplates:
        _require_digit_runs_single_tokens()
        digits = len(str(users))
        documents = tuple(render(_profile(_MARKER, v)) for v in range(len(_TOPICS)))
        tokens = tuple(
            count_tokens(profile_of(_representative(v, d)), STORED)
            for v in range(len(_TOPICS))
            for d in range(1, digits + 1)
        )
        return cls(digits, documents, tokens)

    def document(self, user: int) -> str:
        return self.documents[user % len(_TOPICS)].replace(_MARKER, str(user))

    def tokens_of(self, user: int) -> int:
        return self.tokens[(user % len(_TOPICS)) * self.digits + len(str(user)) - 1]


def _representative(variant: int, digits: int) -> int:
    """The smallest number of `digits` digits with `number % 8 == variant`."""
    low: int = 10 ** (digits - 1)
    return low + (variant - low) % len(_TOPICS)


# --- message contents and their tokens ----------------------------------------------------------


def message_content(conversation: int, message: int) -> str:
    """The reference seed's message text: 16 md5 hex digests, 512 chars."""
    return "".join(
        hashlib.md5(f"{conversation}:{message}:{i}".encode(), usedforsecurity=False).hexdigest()
        for i in range(1, 17)
    )


_DIGEST_SUFFIXES = tuple(b"%d" % i for i in range(1, 17))
try:  # CPython's own md5: ~2x faster than OpenSSL's on inputs this short
    _md5: Any = importlib.import_module("_md5").md5
except ImportError:  # pragma: no cover - an interpreter without it
    _md5 = functools.partial(hashlib.md5, usedforsecurity=False)


def message_bytes(conversation: int, message: int) -> bytes:
    """`message_content` as ASCII bytes, ~4x faster."""
    prefix = _md5(b"%d:%d:" % (conversation, message))
    digests = []
    for suffix in _DIGEST_SUFFIXES:
        digest = prefix.copy()
        digest.update(suffix)
        digests.append(digest.digest())
    return binascii.hexlify(b"".join(digests))


class _LetterRunTokens(dict[bytes, int]):
    """Tokens of one maximal run of a-f (a pre-tokenizer piece), counted once per run."""

    def __missing__(self, run: bytes) -> int:
        tokens = self[run] = STORED.count(run.decode("ascii"))
        return tokens

    def warm(self, longest: int) -> None:
        """Count every run of up to `longest` letters (before forking the workers)."""
        for length in range(1, longest + 1):
            for letters in itertools.product(b"abcdef", repeat=length):
                self[bytes(letters)]  # filled by __missing__


_LETTER_RUNS = _LetterRunTokens()
_DIGITS_TO_SPACES = bytes.maketrans(b"0123456789", b" " * 10)
_DIGIT_FLAGS = bytes.maketrans(b"0123456789abcdef", b"\x01" * 10 + b"\x00" * 6)


def hex_tokens(content: bytes) -> int:
    """`STORED.count(content)` for lowercase hex text, ~6x faster.

    The cl100k pre-tokenizer cuts hex text into the maximal runs of letters and the runs of
    digits in chunks of at most 3 (left to right); each piece is BPE-encoded on its own. A letter
    run's tokens come from the counter (cached per run); a digit chunk is one token
    (`_require_digit_runs_single_tokens`), and a run of L digits holds ceil(L / 3) chunks.
    """
    letters = sum(map(_LETTER_RUNS.__getitem__, content.translate(_DIGITS_TO_SPACES).split()))
    return letters + _digit_chunks(content)


def _digit_chunks(content: bytes) -> int:
    """Sum of ceil(L / 3) over the runs of digits of `content`, by bit operations: with one
    byte per character (1 for a digit), count the runs that reach 1, 4, 7, ... digits."""
    digits = int.from_bytes(content.translate(_DIGIT_FLAGS), "big")  # char i+1 is 8 bits lower
    starts = digits & ~(digits >> 8)  # a digit after a non-digit
    three = digits & (digits << 8) & (digits << 16)  # a digit followed by two digits
    chunks, reach, shift = starts.bit_count(), digits, 8
    while True:
        reach &= three << shift  # runs of 3 more digits: 4, 7, 10, ... from their start
        longer = starts & reach
        if not longer:
            return chunks
        chunks += longer.bit_count()
        shift += 24


def _require_digit_runs_single_tokens() -> None:
    """What `hex_tokens` and the profile templates rely on: 1-3 digits are one token."""
    for width in (1, 2, 3):
        for number in range(10**width):
            if STORED.count(f"{number:0{width}d}") != 1:
                raise RuntimeError(f"{number:0{width}d} is not one token: the seed's counts fail")


# --- ours ---------------------------------------------------------------------------------------

# Folders, their ACL entries and the memory.md rows of users 1..$3, as `ensure_user_folder` and
# `ensure_memory_file` write them (plus head version 1, as a first version write leaves it).
_USER_ROWS = """
WITH numbers AS (
    SELECT g, $4::text || g AS user_id FROM generate_series(1, $3::int) g
), new_folders AS (
    INSERT INTO folders (company_id, id, path, parent_id, inherit_access)
    SELECT $1, gen_random_uuid(), $5::text || user_id, $2::uuid, false FROM numbers ORDER BY g
    RETURNING id, path
), acl AS (
    INSERT INTO folder_acl (company_id, folder_id, principal_kind, principal_id, permission)
    SELECT $1, f.id, e.kind, substr(f.path, length($5::text) + 1), e.permission
    FROM new_folders f, unnest($6::text[], $7::text[]) AS e(kind, permission)
)
INSERT INTO memory_files (company_id, user_id, folder_id, skip_ingestion, hidden_in_chat,
                          head_version)
SELECT $1, substr(f.path, length($5::text) + 1), f.id, true, true, 1 FROM new_folders f
"""

# Version 1 of users 1..$2: the template of `g % 8` with the user's number in, its sha256 (of
# the UTF-8 bytes, as `content_sha256`) and its tokens (per template and number of digits).
_VERSION_ROWS = """
INSERT INTO memory_versions (company_id, user_id, version, content, sha256, tokens, reason)
SELECT $1, $3::text || g, 1, d.content, encode(sha256(convert_to(d.content, 'UTF8')), 'hex'),
       ($6::int[])[(g % $7::int) * $8::int + length(g::text)], 'consolidation'
FROM generate_series(1, $2::int) g,
     LATERAL (SELECT replace(($4::text[])[g % $7::int + 1], $5::text, g::text) AS content) d
ORDER BY g
"""


async def seed_ours(url: str, settings: Settings, users: int) -> int:
    """Migrate, seed `users` users (see the module docstring), VACUUM ANALYZE and check;
    returns user 1's stored profile tokens."""
    timings: dict[str, float] = {}
    started = time.monotonic()
    await asyncio.to_thread(run_migrations, to_asyncpg_url(url))
    await _seed_company(url, settings, COMPANY)
    timings["migrations, flag, root folder"] = time.monotonic() - started

    templates = ProfileTemplates.build(users)
    if max(templates.tokens) > DEFAULT_BUDGET:
        raise RuntimeError(f"a profile holds {max(templates.tokens)} > {DEFAULT_BUDGET} tokens")

    async def profiles_part() -> None:
        step = time.monotonic()
        await seed_profiles(url, users, templates)
        timings["folders, ACL, memory.md, versions (SQL)"] = time.monotonic() - step

    async def history_part() -> None:
        step = time.monotonic()
        await seed_history(url, users, vacuum=False)
        timings["turns, messages (COPY)"] = time.monotonic() - step

    async with asyncio.TaskGroup() as group:  # PostgreSQL works on both while Python computes
        group.create_task(profiles_part())
        group.create_task(history_part())

    step = time.monotonic()
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()
    timings["VACUUM ANALYZE"] = time.monotonic() - step

    step = time.monotonic()
    await check_ours(url, settings, users, templates)
    timings["check"] = time.monotonic() - step
    print(
        "  ours: "
        + "; ".join(f"{name} {seconds:.1f} s" for name, seconds in timings.items())
        + f"; profile tokens {min(templates.tokens):,}-{max(templates.tokens):,}",
        flush=True,
    )
    return templates.tokens_of(1)


async def _seed_company(url: str, settings: Settings, company: str) -> None:
    """The context-memory flag and the root folder, through the app's services."""
    database = create_database(to_asyncpg_url(url), settings)
    try:
        async with database.sessionmaker() as session, session.begin():
            await session.execute(
                text(
                    "INSERT INTO company_feature_flags"
                    " (company_id, flag, enabled, updated_by_company_id, updated_by)"
                    " VALUES (:c, :f, true, :c, 'bench')"
                ),
                {"c": company, "f": FLAG_CONTEXT_MEMORY},
            )
            await folders.ensure_root_folder(session, company)
    finally:
        await database.dispose()


async def seed_profiles(dsn: str, users: int, templates: ProfileTemplates) -> None:
    """Per-user folders, ACL entries, memory.md rows and head versions (the root must exist)."""
    entries = user_folder_entries(_MARKER)
    if any(entry.principal_id != _MARKER for entry in entries):
        raise RuntimeError("the per-user folder's ACL names more than its owner: update the seed")
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            root = await conn.fetchval(
                "SELECT id FROM folders WHERE company_id = $1 AND path = $2", COMPANY, ROOT_FOLDER
            )
            await conn.execute(
                _USER_ROWS,
                COMPANY,
                root,
                users,
                user_id_of(""),
                user_folder_path(""),
                [entry.principal_kind for entry in entries],
                [entry.permission.value for entry in entries],
            )
            await conn.execute(
                _VERSION_ROWS,
                COMPANY,
                users,
                user_id_of(""),
                list(templates.documents),
                _MARKER,
                list(templates.tokens),
                len(_TOPICS),
                templates.digits,
            )
    finally:
        await conn.close()


_TURN_COLUMNS = ["company_id", "id", "user_id", "chat_id", "space_id", "history_mode"]
_MESSAGE_COLUMNS = [
    "company_id",
    "user_id",
    "chat_id",
    "turn_id",
    "role",
    "content",
    "source",
    "tokens",
]
_CHUNK_USERS = 500  # users per worker task: 10,000 messages, ~6 MB of COPY text


def history_rows(users: Sequence[int]) -> tuple[bytes, bytes]:
    """COPY text (turns, chat_messages) of `users`' chats: 10 turns of (user, assistant), as the
    turn-save writes them (history_mode auto, no language model, tokens counted)."""
    company, space = COMPANY.encode(), SPACE.encode()
    turns: list[bytes] = []
    messages: list[bytes] = []
    for user in users:
        uid, chat = user_id(user).encode(), context_chat(user).encode()
        owner = b"%s\t%s\t%s" % (company, uid, chat)
        for first in range(1, HISTORY_MESSAGES + 1, 2):
            turn = str(uuid.uuid4()).encode()
            turns.append(b"%s\t%s\t%s\t%s\t%s\tauto\n" % (company, turn, uid, chat, space))
            for message, role, source in (
                (first, b"user", b"request"),
                (first + 1, b"assistant", b"response"),
            ):
                content = message_bytes(user, message)
                messages.append(
                    b"%s\t%s\t%s\t%s\t%s\t%d\n"
                    % (owner, turn, role, content, source, hex_tokens(content))
                )
    return b"".join(turns), b"".join(messages)


def _worker_signals() -> None:
    """A worker dies on SIGTERM (`Pool.terminate`), whatever handler its parent installed (the
    harness turns SIGTERM into KeyboardInterrupt, which would leave a worker stuck on a lock of
    the pool), and leaves Ctrl-C to its parent."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)


async def _next_result(results: Any) -> tuple[bytes, bytes] | None:
    """The next result of `Pool.imap`, None at the end; polled, so a failing COPY cancels it."""
    while True:
        try:
            rows: tuple[bytes, bytes] = results.next(timeout=0)
        except multiprocessing.TimeoutError:
            await asyncio.sleep(0.005)
        except StopIteration:
            return None
        else:
            return rows


def _index_order(users: int) -> list[int]:
    """1..users in the order of their ids' bytes (the C collation of the bench databases), so
    the (company, user, chat, id) indexes are filled by appends."""
    return sorted(range(1, users + 1), key=lambda user: user_id(user).encode())


async def seed_history(
    dsn: str, users: int, *, vacuum: bool = True, processes: int | None = None
) -> None:
    """One chat of 10 turns / 20 messages per user (`history_rows`), computed by worker
    processes and streamed to two COPYs, turns and messages."""
    _require_digit_runs_single_tokens()
    order = _index_order(users)
    chunks = [order[i : i + _CHUNK_USERS] for i in range(0, users, _CHUNK_USERS)]
    queues: tuple[asyncio.Queue[bytes | None], ...] = (asyncio.Queue(8), asyncio.Queue(8))

    async def produce(results: Iterator[tuple[bytes, bytes]]) -> None:
        while (rows := await _next_result(results)) is not None:
            for queue, data in zip(queues, rows, strict=True):
                await queue.put(data)
        for queue in queues:
            await queue.put(None)

    async def drain(queue: asyncio.Queue[bytes | None]) -> AsyncIterator[bytes]:
        while (data := await queue.get()) is not None:
            yield data

    async def copy(queue: asyncio.Queue[bytes | None], table: str, columns: list[str]) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.copy_to_table(table, source=drain(queue), columns=columns, format="text")
        finally:
            await conn.close()

    _LETTER_RUNS.warm(6)  # 56k runs, ~0.2 s: the workers inherit them
    # fork: the workers start at once, with the counter and its caches of this process
    context = multiprocessing.get_context("fork")
    pool = context.Pool(processes or os.cpu_count() or 1, initializer=_worker_signals)
    try:
        async with asyncio.TaskGroup() as group:
            group.create_task(produce(pool.imap(history_rows, chunks)))
            group.create_task(copy(queues[0], "turns", _TURN_COLUMNS))
            group.create_task(copy(queues[1], "chat_messages", _MESSAGE_COLUMNS))
    except BaseException:
        pool.terminate()
        raise
    else:
        pool.close()
    finally:
        pool.join()
    if vacuum:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute("VACUUM ANALYZE turns, chat_messages")
        finally:
            await conn.close()


# --- the check ------------------------------------------------------------------------------------

# A user's rows as JSON without ids and timestamps (new columns are compared too): company $1,
# and $2 the user's folder path (by_path) or the user id.
_USER_ROWS_JSON = (
    (
        "folder",
        True,
        "SELECT to_jsonb(f) - ARRAY['company_id', 'id', 'parent_id', 'created_at']"
        " || jsonb_build_object('parent', p.path)"
        " FROM folders f JOIN folders p ON p.company_id = f.company_id AND p.id = f.parent_id"
        " WHERE f.company_id = $1 AND f.path = $2",
    ),
    (
        "folder ACL",
        True,
        "SELECT to_jsonb(a) - ARRAY['company_id', 'folder_id'] FROM folder_acl a"
        " JOIN folders f ON f.company_id = a.company_id AND f.id = a.folder_id"
        " WHERE f.company_id = $1 AND f.path = $2"
        " ORDER BY a.principal_kind, a.principal_id, a.permission",
    ),
    (
        "memory.md",
        False,
        "SELECT to_jsonb(m) - ARRAY['company_id', 'folder_id', 'created_at', 'updated_at']"
        " || jsonb_build_object('folder', f.path)"
        " FROM memory_files m JOIN folders f ON f.company_id = m.company_id AND f.id = m.folder_id"
        " WHERE m.company_id = $1 AND m.user_id = $2",
    ),
    (
        "versions",
        False,
        "SELECT to_jsonb(v) - ARRAY['company_id', 'created_at'] FROM memory_versions v"
        " WHERE v.company_id = $1 AND v.user_id = $2 ORDER BY v.version",
    ),
)


async def check_ours(
    url: str, settings: Settings, users: int, templates: ProfileTemplates, samples: int = 40
) -> None:
    """Raise unless the seeded rows are what the app would have written (see the module doc)."""
    rng = random.Random(users)  # noqa: S311 - a sample, reproducible per scale
    # every (template, number of digits) of the tokens table, the first and the last user
    edges = {
        1,
        users,
        *(
            _representative(v, d)
            for v in range(len(_TOPICS))
            for d in range(1, templates.digits + 1)
        ),
    }
    randoms = rng.sample(range(1, users + 1), min(samples, users))
    sampled = sorted({u for u in edges if u <= users} | set(randoms))
    through_services = sorted({1, users})
    await _seed_through_services(url, settings, through_services)
    problems: list[str] = []
    conn = await asyncpg.connect(url)
    try:
        for user in through_services:
            for what, by_path, query in _USER_ROWS_JSON:
                key = user_folder_path(user_id(user)) if by_path else user_id(user)
                ours = [r[0] for r in await conn.fetch(query, COMPANY, key)]
                theirs = [r[0] for r in await conn.fetch(query, CHECK_COMPANY, key)]
                if ours != theirs or not ours:
                    problems.append(f"{user_id(user)} {what}: seeded {ours}, services {theirs}")
        for user in sampled:
            problems += await _check_user(conn, user, templates)
        problems += await _check_counts(conn, users)
        tokens_sample = rng.sample(range(1, users + 1), min(100, users))
        problems += await _check_message_tokens(conn, tokens_sample)
        async with conn.transaction():  # the folders cascade to ACL, memory.md and versions
            for table in ("company_feature_flags", "folders"):
                await conn.execute(f"DELETE FROM {table} WHERE company_id = $1", CHECK_COMPANY)  # noqa: S608
    finally:
        await conn.close()
    if problems:
        raise RuntimeError("the seed check failed:\n  " + "\n  ".join(problems[:20]))


async def _seed_through_services(url: str, settings: Settings, users: Sequence[int]) -> None:
    """`users`' folder, ACL, memory.md and version 1 in CHECK_COMPANY, the app's way."""
    await _seed_company(url, settings, CHECK_COMPANY)
    database = create_database(to_asyncpg_url(url), settings)
    try:
        async with database.sessionmaker() as session, session.begin():
            for user in users:
                principal = Principal(user_id(user), CHECK_COMPANY, frozenset())
                folder_id, _ = await folders.ensure_user_folder(session, principal)
                await profile_service.ensure_memory_file(
                    session, CHECK_COMPANY, user_id(user), folder_id
                )
                profile = profile_of(user)
                await profiles.write_version(
                    session,
                    ExpectedHead(CHECK_COMPANY, user_id(user), 0),
                    profile,
                    source=VersionSource("consolidation"),
                    tokens=count_tokens(profile, STORED),
                )
    finally:
        await database.dispose()


async def _check_user(
    conn: asyncpg.Connection, user: int, templates: ProfileTemplates
) -> list[str]:
    uid, problems = user_id(user), []
    row = await conn.fetchrow(
        "SELECT v.content, v.sha256, v.tokens, m.head_version FROM memory_versions v"
        " JOIN memory_files m USING (company_id, user_id)"
        " WHERE v.company_id = $1 AND v.user_id = $2 AND v.version = 1",
        COMPANY,
        uid,
    )
    document, tokens = profile_document(user)
    profile = parse(row["content"])  # a valid memory.md, or this raises
    if row["content"] != document or templates.document(user) != document:
        problems.append(f"{uid}: stored document differs from the rendered profile")
    if profile.user_id != uid:
        problems.append(f"{uid}: the document's user_id is {profile.user_id}")
    if row["sha256"] != content_sha256(row["content"]):
        problems.append(f"{uid}: sha256 {row['sha256']} is not the content's")
    if not row["tokens"] == tokens == count_tokens(profile, STORED) == templates.tokens_of(user):
        problems.append(f"{uid}: stored tokens {row['tokens']}, counted {tokens}")
    if row["head_version"] != 1:
        problems.append(f"{uid}: head version {row['head_version']}")

    turns = await conn.fetch(
        "SELECT id, space_id, history_mode, language_model FROM turns"
        " WHERE company_id = $1 AND user_id = $2 AND chat_id = $3",
        COMPANY,
        uid,
        context_chat(user),
    )
    messages = await conn.fetch(
        "SELECT turn_id, role, content, source, tokens FROM chat_messages"
        " WHERE company_id = $1 AND user_id = $2 AND chat_id = $3 ORDER BY id",
        COMPANY,
        uid,
        context_chat(user),
    )
    if {(t["space_id"], t["history_mode"], t["language_model"]) for t in turns} != {
        (SPACE, "auto", None)
    } or len(turns) != HISTORY_MESSAGES // 2:
        problems.append(f"{uid}: turns {turns}")
    expected = [
        (
            ("user", "request") if m % 2 else ("assistant", "response"),
            message_content(user, m),
        )
        for m in range(1, HISTORY_MESSAGES + 1)
    ]
    got = [((m["role"], m["source"]), m["content"]) for m in messages]
    if got != expected:
        problems.append(f"{uid}: messages differ from the reference's contents in turn order")
    turn_ids = [m["turn_id"] for m in messages]
    if turn_ids[::2] != turn_ids[1::2] or set(turn_ids) != {t["id"] for t in turns}:
        problems.append(f"{uid}: messages are not paired by turn")
    wrong = [m["tokens"] for m in messages if m["tokens"] != STORED.count(m["content"])]
    if wrong:
        problems.append(f"{uid}: {len(wrong)} message token counts differ from the counter's")
    return problems


async def _check_counts(conn: asyncpg.Connection, users: int) -> list[str]:
    expected = {
        "folders": users + 1,
        "folder_acl": 2 * users + 2,
        "memory_files": users,
        "memory_versions": users,
        "turns": users * HISTORY_MESSAGES // 2,
        "chat_messages": users * HISTORY_MESSAGES,
    }
    problems = []
    for table, want in expected.items():
        got = await conn.fetchval(
            f"SELECT count(*) FROM {table} WHERE company_id = $1",  # noqa: S608
            COMPANY,
        )
        if got != want:
            problems.append(f"{table}: {got} rows, expected {want}")
    return problems


async def _check_message_tokens(conn: asyncpg.Connection, users: Sequence[int]) -> list[str]:
    """Stored tokens of all messages of `users` against the counter itself."""
    rows = await conn.fetch(
        "SELECT user_id, content, tokens FROM chat_messages"
        " WHERE company_id = $1 AND user_id = ANY($2::text[])",
        COMPANY,
        [user_id(u) for u in users],
    )
    wrong = [r for r in rows if r["tokens"] != STORED.count(r["content"])]
    if wrong or len(rows) != len(users) * HISTORY_MESSAGES:
        return [f"message tokens: {len(wrong)} of {len(rows)} differ from the counter's"]
    return []


async def check_against_reference(ours: str, reference: str, users: int, samples: int = 5) -> None:
    """Raise unless sampled chats hold byte-for-byte the reference's messages, in its order."""
    rng = random.Random(-users)  # noqa: S311 - a sample, reproducible per scale
    sampled = sorted({1, users, *rng.sample(range(1, users + 1), min(samples, users))})
    ours_conn = await asyncpg.connect(ours)
    reference_conn = await asyncpg.connect(reference)
    try:
        for user in sampled:
            mine = await ours_conn.fetch(
                "SELECT content FROM chat_messages"
                " WHERE company_id = $1 AND user_id = $2 AND chat_id = $3 ORDER BY id",
                COMPANY,
                user_id(user),
                context_chat(user),
            )
            theirs = await reference_conn.fetch(
                "SELECT content FROM messages WHERE conversation_id = $1 ORDER BY id", user
            )
            if [r[0] for r in mine] != [r[0] for r in theirs] or not mine:
                raise RuntimeError(f"{user_id(user)}'s messages are not the reference's")
    finally:
        await ours_conn.close()
        await reference_conn.close()
