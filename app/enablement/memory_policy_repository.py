"""SQL of the company's memory policy: the read every profile write makes
(`read_memory_policy`), and the operator's locked read and save (flushes, never commits).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from types import MappingProxyType

from sqlalchemy import Row, String, bindparam, func, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.detectors import Category
from app.enablement.audit import Actor
from app.enablement.memory_policy import DEFAULT_POLICY, Action, MemoryPolicy
from app.enablement.models import CompanyMemoryPolicy


@dataclass(frozen=True)
class MemoryPolicyRecord:
    """A company's saved policy and who saved it last."""

    policy: MemoryPolicy
    updated_at: datetime
    updated_by_company_id: str
    updated_by: str


_COLUMNS = (
    CompanyMemoryPolicy.actions,
    CompanyMemoryPolicy.recent_topics_days,
    CompanyMemoryPolicy.inactive_memory_days,
    CompanyMemoryPolicy.updated_at,
    CompanyMemoryPolicy.updated_by_company_id,
    CompanyMemoryPolicy.updated_by,
)


def actions_json(policy: MemoryPolicy) -> dict[str, str]:
    """The stored form of the actions: every category, by its name."""
    return {category.value: policy.action(category).value for category in Category}


def _actions_of(stored: Mapping[str, object]) -> Mapping[Category, Action]:
    """The stored actions; a category or action this build does not know is skipped, so the
    category reads as its default (`MemoryPolicy.action`)."""
    categories = {category.value: category for category in Category}
    actions = {action.value: action for action in Action}
    return MappingProxyType(
        {
            categories[name]: actions[value]
            for name, value in stored.items()
            if name in categories and isinstance(value, str) and value in actions
        }
    )


def _record(row: Row[dict[str, str], int, int, datetime, str, str]) -> MemoryPolicyRecord:
    policy = MemoryPolicy(
        actions=_actions_of(row.actions),
        recent_topics_days=row.recent_topics_days,
        inactive_memory_days=row.inactive_memory_days,
    )
    return MemoryPolicyRecord(policy, row.updated_at, row.updated_by_company_id, row.updated_by)


async def read_memory_policy(session: AsyncSession, company_id: str) -> MemoryPolicy:
    """The company's memory policy: the saved one, else `DEFAULT_POLICY`.

    Read afresh by every write of a profile (no cache), so a change applies from the next
    write on.
    """
    record = await select_memory_policy(session, company_id)
    return DEFAULT_POLICY if record is None else record.policy


_SELECT_POLICY = select(*_COLUMNS).where(
    CompanyMemoryPolicy.company_id == bindparam("company_id", type_=String)
)
_SELECT_POLICY_FOR_UPDATE = _SELECT_POLICY.with_for_update()


async def select_memory_policy(
    session: AsyncSession, company_id: str, *, for_update: bool = False
) -> MemoryPolicyRecord | None:
    """The saved policy, or None when the company never saved one; `for_update` row-locks it."""
    statement = _SELECT_POLICY_FOR_UPDATE if for_update else _SELECT_POLICY
    row = (await session.execute(statement, {"company_id": company_id})).first()
    return None if row is None else _record(row)


async def upsert_memory_policy(
    session: AsyncSession, company_id: str, policy: MemoryPolicy, editor: Actor
) -> MemoryPolicyRecord:
    """Save the whole policy (every category), naming `editor` as its last editor."""
    values = insert(CompanyMemoryPolicy).values(
        company_id=company_id,
        actions=actions_json(policy),
        recent_topics_days=policy.recent_topics_days,
        inactive_memory_days=policy.inactive_memory_days,
        updated_by_company_id=editor.company_id,
        updated_by=editor.user_id,
        updated_at=func.now(),
    )
    # the time through EXCLUDED: Citus refuses a function in DO UPDATE SET
    statement = values.on_conflict_do_update(
        index_elements=[CompanyMemoryPolicy.company_id],
        set_={
            "actions": values.excluded.actions,
            "recent_topics_days": values.excluded.recent_topics_days,
            "inactive_memory_days": values.excluded.inactive_memory_days,
            "updated_by_company_id": values.excluded.updated_by_company_id,
            "updated_by": values.excluded.updated_by,
            "updated_at": values.excluded.updated_at,
        },
    ).returning(CompanyMemoryPolicy.updated_at)
    updated_at = (await session.execute(statement)).scalar_one()
    return MemoryPolicyRecord(policy, updated_at, editor.company_id, editor.user_id)
