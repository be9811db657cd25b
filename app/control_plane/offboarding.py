"""Offboarding a company: everything it holds erased, as a durable job with a receipt.

`request_offboarding` (the request's transaction) deletes the company's registry row, so that
operator writes to it are a 404 from then on, and queues a `company_offboardings` record with a
platform event naming the operator. `Offboarder.run` then erases the company table by table,
children first, each table's rows and their count committed together: a crash half-way leaves
the record `running` with the counts of the tables done, and the next run (the request's
process right after it answers, or any worker's maintenance step, `resume_step`) carries on
from there, deleting nothing twice and counting nothing twice. One process works on a record
at a time (its row lock, `SKIP LOCKED`). A pass over every table that finds nothing left ends
it: `done`, with a `company.offboarded` platform event holding the counts. Turns the company's
users send meanwhile are erased by the pass after them; after `MAX_PASSES` passes that each
found rows, the record stays `running` for the next run.

The record and the platform events name the company in `subject_company` and have no
`company_id` column: they survive it. A second request answers the same receipt.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from app.companies import repository as companies
from app.companies.errors import UnknownCompany
from app.companies.repository import OffboardingRecord
from app.control_plane.errors import NeverOffboarded
from app.kit.principal import Principal

logger = logging.getLogger("app.control_plane")

REQUESTED: Final = "company.offboarding_requested"
OFFBOARDED: Final = "company.offboarded"
MAX_PASSES: Final = 3
REGISTRY_TABLE: Final = "companies"
SERVICE_ACTOR: Final = ("service", "offboarding")
"""The actor (company, user) of the `company.offboarded` event: the service finished it; the
operator who asked is the actor of `company.offboarding_requested`."""


async def request_offboarding(
    session: AsyncSession, operator: Principal, company_id: str
) -> OffboardingRecord:
    """Queue the offboarding of a registered company (its registry row deleted now, in the
    request's transaction); an offboarding of it queued or finished already is answered as it
    is. A company never registered, and never offboarded, is `UnknownCompany`."""
    latest = await companies.select_latest_offboarding(session, company_id)
    if latest is not None and latest.status != "done":
        return latest
    if not await companies.delete_company_rows(session, REGISTRY_TABLE, company_id):
        # read again: a concurrent request that deleted the row has committed its record
        latest = await companies.select_latest_offboarding(session, company_id)
        if latest is None:
            raise UnknownCompany(company_id)
        return latest
    record = await companies.insert_offboarding(session, company_id, {REGISTRY_TABLE: 1})
    await companies.record_platform_event(
        session,
        company_id,
        actor=(operator.company_id, operator.user_id),
        action=REQUESTED,
        detail={"offboarding_id": str(record.id)},
    )
    return record


async def read_offboarding(session: AsyncSession, company_id: str) -> OffboardingRecord:
    """The receipt of the company's latest offboarding (404 when it was never offboarded)."""
    latest = await companies.select_latest_offboarding(session, company_id)
    if latest is None:
        raise NeverOffboarded(company_id)
    return latest


@dataclass(frozen=True)
class Offboarder:
    """Runs offboardings over `tables`: every company table, children first (a parent's
    cascade never deletes rows a count would miss)."""

    tables: Sequence[str]

    async def run(self, engine: AsyncEngine, offboarding_id: uuid.UUID) -> OffboardingRecord | None:
        """Erase the offboarding's company; the finished record, or None when another process
        holds it, it is done already, or rows kept arriving (see the module docstring)."""
        sessions = async_sessionmaker(engine, expire_on_commit=False)
        for passes in range(1, MAX_PASSES + 1):
            found = 0
            for table in self.tables:
                async with sessions() as session, session.begin():
                    claimed = await companies.claim_offboarding(session, offboarding_id)
                    if claimed is None:
                        return None
                    erased = await companies.delete_company_rows(
                        session, table, claimed.subject_company
                    )
                    if erased:
                        await companies.add_erased(session, offboarding_id, table, erased)
                found += erased
            if not found or passes == MAX_PASSES:
                break
        if found:
            logger.warning("offboarding %s: rows kept arriving; it resumes later", offboarding_id)
            return None
        async with sessions() as session, session.begin():
            claimed = await companies.claim_offboarding(session, offboarding_id)
            if claimed is None:
                return None
            done = await companies.finish_offboarding(session, offboarding_id, passes=passes)
            await companies.record_platform_event(
                session,
                done.subject_company,
                actor=SERVICE_ACTOR,
                action=OFFBOARDED,
                detail={"offboarding_id": str(done.id), "erased": done.erased},
            )
        logger.info(
            "company offboarded",
            extra={"offboarding_id": str(done.id), "rows": sum(done.erased.values())},
        )
        return done

    async def run_after_answer(self, engine: AsyncEngine, offboarding_id: uuid.UUID) -> None:
        """`run`, from the request that queued it, once its answer is sent: a failure (the
        database gone) is logged, and the worker's `resume_step` carries on later."""
        try:
            await self.run(engine, offboarding_id)
        except Exception:
            logger.warning(
                "offboarding %s stopped; the worker resumes it", offboarding_id, exc_info=True
            )

    async def resume_step(self, engine: AsyncEngine) -> int:
        """The worker's maintenance step: every unfinished offboarding run again (those
        another process holds are passed over); the offboardings finished."""
        async with async_sessionmaker(engine)() as session:
            unfinished = await companies.select_unfinished_offboardings(session)
        finished = 0
        for offboarding_id in unfinished:
            finished += await self.run(engine, offboarding_id) is not None
        return finished
