"""Reads the exchanges a consolidation claim refers to: the saved request and response of each
turn id in its job payloads, scoped to the claim's (company, user).

Job payloads hold ids only; this is where the worker turns them back into text.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from app.consolidation.rules import Exchange
from app.conversations.models import ChatMessage, Turn

EXCHANGE_SOURCES = ("request", "response")


async def select_exchanges(
    session: AsyncSession, company_id: str, user_id: str, turn_ids: Sequence[uuid.UUID]
) -> list[tuple[uuid.UUID, Exchange]]:
    """One exchange per turn that still has its messages, in the order of `turn_ids`.

    The user text is the turn's saved request messages of role `user` (joined by a blank line),
    the assistant text its response; `at` is when the turn was saved. Placeholder history is
    never consolidated: it is what the caller's template replays, not what the user just said.
    A turn whose chat was deleted meanwhile (or that belongs to somebody else) yields nothing.
    """
    if not turn_ids:
        return []
    rows = await session.execute(
        select(ChatMessage.turn_id, ChatMessage.role, ChatMessage.content, ChatMessage.source)
        .add_columns(Turn.created_at)
        .join(
            Turn,
            (Turn.company_id == ChatMessage.company_id)
            & (Turn.id == ChatMessage.turn_id)
            & (Turn.user_id == ChatMessage.user_id),
        )
        .where(
            ChatMessage.company_id == company_id,
            ChatMessage.user_id == user_id,
            ChatMessage.turn_id.in_(list(turn_ids)),
            ChatMessage.source.in_(EXCHANGE_SOURCES),
        )
        .order_by(ChatMessage.id)
    )
    users: dict[uuid.UUID, list[str]] = {}
    answers: dict[uuid.UUID, list[str]] = {}
    saved_at: dict[uuid.UUID, datetime] = {}
    for turn_id, role, content, source, created_at in rows:
        saved_at[turn_id] = created_at
        if source == "request" and role == "user":
            users.setdefault(turn_id, []).append(content)
        elif source == "response":
            answers.setdefault(turn_id, []).append(content)
    exchanges: list[tuple[uuid.UUID, Exchange]] = []
    for turn_id in dict.fromkeys(turn_ids):
        if turn_id not in saved_at:
            continue
        exchange = Exchange(
            user="\n\n".join(users.get(turn_id, [])),
            assistant="\n\n".join(answers.get(turn_id, [])),
            at=saved_at[turn_id],
        )
        exchanges.append((turn_id, exchange))
    return exchanges
