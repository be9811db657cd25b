"""The record of what the company's memory policy kept out of a user's memory: written with each
profile write that dropped a bullet or redacted a value, read back for the user (a page of
them, and all of them in the export), cleared with the profile.

Never the value, nor the bullet: the category, the detector's kind, the action, the section and
the write it happened in. SQL here flushes, never commits: the caller owns the transaction.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Select, delete, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from app.kit.pagination import Page, PageRequest, page_of
from app.profiles.models import MemoryPolicyAction
from app.profiles.policy import PolicyAction
from app.profiles.versions import VersionSource


@dataclass(frozen=True)
class PolicyActionRecord:
    """One recorded action, as the user sees it (`version` None: the write stored nothing)."""

    id: int
    occurred_at: datetime
    version: int | None
    reason: str
    category: str
    kind: str
    action: str
    section: str
    source_turn_ids: list[str]
    job_id: uuid.UUID | None


_COLUMNS = tuple(getattr(MemoryPolicyAction, field.name) for field in fields(PolicyActionRecord))


def _owned(company_id: str, user_id: str) -> tuple[ColumnElement[bool], ...]:
    return (MemoryPolicyAction.company_id == company_id, MemoryPolicyAction.user_id == user_id)


@dataclass(frozen=True)
class PolicyWrite:
    """The write the actions were taken at: whose memory, the version written (None: the
    write stored nothing) and its provenance (reason; for a consolidation, turns and job)."""

    company_id: str
    user_id: str
    version: int | None
    source: VersionSource


async def record_policy_actions(
    session: AsyncSession, write: PolicyWrite, actions: Sequence[PolicyAction]
) -> None:
    """Append `actions`, taken at `write`."""
    if not actions:
        return
    await session.execute(
        insert(MemoryPolicyAction),
        [
            {
                "company_id": write.company_id,
                "user_id": write.user_id,
                "version": write.version,
                "reason": write.source.reason,
                "category": action.category.value,
                "kind": action.kind,
                "action": action.action.value,
                "section": action.section.value,
                "source_turn_ids": list(write.source.source_turn_ids),
                "job_id": write.source.job_id,
            }
            for action in actions
        ],
    )


async def list_policy_actions(
    session: AsyncSession, company_id: str, user_id: str, page: PageRequest
) -> Page[PolicyActionRecord]:
    """The user's recorded actions, newest first, cursor on the id."""
    before = page.integer("id")
    statement = select(*_COLUMNS).where(*_owned(company_id, user_id))
    if before is not None:
        statement = statement.where(MemoryPolicyAction.id < before)
    statement = statement.order_by(MemoryPolicyAction.id.desc()).limit(page.limit + 1)
    records = [PolicyActionRecord(*row) for row in (await session.execute(statement)).all()]
    return page_of(records, page.limit, lambda record: {"id": record.id})


def every_policy_action(company_id: str, user_id: str) -> Select[Any]:
    """Every recorded action of the user, oldest first, as `PolicyActionRecord` columns (the
    export streams it)."""
    return select(*_COLUMNS).where(*_owned(company_id, user_id)).order_by(MemoryPolicyAction.id)


async def delete_policy_actions(session: AsyncSession, company_id: str, user_id: str) -> int:
    """Clear the record with the profile; the number of actions deleted. (An opt-out and an
    erasure delete it with memory.md, by the foreign key's cascade.)"""
    statement = (
        delete(MemoryPolicyAction)
        .where(*_owned(company_id, user_id))
        .returning(MemoryPolicyAction.id)
        .execution_options(synchronize_session=False)
    )
    return len((await session.execute(statement)).all())
