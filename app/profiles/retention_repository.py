"""SQL of the memory retention: the window of memories one run examines, the memories in it
whose Recent Topics hold an expired bullet, and the memories in it that have been idle.

Flushes (executes), never commits: the caller owns the transaction.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.kit.citus import across_companies
from app.profiles.profile import TOPIC_TIME_FORMAT, Section


@dataclass(frozen=True)
class MemoryKey:
    """A memory.md; the retention walks them in the database's order of (company, user)."""

    company_id: str
    user_id: str


START: Final = MemoryKey("", "")
"""Before every memory: the empty string sorts first in every collation."""


@dataclass(frozen=True)
class Window:
    """The memories `after` < key <= `last`, examined in one run, and their companies in the
    same order."""

    after: MemoryKey
    last: MemoryKey
    companies: tuple[str, ...]
    size: int


@dataclass(frozen=True)
class ExpiringHead:
    """A head version whose Recent Topics hold a bullet dated before the cutoff."""

    key: MemoryKey
    version: int
    content: str


_WINDOW = text("""
SELECT company_id, user_id FROM memory_files
WHERE (company_id, user_id) > (:after_company, :after_user)
ORDER BY company_id, user_id
LIMIT :size
""")


async def select_window(session: AsyncSession, after: MemoryKey, size: int) -> Window | None:
    """Up to `size` memories after `after` (an index range scan of the primary key); None when
    there is none left."""
    params = {"after_company": after.company_id, "after_user": after.user_id, "size": size}
    # every company's memories in key order: the walk reaches every shard (docs/scaling.md)
    async with across_companies(session):
        keys = [MemoryKey(*row) for row in (await session.execute(_WINDOW, params)).all()]
    if not keys:
        return None
    companies = tuple(dict.fromkeys(key.company_id for key in keys))  # the database's order
    return Window(after, keys[-1], companies, len(keys))


_IN_WINDOW = """
f.company_id = :company_id
AND (f.company_id, f.user_id) > (:after_company, :after_user)
AND (f.company_id, f.user_id) <= (:last_company, :last_user)"""


def _window_params(window: Window, company_id: str) -> dict[str, object]:
    return {
        "company_id": company_id,
        "after_company": window.after.company_id,
        "after_user": window.after.user_id,
        "last_company": window.last.company_id,
        "last_user": window.last.user_id,
    }


# The lines of the Recent Topics section of a stored (canonical) document: the text between its
# heading and the next one (which always follows), cut by plain string functions. A dated bullet
# is `- YYYY-MM-DD HH:MM UTC: ...`: its minute is characters 3-18, which sort as time does when
# compared byte by byte ("C"). A regular expression per document costs 20-50 times as much.
RECENT_TOPICS_HEADING: Final = f"\n## {Section.RECENT.value}\n"
_TOPIC_LINES = """
unnest(string_to_array(
    split_part(split_part(v.content, :heading, 2), E'\\n## ', 1), E'\\n'
)) AS line"""

_EXPIRING_HEADS = text(f"""
SELECT f.company_id, f.user_id, v.version, v.content
FROM memory_files f
JOIN memory_versions v
    ON v.company_id = f.company_id AND v.user_id = f.user_id AND v.version = f.head_version
WHERE {_IN_WINDOW}
  AND EXISTS (
      SELECT 1 FROM {_TOPIC_LINES}
      WHERE substr(line, 19, 6) = ' UTC: ' AND substr(line, 3, 16) COLLATE "C" < :cutoff
  )
ORDER BY f.company_id, f.user_id
LIMIT :limit
""")  # noqa: S608 - composed of this module's constants only


async def select_expiring_heads(
    session: AsyncSession, window: Window, company_id: str, cutoff: datetime, limit: int
) -> list[ExpiringHead]:
    """The first `limit` heads of `company_id`'s memories in `window` with a Recent Topics
    bullet dated before `cutoff` (a whole minute).

    Each head in the window is read once, by primary key, and its section's lines compared as
    text. A line that only looks dated (`2026-02-30 10:00 UTC: `) may select a head whose
    profile then has nothing to drop: the caller parses the profile before it writes.
    """
    params = {
        **_window_params(window, company_id),
        "heading": RECENT_TOPICS_HEADING,
        "cutoff": cutoff.strftime(TOPIC_TIME_FORMAT),
        "limit": limit,
    }
    result = await session.execute(_EXPIRING_HEADS, params)
    return [ExpiringHead(MemoryKey(c, u), version, content) for c, u, version, content in result]


# Idle: nothing the user did has touched the memory since :cutoff. Each NOT EXISTS is an index
# probe on the owner's (company_id, user_id) prefix; the cheapest (versions, at most
# MEMORY_MAX_VERSIONS rows) comes first and settles most active users.
_IDLE = """
f.created_at < :cutoff
AND NOT EXISTS (
    SELECT 1 FROM memory_versions v
    WHERE v.company_id = f.company_id AND v.user_id = f.user_id
      AND v.reason <> 'retention' AND v.created_at >= :cutoff
)
AND NOT EXISTS (
    SELECT 1 FROM jobs j
    WHERE j.company_id = f.company_id AND j.user_id = f.user_id AND j.created_at >= :cutoff
)
AND NOT EXISTS (
    SELECT 1 FROM turns t
    WHERE t.company_id = f.company_id AND t.user_id = f.user_id AND t.created_at >= :cutoff
)"""

_IDLE_MEMORIES = text(f"""
SELECT f.company_id, f.user_id FROM memory_files f
WHERE {_IN_WINDOW} AND {_IDLE}
ORDER BY f.company_id, f.user_id
LIMIT :limit
""")  # noqa: S608 - composed of this module's constants only

_IS_IDLE = text(f"""
SELECT 1 FROM memory_files f
WHERE f.company_id = :company_id AND f.user_id = :user_id AND {_IDLE}
""")  # noqa: S608 - composed of this module's constants only


async def select_idle_memories(
    session: AsyncSession, window: Window, company_id: str, cutoff: datetime, limit: int
) -> Sequence[MemoryKey]:
    """The first `limit` of `company_id`'s memories in `window` idle since before `cutoff`
    (see `is_idle`)."""
    params = {**_window_params(window, company_id), "cutoff": cutoff, "limit": limit}
    return [MemoryKey(*row) for row in (await session.execute(_IDLE_MEMORIES, params)).all()]


async def is_idle(session: AsyncSession, key: MemoryKey, cutoff: datetime) -> bool:
    """True when the user's memory.md exists and nothing touched it since `cutoff`: it was
    created before, and since then no version was written other than by the retention, no job
    was queued for the user (a consolidation of a turn, an explicit one, a condensation queued
    when a context was read) and no turn was saved."""
    params = {"company_id": key.company_id, "user_id": key.user_id, "cutoff": cutoff}
    return (await session.execute(_IS_IDLE, params)).first() is not None
