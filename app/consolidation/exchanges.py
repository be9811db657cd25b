"""Reads the exchanges a consolidation claim refers to: the saved request and response of each
turn id in its job payloads, scoped to the claim's (company, user), as a fragment of the read
step's one statement (`snapshot`).

Job payloads hold ids only; this is where the worker turns them back into text.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from app.consolidation.rules import Exchange

# Joins the messages of the turns :turn_ids of (:company_id, :user_id), their request and
# response (never placeholder history), as arrays in message order.
EXCHANGE_COLUMNS = """
    ex.turn_ids AS exchange_turn_ids, ex.roles AS exchange_roles,
    ex.contents AS exchange_contents, ex.sources AS exchange_sources,
    ex.saved_at AS exchange_saved_at"""

EXCHANGE_JOIN = """
LEFT JOIN LATERAL (
    SELECT array_agg(m.turn_id ORDER BY m.id) AS turn_ids,
           array_agg(m.role ORDER BY m.id) AS roles,
           array_agg(m.content ORDER BY m.id) AS contents,
           array_agg(m.source ORDER BY m.id) AS sources,
           array_agg(t.created_at ORDER BY m.id) AS saved_at
      FROM chat_messages m
      JOIN turns t ON t.company_id = m.company_id AND t.id = m.turn_id AND t.user_id = m.user_id
     WHERE m.company_id = :company_id AND m.user_id = :user_id
       AND m.turn_id = ANY(:turn_ids::uuid[]) AND m.source IN ('request', 'response')
) ex ON true"""


def exchanges_of(
    row: Mapping[str, Any], turn_ids: Sequence[uuid.UUID]
) -> list[tuple[uuid.UUID, Exchange]]:
    """One exchange per turn of `turn_ids` that still has its messages, in the order of
    `turn_ids`, from the `EXCHANGE_COLUMNS` of a row.

    The user text is the turn's saved request messages of role `user` (joined by a blank line),
    the assistant text its response; `at` is when the turn was saved. Placeholder history is
    never consolidated: it is what the caller's template replays, not what the user just said.
    A turn whose chat was deleted meanwhile (or that belongs to somebody else) yields nothing.
    """
    columns = ("turn_ids", "roles", "contents", "sources", "saved_at")
    messages = zip(*(row[f"exchange_{name}"] or [] for name in columns), strict=True)
    users: dict[uuid.UUID, list[str]] = {}
    answers: dict[uuid.UUID, list[str]] = {}
    saved_at: dict[uuid.UUID, datetime] = {}
    for turn_id, role, content, source, created_at in messages:
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
