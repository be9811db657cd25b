"""The user-memory records of a company import stream, built from memory versions: the
`user-memory` root folder, a private folder per user with their ACLs, each user's `memory.md`
file and its versions, grouped by type in stream order (docs/portability.md). Used by the policy
replay's company import and by the tests that build such streams."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

UserVersions = tuple[str, Sequence[Mapping[str, Any]]]
"""A user id and their `memory_version` records, oldest first."""


def user_memory_records(company: str, histories: Sequence[UserVersions]) -> list[dict[str, Any]]:
    """The records of every user's memory in `histories`; the company's root group reads and
    writes the root, each user their own folder."""
    root = str(uuid.uuid4())
    folders = {user_id: str(uuid.uuid4()) for user_id, _ in histories}
    acl = [("group", f"root:{company}", root)] + [
        ("user", user_id, folder) for user_id, folder in folders.items()
    ]
    return [
        {
            "type": "folder",
            "id": root,
            "path": "user-memory",
            "parent_id": None,
            "inherit_access": False,
        },
        *(
            {
                "type": "folder",
                "id": folder,
                "path": f"user-memory/{user_id}",
                "parent_id": root,
                "inherit_access": False,
            }
            for user_id, folder in folders.items()
        ),
        *(
            {
                "type": "folder_acl",
                "folder_id": folder_id,
                "principal_kind": kind,
                "principal_id": principal,
                "permission": permission,
            }
            for kind, principal, folder_id in acl
            for permission in ("READ", "WRITE")
        ),
        *(
            {
                "type": "memory_file",
                "user_id": user_id,
                "folder_id": folders[user_id],
                "head_version": len(versions),
            }
            for user_id, versions in histories
        ),
        *(dict(version) for _, versions in histories for version in versions),
    ]
