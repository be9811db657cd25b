"""The named failures of the job queue's API."""

from __future__ import annotations

from app.kit.errors import Conflict, NotFound


class JobNotFound(NotFound):
    """No job of the caller has this id (or the id is not a UUID)."""

    def __init__(self) -> None:
        super().__init__("No such job.")


class JobNotDead(Conflict):
    """A retry of a job that has not failed for good: only a dead job can be sent again."""

    def __init__(self, status: str) -> None:
        super().__init__(f"Only a dead job can be retried; this job is {status}.")
