"""The worker: claims jobs from the queue and runs them, several users at once.

Domains register a handler per job kind (and which kinds coalesce) and the periodic maintenance
steps they need; the worker knows nothing else of them.

Each of `WORKER_CONCURRENCY` slots loops: claim (one short transaction) → run the kind's handler
while a heartbeat task extends the lease → the handler commits its result together with
`complete_jobs` (fenced by the lease token) → on a failure, `fail_jobs` schedules a retry or
dead-letters. Each run is a span (`job <kind>`, from the claim to the outcome) in a trace of its
own, linked to the trace of every request that queued one of its jobs: one run serves several
turns. On shutdown (SIGTERM) slots stop claiming; running jobs get `shutdown_grace` seconds
to finish, then are cancelled and released back to the queue, so no attempt is lost or
double-counted.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from opentelemetry import trace
from opentelemetry.trace import SpanKind, Tracer
from sqlalchemy.ext.asyncio import AsyncEngine

from app.jobs.lifecycle import AttemptFailure, fail_jobs, heartbeat, release_jobs
from app.jobs.queue import ClaimedJob, ClaimPolicy, JobKind, claim_next_job
from app.jobs.repository import queue_stats
from app.jobs.wakeup import JobWakeups
from app.kit.observability import Metrics
from app.kit.tracing import NO_TRACER, links_to

logger = logging.getLogger("app.worker")

INTERNAL_ERROR_CLASS: Final = "internal_error"
INTERNAL_ERROR_MESSAGE: Final = "The worker failed unexpectedly; see the service logs."
UNKNOWN_KIND_CLASS: Final = "unknown_job_kind"
UNKNOWN_KIND_MESSAGE: Final = "No handler is registered for this kind of job."


class JobFailure(Exception):
    """A handler's typed failure, recorded as its `AttemptFailure` (whose contract says what
    `message` may hold: a fixed description, never user or model text)."""

    def __init__(
        self,
        error_class: str,
        message: str,
        *,
        retryable: bool,
        retry_after_seconds: float | None = None,
    ) -> None:
        super().__init__(message)
        self.failure = AttemptFailure(error_class, message, retryable, retry_after_seconds)


Maintenance = Callable[[AsyncEngine], Awaitable[int]]
"""A periodic housekeeping step (e.g. pruning expired idempotency keys); returns rows touched."""
MAINTENANCE_INTERVAL_SECONDS: Final = 300.0

JobHandler = Callable[[ClaimedJob, asyncio.Event], Awaitable[str]]
"""Runs one claim; returns the outcome after committing it: `noop` | `updated` with
`complete_jobs`, or `deferred` with `defer_jobs` (the claim put back for later, its attempt not
counted). The event is set when the lease was lost: stop and write nothing."""


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class WorkerConfig:
    """`coalesce`: the kinds whose waiting jobs of one owner are claimed together (up to
    `batch_size`); `worker_id` names this worker in the jobs it holds."""

    concurrency: int
    poll_seconds: float
    lease_seconds: float
    batch_size: int
    shutdown_grace_seconds: float = 10.0
    heartbeat_file: Path | None = None
    coalesce: frozenset[JobKind] = frozenset()
    worker_id: str = field(default_factory=default_worker_id)

    @property
    def claim_policy(self) -> ClaimPolicy:
        return ClaimPolicy(
            self.lease_seconds, self.batch_size, self.coalesce, candidates=self.concurrency
        )


class Worker:
    def __init__(  # noqa: PLR0913 - the last two are optional, by keyword
        self,
        engine: AsyncEngine,
        handlers: Mapping[JobKind, JobHandler],
        config: WorkerConfig,
        metrics: Metrics,
        *,
        maintenance: Sequence[Maintenance] = (),
        tracer: Tracer = NO_TRACER,
        wakeups: JobWakeups | None = None,
    ) -> None:
        """`handlers` run the jobs of their kind; `maintenance` steps run every few minutes;
        each run is a span of `tracer`; `wakeups` (started and closed by the caller) wake idle
        slots when jobs are queued, between their polls."""
        self.wakeups = wakeups
        self.engine = engine
        self.tracer = tracer
        self.maintenance = tuple(maintenance)
        self.handlers = dict(handlers)
        self.config = config
        self.metrics = metrics
        self.worker_id = config.worker_id
        self._stopping = asyncio.Event()
        self._running: set[asyncio.Task[None]] = set()

    def stop(self) -> None:
        """Stop claiming; running jobs finish within the grace period (see `run`)."""
        self._stopping.set()

    async def run(self) -> None:
        slots = [
            asyncio.create_task(self._slot(n), name=f"worker-slot-{n}")
            for n in range(self.config.concurrency)
        ]
        stats = asyncio.create_task(self._report_stats(), name="worker-stats")
        try:
            await self._stopping.wait()
        finally:
            stats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await stats
            await asyncio.gather(*slots, return_exceptions=True)

    async def run_once(self) -> ClaimedJob | None:
        """Claim and run at most one job (tests, and `worker --once` style tooling)."""
        claimed, claim_window = await self._claim()
        if claimed is not None:
            await self._execute(claimed, claim_window)
        return claimed

    async def _claim(self) -> tuple[ClaimedJob | None, tuple[int, int]]:
        """The claim, and when it started and ended (ns since the epoch: the run's span starts
        with the claim, which is only known to have been one once it returns a job)."""
        started = time.time_ns()
        claimed = await claim_next_job(self.engine, self.worker_id, self.config.claim_policy)
        return claimed, (started, time.time_ns())

    async def _slot(self, number: int) -> None:
        while not self._stopping.is_set():
            self._touch_heartbeat_file()
            # armed before the claim: a notification during a claim that finds nothing is kept
            woken = self.wakeups.armed() if self.wakeups is not None else None
            try:
                claimed, claim_window = await self._claim()
            except Exception:
                logger.exception("claiming a job failed; retrying after the poll interval")
                claimed = None
                woken = None
            if claimed is None:
                await self._idle(woken)
                continue
            task = asyncio.create_task(self._execute(claimed, claim_window), name=f"job-{number}")
            # cancelled after every job: a waiter left pending would pile up, one per job run
            stopping = asyncio.create_task(self._stopping.wait(), name=f"stop-waiter-{number}")
            self._running.add(task)
            try:
                await asyncio.wait({task, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if not task.done():  # shutting down: give it the grace period
                    await asyncio.wait({task}, timeout=self.config.shutdown_grace_seconds)
                if not task.done():
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    released = await release_jobs(self.engine, claimed)
                    logger.info("released %d job(s) on shutdown", released)
            finally:
                stopping.cancel()
                self._running.discard(task)

    async def _idle(self, woken: asyncio.Event | None) -> None:
        """Until the poll interval is over, the worker stops or `woken` is set."""
        waits = {asyncio.ensure_future(self._stopping.wait())}
        if woken is not None:
            waits.add(asyncio.ensure_future(woken.wait()))
        try:
            await asyncio.wait(
                waits, timeout=self.config.poll_seconds, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            for waiting in waits:
                waiting.cancel()

    async def _execute(self, claimed: ClaimedJob, claim_window: tuple[int, int]) -> None:
        lease_lost = asyncio.Event()
        beat = asyncio.create_task(self._keep_lease(claimed, lease_lost))
        span = self.tracer.start_span(
            f"job {claimed.kind}",
            kind=SpanKind.CONSUMER,
            links=links_to(parent for job in claimed.jobs for parent in job.trace_context),
            attributes=_job_attributes(claimed),
            start_time=claim_window[0],
        )
        with trace.use_span(span, end_on_exit=True):
            self.tracer.start_span("claim", start_time=claim_window[0]).end(claim_window[1])
            outcome = await self._run(claimed, lease_lost, beat)
            span.set_attribute("context_memory.job.outcome", outcome)

    async def _run(
        self, claimed: ClaimedJob, lease_lost: asyncio.Event, beat: asyncio.Task[None]
    ) -> str:
        started = time.perf_counter()
        outcome = "failed"
        try:
            handler = self.handlers.get(claimed.kind)
            if handler is None:
                raise JobFailure(UNKNOWN_KIND_CLASS, UNKNOWN_KIND_MESSAGE, retryable=False)
            outcome = await handler(claimed, lease_lost)
        except JobFailure as failure:
            outcome = await self._fail(claimed, failure)
        except asyncio.CancelledError:
            raise
        except Exception:
            logger.exception("job handler crashed", extra={"job_id": str(claimed.jobs[0].id)})
            outcome = await self._fail(
                claimed,
                JobFailure(INTERNAL_ERROR_CLASS, INTERNAL_ERROR_MESSAGE, retryable=True),
            )
        finally:
            beat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beat
        self.metrics.jobs.labels(claimed.kind, outcome).inc(len(claimed.jobs))
        logger.info(
            "job finished",
            extra={
                "job_id": ",".join(str(job.id) for job in claimed.jobs),
                "outcome": outcome,
                "duration_ms": round((time.perf_counter() - started) * 1000, 1),
            },
        )
        return outcome

    async def _fail(self, claimed: ClaimedJob, failure: JobFailure) -> str:
        return await fail_jobs(self.engine, claimed, failure.failure)

    async def _keep_lease(self, claimed: ClaimedJob, lease_lost: asyncio.Event) -> None:
        interval = max(self.config.lease_seconds / 3, 0.05)
        while True:
            await asyncio.sleep(interval)
            try:
                alive = await heartbeat(self.engine, claimed, self.config.lease_seconds)
            except Exception:
                logger.warning("heartbeat failed; will retry", exc_info=True)
                continue
            if not alive:
                lease_lost.set()
                return

    async def _report_stats(self) -> None:
        """Every few seconds: the heartbeat file (alive even while every slot is busy with a long
        job), the heartbeat gauge and the queue gauges, and every MAINTENANCE_INTERVAL_SECONDS
        the housekeeping steps."""
        last_maintenance = float("-inf")
        while True:
            self._touch_heartbeat_file()
            if time.monotonic() - last_maintenance >= MAINTENANCE_INTERVAL_SECONDS:
                last_maintenance = time.monotonic()
                await self._run_maintenance()
            stats = None
            try:
                stats = await queue_stats(self.engine)
            except Exception:
                logger.warning("queue statistics unavailable", exc_info=True)
            self.metrics.observe_worker_report(stats)
            await asyncio.sleep(max(self.config.poll_seconds * 5, 5.0))

    async def _run_maintenance(self) -> None:
        for step in self.maintenance:
            try:
                touched = await step(self.engine)
            except Exception:
                logger.warning("maintenance step %s failed", step.__name__, exc_info=True)
            else:
                logger.log(
                    logging.INFO if touched else logging.DEBUG,
                    "maintenance step %s touched %d row(s)",
                    step.__name__,
                    touched,
                )

    def _touch_heartbeat_file(self) -> None:
        if self.config.heartbeat_file is not None:
            with contextlib.suppress(OSError):
                self.config.heartbeat_file.touch()


def _job_attributes(claimed: ClaimedJob) -> dict[str, str | int | list[str]]:
    """What the run's span says of its claim: ids and counts, nothing of the owner."""
    return {
        "context_memory.job.kind": claimed.kind,
        "context_memory.job.ids": [str(job.id) for job in claimed.jobs],
        "context_memory.job.count": len(claimed.jobs),
        "context_memory.job.attempt": max(job.attempts for job in claimed.jobs),
    }


def heartbeat_is_fresh(path: Path, max_age_seconds: float) -> bool:
    """`worker --check`: the worker loop touched its heartbeat file recently."""
    try:
        return time.time() - path.stat().st_mtime <= max_age_seconds
    except OSError:
        return False
