"""What the service answers about a company's memory policy and a space's settings: plain
values, which the service builds and the schemas render (neither imports the other's module
for them)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from app.enablement.decision import Decision, SwitchState
from app.enablement.memory_policy import DEFAULT_POLICY, MemoryPolicy
from app.enablement.repository import SpaceRecord
from app.kit.audited_setting import Stored


@dataclass(frozen=True)
class MemoryPolicyView:
    """A company's memory policy; `default` when it never saved one (then nobody edited it)."""

    company_id: str
    policy: MemoryPolicy
    default: bool = True
    updated_at: datetime | None = None
    updated_by_company_id: str | None = None
    updated_by: str | None = None

    @classmethod
    def of(cls, company_id: str, stored: Stored[MemoryPolicy] | None) -> MemoryPolicyView:
        if stored is None:
            return cls(company_id, DEFAULT_POLICY)
        return cls(
            company_id,
            stored.value,
            default=False,
            updated_at=stored.updated_at,
            updated_by_company_id=stored.updated_by_company_id,
            updated_by=stored.updated_by,
        )


@dataclass(frozen=True)
class SpaceView:
    """A space's settings (defaults when never saved), its switch and its space-level decision."""

    space_id: str
    settings: SpaceRecord
    switch: SwitchState
    decision: Decision
    decision_reason: str
