"""The company export: everything the service holds for one company, as the NDJSON stream of
`format.py`, read from one consistent snapshot.

The snapshot is a REPEATABLE READ, READ ONLY transaction on a connection of its own, opened
before the response starts (so a database outage is still a 503) and read into a spool
(`app.kit.spool`) as fast as the database serves it, which the response sends at the client's
pace: every table is read through it, so the stream shows the company at one instant, whatever
is written meanwhile, and the connection is given back once the snapshot is read, however
slowly the client reads. Each table is read with a server-side cursor, `kind.batch` rows at a
time, and each batch is written before the next is fetched: memory holds one batch (at most
`kinds.TEXT_BATCH` rows of chat text or profile versions), never the company.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

from app.enablement import audit
from app.kit.db.engine import Database
from app.kit.principal import Principal
from app.kit.snapshots import begin_snapshot, end_snapshot
from app.kit.spool import Spool
from app.portability import repository
from app.portability.format import FORMAT_VERSION, header_line, record_line, trailer_line
from app.portability.kinds import KINDS, RECORD_TYPES

EXPORTED: Final = "company.exported"
"""The audit event of an export (target: the company): who read the company's data, when."""

logger = logging.getLogger("app.portability")


@dataclass
class CompanySnapshot:
    """An open snapshot of one company; `lines()` streams it, `close()` ends it (always call
    it, also when the client went away half-way)."""

    company_id: str
    exported_at: datetime
    connection: AsyncConnection
    counts: dict[str, int] = field(default_factory=dict)
    _closed: bool = False

    async def lines(self) -> AsyncGenerator[bytes]:
        """The header, every record kind in stream order, then the trailer with the counts.

        A failure half-way ends the stream without its trailer, which is how a reader (and
        the import) tells a cut stream from a complete one; the status was sent already.
        """
        yield header_line(self.company_id, self.exported_at, RECORD_TYPES)
        for kind in KINDS:
            statement = repository.company_rows(kind, self.company_id)
            result = await self.connection.stream(
                statement, execution_options={"yield_per": kind.batch}
            )
            count = 0
            async for rows in result.partitions():
                count += len(rows)
                batch = bytearray()
                for row in rows:  # one line at a time: orjson's buffer of a line is ~12x its text
                    batch += record_line(kind.type, row._mapping)
                yield bytes(batch)
            self.counts[kind.name] = count
        yield trailer_line(self.counts)
        logger.info(
            "company exported",
            extra={"company_id": self.company_id, "records": sum(self.counts.values())},
        )

    async def write_to(self, spool: Spool) -> None:
        """The whole stream into `spool` (see `lines`)."""
        await spool.write_all(self.lines())

    async def close(self) -> None:
        """End the transaction and give the connection back (shielded: a client that went
        away cancels the response, not this)."""
        if self._closed:
            return
        self._closed = True
        await end_snapshot(self.connection)


async def open_snapshot(database: Database, company_id: str) -> CompanySnapshot:
    """Begin the export's snapshot of `company_id` on a connection of its own."""
    connection = await begin_snapshot(database)
    try:
        exported_at = await repository.snapshot_time(connection, company_id)
    except BaseException:
        await end_snapshot(connection)
        raise
    return CompanySnapshot(company_id, exported_at, connection)


async def start_export(
    session: AsyncSession, database: Database, actor: Principal, company_id: str
) -> CompanySnapshot:
    """Audit the export in the request's transaction (committed before the stream starts) and
    open its snapshot, which the caller must close."""
    await _record_export(session, actor, company_id)
    return await open_snapshot(database, company_id)


async def _record_export(session: AsyncSession, actor: Principal, company_id: str) -> None:
    entry = audit.AuditEntry(
        actor=audit.Actor.of(actor),
        action=EXPORTED,
        target_kind="company",
        target_id=company_id,
        old=None,
        new={"format_version": FORMAT_VERSION},
    )
    await audit.record_event(session, company_id, entry)
