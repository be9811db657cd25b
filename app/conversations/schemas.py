"""Wire shapes of conversation history: chat and space ids, messages in and out, stored messages.

Static rules live here (roles, patterns, no NUL, no unknown fields); the limits that come from
settings (message count and length) are checked by `check_message_limits`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Literal

from fastapi import Path
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from app.conversations.modes import Message, MessageSource, Role
from app.kit.config import Settings
from app.kit.contract import NUL_FREE_PATTERN
from app.kit.errors import Unprocessable
from app.kit.schemas import IDENTIFIER_PATTERN, Identifier, Schema

MODEL_NAME_PATTERN = r"^[\x21-\x7e]{1,128}$"


def _no_nul(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    return value


Text = Annotated[
    str, AfterValidator(_no_nul), Field(json_schema_extra={"pattern": NUL_FREE_PATTERN})
]
ChatIdPath = Annotated[
    str,
    Path(
        pattern=IDENTIFIER_PATTERN,
        description="The orchestrator's chat id (`[A-Za-z0-9._:-]`)",
        openapi_examples={"chat": {"summary": "A chat of the orchestrator's", "value": "chat-1"}},
    ),
]
SpaceId = Annotated[Identifier, Field(description="The space the turn runs in")]
ModelName = Annotated[
    str, Field(pattern=MODEL_NAME_PATTERN, description="A model name, printable ASCII")
]


class MessageIn(BaseModel):
    """One chat message as the orchestrator sends it."""

    model_config = ConfigDict(extra="forbid")

    role: Role
    content: Text

    def to_message(self) -> Message:
        return Message(self.role, self.content)


def placeholder_messages(history: list[MessageIn] | None) -> list[Message] | None:
    """A request's `placeholder_history` as messages; None when the caller sent none."""
    return None if history is None else [m.to_message() for m in history]


class ResponseIn(BaseModel):
    """The model's answer of the turn."""

    model_config = ConfigDict(extra="forbid")

    role: Literal["assistant"] = "assistant"
    content: Text

    def to_message(self) -> Message:
        return Message(Role.ASSISTANT, self.content)


class MessageOut(BaseModel):
    role: Role
    content: str


class StoredMessageOut(Schema):
    """A message of the stored history, oldest first; `source` says where it came from."""

    id: int
    role: Role
    content: str
    source: MessageSource
    turn_id: uuid.UUID
    created_at: datetime


def check_message_limits(
    settings: Settings,
    *,
    messages: Sequence[MessageIn],
    placeholder_history: Sequence[MessageIn] | None,
    texts: Sequence[tuple[str, str | None]] = (),
) -> None:
    """422 naming the first offending field when a list or a text exceeds the configured limits.

    `messages` must hold 1..MAX_MESSAGES_PER_REQUEST messages, `placeholder_history` at most as
    many; every content and each of `texts` (field name, value) at most MAX_MESSAGE_CHARS.
    """
    most, longest = settings.max_messages_per_request, settings.max_message_chars
    lists = (("messages", messages), ("placeholder_history", placeholder_history or ()))
    for name, items in lists:
        if len(items) > most:
            raise Unprocessable.field(f"body.{name}", f"At most {most} messages are allowed.")
        for index, item in enumerate(items):
            if len(item.content) > longest:
                raise Unprocessable.field(
                    f"body.{name}.{index}.content", f"At most {longest} characters are allowed."
                )
    for name, value in texts:
        if value is not None and len(value) > longest:
            raise Unprocessable.field(f"body.{name}", f"At most {longest} characters are allowed.")
