"""Loading a company export into an empty company, in the request's one transaction: all of the
stream or none of it.

The body is read as it arrives, one line at a time (`format.numbered_lines`), hashed, checked
line by line (`format.StreamReader`) and written in batches of its kind, so memory holds one
batch, not the company. Rows are inserted as they were exported, with three exceptions:

- profile versions are written one by one through the profile gate (`gate.write_screened`),
  as every version is: the company's memory policy (imported before them) screens each one,
  silently, and no value it keeps out reaches any stored version or its operations. Version
  numbers, provenance and times are the source's; a version whose every change the policy kept
  out is not written, as for any write;
- message, audit event and policy action ids are assigned here, in stream order;
- the import is recorded as one audit event `company.imported` with the stream's SHA-256 and
  counts, which is how a repeated import of the same stream is recognised, and registers the
  company (`import`) unless a platform operator registered it before.
"""

from __future__ import annotations

import hashlib
import logging
import typing
import uuid
from collections.abc import AsyncIterable, AsyncIterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from sqlalchemy.exc import DataError, DBAPIError, IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from app.companies.registry import register_company
from app.enablement import audit
from app.kit.db.errors import is_database_unavailable
from app.kit.principal import Principal
from app.portability import repository
from app.portability.errors import CompanyHoldsData, InvalidImportLine
from app.portability.format import (
    MAX_LINE_BYTES,
    StreamError,
    StreamReader,
    numbered_lines,
    read_object,
)
from app.portability.kinds import KINDS, MEMORY_FILE, MEMORY_VERSION, RECORD_TYPES, RecordKind
from app.profiles.document import Operation, OperationError, ProfileFormatError, parse
from app.profiles.gate import ProfileWrite, write_screened
from app.profiles.models import VERSION_REASONS
from app.profiles.versions import (
    HeadState,
    VersionPolicy,
    VersionReason,
    VersionRow,
    VersionSource,
    content_sha256,
)

_T = typing.TypeVar("_T")
logger = logging.getLogger("app.portability")

IMPORTED: Final = "company.imported"
"""The audit event of an import (target: the company), `new` = the outcome's summary."""

_KINDS_BY_NAME: Final = {kind.name: kind for kind in KINDS}
_REFUSALS: Final = {
    "23505": "repeats a record already in the stream",
    "23503": "refers to a record the stream does not hold before it",
    "23514": "breaks a rule of its table",
    "23502": "lacks a value its table requires",
    "22001": "holds a value too long for its column",
    "22003": "holds a number out of its column's range",
}


@dataclass(frozen=True)
class ImportOutcome:
    """What an import loaded (records by type, the stream's SHA-256); `replayed`: the same
    stream had been imported into the company before, and nothing was written now."""

    company_id: str
    sha256: str
    records: Mapping[str, int]
    replayed: bool = False

    def summary(self) -> dict[str, object]:
        return {"sha256": self.sha256, "records": dict(self.records)}


async def import_company(
    session: AsyncSession,
    actor: Principal,
    company_id: str,
    body: AsyncIterable[bytes],
    policy: VersionPolicy,
) -> ImportOutcome:
    """Load the export stream `body` into `company_id`, which must hold nothing yet.

    A company that holds data is a 409, unless its newest import was this very stream (same
    SHA-256): then the first import's outcome is answered again (`replayed`) and nothing is
    written. A line that cannot be loaded is a 422 naming it; the request's transaction then
    rolls everything back. Imports into one company are serialised by a lock.
    """
    await repository.lock_company_import(session, company_id)
    hashed = _Hashed(body)
    if await repository.company_holds_data(session, company_id):
        return await _replay(session, company_id, hashed)
    reader = StreamReader(company_id, RECORD_TYPES)
    loader = _Loader(session, company_id, policy)
    last = 0
    try:
        async for number, raw in numbered_lines(hashed.chunks(), MAX_LINE_BYTES):
            last = number
            accepted = reader.accept(number, read_object(number, raw))
            if accepted is not None:
                record_type, values = accepted
                await loader.add(number, _KINDS_BY_NAME[record_type.name], values)
        reader.finish(last)
        await loader.finish()
    except StreamError as exc:
        raise InvalidImportLine(exc) from None
    outcome = ImportOutcome(company_id, hashed.sha256(), _all_counts(reader.counts))
    entry = audit.AuditEntry(
        actor=audit.Actor.of(actor),
        action=IMPORTED,
        target_kind="company",
        target_id=company_id,
        old=None,
        new=outcome.summary(),
    )
    await audit.record_event(session, company_id, entry)
    await register_company(session, actor, company_id, company_id, "import")
    logger.info(
        "company imported",
        extra={"company_id": company_id, "records": sum(outcome.records.values())},
    )
    return outcome


class _Hashed:
    """The body, hashed (SHA-256) as it is read."""

    def __init__(self, body: AsyncIterable[bytes]) -> None:
        self._body = body
        self._digest = hashlib.sha256()

    async def chunks(self) -> AsyncIterator[bytes]:
        async for chunk in self._body:
            self._digest.update(chunk)
            yield chunk

    def sha256(self) -> str:
        return self._digest.hexdigest()


async def _replay(session: AsyncSession, company_id: str, hashed: _Hashed) -> ImportOutcome:
    refused = CompanyHoldsData(company_id)
    previous = await repository.newest_event(session, company_id, IMPORTED)
    if previous is None:
        raise refused
    async for _ in hashed.chunks():  # the whole body, counted by the size limit
        pass
    records = previous.get("records")
    if previous.get("sha256") != hashed.sha256() or not isinstance(records, dict):
        raise refused
    return ImportOutcome(company_id, hashed.sha256(), dict(records), replayed=True)


def _all_counts(counts: Mapping[str, int]) -> dict[str, int]:
    return {kind.name: counts.get(kind.name, 0) for kind in KINDS}


# --- the loader ---------------------------------------------------------------------------------


@dataclass
class _File:
    """A user's memory.md as the stream has it, and how far its history is written."""

    head_version: int
    updated_at: datetime | None
    last_line: int = 0
    last_version: int | None = None  # the stream's newest version seen
    written: VersionRow | None = None  # the newest version written (the gate's head)
    head_now: int | None = None  # the head number in the database (None: as inserted)


@dataclass
class _Loader:
    session: AsyncSession
    company_id: str
    policy: VersionPolicy
    pending: list[tuple[int, dict[str, object]]] = field(default_factory=list)
    pending_kind: RecordKind | None = None
    files: dict[str, _File] = field(default_factory=dict)
    versions_of: str | None = None

    async def add(self, line: int, kind: RecordKind, values: dict[str, object]) -> None:
        if kind is not self.pending_kind:
            await self._flush()
            self.pending_kind = kind
        if kind is MEMORY_VERSION:
            await self._version(line, values)
            return
        if kind is MEMORY_FILE:
            self._file(line, values)
        self.pending.append((line, values))
        if len(self.pending) >= kind.batch:
            await self._flush()

    async def finish(self) -> None:
        """Write what is pending and put every history's head number where the source had it."""
        await self._flush()
        for user_id, file in self.files.items():
            if file.head_now is None:
                continue  # no version written: the head is as inserted
            head = file.head_version
            written = None if file.written is None else file.written.version
            if file.last_version == head and written is not None and written < head:
                head = written  # the newest version was kept out whole: the head is the last kept
            await repository.set_head_version(
                self.session, self.company_id, user_id, head, file.updated_at
            )

    def _file(self, line: int, values: Mapping[str, object]) -> None:
        user_id = str(values["user_id"])
        if user_id in self.files:
            raise StreamError(line, f"a second memory_file of user {user_id!r}", "user_id")
        head = values.get("head_version", 0)
        updated_at = values.get("updated_at")
        self.files[user_id] = _File(
            head_version=head if isinstance(head, int) else 0,
            updated_at=updated_at if isinstance(updated_at, datetime) else None,
        )

    async def _flush(self) -> None:
        kind, batch = self.pending_kind, self.pending
        if kind is None or not batch:
            return
        self.pending = []
        rows = [values for _, values in batch]
        try:
            async with self.session.begin_nested():
                await repository.insert_rows(self.session, kind, self.company_id, rows)
        except (IntegrityError, DataError) as exc:
            if is_database_unavailable(exc):
                raise
            await self._locate(kind, batch)
            raise

    async def _locate(self, kind: RecordKind, batch: list[tuple[int, dict[str, object]]]) -> None:
        """The line of the first row of a refused batch the database refuses on its own."""
        for line, values in batch:
            try:
                async with self.session.begin_nested():
                    await repository.insert_rows(self.session, kind, self.company_id, [values])
            except (IntegrityError, DataError) as exc:
                if is_database_unavailable(exc):
                    raise
                raise StreamError(line, _refusal(exc)) from None

    async def _version(self, line: int, values: Mapping[str, object]) -> None:
        user_id, number = str(values["user_id"]), values["version"]
        assert isinstance(number, int)
        file = self.files.get(user_id)
        if file is None:
            raise StreamError(line, f"user {user_id!r} has no memory_file before it", "user_id")
        if user_id != self.versions_of and file.last_version is not None:
            raise StreamError(line, f"the versions of {user_id!r} are not together", "user_id")
        self.versions_of = user_id
        if number < 1 or (file.last_version is not None and number != file.last_version + 1):
            after = "" if file.last_version is None else f" after {file.last_version}"
            raise StreamError(line, f"version {number}{after}: versions are consecutive", "version")
        if number > file.head_version:
            raise StreamError(
                line, f"version {number} is past its memory_file's head_version", "version"
            )
        profile_write = _profile_write(line, user_id, values)
        if file.head_now != number - 1:
            await repository.set_head_version(self.session, self.company_id, user_id, number - 1)
        state = HeadState(self.company_id, user_id, number - 1, file.written)
        screening = await write_screened(self.session, state, profile_write, self.policy)
        file.last_version = number
        if screening.row is None:
            file.head_now = number - 1
            return
        created_at = values.get("created_at")
        if isinstance(created_at, datetime):
            await repository.set_version_time(
                self.session, self.company_id, user_id, number, created_at
            )
        file.written, file.head_now = screening.row, number


def _profile_write(line: int, user_id: str, values: Mapping[str, object]) -> ProfileWrite:
    """A stream's version as a write for the gate, or `StreamError` for what is wrong with it."""
    content = values["content"]
    assert isinstance(content, str)
    if values["sha256"] != content_sha256(content):
        raise StreamError(line, "sha256 is not the SHA-256 of content", "sha256")
    try:
        profile = parse(content)
    except ProfileFormatError as exc:
        raise StreamError(line, f"content is not a memory.md: {exc.detail}", "content") from None
    if profile.user_id != user_id:
        raise StreamError(line, "content's frontmatter names another user", "content")
    reason = values["reason"]
    if reason not in VERSION_REASONS or reason not in typing.get_args(VersionReason):
        raise StreamError(line, f"reason must be one of {list(VERSION_REASONS)}", "reason")
    try:
        operations = tuple(Operation.from_json(op) for op in _objects(values.get("operations")))
    except (OperationError, TypeError) as exc:
        raise StreamError(line, f"operations: {exc}", "operations") from None
    turns = values.get("source_turn_ids", [])
    if not isinstance(turns, list) or not all(isinstance(turn, str) for turn in turns):
        raise StreamError(line, "source_turn_ids must be a list of strings", "source_turn_ids")
    job_id = values.get("job_id")
    source = VersionSource(
        typing.cast(VersionReason, reason),
        operations=operations,
        source_turn_ids=tuple(turns),
        model=_optional(values, "model", str),
        tokens_in=_optional(values, "tokens_in", int),
        tokens_out=_optional(values, "tokens_out", int),
        job_id=job_id if isinstance(job_id, uuid.UUID) else None,
    )
    return ProfileWrite(profile, source)


def _optional(values: Mapping[str, object], name: str, kind: type[_T]) -> _T | None:
    value = values.get(name)
    return value if isinstance(value, kind) else None


def _objects(value: object) -> list[Mapping[str, object]]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, dict) for item in value):
        raise TypeError("must be a list of objects")
    return value


def _refusal(exc: DBAPIError) -> str:
    """Why the database refused a row, by its SQLSTATE and constraint (never the values)."""
    sqlstate = getattr(exc.orig, "sqlstate", None)
    constraint = None
    cause: BaseException | None = exc.orig
    while cause is not None and constraint is None:
        constraint = getattr(cause, "constraint_name", None)
        cause = cause.__cause__
    what = _REFUSALS.get(str(sqlstate), "was refused by the database")
    return f"{what} ({constraint})" if constraint else what
