"""Response bodies of the folder routes (ACL metadata only, never folder contents)."""

from __future__ import annotations

from pydantic import BaseModel

from app.folders.acl import FolderNode, Permission, PrincipalKind
from app.kit.schemas import Schema


class AclEntryOut(Schema):
    principal_kind: PrincipalKind
    principal_id: str
    permission: Permission


class FolderOut(BaseModel):
    """A folder's access settings: path, whether it inherits its parent's ACL, its own entries."""

    path: str
    inherit_access: bool
    entries: list[AclEntryOut]

    @classmethod
    def of(cls, node: FolderNode) -> FolderOut:
        """`inherit_access` is the node's `inherit`."""
        return cls(
            path=node.path,
            inherit_access=node.inherit,
            entries=[AclEntryOut.model_validate(entry) for entry in node.entries],
        )
