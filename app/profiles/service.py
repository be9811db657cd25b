"""The user's memory profile as a versioned file: read, edit, clear, history, restore, and the
two calls the consolidation worker makes (`load_profile`, `save_consolidation`).

Every read and write goes through `folders.service.authorize_memory_access` on the owner's
folder first; every write passes the company's memory policy and is a compare-and-set on the
head version, both in `gate.write_screened`.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import CTE, ColumnElement
from sqlalchemy.ext.asyncio import AsyncSession

from app.folders import repository as folder_repository
from app.folders import service as folders
from app.folders.acl import Permission, user_folder_path
from app.folders.errors import NoMemory
from app.kit.pagination import Page, PageRequest
from app.kit.principal import Principal
from app.profiles import repository
from app.profiles.document import (
    Profile,
    diff_operations,
    empty_profile,
    parse,
)
from app.profiles.errors import (
    MemoryOptedOut,
    MemoryTurnedOff,
    ProfileVersionMismatch,
    VersionConflict,
    VersionNotFound,
)
from app.profiles.gate import ProfileWrite, stored_profile, write_screened
from app.profiles.policy import PolicyAction
from app.profiles.policy_actions import (
    PolicyActionRecord,
    delete_policy_actions,
    list_policy_actions,
)
from app.profiles.switch import lock_user_memory
from app.profiles.versions import (
    EntityTags,
    ExpectedHead,
    HeadState,
    VersionInfo,
    VersionPolicy,
    VersionReason,
    VersionRow,
    VersionSource,
    WriteConditions,
    check_user_profile_size,
    check_write_preconditions,
    parse_user_profile,
    same_sections,
    stamp,
    unified_diff,
)


@dataclass(frozen=True)
class WriteOutcome:
    """The head after a write request.

    `written`: a new version was stored (False when the request changed nothing); `created`:
    the request created the profile (there was no current version before); `policy_actions`:
    what the company's memory policy dropped or redacted (recorded with the version).
    """

    row: VersionRow
    written: bool
    created: bool = False
    policy_actions: tuple[PolicyAction, ...] = ()


@dataclass(frozen=True)
class VersionDiff:
    from_version: int
    to_version: int
    diff: str


def _owner(company_id: str, user_id: str) -> Principal:
    """The owner acting through the worker: the same access check as over HTTP, no roles."""
    return Principal(user_id=user_id, company_id=company_id, roles=frozenset())


# --- the user's API ------------------------------------------------------------------------------


async def read_memory(session: AsyncSession, principal: Principal) -> VersionRow:
    """The caller's current version; 404 when there is none (or no access)."""
    await folders.authorize_memory_access(session, principal, Permission.READ)
    head = await repository.read_head(session, principal.company_id, principal.user_id)
    if head is None:
        raise NoMemory
    return head


async def replace_memory(
    session: AsyncSession,
    principal: Principal,
    content: str,
    conditions: WriteConditions,
    *,
    policy: VersionPolicy,
) -> WriteOutcome:
    """PUT: create (`If-None-Match: *`) or replace (`If-Match`) the caller's profile.

    The client's frontmatter is ignored: the stored one names the caller, `last_updated` is now
    and `turn_count` is carried over from the head (a user edit is not a consolidation).
    Sending back the head's bullets unchanged writes nothing (`written` False).
    """
    company_id, user_id = principal.company_id, principal.user_id
    # serialise with an opt-out in flight: it either commits first (we see it) or waits for us
    await lock_user_memory(session, company_id, user_id)
    if await repository.select_user_setting(session, company_id, user_id) is False:
        raise MemoryOptedOut
    folder_id, _ = await folders.ensure_user_folder(
        session, principal, users_with_memory_quota=policy.users_with_memory_quota
    )
    await folders.authorize_memory_access(session, principal, Permission.WRITE)
    state = await repository.select_head_state(session, company_id, user_id)
    if state is None:  # first write: the memory.md row (skip_ingestion, hidden_in_chat)
        await ensure_memory_file(session, company_id, user_id, folder_id)
        state = await repository.select_head_state(session, company_id, user_id)
        if state is None:
            raise RuntimeError("memory.md vanished while it was being ensured")
    current = None if state.row is None else state.row.version
    check_write_preconditions(
        current, conditions.if_match, conditions.if_none_match, may_create=True
    )
    edited = parse_user_profile(content, user_id)
    return await _write_edit(session, state, _Edit(edited, "user_edit", content), policy)


@dataclass(frozen=True)
class _Edit:
    """A user's own edit, with the text they sent (which makes the memory policy strict), or a
    restore (`submitted` None: the policy drops and redacts silently)."""

    profile: Profile
    reason: VersionReason
    submitted: str | None = None


async def _write_edit(
    session: AsyncSession, state: HeadState, edit: _Edit, policy: VersionPolicy
) -> WriteOutcome:
    """A user's edit or restore: nothing when the bullets equal the head's; else a version with
    fresh frontmatter whose `turn_count` is the head's (an edit is not a consolidation).

    Values the memory policy redacts are stored redacted: the version answered shows
    `[redacted: <kind>]` in their place (see `gate.write_screened`).
    """
    head = state.row
    head_profile = stored_profile(head)
    if head is not None and head_profile is not None and same_sections(head_profile, edit.profile):
        return WriteOutcome(head, written=False)
    check_user_profile_size(edit.profile, policy.counter)
    before = head_profile or empty_profile(state.user_id)
    now = policy.clock()
    new = stamp(
        edit.profile, user_id=state.user_id, now=now, turn_count=before.frontmatter.turn_count
    )
    source = VersionSource(edit.reason, operations=tuple(diff_operations(before, new)))
    screening = await write_screened(
        session, state, ProfileWrite(new, source, edit.submitted), policy
    )
    if screening.row is None:  # all that was new was kept out: the head stays
        if head is None:
            raise RuntimeError("an edit of a memory without a head always writes")
        return WriteOutcome(head, written=False, policy_actions=screening.actions)
    await repository.prune_versions(session, state.company_id, state.user_id, policy.keep)
    return WriteOutcome(
        screening.row, written=True, created=head is None, policy_actions=screening.actions
    )


async def clear_memory(
    session: AsyncSession, principal: Principal, *, if_match: EntityTags | None
) -> int:
    """DELETE: remove every version and the record of what the memory policy kept out of them;
    keep the folder, the memory.md row and the settings.

    The head number advances past the cleared versions (see `repository.delete_profile`), so a
    later create continues the numbering and old ETags never match again. `If-Match` is
    optional here. Returns the number of versions deleted; 404 when there is no profile.
    """
    company_id, user_id = principal.company_id, principal.user_id
    await folders.authorize_memory_access(session, principal, Permission.WRITE)
    # Lock first, so the head read below is the newest and no writer slips in before the clear.
    if await repository.select_head_version(session, company_id, user_id, lock=True) is None:
        raise NoMemory
    state = await repository.select_head_state(session, company_id, user_id)
    if state is None or state.row is None:
        raise NoMemory
    if if_match is not None and not if_match.matches(state.head_version, weak=False):
        raise ProfileVersionMismatch(hint=False)
    deleted = await repository.delete_profile(session, company_id, user_id, state.head_version)
    await delete_policy_actions(session, company_id, user_id)  # the record goes with its history
    return deleted


async def list_versions(
    session: AsyncSession, principal: Principal, page: PageRequest
) -> Page[VersionInfo]:
    await folders.authorize_memory_access(session, principal, Permission.READ)
    return await repository.list_versions(session, principal.company_id, principal.user_id, page)


async def read_version(session: AsyncSession, principal: Principal, version: int) -> VersionRow:
    await folders.authorize_memory_access(session, principal, Permission.READ)
    return await _retained(session, principal, version)


async def _retained(session: AsyncSession, principal: Principal, version: int) -> VersionRow:
    row = await repository.read_version(session, principal.company_id, principal.user_id, version)
    if row is None:
        raise VersionNotFound(version)
    return row


async def diff_versions(
    session: AsyncSession, principal: Principal, version: int, against: int | None
) -> VersionDiff:
    """Unified diff from `against` to `version`.

    `against` defaults to the previous retained version (n-1 unless it was pruned or cleared),
    or 0 — the empty document — when there is none; 0 may also be asked for explicitly.
    """
    await folders.authorize_memory_access(session, principal, Permission.READ)
    target = await _retained(session, principal, version)
    if against is None:
        previous = await repository.previous_version_number(
            session, principal.company_id, principal.user_id, version
        )
        against = previous or 0
    old = "" if against == 0 else (await _retained(session, principal, against)).content
    diff = unified_diff(old, target.content, old_version=against, new_version=version)
    return VersionDiff(from_version=against, to_version=version, diff=diff)


async def restore_version(
    session: AsyncSession,
    principal: Principal,
    version: int,
    *,
    if_match: EntityTags | None,
    policy: VersionPolicy,
) -> WriteOutcome:
    """A new version (reason `restore`) holding version `version`'s body with fresh frontmatter.

    Needs `If-Match` of the current head (428 without, 412 when stale). Restoring a body equal
    to the head's writes nothing.
    """
    company_id, user_id = principal.company_id, principal.user_id
    await folders.authorize_memory_access(session, principal, Permission.READ)
    await folders.authorize_memory_access(session, principal, Permission.WRITE)
    source = await _retained(session, principal, version)
    state = await repository.select_head_state(session, company_id, user_id)
    if state is None:  # a version exists, so its memory.md does (FK); defensive only
        raise NoMemory
    current = None if state.row is None else state.row.version
    check_write_preconditions(current, if_match, None, may_create=False)
    return await _write_edit(session, state, _Edit(parse(source.content), "restore"), policy)


async def list_memory_policy_actions(
    session: AsyncSession, principal: Principal, page: PageRequest
) -> Page[PolicyActionRecord]:
    """What the company's memory policy kept out of the caller's memory, newest first."""
    await folders.authorize_memory_access(session, principal, Permission.READ)
    return await list_policy_actions(session, principal.company_id, principal.user_id, page)


# --- what the consolidation worker (and the turn endpoints) call --------------------------------


async def load_profile(session: AsyncSession, company_id: str, user_id: str) -> tuple[Profile, int]:
    """The head profile and the version to pass back as `expected_version`.

    `(empty_profile(user_id), 0)` when no memory.md exists yet; after a clear, the empty profile
    with the cleared head's number. Raises `NotFound` when the user's folder is missing or
    denies READ (the memory was deleted by an opt-out): drop the job, write nothing.
    """
    await folders.authorize_memory_access(session, _owner(company_id, user_id), Permission.READ)
    state = await repository.select_head_state(session, company_id, user_id)
    if state is None:
        return empty_profile(user_id), 0
    return stored_profile(state.row) or empty_profile(user_id), state.head_version


async def save_consolidation(
    session: AsyncSession,
    head: ExpectedHead,
    new_profile: Profile,
    source: VersionSource,
    policy: VersionPolicy,
) -> VersionRow | None:
    """Write the worker's result as a new version by compare-and-set on `head.version`.

    `source` names a worker's reason and the run's provenance. The frontmatter is the
    service's, whatever `new_profile` carries: the owner, `policy.clock()`, and `turn_count` =
    the head's + 1 for reason `consolidation` (unchanged for `condensation` and `truncation`; save a
    consolidation that also had to be condensed or cut as `consolidation`).
    The company's memory policy drops and redacts new or changed bullets silently, recording
    what it did with the version and its turns and job (see `gate.write_screened`).
    Returns the new version, or None when the sections (and the truncation flag) equal the
    head's (an empty profile when there is none), before or after the memory policy: nothing
    is written, as for a NOOP (what the policy kept out is recorded still).
    On the first write the memory.md row is created in the user's existing folder (never the
    folder itself: a folder deleted by an opt-out stays deleted).

    Raises `VersionConflict` when the head moved (roll back, `load_profile` again, rebase) and
    `NotFound` when the folder is gone or denies WRITE (drop the job). Retention is the
    caller's: `prune_versions` in the same transaction, after a version was written.
    """
    company_id, user_id, expected_version = head.company_id, head.user_id, head.version
    owner = _owner(company_id, user_id)
    await lock_user_memory(session, company_id, user_id)  # see replace_memory
    # a new statement after the lock, hence a snapshot that sees what committed before it
    setting, state = await repository.select_writer_state(session, company_id, user_id)
    if setting is False:
        raise MemoryTurnedOff
    await folders.authorize_memory_access(session, owner, Permission.WRITE)
    if state is None:
        if expected_version != 0:
            raise VersionConflict(expected_version, None)
        state = await _create_memory_file(session, owner)
    if state.head_version != expected_version:
        raise VersionConflict(expected_version, state.head_version)
    before = stored_profile(state.row) or empty_profile(user_id)
    if same_sections(before, new_profile) and before.truncated == new_profile.truncated:
        return None
    increment = 1 if source.reason == "consolidation" else 0
    new = stamp(
        new_profile,
        user_id=user_id,
        now=policy.clock(),
        turn_count=before.frontmatter.turn_count + increment,
    )
    return (await write_screened(session, state, ProfileWrite(new, source), policy)).row


async def ensure_memory_file(
    session: AsyncSession, company_id: str, user_id: str, folder_id: uuid.UUID
) -> None:
    """The user's `memory.md` row in `folder_id` (skip_ingestion and hidden_in_chat on)."""
    await repository.insert_memory_file(session, company_id, user_id, folder_id)


async def _create_memory_file(session: AsyncSession, owner: Principal) -> HeadState:
    record = await folder_repository.select_folder(
        session, owner.company_id, user_folder_path(owner.user_id)
    )
    if record is None:
        raise NoMemory
    await ensure_memory_file(session, owner.company_id, owner.user_id, record.id)
    state = await repository.select_head_state(session, owner.company_id, owner.user_id)
    if state is None:
        raise NoMemory
    return state


async def prune_versions(session: AsyncSession, head: ExpectedHead, policy: VersionPolicy) -> int:
    """Retention after a worker's write (`save_consolidation`): keep the newest `policy.keep`
    versions of `head`'s owner (never the head)."""
    return await repository.prune_versions(session, head.company_id, head.user_id, policy.keep)


def retention_cte(when: ColumnElement[bool]) -> CTE:
    """`prune_versions` as a CTE of the statement that finishes a worker's run (built once),
    pruning only when `when` holds; `retention_params` binds it."""
    return repository.prune_versions_cte(when)


def retention_params(head: ExpectedHead, policy: VersionPolicy) -> dict[str, object]:
    return repository.prune_params(head.company_id, head.user_id, policy.keep)
