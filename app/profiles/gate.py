"""The one gate every write of a profile passes: the company's memory policy, then the
compare-and-set write, then the record of what the policy kept out (SPEC §13).

The user's edits, restores and the worker's consolidations, condensations and truncations all
reach the versions table through `write_screened`; no other code calls
`repository.write_version`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from sqlalchemy.ext.asyncio import AsyncSession

from app.detectors import find
from app.enablement.memory_policy import Action, MemoryPolicy
from app.enablement.memory_policy_repository import read_memory_policy
from app.profiles import repository
from app.profiles.document import (
    SECTIONS,
    Operation,
    OpKind,
    Profile,
    diff_operations,
    empty_profile,
    parse,
)
from app.profiles.policy import PolicyAction, screen
from app.profiles.policy_actions import PolicyWrite, record_policy_actions
from app.profiles.refusal import refusal, refused_lines
from app.profiles.versions import (
    HeadState,
    VersionPolicy,
    VersionReason,
    VersionRow,
    VersionSource,
    count_tokens,
    same_sections,
)

_EDITS: Final = frozenset({"user_edit", "restore"})


@dataclass(frozen=True)
class ProfileWrite:
    """A write to pass the gate: the profile (its frontmatter stamped already), its provenance,
    and for a user's own edit the text they sent, which makes the gate strict."""

    profile: Profile
    source: VersionSource
    submitted: str | None = None


@dataclass(frozen=True)
class Screening:
    """The gate's result: the version written (None: the write changed nothing) and what the
    memory policy dropped or redacted (recorded with it)."""

    row: VersionRow | None
    actions: tuple[PolicyAction, ...]


def keep_replaced_bullets(head: Profile, kept: Profile, operations: Sequence[Operation]) -> Profile:
    """`kept` with the old bullet of every update whose new text the policy dropped put back
    where it was: a refused bullet drops alone, and an update refused is an update not made,
    not a deletion of what it would have replaced. Pure."""
    restored = {section: list(kept.bullets(section)) for section in SECTIONS}
    for op in operations:
        if op.kind is not OpKind.UPDATE or op.target is None or op.text is None:
            continue
        bullets = restored[op.section]
        old_bullets = head.bullets(op.section)
        if op.text in bullets or op.target in bullets or op.target not in old_bullets:
            continue  # the update landed (perhaps redacted), or its old bullet is unknown
        before = old_bullets[: old_bullets.index(op.target)]
        position = sum(1 for bullet in bullets if bullet in before)
        bullets.insert(position, op.target)
    return Profile.from_sections(kept.frontmatter, restored, truncated=kept.truncated)


def operations_name_kept_out(
    operations: Sequence[Operation], before: Profile, after: Profile, policy: MemoryPolicy
) -> bool:
    """Whether an operation names a text that neither version holds and that holds what the
    policy keeps out: an import's operations describe the source's own, unscreened history, and
    one batch may add a bullet and update it again. Texts of either version passed the gate
    already. Pure."""
    texts = {
        bullet
        for profile in (before, after)
        for _, bullets in profile.sections
        for bullet in bullets
    }
    for op in operations:
        for text in (op.text, op.target):
            if text is None or text in texts:
                continue
            if any(policy.action(found.category) is not Action.ALLOW for found in find(text)):
                return True
    return False


def stored_profile(row: VersionRow | None) -> Profile | None:
    return None if row is None else parse(row.content)


def unchanged(head: Profile | None, new: Profile, reason: VersionReason) -> bool:
    """Whether writing `new` over `head` would change nothing. A user's edit or restore
    compares the bullets only and, with no head, always writes (it creates the profile); the
    worker's writes also compare the truncation flag, with the empty profile when there is no
    head."""
    if reason in _EDITS:
        return head is not None and same_sections(head, new)
    before = head or empty_profile(new.user_id)
    return same_sections(before, new) and before.truncated == new.truncated


async def write_screened(
    session: AsyncSession, state: HeadState, write: ProfileWrite, policy: VersionPolicy
) -> Screening:
    """Screen `write.profile` with the company's memory policy and write what may be kept as
    version `state.head_version + 1`, by compare-and-set (`repository.write_version`).

    The policy is read afresh (a change applies from the next write) and judges each bullet
    that is new or changed relative to the head (`profiles.policy.screen`). A user's own edit
    holding a bullet the policy drops is refused whole (`MemoryPolicyRefusal`: 422 naming
    category and line, never the value); every other write drops and redacts silently. What
    was dropped or redacted is recorded with the version written, or with none when the
    screened profile equals the head: then no version is written and the actions alone are
    kept. When the policy acted, or an operation names a text that holds what the policy keeps
    out (an import's history, a batch that adds and updates one bullet), the version's
    operations are derived again from the head and what is written, so that none carries a
    value that was kept out. Everything the policy found,
    `allow` included, goes to `policy.on_policy_actions`. Retention is the caller's.
    """
    head = stored_profile(state.row)
    with policy.tracer.start_as_current_span("memory policy") as span:
        company_policy = await read_memory_policy(session, state.company_id)
        screened = screen(head, write.profile, company_policy)
        span.set_attribute("context_memory.memory_policy.findings", len(screened.actions))
        span.set_attribute(
            "context_memory.memory_policy.actions",
            [f"{action.category.value}:{action.action.value}" for action in screened.actions],
        )
    policy.on_policy_actions(screened.actions)
    if write.submitted is not None and screened.dropped:
        lines = refused_lines(write.submitted, head, company_policy, state.user_id)
        raise refusal(lines, screened.dropped)
    taken = tuple(action for action in screened.actions if action.action is not Action.ALLOW)
    kept, source = screened.profile, write.source
    if screened.dropped and head is not None:
        kept = keep_replaced_bullets(head, kept, source.operations)
    row: VersionRow | None = None
    if not unchanged(head, kept, source.reason):
        before = head or empty_profile(state.user_id)
        if taken or operations_name_kept_out(source.operations, before, kept, company_policy):
            source = replace(source, operations=tuple(diff_operations(before, kept)))
        tokens = count_tokens(kept, policy.counter)
        row = await repository.write_version(
            session, state.expected, kept, source=source, tokens=tokens
        )
    written = PolicyWrite(
        state.company_id, state.user_id, None if row is None else row.version, source
    )
    await record_policy_actions(session, written, taken)
    return Screening(row, taken)
