"""The erasure of one user (the twin of the export): everything the service holds about the
caller, deleted in the request's one transaction.

Deleted: the profile with its versions, the memory.md row and the folder `user-memory/<user_id>`
with its ACL; every chat (turns and messages); every job, finished ones included; every
idempotency record; the stored setting; the audit events about the user; the record of what
the memory policy kept out of the user's memory (with memory.md); the quota check's marks of
the user (counted from their history, so not reported). Anonymised (the companies'
records, not the user's): the audit events the user caused on company flags, spaces and memory
policies (and on the platform log: companies registered, offboardings requested), and
`updated_by` of the flags, spaces, policies and rate limits the user changed last, now naming
`audit.ERASED_ACTOR` (the platform events count with the audit events). "The user" there is
the actor (the caller's company, the caller's id), both matching, in whichever company's
records (an operator changes other companies' flags).
Kept: one `audit.USER_ERASED` event naming the user, with the counts below and nothing else
(its actor is whoever asked: the user, or an operator of the company, `erase_company_user`).

It first takes the user's history lock, which every turn-save holds shared while it writes: a
turn written before is seen, and deleted whole (messages, turn, job, idempotency record); a turn
written after waits for the erasure to commit, finds the memory folder gone and is planned again
from nothing (`app/turns/save.py`), so no job outlives its turn and no later turn is lost. Then
the user-memory lock, as the opt-out does: a consolidation that read the memory before the
erasure either commits first (and is deleted here) or writes after it and is refused, because
the folder it needs is gone. Erasure is not a ban: a later turn of the same user starts from
nothing, with the setting at its default.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Final

from sqlalchemy.ext.asyncio import AsyncSession

from app.companies import repository as companies
from app.conversations.repository import delete_user_history, lock_user_history
from app.enablement import audit
from app.enablement.memory_policy_repository import MEMORY_POLICIES
from app.enablement.repository import FEATURE_FLAGS, SPACE_SETTINGS, delete_user_setting
from app.jobs.repository import delete_every_user_job
from app.kit.audited_setting import SettingTable
from app.kit.citus import across_companies
from app.kit.principal import Principal
from app.profiles.switch import delete_user_memory, lock_user_memory
from app.quotas.repository import delete_user_marks
from app.rate_limits.repository import RATE_LIMIT_OVERRIDES
from app.turns.repository import delete_user_idempotency_keys
from app.usage.repository import MODEL_BUDGETS

AUDITED_SETTINGS: Final[tuple[SettingTable[Any], ...]] = (
    FEATURE_FLAGS,
    SPACE_SETTINGS,
    MEMORY_POLICIES,
    RATE_LIMIT_OVERRIDES,
    MODEL_BUDGETS,  # names no editor: its changes are anonymised in the audit log only
)
"""Every audited setting's table: an erasure anonymises the rows the user changed last."""


@dataclass(frozen=True)
class Deleted:
    profile: bool
    versions: int
    folder: bool
    chats: int
    turns: int
    messages: int
    jobs: int
    idempotency_keys: int
    settings: bool
    audit_events: int


@dataclass(frozen=True)
class Anonymised:
    audit_events: int
    settings: int  # company flags, space settings and memory policies the user changed last


@dataclass(frozen=True)
class Erasure:
    """What an erasure did (counts only, never content); all zero when there was nothing."""

    deleted: Deleted
    anonymised: Anonymised

    @property
    def anything(self) -> bool:
        return any(
            value for part in (self.deleted, self.anonymised) for value in asdict(part).values()
        )

    def counts(self) -> dict[str, dict[str, int | bool]]:
        """The audit event's payload: exactly these fields, all counts or flags."""
        return {"deleted": asdict(self.deleted), "anonymised": asdict(self.anonymised)}


async def erase_user(session: AsyncSession, principal: Principal) -> Erasure:
    """Erase the caller (see the module docstring); a second call finds nothing and reports
    zeros, and records no second event."""
    return await erase_company_user(session, principal, principal.company_id, principal.user_id)


async def erase_company_user(
    session: AsyncSession, actor: Principal, company_id: str, user_id: str
) -> Erasure:
    """Erase `user_id` of `company_id`, as `erase_user` erases the caller, on `actor`'s request
    (the caller, or an operator of the company): the one `USER_ERASED` event names `actor`."""
    await lock_user_history(session, company_id, user_id)
    await lock_user_memory(session, company_id, user_id)
    memory = await delete_user_memory(session, company_id, user_id)
    jobs = memory.jobs + await delete_every_user_job(session, company_id, user_id)
    history = await delete_user_history(session, company_id, user_id)
    keys = await delete_user_idempotency_keys(session, company_id, user_id)
    await delete_user_marks(session, company_id, user_id)  # derived from the history: no count
    setting = await delete_user_setting(session, company_id, user_id)
    # the user's edits as an operator are in other companies, found by the actor: these
    # statements reach every company's shard on a distributed cluster (erasures are rare)
    async with across_companies(session):
        events = await audit.erase_user_events(session, company_id, user_id)
        edits = 0
        for table in AUDITED_SETTINGS:
            edits += await table.anonymise_editor(
                session, audit.Actor(company_id, user_id), audit.ERASED_ACTOR
            )
    # the platform log is one reference table: the user's registrations and offboardings
    platform_events = await companies.anonymise_platform_actor(
        session, company_id, user_id, audit.ERASED_ACTOR
    )
    erasure = Erasure(
        Deleted(
            profile=memory.profile,
            versions=memory.versions,
            folder=memory.folder,
            chats=history.chats,
            turns=history.turns,
            messages=history.messages,
            jobs=jobs,
            idempotency_keys=keys,
            settings=setting,
            audit_events=events.deleted,
        ),
        Anonymised(audit_events=events.anonymised + platform_events, settings=edits),
    )
    if erasure.anything:
        await audit.record_event(
            session,
            company_id,
            audit.AuditEntry(
                actor=audit.Actor.of(actor),
                action=audit.USER_ERASED,
                target_kind="user",
                target_id=user_id,
                old=None,
                new=erasure.counts(),
            ),
        )
    return erasure
