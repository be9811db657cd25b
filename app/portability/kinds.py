"""What a company export holds: one record type per table, in the order an import loads them,
each with its fields derived from the table's columns (all of them but `company_id`, which the
stream names once in its header, and the ids the target assigns itself).

Not exported: jobs (the queue's work in flight, which names the source's workers and leases),
when the source's queue last served the company (`job_company_claims`), idempotency records
(a client's retries, kept a day), the company's rate-limit overrides and model budget
(`company_rate_limits`, `company_model_budgets`: they measure what a deployment can serve and
spend, and its operators set them there), its usage (`usage_daily_counts`,
`usage_daily_model_calls`, `model_budget_crossings`: what the source deployment served and billed
stays with its bill), the quota marks (`user_quota_marks`, `company_quota_marks`: the target's
worker measures them again), and the company's registration (`companies`: the import registers
the company in the target's registry). Versions keep the id of the job that wrote them as
provenance.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Integer,
    String,
    Table,
    Uuid,
)

from app.conversations.models import ChatMessage, Turn
from app.enablement.models import (
    AuditEvent,
    CompanyFeatureFlag,
    CompanyMemoryPolicy,
    SpaceSettings,
    UserSettings,
)
from app.folders.models import Folder, FolderAclEntry
from app.kit.db.base import Base
from app.portability.format import FieldSpec, FieldType, RecordType
from app.profiles.models import MemoryFile, MemoryPolicyAction, MemoryVersion

TEXT_BATCH: Final = 50
"""Rows of a table holding user text (messages, versions) read or written at a time: the
export's and the import's memory bound is this many of the largest such rows."""
SMALL_BATCH: Final = 1000


@dataclass(frozen=True)
class RecordKind:
    """A record type and the table it is stored in.

    `order_by`: the export's order (the primary key's, so the server walks its index);
    `renumbered`: identity columns left out of the stream, assigned by the target in stream
    order (which keeps the source's order); `batch`: rows per read or insert.
    """

    type: RecordType
    table: Table
    order_by: tuple[str, ...]
    renumbered: tuple[str, ...] = ()
    batch: int = SMALL_BATCH

    @property
    def name(self) -> str:
        return self.type.name


def _field_type(column: Column[object]) -> FieldType:
    kind = column.type
    if isinstance(kind, Boolean):
        return FieldType.BOOLEAN
    if isinstance(kind, Integer):
        return FieldType.INTEGER
    if isinstance(kind, DateTime):
        return FieldType.TIMESTAMP
    if isinstance(kind, Uuid):
        return FieldType.UUID
    if isinstance(kind, JSON):  # JSONB too
        return FieldType.JSON
    if isinstance(kind, String):
        return FieldType.TEXT
    raise TypeError(f"{column.table.name}.{column.name}: no export form for {kind!r}")


def _field(column: Column[object]) -> FieldSpec:
    length = column.type.length if isinstance(column.type, String) else None
    return FieldSpec(
        name=column.name,
        type=_field_type(column),
        nullable=bool(column.nullable),
        required=not column.nullable and column.server_default is None,
        max_length=length,
        integer_bits=64 if isinstance(column.type, BigInteger) else 32,
    )


def table_of(model: type[Base]) -> Table:
    table = model.__table__
    assert isinstance(table, Table)
    return table


def _kind(
    name: str,
    model: type[Base],
    order_by: tuple[str, ...],
    *,
    renumbered: tuple[str, ...] = (),
    batch: int = SMALL_BATCH,
) -> RecordKind:
    table = table_of(model)
    left_out = {"company_id", *renumbered}
    fields = tuple(_field(column) for column in table.columns if column.name not in left_out)
    return RecordKind(RecordType(name, fields), table, order_by, renumbered, batch)


FEATURE_FLAG = _kind("feature_flag", CompanyFeatureFlag, ("flag",))
MEMORY_POLICY = _kind("memory_policy", CompanyMemoryPolicy, ())
SPACE = _kind("space", SpaceSettings, ("space_id",))
USER_SETTINGS = _kind("user_settings", UserSettings, ("user_id",))
FOLDER = _kind("folder", Folder, ("path",))  # a parent's path is a prefix: parents first
FOLDER_ACL = _kind(
    "folder_acl", FolderAclEntry, ("folder_id", "principal_kind", "principal_id", "permission")
)
MEMORY_FILE = _kind("memory_file", MemoryFile, ("user_id",))
MEMORY_POLICY_ACTION = _kind(
    "memory_policy_action", MemoryPolicyAction, ("id",), renumbered=("id",)
)
MEMORY_VERSION = _kind("memory_version", MemoryVersion, ("user_id", "version"), batch=TEXT_BATCH)
TURN = _kind("turn", Turn, ("id",))
MESSAGE = _kind("message", ChatMessage, ("id",), renumbered=("id",), batch=TEXT_BATCH)
AUDIT_EVENT = _kind("audit_event", AuditEvent, ("id",), renumbered=("id",))

KINDS: Final[tuple[RecordKind, ...]] = (
    FEATURE_FLAG,
    MEMORY_POLICY,  # before any version: the import screens versions with it
    SPACE,
    USER_SETTINGS,
    FOLDER,
    FOLDER_ACL,
    MEMORY_FILE,
    MEMORY_POLICY_ACTION,  # the source's record first, then what the import's screening adds
    MEMORY_VERSION,
    TURN,
    MESSAGE,
    AUDIT_EVENT,
)
"""Every record kind, in stream order: a record refers only to records of kinds before it."""

RECORD_TYPES: Final = tuple(kind.type for kind in KINDS)
NOT_EXPORTED: Final = frozenset(
    {
        "jobs",
        "job_company_claims",
        "idempotency_keys",
        "company_rate_limits",
        "company_model_budgets",
        "usage_daily_counts",
        "usage_daily_model_calls",
        "model_budget_crossings",
        "user_quota_marks",
        "company_quota_marks",
        "companies",
    }
)
"""Company tables deliberately left out (see the module docstring)."""
