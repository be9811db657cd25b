"""The quota rules, pure: which stored-amount quota, if any, refuses a turn-save (its 409 is
named in `app.quotas.errors`), and where a turn's consolidation goes when its user already has
as many waiting jobs as the quota allows. A limit of 0 is no limit."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from enum import StrEnum
from typing import Final

QUEUE_FULL_RETRY_AFTER_SECONDS: Final = 60
"""`Retry-After` of the 409 answered while every waiting job of the user is full."""


class Quota(StrEnum):
    """The quotas, by the name their 409 and the stored marks use."""

    USER_QUEUED_JOBS = "user_queued_jobs"
    USER_HISTORY_MESSAGES = "user_history_messages"
    COMPANY_USERS_WITH_MEMORY = "company_users_with_memory"
    COMPANY_STORAGE_BYTES = "company_storage_bytes"


@dataclass(frozen=True)
class QuotaLimits:
    """The limits in force (0: none). `job_max_turns` is no quota of its own: it bounds how many
    turns coalescing puts into one job."""

    user_queued_jobs: int = 0
    job_max_turns: int = 1
    user_history_messages: int = 0
    company_users_with_memory: int = 0
    company_storage_bytes: int = 0


def reached(used: int | None, limit: int) -> bool:
    """Whether `used` (None: not known to be over anything) has reached `limit` (0: none)."""
    return limit > 0 and used is not None and used >= limit


@dataclass(frozen=True)
class StoredUsage:
    """What the last periodic check counted for the caller, where it found a quota reached."""

    user_history_messages: int | None = None
    company_storage_bytes: int | None = None


def stored_quota_reached(usage: StoredUsage, limits: QuotaLimits) -> Quota | None:
    """The stored-amount quota that refuses a turn-save (its 409 is in `app.quotas.errors`);
    None when under every one.

    The marks are compared with the limits in force now: a quota raised since the check lets
    the caller through at once; one lowered takes effect at the next check.
    """
    if reached(usage.user_history_messages, limits.user_history_messages):
        return Quota.USER_HISTORY_MESSAGES
    if reached(usage.company_storage_bytes, limits.company_storage_bytes):
        return Quota.COMPANY_STORAGE_BYTES
    return None


@dataclass(frozen=True)
class WaitingJobs:
    """The user's waiting (queued or retrying) consolidation jobs, counted up to the quota, and
    the newest still-queued one with room for another turn (None: none has)."""

    count: int
    target: uuid.UUID | None


@dataclass(frozen=True)
class JobPlacement:
    """Where a turn's consolidation goes: a new job (`coalesce_into` None), or the turn id
    appended to the waiting job `coalesce_into`."""

    coalesce_into: uuid.UUID | None = None


NEW_JOB: Final = JobPlacement()


def place_consolidation(waiting: WaitingJobs, limits: QuotaLimits) -> JobPlacement | None:
    """A new job while the user has fewer waiting jobs than the quota (or there is none); else
    the newest queued job with room; None when every waiting job is full (the turn is
    refused: `app.quotas.errors.WaitingJobsFull`)."""
    if limits.user_queued_jobs == 0:
        return NEW_JOB
    if waiting.count < limits.user_queued_jobs:
        return NEW_JOB
    if waiting.target is None:
        return None
    return JobPlacement(waiting.target)


def users_with_memory_skip_reason(limits: QuotaLimits) -> str:
    """Why a turn of a user beyond the company's quota of users with memory is not consolidated
    (the turn itself is saved)."""
    return (
        f"Quota {Quota.COMPANY_USERS_WITH_MEMORY} reached: your company already has "
        f"{limits.company_users_with_memory:,} users with memory, so none was created for you; "
        "this turn was saved without updating memory."
    )
