"""SQL of the company's memory policy: its table, an audited setting
(`app.kit.audited_setting`), and the read every profile write makes (`read_memory_policy`).
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from sqlalchemy import RowMapping
from sqlalchemy.ext.asyncio import AsyncSession

from app.detectors import Category
from app.enablement.memory_policy import DEFAULT_POLICY, Action, MemoryPolicy
from app.enablement.models import CompanyMemoryPolicy
from app.kit.audited_setting import SettingTable


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


def policy_columns(policy: MemoryPolicy) -> dict[str, object]:
    """The policy as stored, and as the audit trail records it (changed fields only)."""
    return {
        "actions": actions_json(policy),
        "recent_topics_days": policy.recent_topics_days,
        "inactive_memory_days": policy.inactive_memory_days,
    }


def _policy_of(row: RowMapping) -> MemoryPolicy:
    return MemoryPolicy(
        actions=_actions_of(row["actions"]),
        recent_topics_days=row["recent_topics_days"],
        inactive_memory_days=row["inactive_memory_days"],
    )


MEMORY_POLICIES: Final = SettingTable[MemoryPolicy](
    CompanyMemoryPolicy,
    columns=("actions", "recent_topics_days", "inactive_memory_days"),
    to_row=policy_columns,
    of_row=_policy_of,
)
"""A company's memory policy, one row per company that saved one."""


async def read_memory_policy(session: AsyncSession, company_id: str) -> MemoryPolicy:
    """The company's memory policy: the saved one, else `DEFAULT_POLICY`.

    Read afresh by every write of a profile (no cache), so a change applies from the next
    write on.
    """
    stored = await MEMORY_POLICIES.select(session, company_id)
    return DEFAULT_POLICY if stored is None else stored.value
