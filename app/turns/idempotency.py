"""Idempotency-Key rules of the turn-save (Stripe semantics): which keys are valid, and what
makes two requests "the same". The lock and the stored records are in `turns.repository`.
"""

from __future__ import annotations

import hashlib

import orjson

from app.kit.errors import Unprocessable
from app.turns.schemas import TurnRequest

HEADER = "Idempotency-Key"
STORED_KEY_MAX_LENGTH = 255  # idempotency_keys.key is VARCHAR(255)
REPLAYED_HEADER = "Idempotent-Replayed"


KEY_PATTERN = "^[ -~]+$"  # printable ASCII, as the published schema says it


def max_key_length(setting: int) -> int:
    """The longest key accepted: the setting, capped at what the table stores."""
    return min(setting, STORED_KEY_MAX_LENGTH)


def check_key(raw: str | None, max_length: int) -> str | None:
    """The key as sent, or None when absent; 422 unless 1..`max_length` printable ASCII.

    `max_length` is capped at what the table stores, whatever the setting says.
    """
    if raw is None:
        return None
    max_length = max_key_length(max_length)
    if not 0 < len(raw) <= max_length or not all(" " <= ch <= "~" for ch in raw):
        raise Unprocessable.field(
            f"header.{HEADER}",
            f"The {HEADER} must be 1 to {max_length} printable ASCII characters.",
        )
    return raw


def request_hash(chat_id: str, request: TurnRequest) -> str:
    """sha256 of the canonical JSON of the chat id and the validated body.

    Canonical: keys sorted, defaults filled in, so an omitted default and the same value sent
    explicitly are the same request; any other difference is a different request.
    """
    canonical = orjson.dumps(
        {"chat_id": chat_id, "body": request.model_dump(mode="json")},
        option=orjson.OPT_SORT_KEYS,
    )
    return hashlib.sha256(canonical).hexdigest()
