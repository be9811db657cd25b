"""The user's context-memory switch (`/v1/me/settings`): turning it off permanently deletes the
memory — the profile with its versions, the folder `user-memory/<user_id>` and the pending jobs —
in the transaction that stores the setting. The setting itself and its audit trail belong to
`app.enablement`; the deletion reaches down into the packages that own what is deleted.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy.ext.asyncio import AsyncSession

from app.enablement import audit
from app.enablement import repository as settings
from app.folders import service as folders
from app.jobs.repository import delete_user_jobs
from app.kit.principal import Principal
from app.profiles import repository


@dataclass(frozen=True)
class MemoryDeletion:
    """What an opt-out deleted (counts only, never content)."""

    profile: bool
    versions: int
    jobs: int
    folder: bool

    @property
    def anything(self) -> bool:
        return self.profile or self.folder or self.versions > 0 or self.jobs > 0


@dataclass(frozen=True)
class UserSettingUpdate:
    context_memory: bool
    deleted: MemoryDeletion | None


async def lock_user_memory(session: AsyncSession, company_id: str, user_id: str) -> None:
    """Serialise writers of a user's memory with the user's opt-out, until the transaction ends.

    Opt-out takes this lock before it deletes. Anything that writes memory (consolidation, a
    user's edit) must take it in its write transaction *before* it reads the user's setting: it
    then either sees the opt-out and writes nothing, or commits first and the opt-out deletes
    what it wrote. Without it, a writer that checked the setting just before an opt-out could
    recreate memory.
    """
    await repository.lock_user_memory(session, company_id, user_id)


async def update_user_setting(
    session: AsyncSession, principal: Principal, context_memory: bool
) -> UserSettingUpdate:
    """Turn the caller's context memory on or off; off permanently deletes the memory.

    Off deletes, in this transaction, the profile with all its versions, the pending jobs and
    the folder `user-memory/<user_id>`, every time it is asked (off -> off finds nothing more
    and reports zeros). On only flips the setting: the next turn starts from an empty profile.
    """
    company_id, user_id = principal.company_id, principal.user_id
    if not context_memory:
        await lock_user_memory(session, company_id, user_id)
    current = await settings.lock_user_setting(session, company_id, user_id) is not False
    if current != context_memory:
        await settings.upsert_user_setting(session, company_id, user_id, context_memory)
        await audit.record_event(
            session,
            company_id,
            audit.AuditEntry(
                actor=audit.Actor.of(principal),
                action="user_settings.update",
                target_kind="user",
                target_id=user_id,
                old={"context_memory": current},
                new={"context_memory": context_memory},
            ),
        )
    if context_memory:
        return UserSettingUpdate(True, None)

    deleted = await delete_user_memory(session, company_id, user_id)
    if deleted.anything:
        await audit.record_event(
            session,
            company_id,
            audit.AuditEntry(
                actor=audit.Actor.of(principal),
                action="user_memory.deleted",
                target_kind="user",
                target_id=user_id,
                old=None,
                new={
                    "profile": deleted.profile,
                    "versions": deleted.versions,
                    "jobs": deleted.jobs,
                    "folder": deleted.folder,
                },
            ),
        )
    return UserSettingUpdate(False, deleted)


async def delete_user_memory(
    session: AsyncSession, company_id: str, user_id: str
) -> MemoryDeletion:
    """The profile, its versions, the folder and the pending jobs; the caller holds
    `lock_user_memory` (the opt-out, and the erasure, which deletes the finished jobs too)."""
    # Lock the profile first: an in-flight version write commits before we count and delete.
    profile = await repository.lock_memory_file(session, company_id, user_id)
    versions = await repository.delete_memory_versions(session, company_id, user_id)
    profile = await repository.delete_memory_file(session, company_id, user_id) or profile
    folder = await folders.delete_user_folder(session, company_id, user_id)
    jobs = await delete_user_jobs(session, company_id, user_id)
    return MemoryDeletion(profile=profile, versions=versions, jobs=jobs, folder=folder)
