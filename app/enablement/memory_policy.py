"""A company's memory policy as a value: what happens to each category of content a bullet may
hold (`drop` the bullet, `redact` the value, `allow` it), and how long memories live.

Pure: the defaults below hold for every company that stored none (SPEC §13).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType
from typing import Final

from app.detectors import Category


class Action(StrEnum):
    DROP = "drop"
    REDACT = "redact"
    ALLOW = "allow"


DEFAULT_ACTIONS: Final[Mapping[Category, Action]] = MappingProxyType(
    {
        Category.SECRETS: Action.DROP,
        Category.PAYMENT_CARDS: Action.DROP,
        Category.BANK_ACCOUNTS: Action.DROP,
        Category.NATIONAL_IDS: Action.DROP,
        Category.EMAIL_ADDRESSES: Action.REDACT,
        Category.PHONE_NUMBERS: Action.REDACT,
        Category.INSTRUCTIONS: Action.DROP,
    }
)
DEFAULT_RECENT_TOPICS_DAYS: Final = 90
DEFAULT_INACTIVE_MEMORY_DAYS: Final = 0  # never


@dataclass(frozen=True)
class MemoryPolicy:
    """What the company allows in its users' memories; every category has an action."""

    actions: Mapping[Category, Action] = field(default_factory=lambda: DEFAULT_ACTIONS)
    recent_topics_days: int = DEFAULT_RECENT_TOPICS_DAYS  # 0 keeps Recent Topics forever
    inactive_memory_days: int = DEFAULT_INACTIVE_MEMORY_DAYS  # 0 never erases idle memories

    def action(self, category: Category) -> Action:
        return self.actions.get(category, DEFAULT_ACTIONS[category])


DEFAULT_POLICY: Final = MemoryPolicy()
