"""The company memory policy's retention (SPEC §13), as two housekeeping steps of the worker:
memories idle longer than `inactive_memory_days` are erased as an opt-out erases them, and
Recent Topics bullets older than `recent_topics_days` are dropped from the head profile.

The worker knows no domain: `main` hands it the steps this module builds.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Generic, TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.enablement import audit
from app.enablement.memory_policy import MemoryPolicy
from app.enablement.memory_policy_repository import read_memory_policy
from app.jobs.worker import Maintenance
from app.kit.errors import NotFound
from app.kit.observability import Metrics
from app.profiles import retention_repository as repository
from app.profiles.document import ProfileFormatError, diff_operations, parse
from app.profiles.errors import VersionConflict
from app.profiles.expiry import expire_topics, retention_cutoff
from app.profiles.retention_repository import START, ExpiringHead, MemoryKey, Window
from app.profiles.service import prune_versions, save_consolidation
from app.profiles.switch import delete_user_memory, lock_user_memory
from app.profiles.versions import ExpectedHead, VersionPolicy, VersionSource

logger = logging.getLogger("app.retention")

PolicyReader = Callable[[AsyncSession, str], Awaitable[MemoryPolicy]]
Sessions = async_sessionmaker[AsyncSession]
T = TypeVar("T")
Finder = Callable[[AsyncSession, Window, str, datetime, int], Awaitable[Sequence[T]]]

RETENTION_WINDOW: Final = 5_000
"""Memories a step examines per run: the next ones in (company, user) order."""
RETENTION_LIMIT: Final = 500
"""Memories a step writes or erases per run, each in a short transaction of its own."""
RETENTION_ACTOR: Final = "memory-retention"
"""The actor of the audit event an idle memory's erasure records (no user asked for it)."""


@dataclass(frozen=True)
class _Due(Generic[T]):
    """A memory its company's policy makes due, with that policy's cutoff and days."""

    item: T
    cutoff: datetime
    days: int


@dataclass
class _Walk(Generic[T]):
    """One step's walk over every memory: where it continues (after the last memory it
    examined, or the last it handled when it reached `limit`; from the start once a run
    reached the end), which of the policy's days it applies and how it finds what is due.
    Per process: a restart starts over, and repeating a run is harmless."""

    window: int
    limit: int
    read_policy: PolicyReader
    days_of: Callable[[MemoryPolicy], int]
    find: Finder[T]
    key_of: Callable[[T], MemoryKey]
    after: MemoryKey = field(default=START)

    async def due(self, sessions: Sessions, now: datetime) -> list[_Due[T]]:
        """What is due among the next memories, in order, in one read transaction: each
        company's policy read once, none due where its days are 0."""
        async with sessions() as session, session.begin():
            window = await repository.select_window(session, self.after, self.window)
            self.after = START if window is None or window.size < self.window else window.last
            if window is None:
                return []
            due: list[_Due[T]] = []
            for company_id in window.companies:
                days = self.days_of(await self.read_policy(session, company_id))
                cutoff = retention_cutoff(now, days)
                if cutoff is None:
                    continue
                found = await self.find(session, window, company_id, cutoff, self.limit - len(due))
                due += [_Due(item, cutoff, days) for item in found]
                if len(due) >= self.limit:  # continue after the last one next run
                    self.after = self.key_of(due[-1].item)
                    break
            return due


def _inactive_memory_days(company: MemoryPolicy) -> int:
    return company.inactive_memory_days


def _recent_topics_days(company: MemoryPolicy) -> int:
    return company.recent_topics_days


def _key(key: MemoryKey) -> MemoryKey:
    return key


def _head_key(head: ExpiringHead) -> MemoryKey:
    return head.key


def memory_retention_steps(
    policy: VersionPolicy,
    metrics: Metrics,
    *,
    read_policy: PolicyReader = read_memory_policy,
    window: int = RETENTION_WINDOW,
    limit: int = RETENTION_LIMIT,
) -> tuple[Maintenance, Maintenance]:
    """The housekeeping steps erasing idle memories, then expiring Recent Topics.

    Each run of a step examines the next `window` memories and handles at most `limit` of those
    due, each in a short transaction of its own; the next run continues after them, and starts
    over once a run reached the end. Each company's policy comes from `read_policy` (a company
    that saved none has the defaults). `policy` writes the versions; its clock is `now`. Both
    steps are idempotent: what they removed is not found again.
    """
    idle = _Walk(
        window,
        limit,
        read_policy,
        _inactive_memory_days,
        repository.select_idle_memories,
        _key,
    )
    topics = _Walk(
        window,
        limit,
        read_policy,
        _recent_topics_days,
        repository.select_expiring_heads,
        _head_key,
    )

    async def erase_idle_memories(engine: AsyncEngine) -> int:
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        erased = 0
        for memory in await idle.due(sessions, policy.clock()):
            if await _erase_idle_memory(sessions, memory.item, memory.cutoff, memory.days):
                metrics.memory_retention.labels("memories_erased").inc()
                erased += 1
        return erased

    async def expire_recent_topics(engine: AsyncEngine) -> int:
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        written = 0
        for head in await topics.due(sessions, policy.clock()):
            dropped = await _expire_topics(sessions, head.item, head.cutoff, policy)
            if dropped:
                metrics.memory_retention.labels("topics_dropped").inc(dropped)
                metrics.memory_retention.labels("versions_written").inc()
                written += 1
        return written

    return erase_idle_memories, expire_recent_topics


async def _erase_idle_memory(
    sessions: Sessions, key: MemoryKey, cutoff: datetime, days: int
) -> bool:
    """Erase the memory as the opt-out does (profile, versions, folder, pending jobs) if it is
    still idle; the user's setting is left as it is. True when something was deleted.

    Under the user-memory lock, idleness is checked again: a write or a turn committed since the
    window was read keeps the memory. A consolidation that read the memory before the erasure
    finds the folder gone and writes nothing, as after an opt-out.
    """
    company_id, user_id = key.company_id, key.user_id
    async with sessions() as session, session.begin():
        await lock_user_memory(session, company_id, user_id)
        if not await repository.is_idle(session, key, cutoff):
            return False
        deleted = await delete_user_memory(session, company_id, user_id)
        if deleted.anything:
            await audit.record_event(
                session,
                company_id,
                audit.AuditEntry(
                    actor=audit.Actor(company_id, RETENTION_ACTOR),
                    action="user_memory.deleted",
                    target_kind="user",
                    target_id=user_id,
                    old=None,
                    new={
                        "profile": deleted.profile,
                        "versions": deleted.versions,
                        "jobs": deleted.jobs,
                        "folder": deleted.folder,
                        "inactive_memory_days": days,
                    },
                ),
            )
    return deleted.anything


async def _expire_topics(
    sessions: Sessions, head: ExpiringHead, cutoff: datetime, policy: VersionPolicy
) -> int:
    """Write `head` without its expired Recent Topics as a `retention` version, by
    compare-and-set on `head.version`; the number of bullets dropped (0: nothing written).

    A write that moved the head meanwhile wins: this one is dropped, and the step's next pass
    over the memory finds the new head. A memory deleted meanwhile (opt-out, erasure) is left
    alone.
    """
    try:
        before = parse(head.content)
    except ProfileFormatError:
        logger.warning("stored profile does not parse; its Recent Topics are not expired")
        return 0
    after, dropped = expire_topics(before, cutoff)
    if not dropped:  # only a prefix that is no valid date matched
        return 0
    expected = ExpectedHead(head.key.company_id, head.key.user_id, head.version)
    source = VersionSource("retention", operations=tuple(diff_operations(before, after)))
    try:
        async with sessions() as session, session.begin():
            if await save_consolidation(session, expected, after, source, policy) is None:
                return 0
            await prune_versions(session, expected, policy)
    except (VersionConflict, NotFound):  # a concurrent write won, or the memory is gone
        return 0
    return dropped
