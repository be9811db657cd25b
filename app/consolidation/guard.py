"""The change guard: how much of a memory one consolidation may delete without the user asking
to forget. Pure: no session, no settings; the caller passes the allowed share."""

from __future__ import annotations

from collections.abc import Sequence

from app.profiles.document import Operation, OpKind, Profile, bullet_count


class TooManyDeletions(Exception):
    """The operations delete more bullets than one update may without a forget request."""

    def __init__(self, deleted: int, allowed: int) -> None:
        super().__init__(f"{deleted} deletions, at most {allowed} allowed")
        self.deleted = deleted
        self.allowed = allowed


def guard_change(
    before: Profile,
    operations: Sequence[Operation],
    forget_requested: bool,
    allowed_share: float,
) -> int:
    """The number of bullets `operations` delete from `before`, when that many may go.

    At most `allowed_share` of the bullets may be deleted, rounded down, but one deletion is
    always allowed; a user who asked to forget lifts the limit. Raises `TooManyDeletions`.
    """
    deleted = sum(1 for op in operations if op.kind is OpKind.DELETE)
    if forget_requested:
        return deleted
    allowed = max(1, int(allowed_share * bullet_count(before)))
    if deleted > allowed:
        raise TooManyDeletions(deleted, allowed)
    return deleted
