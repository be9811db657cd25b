"""The named failures of the folder tree and its access check."""

from __future__ import annotations

from app.folders.acl import ROOT_FOLDER
from app.kit.errors import Forbidden, NotFound


class NoMemory(NotFound):
    """The caller has no memory, or may not see it: a missing folder, a denied permission and
    a memory without a profile answer alike, so nobody learns whether a memory exists."""

    def __init__(self) -> None:
        super().__init__("No memory.")


class MemoryFolderRefused(Forbidden):
    """The company's root folder does not let the caller create their memory folder."""

    def __init__(self) -> None:
        super().__init__("You may not create a memory folder in this company.")


class RootFolderMissing(NotFound):
    """The company's root folder (`user-memory`) was never created."""

    def __init__(self) -> None:
        super().__init__(f"The {ROOT_FOLDER} folder has not been created for this company.")
