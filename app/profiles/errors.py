"""The named failures of the user's memory: its versions, their preconditions, its export and
what the company's memory policy refuses."""

from __future__ import annotations

from typing import Final

from app.folders.errors import NoMemory
from app.kit.errors import (
    Conflict,
    NotFound,
    PreconditionFailed,
    PreconditionRequired,
    TooManyRequests,
    Unprocessable,
)

_SEND_THE_ETAG: Final = 'send the ETag of the current version, e.g. If-Match: "3"'


class MemoryFileMissing(NoMemory):
    """The user's memory.md row does not exist (never provisioned, or deleted by an opt-out)."""


class VersionNotFound(NotFound):
    """The version asked for is not retained (never written, pruned, or cleared)."""

    def __init__(self, version: int) -> None:
        super().__init__(f"No version {version}.")


class MemoryOptedOut(Conflict):
    """A user who turned context memory off wrote to their memory."""

    def __init__(self) -> None:
        super().__init__(
            "Context memory is turned off for your account; turn it on in /v1/me/settings "
            "before writing a memory profile."
        )


class MemoryTurnedOff(NotFound):
    """The worker's write met a user who turned context memory off meanwhile: drop the job."""

    def __init__(self) -> None:
        super().__init__("The user turned context memory off.")


class VersionConflict(PreconditionFailed):
    """The compare-and-set lost: the head is no longer `expected` (HTTP 412 for a stale If-Match).

    The transaction that raised it must be rolled back; a worker re-reads the head and rebases.
    """

    def __init__(self, expected: int, current: int | None) -> None:
        now = "the memory no longer exists" if current is None else f"the head is {current}"
        super().__init__(
            f"The memory changed meanwhile (expected version {expected}, {now}); "
            "fetch it again and retry."
        )
        self.expected = expected
        self.current = current


class ProfileVersionMismatch(PreconditionFailed):
    """`If-Match` does not name the current version (someone wrote first, or there is none);
    `hint`: say which ETag to send."""

    def __init__(self, *, hint: bool = True) -> None:
        said = f"; {_SEND_THE_ETAG}" if hint else ""
        super().__init__(f"If-Match does not name the current version{said}.")


class ProfileAlreadyExists(PreconditionFailed):
    """`If-None-Match` (a create) met an existing profile."""

    def __init__(self) -> None:
        super().__init__("A memory profile already exists (If-None-Match failed).")


class IfMatchRequired(PreconditionRequired):
    """A change of an existing profile without `If-Match`."""

    def __init__(self) -> None:
        super().__init__(f"Changing your memory needs If-Match: {_SEND_THE_ETAG}.")


class NoProfileYet(PreconditionRequired):
    """A write without a precondition where there is no profile: one that may create it needs
    `If-None-Match: *` (`may_create`), any other a current version first."""

    def __init__(self, *, may_create: bool) -> None:
        hint = "If-None-Match: * to create it" if may_create else "a current version first"
        super().__init__(f"There is no memory profile yet; this needs {hint}.")


class ExportInProgress(TooManyRequests):
    """Another export of the user's memory is being sent; one runs at a time."""

    def __init__(self, retry_after_seconds: int) -> None:
        super().__init__(
            "Another export of your memory is running; one runs at a time. Retry when it is done.",
            retry_after_seconds=retry_after_seconds,
        )


class MemoryPolicyRefusal(Unprocessable):
    """An edit holding what the company does not allow in memory (422, nothing stored); its
    detail and errors name each refused line (`app.profiles.refusal.refusal`)."""

    title = "Not allowed in memory"
    slug = "memory-policy"
