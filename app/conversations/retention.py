"""Retention of stored chat history: `CHAT_RETENTION_DAYS` after it was saved, a message is
deleted by the worker's housekeeping (and a turn with it, once none of its messages is left).

The worker knows no domain: `main` hands it the step this module builds.
"""

from __future__ import annotations

from typing import Final

from sqlalchemy.ext.asyncio import AsyncEngine

from app.conversations.repository import delete_history_older_than
from app.jobs.worker import Maintenance

RETENTION_BATCH: Final = 5_000
"""Messages deleted per transaction."""


def chat_retention_steps(days: int, *, batch: int = RETENTION_BATCH) -> tuple[Maintenance, ...]:
    """The housekeeping step deleting history older than `days` days; none when `days` is 0
    (history is kept until the user deletes it)."""
    if days <= 0:
        return ()

    async def delete_expired_chat_history(engine: AsyncEngine) -> int:
        return await delete_history_older_than(engine, days, batch=batch)

    return (delete_expired_chat_history,)
