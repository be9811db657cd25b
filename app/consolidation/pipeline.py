"""The consolidation pipeline the worker runs for each claim: the orchestration of its steps.

One claim: read the turns and the head profile (one short transaction, `snapshot`), decide the
operations with the language model (`model_calls`) or the offline rules (no transaction open),
check them against the change guard and fit the result to the space's budget (`sizing`), then
write the version and complete the jobs in one transaction (compare-and-set on the version
read). When the profile moved meanwhile, run again on the new head (rebase). Failures leave the
profile untouched and become typed `JobFailure`s. The worker that runs it lives in `runner`.

Metering and the model budget (`app.usage`): before each decision that would call the model,
one read of the company's budget and month's spend; once it is spent, the decision is the
offline engine's (`offline`) or the claim goes back to the queue until the next month
(`defer`). Every answered model call is recorded right after it; each finished run counts its
outcome in the transaction that finishes it (a failed one, in a transaction of its own).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Final

from opentelemetry.trace import Tracer
from sqlalchemy import CTE, ColumnElement, Select

from app.consolidation.guard import TooManyDeletions, guard_change
from app.consolidation.kinds import CONDENSATION
from app.consolidation.model_calls import (
    INVALID_OUTPUT,
    AnswerHook,
    CallKind,
    ModelCalls,
    Usage,
    model_failure,
)
from app.consolidation.prefilter import prefilter
from app.consolidation.rules import consolidate_with_rules
from app.consolidation.sizing import Change, SizeControl
from app.consolidation.snapshot import Snapshot, read_snapshot
from app.jobs.lifecycle import complete_jobs, completion_statement, defer_jobs
from app.jobs.queue import ClaimedJob, JobOutcome
from app.jobs.worker import JobFailure, JobHandler
from app.kit.config import Settings
from app.kit.db.engine import Database
from app.kit.errors import NotFound
from app.kit.llm import ChatModel, ChatUsage, ModelError
from app.kit.observability import Metrics
from app.kit.tokens import TokenCounters
from app.kit.tracing import NO_TRACER
from app.profiles.document import Operation, OperationError, OpKind, ProfileFormatError, apply
from app.profiles.errors import VersionConflict
from app.profiles.service import retention_cte, retention_params, save_consolidation
from app.profiles.versions import ExpectedHead, VersionPolicy, VersionSource
from app.usage import repository as usage_counts
from app.usage.budget import BudgetStatus, period_of
from app.usage.recorder import BudgetWatch, UsageRecorder
from app.usage.repository import CountKey

logger = logging.getLogger("app.consolidation")

MAX_REBASES: Final = 3
RULES_ENGINE: Final = "offline-rules"
"""Recorded as the model of versions written by the offline rule-based consolidator."""
LEASE_LOST: Final = "lease_lost"
DEFERRED: Final = "deferred"
"""The outcome of a claim put back until the company's model budget renews."""

CHANGE_GUARD: Final = "change_guard"
VERSION_CONFLICT: Final = "version_conflict"
_UNFIT_OPERATIONS_MESSAGE: Final = (
    "The language model's operations do not fit the memory profile; the memory is unchanged."
)
_CHANGE_GUARD_MESSAGE: Final = (
    "The consolidation would delete more of the memory than one update may without the user "
    "asking to forget; the memory is unchanged."
)
_CONFLICT_MESSAGE: Final = "The memory kept changing during consolidation; it will be retried."


def finish_statement(*, retention: bool) -> Select[int]:
    """What finishes a run, ONE statement: the claim's completion (`complete_jobs`), the run's
    count and, after a version was written, retention (`retention_cte`), each only when the
    claim was still held."""

    def riders(completed: ColumnElement[bool]) -> tuple[CTE, ...]:
        counted = usage_counts.add_counts_cte(completed)
        return (counted, retention_cte(completed)) if retention else (counted,)

    return completion_statement(riders)


FINISH_STATEMENTS: Final = {
    retention: finish_statement(retention=retention) for retention in (False, True)
}
"""By whether a version was written."""


class _LeaseLost(Exception):
    """Raised inside the write transaction to roll it back: the claim is no longer ours."""


@dataclass(frozen=True)
class _Engine:
    """How a decision is made: with the model (`model_calls`) or by the offline rules."""

    model_calls: ModelCalls | None
    size_control: SizeControl

    @property
    def offline(self) -> bool:
        return self.model_calls is None


def make_consolidation_handler(
    database: Database,
    settings: Settings,
    chat_model: ChatModel | None,
    metrics: Metrics,
    tokens: TokenCounters,
) -> JobHandler:
    """The worker's handler: `chat_model` None means the offline rule-based consolidator."""
    return ConsolidationPipeline(database, settings, chat_model, metrics, tokens).run


class ConsolidationPipeline:
    """Runs claims (see the module docstring). Holds no state between claims. Its steps are
    spans of `tracer` (the budget check, the read, the decision, the write), under the run's."""

    def __init__(  # noqa: PLR0913 - `tracer` is optional, by keyword
        self,
        database: Database,
        settings: Settings,
        chat_model: ChatModel | None,
        metrics: Metrics,
        tokens: TokenCounters,
        *,
        tracer: Tracer = NO_TRACER,
    ) -> None:
        self.database = database
        self.settings = settings
        self.metrics = metrics
        self.tokens = tokens
        self.tracer = tracer
        self.recorder = UsageRecorder(database)
        self.budget = BudgetWatch(database, metrics)
        self.policy = VersionPolicy(
            tokens.stored,
            settings.memory_max_versions,
            on_policy_actions=metrics.observe_memory_policy_actions,
            tracer=tracer,
        )
        self.clock = self.policy.clock
        self.offline = _Engine(None, SizeControl(None, metrics, tokens))
        if chat_model is None:
            self.engine = self.offline
        else:
            model_calls = ModelCalls(
                chat_model, settings, metrics, tokens, clock=self.clock, tracer=tracer
            )
            self.engine = _Engine(model_calls, SizeControl(model_calls, metrics, tokens))

    async def run(self, claimed: ClaimedJob, lease_lost: asyncio.Event) -> str:
        """Consolidate the claim; returns `noop`, `updated`, `deferred` or `lease_lost` after
        committing. A run that fails is counted (`consolidations_failed`) before it raises."""
        try:
            return await self._run(claimed, lease_lost)
        except Exception:
            await self.recorder.count(
                claimed.company_id, self.clock().date(), "consolidations_failed"
            )
            raise

    async def _run(self, claimed: ClaimedJob, lease_lost: asyncio.Event) -> str:
        """Rebases at most `MAX_REBASES` times; then the jobs fail retryably (`version_conflict`).

        The budget is read with the snapshot (one round trip for both), before each decision
        that would call the model, so a company goes past its budget by at most the calls of
        decisions already past that read (one decision: the gate, the update call and its one
        retry on a cut-off answer, and a condensation), in each run in flight.
        """
        for attempt in range(MAX_REBASES + 1):
            try:
                snapshot = await self._read(claimed, attempt)
            except NotFound:  # the memory was deleted (opt-out) after the job was queued
                return await self._finish_noop(claimed, Usage(), "memory gone")
            if snapshot is None:
                return await self._finish_noop(claimed, Usage(), "memory off or turns gone")
            engine, status = self.engine, None
            if not engine.offline:
                status = await self._check_budget(claimed.company_id, snapshot.model_budget)
            usage = Usage(on_answer=self._metering(claimed.company_id, status is not None))
            if status is not None and status.exhausted:
                if status.budget.when_spent == "defer":
                    return await self._defer(claimed, status.period.end_instant)
                engine, usage.offline = self.offline, True
                usage.calls.append("budget=spent")
            try:
                with self.tracer.start_as_current_span("decide") as span:
                    span.set_attribute("context_memory.engine", _engine_name(engine))
                    change = await self._decide(claimed, snapshot, usage, engine)
                    span.set_attribute("context_memory.calls", usage.calls)
            except ModelError as error:
                raise model_failure(error) from None
            if change is None:
                return await self._finish_noop(claimed, usage, "nothing to change")
            if lease_lost.is_set():
                return LEASE_LOST
            try:
                return await self._write(claimed, snapshot, change, usage, engine)
            except VersionConflict:
                if attempt == MAX_REBASES:
                    break
                self.metrics.rebases.inc()
                logger.info("profile moved; rebasing", extra={"job_id": _job_ids(claimed)})
            except NotFound:
                return await self._finish_noop(claimed, usage, "memory gone")
        raise JobFailure(VERSION_CONFLICT, _CONFLICT_MESSAGE, retryable=True)

    async def _read(self, claimed: ClaimedJob, attempt: int) -> Snapshot | None:
        """The read step (`read_snapshot`), a span saying what it found."""
        with self.tracer.start_as_current_span("read snapshot") as span:
            span.set_attribute("context_memory.rebase", attempt)
            period = period_of(self.clock().date())
            snapshot = await read_snapshot(self.database, claimed, self.settings.llm_model, period)
            if snapshot is not None:
                span.set_attribute("context_memory.profile.version", snapshot.version)
                span.set_attribute("context_memory.turns", len(snapshot.turn_ids))
                span.set_attribute("gen_ai.request.model", snapshot.model)
            return snapshot

    # --- metering and the budget ---------------------------------------------------------------

    async def _check_budget(
        self, company_id: str, status: BudgetStatus | None
    ) -> BudgetStatus | None:
        """The company's model budget before a decision that would call the model, as the read
        step read it (its gauge and alerts updated), a span."""
        with self.tracer.start_as_current_span("model budget") as span:
            await self.budget.observe(company_id, status)
            span.set_attribute("context_memory.budget.limited", status is not None)
            if status is not None:
                span.set_attribute("context_memory.budget.exhausted", status.exhausted)
                span.set_attribute("context_memory.budget.when_spent", status.budget.when_spent)
            return status

    def _metering(self, company_id: str, budgeted: bool) -> AnswerHook:
        """Records each answered call of the company's run, right after it (its own
        transaction); then, when the company has a budget, lets the budget watch see the new
        spend (gauge and alerts)."""

        async def answered(kind: CallKind, billed: ChatUsage) -> None:
            day = self.clock().date()
            await self.recorder.model_call(company_id, day, kind, billed)
            if not budgeted:
                return
            try:
                await self.budget.check(company_id, day)
            except Exception:  # the alert is checked again before the next decision
                logger.warning("model budget check failed after a model call", exc_info=True)

        return answered

    async def _defer(self, claimed: ClaimedJob, run_after: datetime) -> str:
        """The company's budget is spent and it chose `defer`: the claim goes back to the
        queue, to run when the next period starts; its attempt does not count."""
        try:
            async with self.database.sessionmaker() as session, session.begin():
                if not await defer_jobs(session, claimed, run_after):
                    raise _LeaseLost
                await usage_counts.add_counts(session, self._counts(claimed, DEFERRED))
        except _LeaseLost:
            return LEASE_LOST
        logger.info(
            "consolidation deferred until %s: the company's model budget is spent",
            run_after.isoformat(),
            extra={"job_id": _job_ids(claimed), "outcome": DEFERRED},
        )
        return DEFERRED

    def _counts(
        self, claimed: ClaimedJob, outcome: str, *, offline: bool = False
    ) -> dict[CountKey, int]:
        """The run's outcome in the company's day, counted with what finishes the run."""
        company_id, day = claimed.company_id, self.clock().date()
        counts = {(company_id, day, f"consolidations_{outcome}"): 1}
        if offline:
            counts[(company_id, day, "consolidations_offline")] = 1
        return counts

    # --- decide (no transaction open) ----------------------------------------------------------

    async def _decide(
        self, claimed: ClaimedJob, snapshot: Snapshot, usage: Usage, engine: _Engine
    ) -> Change | None:
        now = self.clock()
        size_control = engine.size_control
        if claimed.kind == CONDENSATION:
            if size_control.fits(snapshot.profile, snapshot):
                return None
            unfitted = Change(snapshot.profile, (), "condensation")
            return await size_control.fit(snapshot, unfitted, usage)
        operations, forget_requested = await self._operations(snapshot, usage, engine)
        if not operations:
            return None
        try:
            updated = apply(snapshot.profile, operations, now)
        except (OperationError, ProfileFormatError):
            raise JobFailure(INVALID_OUTPUT, _UNFIT_OPERATIONS_MESSAGE, retryable=False) from None
        if updated.sections == snapshot.profile.sections:
            return None
        share = self.settings.memory_change_guard_share
        try:
            guard_change(snapshot.profile, operations, forget_requested, share)
        except TooManyDeletions:
            raise JobFailure(CHANGE_GUARD, _CHANGE_GUARD_MESSAGE, retryable=False) from None
        unfitted = Change(updated, tuple(operations), "consolidation")
        return await size_control.fit(snapshot, unfitted, usage)

    async def _operations(
        self, snapshot: Snapshot, usage: Usage, engine: _Engine
    ) -> tuple[list[Operation], bool]:
        """The operations for the exchanges and whether the user asked to forget something.

        Whether the user asked to forget is always read by the offline engine's parser (a
        deterministic reading of the user's own words), never taken from a model's answer. With
        a model, the pre-filter (`prefilter`) decides from the same reading which calls are
        made: none, the operations call alone, or the gate first.
        """
        offline = engine.model_calls is None  # keeps what it cannot read; a model reads it
        rules = consolidate_with_rules(snapshot.profile, snapshot.exchanges, keep_unread=offline)
        if engine.model_calls is None:
            usage.calls.append(f"rules={rules.decision}")
            return list(rules.operations), rules.forget_requested
        gate = self.settings.consolidation_gate
        if self.settings.consolidation_prefilter:
            users = [exchange.user for exchange in snapshot.exchanges]
            decision = prefilter(users, rules.decision == "UPDATE", rules.forget_requested)
            self.metrics.consolidation_prefilter.labels(decision).inc()
            if decision == "noop":
                usage.calls.append("prefilter=NOOP")
                return [], rules.forget_requested
            gate = gate and decision == "gate"
        operations = await engine.model_calls.operations(snapshot, usage, gate=gate)
        return operations, rules.forget_requested

    # --- write ---------------------------------------------------------------------------------

    async def _write(
        self, claimed: ClaimedJob, snapshot: Snapshot, change: Change, usage: Usage, engine: _Engine
    ) -> str:
        """One transaction: the compare-and-set version write, retention, the jobs' completion
        and the run's count."""
        head = ExpectedHead(claimed.company_id, claimed.user_id, snapshot.version)
        source = self._source(claimed, snapshot, change, usage, engine)
        try:
            with self.tracer.start_as_current_span("write version") as span:
                span.set_attribute("context_memory.profile.expected_version", snapshot.version)
                span.set_attribute("context_memory.operations", len(change.operations))
                async with self.database.sessionmaker() as session, session.begin():
                    row = await save_consolidation(
                        session, head, change.profile, source, self.policy
                    )
                    version = None if row is None else row.version
                    outcome: JobOutcome = "noop" if row is None else "updated"
                    riders = usage_counts.counts_params(
                        self._counts(claimed, outcome, offline=usage.offline)
                    )
                    if row is not None:
                        riders |= retention_params(head, self.policy)
                    if not await complete_jobs(
                        session,
                        claimed,
                        outcome=outcome,
                        version=version,
                        statement=FINISH_STATEMENTS[row is not None],
                        riders=riders,
                    ):
                        raise _LeaseLost
                if version is not None:
                    span.set_attribute("context_memory.profile.version", version)
        except _LeaseLost:
            return LEASE_LOST
        self.metrics.consolidations.labels(outcome).inc()
        if row is not None:
            for op in change.operations:
                self.metrics.consolidation_operations.labels(op.kind.value).inc()
        counts = {kind.value: 0 for kind in OpKind}
        for op in change.operations:
            counts[op.kind.value] += 1
        logger.info(
            "consolidation %s: %s; operations %s; version %s (%s)",
            outcome,
            " ".join(usage.calls),
            " ".join(f"{kind}={n}" for kind, n in counts.items()),
            version,
            change.reason,
            extra={"job_id": _job_ids(claimed), "outcome": outcome},
        )
        return outcome

    def _source(
        self,
        claimed: ClaimedJob,
        snapshot: Snapshot,
        change: Change,
        usage: Usage,
        engine: _Engine,
    ) -> VersionSource:
        """The provenance stored with the version: the offline engine names itself as the
        model and spends no tokens; the newest job of the claim wrote it."""
        offline = engine.offline
        return VersionSource(
            reason=change.reason,
            operations=change.operations,
            source_turn_ids=snapshot.turn_ids,
            model=usage.model or (RULES_ENGINE if offline else None),
            tokens_in=None if offline else usage.tokens_in,
            tokens_out=None if offline else usage.tokens_out,
            job_id=claimed.jobs[-1].id,
        )

    async def _finish_noop(self, claimed: ClaimedJob, usage: Usage, why: str) -> str:
        """The jobs completed and the run counted: ONE statement, in autocommit (atomic on its
        own; no BEGIN and COMMIT around it)."""
        riders = usage_counts.counts_params(self._counts(claimed, "noop", offline=usage.offline))
        async with self.database.engine.connect() as conn:
            writer = await conn.execution_options(isolation_level="AUTOCOMMIT")
            completed = await complete_jobs(
                writer,
                claimed,
                outcome="noop",
                version=None,
                statement=FINISH_STATEMENTS[False],
                riders=riders,
            )
        if not completed:
            return LEASE_LOST
        self.metrics.consolidations.labels("noop").inc()
        logger.info(
            "consolidation noop (%s): %s",
            why,
            " ".join(usage.calls) or "no model call",
            extra={"job_id": _job_ids(claimed), "outcome": "noop"},
        )
        return "noop"


def _engine_name(engine: _Engine) -> str:
    return "offline-rules" if engine.offline else "model"


def _job_ids(claimed: ClaimedJob) -> str:
    return ",".join(str(job_id) for job_id in claimed.job_ids)
