"""The named failures of the enablement settings."""

from __future__ import annotations

from app.kit.errors import RetryableConflict


class SpaceSettingsChanged(RetryableConflict):
    """A space save lost a race with another save of the same space; nothing was written."""

    def __init__(self) -> None:
        super().__init__("The space settings changed while saving; retry the request.")
