"""The consolidation pipeline the worker runs for each claim: the orchestration of its steps.

One claim: read the turns and the head profile (one short transaction, `snapshot`), decide the
operations with the language model (`model_calls`) or the offline rules (no transaction open),
check them against the change guard and fit the result to the space's budget (`sizing`), then
write the version and complete the jobs in one transaction (compare-and-set on the version
read). When the profile moved meanwhile, run again on the new head (rebase). Failures leave the
profile untouched and become typed `JobFailure`s. The worker that runs it lives in `runner`.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from app.config import Settings
from app.consolidation.guard import TooManyDeletions, guard_change
from app.consolidation.kinds import CONDENSATION
from app.consolidation.model_calls import INVALID_OUTPUT, ModelCalls, Usage, model_failure
from app.consolidation.prefilter import prefilter
from app.consolidation.rules import consolidate_with_rules
from app.consolidation.sizing import Change, SizeControl
from app.consolidation.snapshot import Snapshot, read_snapshot
from app.db import Database
from app.errors import NotFound
from app.jobs.lifecycle import complete_jobs
from app.jobs.queue import ClaimedJob, JobOutcome
from app.jobs.worker import JobFailure, JobHandler
from app.llm import ChatModel, ModelError
from app.observability import Metrics
from app.profiles.document import Operation, OperationError, OpKind, ProfileFormatError, apply
from app.profiles.service import prune_versions, save_consolidation
from app.profiles.versions import ExpectedHead, VersionConflict, VersionPolicy, VersionSource
from app.tokens import TokenCounters

logger = logging.getLogger("app.consolidation")

MAX_REBASES: Final = 3
RULES_ENGINE: Final = "offline-rules"
"""Recorded as the model of versions written by the offline rule-based consolidator."""
LEASE_LOST: Final = "lease_lost"

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


class _LeaseLost(Exception):
    """Raised inside the write transaction to roll it back: the claim is no longer ours."""


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
    """Runs claims (see the module docstring). Holds no state between claims."""

    def __init__(
        self,
        database: Database,
        settings: Settings,
        chat_model: ChatModel | None,
        metrics: Metrics,
        tokens: TokenCounters,
    ) -> None:
        self.database = database
        self.settings = settings
        self.metrics = metrics
        self.tokens = tokens
        self.policy = VersionPolicy(
            tokens.stored,
            settings.memory_max_versions,
            on_policy_actions=metrics.observe_memory_policy_actions,
        )
        self.clock = self.policy.clock
        self.model_calls = (
            None
            if chat_model is None
            else ModelCalls(chat_model, settings, metrics, tokens, clock=self.clock)
        )
        self.size_control = SizeControl(self.model_calls, metrics, tokens)

    async def run(self, claimed: ClaimedJob, lease_lost: asyncio.Event) -> str:
        """Consolidate the claim; returns `noop`, `updated` or `lease_lost` after committing.

        Rebases at most `MAX_REBASES` times; then the jobs fail retryably (`version_conflict`).
        """
        for attempt in range(MAX_REBASES + 1):
            usage = Usage()
            try:
                snapshot = await read_snapshot(self.database, claimed, self.settings.llm_model)
            except NotFound:  # the memory was deleted (opt-out) after the job was queued
                return await self._finish_noop(claimed, usage, "memory gone")
            if snapshot is None:
                return await self._finish_noop(claimed, usage, "memory off or turns gone")
            try:
                change = await self._decide(claimed, snapshot, usage)
            except ModelError as error:
                raise model_failure(error) from None
            if change is None:
                return await self._finish_noop(claimed, usage, "nothing to change")
            if lease_lost.is_set():
                return LEASE_LOST
            try:
                return await self._write(claimed, snapshot, change, usage)
            except VersionConflict:
                if attempt == MAX_REBASES:
                    break
                self.metrics.rebases.inc()
                logger.info("profile moved; rebasing", extra={"job_id": _job_ids(claimed)})
            except NotFound:
                return await self._finish_noop(claimed, usage, "memory gone")
        raise JobFailure(VERSION_CONFLICT, _CONFLICT_MESSAGE, retryable=True)

    # --- decide (no transaction open) ----------------------------------------------------------

    async def _decide(self, claimed: ClaimedJob, snapshot: Snapshot, usage: Usage) -> Change | None:
        now = self.clock()
        if claimed.kind == CONDENSATION:
            if self.size_control.fits(snapshot.profile, snapshot):
                return None
            unfitted = Change(snapshot.profile, (), "condensation")
            return await self.size_control.fit(snapshot, unfitted, usage)
        operations, forget_requested = await self._operations(snapshot, usage)
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
        return await self.size_control.fit(snapshot, unfitted, usage)

    async def _operations(self, snapshot: Snapshot, usage: Usage) -> tuple[list[Operation], bool]:
        """The operations for the exchanges and whether the user asked to forget something.

        Whether the user asked to forget is always read by the offline engine's parser (a
        deterministic reading of the user's own words), never taken from a model's answer. With
        a model, the pre-filter (`prefilter`) decides from the same reading which calls are
        made: none, the operations call alone, or the gate first.
        """
        rules = consolidate_with_rules(snapshot.profile, snapshot.exchanges)
        if self.model_calls is None:
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
        operations = await self.model_calls.operations(snapshot, usage, gate=gate)
        return operations, rules.forget_requested

    # --- write ---------------------------------------------------------------------------------

    async def _write(
        self, claimed: ClaimedJob, snapshot: Snapshot, change: Change, usage: Usage
    ) -> str:
        """One transaction: the compare-and-set version write, retention, the jobs' completion."""
        head = ExpectedHead(claimed.company_id, claimed.user_id, snapshot.version)
        source = self._source(claimed, snapshot, change, usage)
        try:
            async with self.database.sessionmaker() as session, session.begin():
                row = await save_consolidation(session, head, change.profile, source, self.policy)
                if row is not None:
                    await prune_versions(session, head, self.policy)
                version = None if row is None else row.version
                outcome: JobOutcome = "noop" if row is None else "updated"
                if not await complete_jobs(session, claimed, outcome=outcome, version=version):
                    raise _LeaseLost
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
        self, claimed: ClaimedJob, snapshot: Snapshot, change: Change, usage: Usage
    ) -> VersionSource:
        """The provenance stored with the version: the offline engine names itself as the
        model and spends no tokens; the newest job of the claim wrote it."""
        offline = self.model_calls is None
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
        try:
            async with self.database.sessionmaker() as session, session.begin():
                if not await complete_jobs(session, claimed, outcome="noop", version=None):
                    raise _LeaseLost
        except _LeaseLost:
            return LEASE_LOST
        self.metrics.consolidations.labels("noop").inc()
        logger.info(
            "consolidation noop (%s): %s",
            why,
            " ".join(usage.calls) or "no model call",
            extra={"job_id": _job_ids(claimed), "outcome": "noop"},
        )
        return "noop"


def _job_ids(claimed: ClaimedJob) -> str:
    return ",".join(str(job_id) for job_id in claimed.job_ids)
