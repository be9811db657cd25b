"""SQL of the quotas: the marks as a fragment of turn-save's settings statement, the periodic
check's counts and mark updates, and the erasure of a user's marks. Flushes, never commits
(but `mark_users` and the counts, given an engine, run transactions of their own)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from app.conversations.repository import lock_user_history
from app.kit.citus import across_companies
from app.quotas.rule import Quota, StoredUsage

# --- the marks as columns of turn-save's one settings statement (binds :company_id, :user_id) ---

MARK_COLUMNS: Final = f"""
    (SELECT qu.used FROM user_quota_marks qu
     WHERE qu.company_id = :company_id AND qu.user_id = :user_id
       AND qu.quota = '{Quota.USER_HISTORY_MESSAGES}') AS quota_history_messages,
    (SELECT qc.used FROM company_quota_marks qc
     WHERE qc.company_id = :company_id
       AND qc.quota = '{Quota.COMPANY_STORAGE_BYTES}') AS quota_storage_bytes"""  # noqa: S608
"""Two primary-key lookups: what the last check counted where the caller was over a quota."""


def under_marks_sql(alias: str) -> str:
    """`stored_quota_reached(...) is None` (`app.quotas.rule`) in SQL, over the `MARK_COLUMNS`
    of the row `alias` (a constant of the composing statement, never user input), with the
    limits in force bound by `marks_params`: each mark unknown, or below its limit, or no
    limit."""
    a = alias
    history = "CAST(:quota_history_limit AS bigint)"
    storage = "CAST(:quota_storage_limit AS bigint)"
    return f"""({history} = 0 OR {a}.quota_history_messages IS NULL
         OR {a}.quota_history_messages < {history})
        AND ({storage} = 0 OR {a}.quota_storage_bytes IS NULL
         OR {a}.quota_storage_bytes < {storage})"""


def marks_params(user_history_messages: int, company_storage_bytes: int) -> dict[str, object]:
    """The limits `under_marks_sql` compares the marks with (0: none)."""
    return {
        "quota_history_limit": user_history_messages,
        "quota_storage_limit": company_storage_bytes,
    }


def stored_usage_of(row: Mapping[str, Any]) -> StoredUsage:
    """The `MARK_COLUMNS` of a row."""
    return StoredUsage(row["quota_history_messages"], row["quota_storage_bytes"])


# --- the periodic check --------------------------------------------------------------------------


@dataclass(frozen=True)
class UserUsage:
    company_id: str
    user_id: str
    used: int


@dataclass(frozen=True)
class CompanyUsage:
    company_id: str
    used: int


_HISTORY_OVER = text("""
SELECT company_id, user_id, count(*) AS used FROM chat_messages
GROUP BY company_id, user_id
HAVING count(*) >= :quota_limit
""")

# Bytes of the stored text: every chat message's content and every kept version's content.
_STORAGE_OVER = text("""
SELECT company_id, sum(bytes)::bigint AS used FROM (
    SELECT company_id, sum(octet_length(content)) AS bytes FROM chat_messages GROUP BY company_id
    UNION ALL
    SELECT company_id, sum(octet_length(content)) FROM memory_versions GROUP BY company_id
) stored
GROUP BY company_id
HAVING sum(bytes) >= :quota_limit
""")


async def users_over_history(conn: AsyncConnection, quota_limit: int) -> list[UserUsage]:
    """Every user storing at least `quota_limit` chat messages, with the count."""
    rows = await conn.execute(_HISTORY_OVER, {"quota_limit": quota_limit})
    return [UserUsage(r.company_id, r.user_id, int(r.used)) for r in rows]


async def companies_over_storage(conn: AsyncConnection, quota_limit: int) -> list[CompanyUsage]:
    """Every company storing at least `quota_limit` bytes of messages and versions."""
    rows = await conn.execute(_STORAGE_OVER, {"quota_limit": quota_limit})
    return [CompanyUsage(r.company_id, int(r.used)) for r in rows]


_UNMARK_USERS = text("""
DELETE FROM user_quota_marks m
WHERE m.quota = :quota
  AND NOT EXISTS (
      SELECT 1 FROM unnest(CAST(:company_ids AS varchar[]), CAST(:user_ids AS varchar[]))
          AS o(company_id, user_id)
      WHERE o.company_id = m.company_id AND o.user_id = m.user_id
  )
""")

# Only while the user still has history: an erasure that committed meanwhile leaves no mark.
_MARK_USER = text("""
INSERT INTO user_quota_marks (company_id, user_id, quota, used, quota_limit, checked_at)
SELECT CAST(:company_id AS varchar), CAST(:user_id AS varchar), :quota, :used, :quota_limit,
       now()
WHERE EXISTS (
    SELECT 1 FROM chat_messages
    WHERE company_id = CAST(:company_id AS varchar) AND user_id = CAST(:user_id AS varchar)
)
ON CONFLICT (company_id, user_id, quota) DO UPDATE
    SET used = EXCLUDED.used, quota_limit = EXCLUDED.quota_limit, checked_at = EXCLUDED.checked_at
""")


async def mark_users(
    engine: AsyncEngine, quota: Quota, quota_limit: int, over: Sequence[UserUsage]
) -> int:
    """Make the marks of `quota` exactly `over`: the others deleted in one transaction, then
    each user of `over` marked in a short transaction of its own; returns the rows written.

    Each mark is written holding the user's history lock shared and only while the user still
    has history, in a statement that starts after the lock is held: an erasure of the user
    (which holds that lock exclusively while it deletes the user's marks) either committed
    before, and the user has no history left to mark, or waits for the mark and deletes it.
    """
    params = {
        "quota": quota.value,
        "company_ids": [usage.company_id for usage in over],
        "user_ids": [usage.user_id for usage in over],
    }
    # replaces the set of marks of every company
    async with engine.begin() as conn, across_companies(conn):
        written = int((await conn.execute(_UNMARK_USERS, params)).rowcount)
    for usage in over:
        async with engine.begin() as conn:
            await lock_user_history(conn, usage.company_id, usage.user_id, shared=True)
            mark = {
                "company_id": usage.company_id,
                "user_id": usage.user_id,
                "quota": quota.value,
                "used": usage.used,
                "quota_limit": quota_limit,
            }
            written += int((await conn.execute(_MARK_USER, mark)).rowcount)
    return written


_UNMARK_COMPANIES = text("""
DELETE FROM company_quota_marks
WHERE quota = :quota AND NOT (company_id = ANY(CAST(:company_ids AS varchar[])))
""")

_MARK_COMPANIES = text("""
INSERT INTO company_quota_marks (company_id, quota, used, quota_limit, checked_at)
SELECT o.company_id, :quota, o.used, :quota_limit, now()
FROM unnest(CAST(:company_ids AS varchar[]), CAST(:used AS bigint[])) AS o(company_id, used)
ON CONFLICT (company_id, quota) DO UPDATE
    SET used = EXCLUDED.used, quota_limit = EXCLUDED.quota_limit, checked_at = EXCLUDED.checked_at
""")


async def mark_companies(
    engine: AsyncEngine, quota: Quota, quota_limit: int, over: Sequence[CompanyUsage]
) -> int:
    """Make the marks of `quota` exactly `over`, in one transaction; returns the rows written."""
    params = {
        "quota": quota.value,
        "quota_limit": quota_limit,
        "company_ids": [usage.company_id for usage in over],
        "used": [usage.used for usage in over],
    }
    # replaces the set of marks of every company, one row each
    async with engine.begin() as conn, across_companies(conn):
        written = int((await conn.execute(_UNMARK_COMPANIES, params)).rowcount)
        if over:
            written += int((await conn.execute(_MARK_COMPANIES, params)).rowcount)
    return written


# --- erasure -------------------------------------------------------------------------------------

_DELETE_USER_MARKS = text(
    "DELETE FROM user_quota_marks WHERE company_id = :company_id AND user_id = :user_id"
)


async def delete_user_marks(session: AsyncSession, company_id: str, user_id: str) -> int:
    """Erasure: delete every quota mark of the user; returns how many."""
    params = {"company_id": company_id, "user_id": user_id}
    result = await session.execute(_DELETE_USER_MARKS, params)
    return int(result.rowcount)  # type: ignore[attr-defined]
