"""The quota limits in force: the settings' values, as the pure rules take them."""

from __future__ import annotations

from app.kit.config import Settings
from app.quotas.rule import QuotaLimits


def quota_limits(settings: Settings) -> QuotaLimits:
    return QuotaLimits(
        user_queued_jobs=settings.quota_user_queued_jobs,
        job_max_turns=settings.quota_job_max_turns,
        user_history_messages=settings.quota_user_history_messages,
        company_users_with_memory=settings.quota_company_users_with_memory,
        company_storage_bytes=settings.quota_company_storage_bytes,
    )
