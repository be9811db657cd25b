"""The settings rules: company flags, the company's memory policy, space settings, the user's
stored setting, the audit trail of every change, and `load_enablement`, the hot-path read every
turn calls.

Turning a user's memory off deletes their memory, which lives above this package: that switch
is `app.profiles.switch`, which writes the setting through this package's repository.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Final

from sqlalchemy.ext.asyncio import AsyncSession

from app.enablement import audit, repository
from app.enablement.audit import AuditRecord
from app.enablement.decision import (
    FLAG_ALLOW_WITH_WEB_SEARCH,
    FLAG_CONTEXT_MEMORY,
    KNOWN_FLAGS,
    WEB_SEARCH_TOOLTIP,
    CompanyFlags,
    Decision,
    context_memory_switch,
    effective_enablement,
)
from app.enablement.errors import SpaceSettingsChanged
from app.enablement.memory_policy import DEFAULT_POLICY, MemoryPolicy
from app.enablement.memory_policy_repository import MEMORY_POLICIES, policy_columns
from app.enablement.repository import SpaceRecord, UserMemoryConfig
from app.enablement.schemas import SpacePatch
from app.enablement.views import MemoryPolicyView, SpaceView
from app.folders import service as folders
from app.kit.audited_setting import Actor, AuditedSetting, Stored
from app.kit.errors import Unprocessable
from app.kit.pagination import Page, PageRequest, page_of
from app.kit.principal import Principal

SPACE_ENABLED_REASON = (
    "Context memory is enabled for this space; each user can still turn it off for themselves."
)


# --- the hot path -------------------------------------------------------------------------------


@dataclass(frozen=True)
class EnablementContext:
    """Whether memory is active for (company, space, user), why, and how the space consolidates."""

    decision: Decision
    user_memory: UserMemoryConfig

    @property
    def enabled(self) -> bool:
        return self.decision.enabled


async def load_enablement(
    session: AsyncSession, company_id: str, space_id: str, user_id: str
) -> EnablementContext:
    """The decision for a turn and the space's user-memory config, read in ONE SQL statement."""
    inputs = await repository.select_enablement_inputs(session, company_id, space_id, user_id)
    decision = effective_enablement(inputs.flags, inputs.space.state, inputs.user)
    return EnablementContext(decision, inputs.space.user_memory)


# --- company feature flags ----------------------------------------------------------------------


@dataclass(frozen=True)
class FeatureFlag:
    flag: str
    enabled: bool = False
    updated_at: datetime | None = None
    updated_by_company_id: str | None = None
    updated_by: str | None = None

    @classmethod
    def of(cls, flag: str, stored: Stored[bool] | None) -> FeatureFlag:
        if stored is None:
            return cls(flag)
        return cls(
            flag,
            stored.value,
            stored.updated_at,
            stored.updated_by_company_id,
            stored.updated_by,
        )


FEATURE_FLAG: Final = AuditedSetting(
    repository.FEATURE_FLAGS,
    audit.AUDIT_LOG,
    action="feature_flag.set",
    target_kind="feature_flag",
    default=False,
    audited=lambda enabled: {"enabled": enabled},
)


async def list_feature_flags(session: AsyncSession, company_id: str) -> list[FeatureFlag]:
    """Every known flag of the company, in a stable order; a flag never set is off."""
    stored = await repository.select_flags(session, company_id)
    return [FeatureFlag.of(name, stored.get(name)) for name in KNOWN_FLAGS]


async def set_feature_flag(
    session: AsyncSession, actor: Principal, company_id: str, flag: str, enabled: bool
) -> FeatureFlag:
    """Turn a known flag on or off for `company_id`; an unchanged value writes nothing."""
    if flag not in KNOWN_FLAGS:
        raise Unprocessable.field(
            "path.flag", f"Unknown feature flag; the known flags are {' and '.join(KNOWN_FLAGS)}."
        )
    saved = await FEATURE_FLAG.save(
        session, Actor.of(actor), company_id, flag, change=lambda _: enabled
    )
    return FeatureFlag.of(flag, saved.stored)


async def _company_flags(session: AsyncSession, company_id: str) -> CompanyFlags:
    stored = await repository.select_flags(session, company_id)
    return CompanyFlags(
        context_memory=FLAG_CONTEXT_MEMORY in stored and stored[FLAG_CONTEXT_MEMORY].value,
        allow_with_web_search=FLAG_ALLOW_WITH_WEB_SEARCH in stored
        and stored[FLAG_ALLOW_WITH_WEB_SEARCH].value,
    )


# --- the company's memory policy ----------------------------------------------------------------


MEMORY_POLICY: Final = AuditedSetting(
    MEMORY_POLICIES,
    audit.AUDIT_LOG,
    action="memory_policy.set",
    target_kind="memory_policy",
    default=DEFAULT_POLICY,
    audited=policy_columns,
)


async def read_company_memory_policy(session: AsyncSession, company_id: str) -> MemoryPolicyView:
    """The company's saved memory policy, or the defaults (flagged `default`)."""
    return MemoryPolicyView.of(company_id, await MEMORY_POLICIES.select(session, company_id))


async def set_company_memory_policy(
    session: AsyncSession, actor: Principal, company_id: str, policy: MemoryPolicy
) -> MemoryPolicyView:
    """Replace the company's memory policy with `policy` (every field), audited with the
    changed fields old -> new, under a row lock. A policy equal to the one in force (the
    defaults, for a company that saved none) writes nothing, as an unchanged flag does.

    Applies from the next write of any profile of the company: writes read it afresh.
    """
    saved = await MEMORY_POLICY.save(session, Actor.of(actor), company_id, change=lambda _: policy)
    return MemoryPolicyView.of(company_id, saved.stored)


# --- space settings -----------------------------------------------------------------------------


def _space_view(space_id: str, flags: CompanyFlags, space: SpaceRecord) -> SpaceView:
    full = effective_enablement(flags, space.state, None)
    conditions = tuple(c for c in full.conditions if c.key != "user_setting")
    decision = Decision(all(c.satisfied for c in conditions), conditions)
    reason = decision.blocking[0].reason if decision.blocking else SPACE_ENABLED_REASON
    return SpaceView(space_id, space, context_memory_switch(flags, space.state), decision, reason)


def _audit_fields(space: SpaceRecord) -> dict[str, object]:
    memory = space.user_memory
    return {
        "context_memory": space.context_memory,
        "web_search": space.web_search,
        "user_memory": {
            "use_orchestrator_language_model": memory.use_orchestrator_language_model,
            "language_model": memory.language_model,
            "max_tokens": memory.max_tokens,
        },
    }


def _apply(space: SpaceRecord, patch: SpacePatch) -> SpaceRecord:
    memory = space.user_memory
    if patch.user_memory is not None:
        given = patch.user_memory
        memory = UserMemoryConfig(
            use_orchestrator_language_model=memory.use_orchestrator_language_model
            if given.use_orchestrator_language_model is None
            else given.use_orchestrator_language_model,
            language_model=memory.language_model
            if given.language_model is None
            else given.language_model,
            max_tokens=memory.max_tokens if given.max_tokens is None else given.max_tokens,
        )
    return replace(
        space,
        context_memory=patch.context_memory
        if "context_memory" in patch.model_fields_set
        else space.context_memory,
        web_search=space.web_search if patch.web_search is None else patch.web_search,
        user_memory=memory,
    )


def _refuse_enabling_behind_web_search(
    flags: CompanyFlags, before: SpaceRecord, after: SpaceRecord
) -> None:
    """The locked switch, enforced: context memory cannot be switched on (or reset to its
    enabled default) while web search blocks it. Switching it off, and turning web search on
    while memory is on, stay allowed: both only make the space more private.
    """
    blocked = after.web_search and not flags.allow_with_web_search
    if (
        blocked
        and after.context_memory is not False
        and after.context_memory != before.context_memory
    ):
        raise Unprocessable.field(
            "body.context_memory",
            f"{WEB_SEARCH_TOOLTIP} Turn web search off (in the same request is fine) before "
            f"enabling context memory, or ask an operator to turn on {FLAG_ALLOW_WITH_WEB_SEARCH}.",
        )


SPACE_SETTING: Final = AuditedSetting(
    repository.SPACE_SETTINGS,
    audit.AUDIT_LOG,
    action="space_settings.update",
    target_kind="space",
    default=SpaceRecord(),
    audited=_audit_fields,
    lost_race=SpaceSettingsChanged,
)


def _space_of(stored: Stored[SpaceRecord] | None) -> SpaceRecord:
    """The space as saved last, with who saved it; its defaults when never saved."""
    if stored is None:
        return SpaceRecord()
    return replace(
        stored.value,
        saved=True,
        updated_at=stored.updated_at,
        updated_by_company_id=stored.updated_by_company_id,
        updated_by=stored.updated_by,
    )


async def read_space(session: AsyncSession, company_id: str, space_id: str) -> SpaceView:
    flags = await _company_flags(session, company_id)
    stored = await repository.SPACE_SETTINGS.select(session, company_id, space_id)
    return _space_view(space_id, flags, _space_of(stored))


async def list_spaces(session: AsyncSession, company_id: str, page: PageRequest) -> Page[SpaceView]:
    """The company's saved spaces by id, each as `read_space` shows it (a space never saved is
    at its defaults and not listed), cursor-paginated by space id."""
    flags = await _company_flags(session, company_id)
    saved = await repository.select_spaces(
        session, company_id, after=page.text("space_id", max_length=128), limit=page.limit + 1
    )
    views = [_space_view(space_id, flags, space) for space_id, space in saved]
    return page_of(views, page.limit, lambda view: {"space_id": view.space_id})


async def update_space(
    session: AsyncSession,
    actor: Principal,
    space_id: str,
    patch: SpacePatch,
    *,
    company_id: str | None = None,
) -> SpaceView:
    """Apply a partial update to a space of `company_id` (by default the actor's company: a
    space admin's), audited, under a row lock.

    When memory is then effectively enabled for the space (company and space conditions), the
    company's `user-memory` root folder is ensured, also when the patch changed nothing.
    """
    company_id = actor.company_id if company_id is None else company_id
    flags = await _company_flags(session, company_id)

    def change(before: SpaceRecord) -> SpaceRecord:
        after = _apply(before, patch)
        _refuse_enabling_behind_web_search(flags, before, after)
        return after

    result = await SPACE_SETTING.save(session, Actor.of(actor), company_id, space_id, change=change)
    saved = _space_of(result.stored)
    if effective_enablement(flags, saved.state, None).enabled:
        await folders.ensure_root_folder(session, company_id)
    return _space_view(space_id, flags, saved)


# --- user settings ------------------------------------------------------------------------------


async def read_user_setting(session: AsyncSession, principal: Principal) -> bool:
    """The caller's context memory setting; never saved means on."""
    stored = await repository.select_user_setting(session, principal.company_id, principal.user_id)
    return stored is not False


# --- audit log ----------------------------------------------------------------------------------


async def list_audit_events(
    session: AsyncSession, company_id: str, page: PageRequest
) -> Page[AuditRecord]:
    """The company's audit events, newest first, cursor-paginated by id."""
    records = await audit.select_events(
        session, company_id, before_id=page.integer("id"), limit=page.limit + 1
    )
    return page_of(records, page.limit, lambda record: {"id": record.id})
