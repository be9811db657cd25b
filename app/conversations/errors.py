"""The named failures of chats and their history."""

from __future__ import annotations

from app.kit.errors import NotFound


class ChatNotFound(NotFound):
    """The caller has no message in a chat of this id (never saved, or deleted)."""

    def __init__(self) -> None:
        super().__init__("No such chat.")
