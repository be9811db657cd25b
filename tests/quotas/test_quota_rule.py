"""The quota rules as tables: when a stored amount refuses a turn-save and what the refusal
(`app.quotas.errors`) says, and where a turn's consolidation goes as its user's waiting jobs
fill up."""

from __future__ import annotations

import uuid

import pytest

from app.quotas.errors import (
    HistoryQuotaReached,
    StorageQuotaReached,
    UsersWithMemoryQuotaReached,
    WaitingJobsFull,
    stored_quota_refusal,
)
from app.quotas.rule import (
    NEW_JOB,
    QUEUE_FULL_RETRY_AFTER_SECONDS,
    JobPlacement,
    Quota,
    QuotaLimits,
    StoredUsage,
    WaitingJobs,
    place_consolidation,
    reached,
    stored_quota_reached,
)

TARGET = uuid.UUID("00000000-0000-4000-8000-000000000001")


@pytest.mark.parametrize(
    ("used", "limit", "expected"),
    [
        (None, 10, False),  # no mark: under every quota
        (9, 10, False),
        (10, 10, True),  # the limit itself is reached: storing more would exceed it
        (11, 10, True),
        (10**9, 0, False),  # 0 is no quota
    ],
)
def test_a_quota_is_reached_at_its_limit_and_never_when_it_is_zero(
    used: int | None, limit: int, expected: bool
) -> None:
    assert reached(used, limit) is expected


def test_a_history_mark_at_the_limit_refuses_and_says_which_quota_its_limit_and_what_to_do() -> (
    None
):
    limits = QuotaLimits(user_history_messages=1_000)

    refused = stored_quota_refusal(StoredUsage(user_history_messages=1_204), limits)

    assert isinstance(refused, HistoryQuotaReached)
    detail = refused.detail
    assert Quota.USER_HISTORY_MESSAGES in detail
    assert "1,000" in detail
    assert "1,204" in detail
    assert "DELETE /v1/chats/{chat_id}" in detail
    assert "Nothing was saved" in detail


def test_a_storage_mark_refuses_with_the_company_quota() -> None:
    limits = QuotaLimits(company_storage_bytes=5_000_000)

    refused = stored_quota_refusal(StoredUsage(company_storage_bytes=5_000_001), limits)

    assert isinstance(refused, StorageQuotaReached)
    detail = refused.detail
    assert Quota.COMPANY_STORAGE_BYTES in detail
    assert "5,000,000" in detail


@pytest.mark.parametrize(
    ("usage", "limits"),
    [
        (StoredUsage(), QuotaLimits(user_history_messages=1, company_storage_bytes=1)),
        # a quota raised since the check lets the caller through at once
        (StoredUsage(user_history_messages=50), QuotaLimits(user_history_messages=51)),
        # a quota turned off ignores its marks
        (StoredUsage(user_history_messages=50, company_storage_bytes=9), QuotaLimits()),
    ],
)
def test_no_refusal_under_every_quota_in_force(usage: StoredUsage, limits: QuotaLimits) -> None:
    assert stored_quota_reached(usage, limits) is None
    assert stored_quota_refusal(usage, limits) is None


LIMITS = QuotaLimits(user_queued_jobs=3, job_max_turns=5)


@pytest.mark.parametrize(
    ("waiting", "limits", "expected"),
    [
        (WaitingJobs(0, None), LIMITS, NEW_JOB),
        (WaitingJobs(2, None), LIMITS, NEW_JOB),
        (WaitingJobs(3, TARGET), LIMITS, JobPlacement(TARGET)),
        (WaitingJobs(3, None), LIMITS, None),  # every waiting job is full: refused
        (WaitingJobs(9, None), QuotaLimits(user_queued_jobs=0), NEW_JOB),  # no quota
    ],
)
def test_a_turn_gets_a_job_of_its_own_until_the_quota_then_joins_the_newest_with_room(
    waiting: WaitingJobs, limits: QuotaLimits, expected: JobPlacement | None
) -> None:
    assert place_consolidation(waiting, limits) == expected


def test_the_queue_full_and_users_with_memory_refusals_name_their_quota_and_limit() -> None:
    queue_full = WaitingJobsFull(LIMITS)
    queue, users = queue_full.detail, UsersWithMemoryQuotaReached(1_500).detail

    assert queue_full.headers == {"Retry-After": str(QUEUE_FULL_RETRY_AFTER_SECONDS)}
    assert Quota.USER_QUEUED_JOBS in queue
    assert "3 consolidation jobs" in queue
    assert "5 turns" in queue
    assert Quota.COMPANY_USERS_WITH_MEMORY in users
    assert "1,500" in users
