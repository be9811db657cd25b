"""The named failures of the quotas: a 409 `quota-exceeded` each, whose detail names the quota,
its limit and what to do. Nothing of the refused request is written."""

from __future__ import annotations

from app.kit.errors import QuotaExceeded
from app.quotas.rule import (
    QUEUE_FULL_RETRY_AFTER_SECONDS,
    Quota,
    QuotaLimits,
    StoredUsage,
    stored_quota_reached,
)


class HistoryQuotaReached(QuotaExceeded):
    """The last quota check counted the user's stored chat history at its limit."""

    def __init__(self, messages: int, limit: int) -> None:
        super().__init__(
            f"Quota {Quota.USER_HISTORY_MESSAGES} reached: your stored chat history holds "
            f"{messages:,} messages, the limit is {limit:,}. Nothing was saved. Delete chats you "
            "no longer need (DELETE /v1/chats/{chat_id}); turns are accepted again once the next "
            "quota check counts you under the limit."
        )


class StorageQuotaReached(QuotaExceeded):
    """The last quota check counted the company's stored bytes at their limit."""

    def __init__(self, stored_bytes: int, limit: int) -> None:
        super().__init__(
            f"Quota {Quota.COMPANY_STORAGE_BYTES} reached: your company stores "
            f"{stored_bytes:,} bytes of chat history and memory, the limit is {limit:,}. Nothing "
            "was saved. Ask your administrator to free space or raise the quota; turns are "
            "accepted again once the next quota check counts the company under the limit."
        )


def stored_quota_refusal(usage: StoredUsage, limits: QuotaLimits) -> QuotaExceeded | None:
    """The 409 refusing a turn-save over a stored-amount quota (`stored_quota_reached`); None
    when under."""
    reached = stored_quota_reached(usage, limits)
    if reached is Quota.USER_HISTORY_MESSAGES and usage.user_history_messages is not None:
        return HistoryQuotaReached(usage.user_history_messages, limits.user_history_messages)
    if reached is Quota.COMPANY_STORAGE_BYTES and usage.company_storage_bytes is not None:
        return StorageQuotaReached(usage.company_storage_bytes, limits.company_storage_bytes)
    return None


class WaitingJobsFull(QuotaExceeded):
    """Every waiting consolidation job of the user holds as many turns as one may: the turn is
    refused until the worker has caught up (`Retry-After`)."""

    def __init__(self, limits: QuotaLimits) -> None:
        super().__init__(
            f"Quota {Quota.USER_QUEUED_JOBS} reached: {limits.user_queued_jobs} consolidation "
            f"jobs of yours are waiting, each with {limits.job_max_turns} turns, the most one "
            "holds. Nothing was saved; retry once the worker has caught up (see Retry-After).",
            retry_after_seconds=QUEUE_FULL_RETRY_AFTER_SECONDS,
        )


class UsersWithMemoryQuotaReached(QuotaExceeded):
    """A write would create the memory of one user more than the company's quota allows."""

    def __init__(self, limit: int) -> None:
        super().__init__(
            f"Quota {Quota.COMPANY_USERS_WITH_MEMORY} reached: your company already has "
            f"{limit:,} users with memory, so none can be created for you. Nothing was saved; "
            "ask your administrator to raise the quota (memories deleted by their users free "
            "places)."
        )
