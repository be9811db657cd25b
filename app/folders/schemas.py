"""Response bodies of the folder routes (ACL metadata only, never folder contents)."""

from __future__ import annotations

from pydantic import BaseModel

from app.folders.acl import AclEntry, FolderNode, Permission, PrincipalKind


class AclEntryOut(BaseModel):
    principal_kind: PrincipalKind
    principal_id: str
    permission: Permission

    @classmethod
    def of(cls, entry: AclEntry) -> AclEntryOut:
        return cls.model_validate(entry, from_attributes=True)


class FolderOut(BaseModel):
    """A folder's access settings: path, whether it inherits its parent's ACL, its own entries."""

    path: str
    inherit_access: bool
    entries: list[AclEntryOut]

    @classmethod
    def of(cls, node: FolderNode) -> FolderOut:
        return cls(
            path=node.path,
            inherit_access=node.inherit,
            entries=[AclEntryOut.of(entry) for entry in node.entries],
        )
