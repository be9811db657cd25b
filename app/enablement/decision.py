"""The effective-enablement decision: is context memory active for a turn, and why (not).

Pure: takes the company flags, the space state and the user state, returns a `Decision`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum

FLAG_CONTEXT_MEMORY = "FEATURE_FLAG_ENABLE_CONTEXT_MEMORY_UN_22033"
FLAG_ALLOW_WITH_WEB_SEARCH = "ALLOW_CONTEXT_MEMORY_WITH_WEB_SEARCH_UN_22591"
KNOWN_FLAGS: tuple[str, ...] = (FLAG_CONTEXT_MEMORY, FLAG_ALLOW_WITH_WEB_SEARCH)

WEB_SEARCH_TOOLTIP = (
    "Context memory is unavailable while web search is enabled, "
    "to keep user data out of external search queries."
)


@dataclass(frozen=True)
class CompanyFlags:
    """The company's feature flags; a flag that was never set is off."""

    context_memory: bool = False
    allow_with_web_search: bool = False

    @classmethod
    def from_mapping(cls, flags: Mapping[str, bool]) -> CompanyFlags:
        """Build from `{flag name: on}`; missing flags are off, unknown names raise ValueError.

        Unknown names are refused rather than ignored so that a misspelt flag can never silently
        leave context memory off.
        """
        unknown = sorted(set(flags) - set(KNOWN_FLAGS))
        if unknown:
            raise ValueError(f"unknown feature flag(s): {', '.join(unknown)}")
        return cls(
            context_memory=flags.get(FLAG_CONTEXT_MEMORY, False),
            allow_with_web_search=flags.get(FLAG_ALLOW_WITH_WEB_SEARCH, False),
        )


@dataclass(frozen=True)
class SpaceState:
    """A space's saved settings; `context_memory=None` means the key is absent, i.e. enabled."""

    context_memory: bool | None = None
    web_search: bool = False


@dataclass(frozen=True)
class UserState:
    """A user's saved settings; `context_memory=None` means never saved, i.e. enabled."""

    context_memory: bool | None = None


class Level(StrEnum):
    """Who can change a condition."""

    OPERATOR = "operator"
    SPACE_ADMIN = "space_admin"
    SPACE_ADMIN_OR_OPERATOR = "space_admin/operator"
    END_USER = "end_user"


@dataclass(frozen=True)
class Condition:
    """One of the four conditions, with whether it holds and a sentence saying why."""

    key: str
    level: Level
    satisfied: bool
    reason: str


@dataclass(frozen=True)
class Decision:
    """Whether context memory is active, with every condition (always all four, in seed order)."""

    enabled: bool
    conditions: tuple[Condition, ...]

    @property
    def blocking(self) -> tuple[Condition, ...]:
        return tuple(c for c in self.conditions if not c.satisfied)

    def reason(self) -> str:
        """The first blocking condition's reason, or a sentence saying memory is active."""
        blocking = self.blocking
        if blocking:
            return blocking[0].reason
        return "Context memory is enabled: all four conditions hold."


def _company_flag(flags: CompanyFlags) -> Condition:
    if flags.context_memory:
        reason = f"The company feature flag {FLAG_CONTEXT_MEMORY} is on."
    else:
        reason = (
            f"The company feature flag {FLAG_CONTEXT_MEMORY} is off; an operator can turn it on."
        )
    return Condition("company_flag", Level.OPERATOR, flags.context_memory, reason)


def _space_setting(space: SpaceState | None) -> Condition:
    if space is None:
        satisfied = True
        reason = "The space settings were never saved, so context memory is enabled by default."
    elif space.context_memory is None:
        satisfied = True
        reason = "The space has no context memory setting, so it is enabled by default."
    elif space.context_memory:
        satisfied = True
        reason = "Context memory is enabled in the space settings."
    else:
        satisfied = False
        reason = "Context memory is disabled in the space settings; a space admin can enable it."
    return Condition("space_setting", Level.SPACE_ADMIN, satisfied, reason)


def _web_search(flags: CompanyFlags, space: SpaceState | None) -> Condition:
    web_search = space is not None and space.web_search
    if not web_search:
        satisfied = True
        reason = "Web search is off for the space."
    elif flags.allow_with_web_search:
        satisfied = True
        reason = (
            f"Web search is on for the space, and the company flag {FLAG_ALLOW_WITH_WEB_SEARCH} "
            "allows context memory alongside it."
        )
    else:
        satisfied = False
        reason = (
            "Web search is on for the space, which blocks context memory; a space admin can "
            f"turn web search off, or an operator can turn on {FLAG_ALLOW_WITH_WEB_SEARCH}."
        )
    return Condition("web_search", Level.SPACE_ADMIN_OR_OPERATOR, satisfied, reason)


def _user_setting(user: UserState | None) -> Condition:
    setting = None if user is None else user.context_memory
    if setting is None:
        satisfied = True
        reason = "The user never changed the context memory setting, so it is enabled by default."
    elif setting:
        satisfied = True
        reason = "The user has context memory turned on."
    else:
        satisfied = False
        reason = "The user has turned context memory off; only the user can turn it back on."
    return Condition("user_setting", Level.END_USER, satisfied, reason)


def effective_enablement(
    flags: CompanyFlags, space: SpaceState | None, user: UserState | None
) -> Decision:
    """Decide whether context memory is active for a turn in `space` for `user`.

    `space=None` / `user=None` mean never saved: the defaults apply (memory enabled, web search
    off). Each condition is evaluated on its own, so all four are always reported, in the seed's
    order (company flag, space setting, web search, user setting), even when an earlier one
    already blocks; memory is active only when all four are satisfied.
    """
    conditions = (
        _company_flag(flags),
        _space_setting(space),
        _web_search(flags, space),
        _user_setting(user),
    )
    return Decision(enabled=all(c.satisfied for c in conditions), conditions=conditions)


@dataclass(frozen=True)
class SwitchState:
    """How the space admin UI shows the space's context-memory switch."""

    visible: bool
    editable: bool
    tooltip: str | None


def context_memory_switch(flags: CompanyFlags, space: SpaceState | None) -> SwitchState:
    """The space's context-memory switch: hidden without the company flag, locked by web search.

    The switch's own value (the space's context_memory setting) does not change how it is shown.
    """
    if not flags.context_memory:
        return SwitchState(visible=False, editable=False, tooltip=None)
    if space is not None and space.web_search and not flags.allow_with_web_search:
        return SwitchState(visible=True, editable=False, tooltip=WEB_SEARCH_TOOLTIP)
    return SwitchState(visible=True, editable=True, tooltip=None)
