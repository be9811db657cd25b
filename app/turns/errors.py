"""The named failures of a turn-save."""

from __future__ import annotations

from app.kit.errors import Conflict, RetryableConflict, Unprocessable


class IdempotencyKeyInFlight(RetryableConflict):
    """Another request with the same Idempotency-Key holds its lock: still in progress."""

    def __init__(self) -> None:
        super().__init__("A request with this Idempotency-Key is still in progress; retry later.")


class IdempotencyKeyRace(RetryableConflict):
    """A record of the Idempotency-Key appeared although this request holds its lock: the turn
    is not saved twice."""

    def __init__(self) -> None:
        super().__init__("This Idempotency-Key was used concurrently; retry the request.")


class IdempotencyKeyReused(Unprocessable):
    """The Idempotency-Key was stored with a request other than this one."""

    def __init__(self) -> None:
        message = "This Idempotency-Key was already used with a different request."
        super().__init__(message, errors=[{"field": "header.Idempotency-Key", "message": message}])


class MemoryDeletedWhileSaving(RetryableConflict):
    """The user's memory was deleted each time the turn was about to be written."""

    def __init__(self) -> None:
        super().__init__(
            "Your memory was deleted while this turn was being saved; nothing was saved, retry."
        )


class NothingQueued(Conflict):
    """An explicit consolidation whose turn would not be consolidated (memory not enabled in
    the space, say): `skipped` says why; nothing is written."""

    def __init__(self, skipped: str) -> None:
        super().__init__(f"Nothing was queued: {skipped}")
