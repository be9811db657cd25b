"""Tables of the folder model: folders (a tree per company) and their ACL entries."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import CheckConstraint, ForeignKeyConstraint, String, UniqueConstraint, func
from sqlalchemy.orm import Mapped, mapped_column

from app.kit.db.base import Base


class Folder(Base):
    __tablename__ = "folders"
    __table_args__ = (
        UniqueConstraint("company_id", "path"),
        ForeignKeyConstraint(
            ["company_id", "parent_id"], ["folders.company_id", "folders.id"], ondelete="CASCADE"
        ),
    )

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    id: Mapped[uuid.UUID] = mapped_column(primary_key=True, default=uuid.uuid4)
    path: Mapped[str] = mapped_column(String(512))
    parent_id: Mapped[uuid.UUID | None]
    inherit_access: Mapped[bool]
    created_at: Mapped[datetime] = mapped_column(server_default=func.now())


class FolderAclEntry(Base):
    __tablename__ = "folder_acl"
    __table_args__ = (
        ForeignKeyConstraint(
            ["company_id", "folder_id"], ["folders.company_id", "folders.id"], ondelete="CASCADE"
        ),
        CheckConstraint("principal_kind IN ('user', 'group')", name="principal_kind"),
        CheckConstraint("permission IN ('READ', 'WRITE', 'MANAGE')", name="permission"),
    )

    company_id: Mapped[str] = mapped_column(String(128), primary_key=True)
    folder_id: Mapped[uuid.UUID] = mapped_column(primary_key=True)
    principal_kind: Mapped[str] = mapped_column(String(8), primary_key=True)
    principal_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    permission: Mapped[str] = mapped_column(String(8), primary_key=True)
