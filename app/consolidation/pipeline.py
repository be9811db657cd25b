"""The consolidation pipeline the worker runs for each claim, and the worker's start and stop.

One claim: read the turns and the head profile (one short transaction), decide the operations
with the language model or the offline rules (no transaction open), validate them and fit the
result to the space's budget, then write the version and complete the jobs in one transaction
(compare-and-set on the version read). When the profile moved meanwhile, run again on the new
head (rebase). Failures leave the profile untouched and become typed `JobFailure`s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Final

from app.config import Settings
from app.consolidation.exchanges import select_exchanges
from app.consolidation.guard import TooManyDeletions, guard_change
from app.consolidation.kinds import CONDENSATION, CONSOLIDATION
from app.consolidation.prompts import (
    MalformedModelOutput,
    condensation_prompt,
    gate_prompt,
    operations_prompt,
    parse_gate,
    parse_operations,
    parse_rewrite,
    rewrite_prompt,
)
from app.consolidation.rules import Exchange, consolidate_with_rules
from app.db import Database
from app.enablement.service import load_enablement
from app.errors import NotFound
from app.jobs.queue import ClaimedJob, JobOutcome, JobRef, complete_jobs
from app.jobs.worker import JobFailure, JobHandler
from app.llm import (
    ChatModel,
    ChatRequest,
    ChatResult,
    ModelError,
    ModelOutputTruncated,
    resolve_model_name,
)
from app.observability import Metrics
from app.profiles.budget import truncate_to_budget
from app.profiles.document import (
    Operation,
    OperationError,
    OpKind,
    Profile,
    ProfileFormatError,
    apply,
    diff_operations,
    render_body,
)
from app.profiles.service import load_profile, save_consolidation
from app.profiles.versions import STORED_TOKEN_COUNTER, VersionConflict, WorkerReason
from app.tokens import TokenCounter

logger = logging.getLogger("app.consolidation")

MAX_REBASES: Final = 3
RULES_ENGINE: Final = "offline-rules"
"""Recorded as the model of versions written by the offline rule-based consolidator."""
GATE_MAX_TOKENS: Final = 16
CHANGE_MAX_TOKENS: Final = 4096
CONDENSATION_TARGET_SHARE: Final = 0.9
CONDENSATION_SLACK_TOKENS: Final = 512
LEASE_LOST: Final = "lease_lost"

INVALID_OUTPUT: Final = "invalid_model_output"
CHANGE_GUARD: Final = "change_guard"
OVERSIZED_OUTPUT: Final = "oversized_model_output"
MAX_CHARS_PER_OUTPUT_TOKEN: Final = 8
"""A token is a few characters; an answer longer than this many per allowed output token came
from a server that ignored the output limit and is refused unread."""
VERSION_CONFLICT: Final = "version_conflict"
_INVALID_OUTPUT_MESSAGE: Final = (
    "The language model's answer was not valid consolidation output; the memory is unchanged."
)
_UNFIT_OPERATIONS_MESSAGE: Final = (
    "The language model's operations do not fit the memory profile; the memory is unchanged."
)
_CHANGE_GUARD_MESSAGE: Final = (
    "The consolidation would delete more of the memory than one update may without the user "
    "asking to forget; the memory is unchanged."
)
_OVERSIZED_MESSAGE: Final = (
    "The language model's answer was far larger than its output limit; the memory is unchanged."
)
_CONFLICT_MESSAGE: Final = "The memory kept changing during consolidation; it will be retried."


class _LeaseLost(Exception):
    """Raised inside the write transaction to roll it back: the claim is no longer ours."""


@dataclass(frozen=True)
class Snapshot:
    """What the read step saw. The decision is made against it and written on `version`."""

    profile: Profile
    version: int
    exchanges: tuple[Exchange, ...]
    turn_ids: tuple[str, ...]
    budget: int
    model: str


@dataclass
class Usage:
    """Tokens spent on the model calls of one run, and the model that answered last."""

    tokens_in: int = 0
    tokens_out: int = 0
    model: str | None = None
    calls: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Change:
    """A new profile, ready to write, with the operations that produced it."""

    profile: Profile
    operations: tuple[Operation, ...]
    reason: WorkerReason


def _utc_now() -> datetime:
    return datetime.now(UTC)


def make_consolidation_handler(
    database: Database,
    settings: Settings,
    chat_model: ChatModel | None,
    metrics: Metrics,
    *,
    clock: Callable[[], datetime] = _utc_now,
) -> JobHandler:
    """The worker's handler: `chat_model` None means the offline rule-based consolidator."""
    return ConsolidationPipeline(database, settings, chat_model, metrics, clock=clock).run


class ConsolidationPipeline:
    """Runs claims (see the module docstring). Holds no state between claims."""

    def __init__(
        self,
        database: Database,
        settings: Settings,
        chat_model: ChatModel | None,
        metrics: Metrics,
        *,
        clock: Callable[[], datetime] = _utc_now,
    ) -> None:
        self.database = database
        self.settings = settings
        self.chat_model = chat_model
        self.metrics = metrics
        self.clock = clock

    async def run(self, claimed: ClaimedJob, lease_lost: asyncio.Event) -> str:
        """Consolidate the claim; returns `noop`, `updated` or `lease_lost` after committing.

        Rebases at most `MAX_REBASES` times; then the jobs fail retryably (`version_conflict`).
        """
        for attempt in range(MAX_REBASES + 1):
            usage = Usage()
            try:
                snapshot = await self._read(claimed)
            except NotFound:  # the memory was deleted (opt-out) after the job was queued
                return await self._finish_noop(claimed, usage, "memory gone")
            if snapshot is None:
                return await self._finish_noop(claimed, usage, "memory off or turns gone")
            try:
                change = await self._decide(claimed, snapshot, usage)
            except ModelError as error:
                raise _model_failure(error) from None
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

    # --- read ----------------------------------------------------------------------------------

    async def _read(self, claimed: ClaimedJob) -> Snapshot | None:
        """One short transaction. None when nothing is left to do (memory off, turns gone)."""
        company_id, user_id = claimed.company_id, claimed.user_id
        async with self.database.sessionmaker() as session, session.begin():
            budgets: dict[str, int | None] = {}  # per space; None where memory is off
            enabled: list[tuple[JobRef, int]] = []
            for job in claimed.jobs:
                space_id = _text(job.payload.get("space_id"))
                if space_id is None:
                    continue
                if space_id not in budgets:
                    context = await load_enablement(session, company_id, space_id, user_id)
                    budgets[space_id] = context.user_memory.max_tokens if context.enabled else None
                budget = budgets[space_id]
                if budget is not None:
                    enabled.append((job, budget))
            if not enabled:
                return None
            profile, version = await load_profile(session, company_id, user_id)
            turn_ids = [turn for job, _ in enabled for turn in _turn_ids(job)]
            found = await select_exchanges(session, company_id, user_id, turn_ids)
        if claimed.kind == CONSOLIDATION and not found:
            return None
        newest, budget = enabled[-1]  # the newest turn's space sets the budget and the model
        return Snapshot(
            profile=profile,
            version=version,
            exchanges=tuple(exchange for _, exchange in found),
            turn_ids=tuple(str(turn_id) for turn_id, _ in found),
            budget=budget,
            model=resolve_model_name(_text(newest.payload.get("model")) or self.settings.llm_model),
        )

    # --- decide (no transaction open) ----------------------------------------------------------

    async def _decide(self, claimed: ClaimedJob, snapshot: Snapshot, usage: Usage) -> Change | None:
        now = self.clock()
        if claimed.kind == CONDENSATION:
            if self._fits(snapshot.profile, snapshot):
                return None
            return await self._fit(snapshot, snapshot.profile, (), "condensation", usage)
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
        return await self._fit(snapshot, updated, operations, "consolidation", usage)

    async def _operations(self, snapshot: Snapshot, usage: Usage) -> tuple[list[Operation], bool]:
        """The operations for the exchanges and whether the user asked to forget something.

        Whether the user asked to forget is always read by the offline engine's parser (a
        deterministic reading of the user's own words), never taken from a model's answer.
        """
        rules = consolidate_with_rules(snapshot.profile, snapshot.exchanges)
        if self.chat_model is None:
            usage.calls.append(f"rules={rules.decision}")
            return list(rules.operations), rules.forget_requested
        operations = await self._model_operations(self.chat_model, snapshot, usage)
        return operations, rules.forget_requested

    async def _model_operations(
        self, chat_model: ChatModel, snapshot: Snapshot, usage: Usage
    ) -> list[Operation]:
        """The gate (only an explicit NOOP skips), then the configured strategy's call."""
        body, exchanges, now = render_body(snapshot.profile), snapshot.exchanges, self.clock()
        if self.settings.consolidation_gate:
            prompt = gate_prompt(body, exchanges, now)
            try:
                gate = await self._ask(
                    chat_model, snapshot, prompt, max_tokens=GATE_MAX_TOKENS, usage=usage
                )
            except ModelOutputTruncated:  # a long-winded gate answer is not an explicit NOOP
                usage.calls.append("gate=truncated")
            else:
                decision = parse_gate(gate.text)
                usage.calls.append(f"gate={decision}")
                if decision == "NOOP":
                    return []
        try:
            if self.settings.consolidation_strategy == "rewrite":
                prompt = rewrite_prompt(body, exchanges, now)
                limit = max(CHANGE_MAX_TOKENS, 2 * snapshot.budget)
                result = await self._ask(
                    chat_model, snapshot, prompt, max_tokens=limit, usage=usage
                )
                rewritten = parse_rewrite(result.text, snapshot.profile.user_id)
                usage.calls.append("rewrite=NOOP" if rewritten == "NOOP" else "rewrite=UPDATE")
                if rewritten == "NOOP":
                    return []
                return diff_operations(snapshot.profile, rewritten)
            prompt = operations_prompt(body, exchanges, now)
            result = await self._ask(
                chat_model,
                snapshot,
                prompt,
                max_tokens=CHANGE_MAX_TOKENS,
                usage=usage,
                json_mode=True,
            )
            reply = parse_operations(result.text)
        except MalformedModelOutput:
            raise JobFailure(INVALID_OUTPUT, _INVALID_OUTPUT_MESSAGE, retryable=False) from None
        usage.calls.append(f"operations={reply.decision}")
        return list(reply.operations)

    async def _ask(
        self,
        chat_model: ChatModel,
        snapshot: Snapshot,
        prompt: tuple[str, str],
        *,
        max_tokens: int,
        usage: Usage,
        json_mode: bool = False,
    ) -> ChatResult:
        system, user = prompt
        request = ChatRequest(
            model=snapshot.model,
            system=system,
            user=user,
            max_output_tokens=max_tokens,
            json_mode=json_mode,
        )
        result = await chat_model.complete(request)
        if len(result.text) > max_tokens * MAX_CHARS_PER_OUTPUT_TOKEN:
            raise JobFailure(OVERSIZED_OUTPUT, _OVERSIZED_MESSAGE, retryable=False)
        usage.tokens_in += result.tokens_in
        usage.tokens_out += result.tokens_out
        usage.model = result.model
        self.metrics.model_tokens.labels("in").inc(result.tokens_in)
        self.metrics.model_tokens.labels("out").inc(result.tokens_out)
        return result

    # --- size control --------------------------------------------------------------------------

    def _count(self, snapshot: Snapshot) -> Callable[[str], int]:
        """Tokens as the consolidation model counts them, but never fewer than the stored count
        the load path compares with the budget (else a profile could fit here and still queue
        condensations at every load)."""
        model_counter = TokenCounter(snapshot.model)
        if model_counter.encoding_name == STORED_TOKEN_COUNTER.encoding_name:
            return STORED_TOKEN_COUNTER.count
        return lambda text: max(model_counter.count(text), STORED_TOKEN_COUNTER.count(text))

    def _fits(self, profile: Profile, snapshot: Snapshot) -> bool:
        return self._count(snapshot)(render_body(profile)) <= snapshot.budget

    async def _fit(
        self,
        snapshot: Snapshot,
        profile: Profile,
        operations: Sequence[Operation],
        reason: WorkerReason,
        usage: Usage,
    ) -> Change:
        """Within budget as is; else condensed by the model; else (or still over) truncated.

        A consolidation keeps reason `consolidation` (its turn count advances); a condensation
        job records `condensation` or `truncation`, whichever step made it fit.
        """
        ops = list(operations)
        if self._fits(profile, snapshot):
            return Change(profile, tuple(ops), reason)
        condensed = await self._condense(snapshot, profile, usage)
        if condensed is not None:
            self.metrics.condensations.inc()
            ops += diff_operations(profile, condensed)
            profile = replace(condensed, frontmatter=profile.frontmatter, truncated=False)
        if not self._fits(profile, snapshot):
            cut = truncate_to_budget(profile, snapshot.budget, self._count(snapshot))
            self.metrics.truncations.inc()
            ops += diff_operations(profile, cut)
            profile = cut
            if reason == "condensation":
                reason = "truncation"
        return Change(profile, tuple(ops), reason)

    async def _condense(self, snapshot: Snapshot, profile: Profile, usage: Usage) -> Profile | None:
        """The model's condensed profile, or None (no model, or the condensation failed)."""
        if self.chat_model is None:
            return None
        budget = snapshot.budget
        target = max(1, int(budget * CONDENSATION_TARGET_SHARE))
        prompt = condensation_prompt(render_body(profile), budget, target)
        try:
            result = await self._ask(
                self.chat_model,
                snapshot,
                prompt,
                max_tokens=budget + CONDENSATION_SLACK_TOKENS,
                usage=usage,
            )
            condensed = parse_rewrite(result.text, profile.user_id)
        except (ModelError, MalformedModelOutput) as error:
            usage.calls.append("condensation=failed")
            logger.warning("condensation failed (%s); truncating instead", type(error).__name__)
            return None
        usage.calls.append("condensation=NOOP" if condensed == "NOOP" else "condensation=done")
        return None if condensed == "NOOP" else condensed

    # --- write ---------------------------------------------------------------------------------

    async def _write(
        self, claimed: ClaimedJob, snapshot: Snapshot, change: Change, usage: Usage
    ) -> str:
        """One transaction: the compare-and-set version write and the jobs' completion."""
        try:
            async with self.database.sessionmaker() as session, session.begin():
                row = await save_consolidation(
                    session,
                    company_id=claimed.company_id,
                    user_id=claimed.user_id,
                    expected_version=snapshot.version,
                    new_profile=change.profile,
                    reason=change.reason,
                    operations=change.operations,
                    keep_versions=self.settings.memory_max_versions,
                    source_turn_ids=snapshot.turn_ids,
                    model=usage.model or (RULES_ENGINE if self.chat_model is None else None),
                    tokens_in=usage.tokens_in if self.chat_model is not None else None,
                    tokens_out=usage.tokens_out if self.chat_model is not None else None,
                    job_id=claimed.jobs[-1].id,
                    now=self.clock(),
                )
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


def _model_failure(error: ModelError) -> JobFailure:
    return JobFailure(
        error.error_class,
        error.operator_message,
        retryable=error.retryable,
        retry_after_seconds=error.retry_after_seconds,
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _turn_ids(job: JobRef) -> list[uuid.UUID]:
    """`turn_id` (turn-save) and `turn_ids` (a list) are both read; malformed ids are skipped."""
    raw = job.payload.get("turn_ids")
    values = list(raw) if isinstance(raw, list) else []
    single = job.payload.get("turn_id")
    if isinstance(single, str):
        values.append(single)
    ids = []
    for value in values:
        with contextlib.suppress(ValueError):
            ids.append(uuid.UUID(value))
    return ids


def _job_ids(claimed: ClaimedJob) -> str:
    return ",".join(str(job_id) for job_id in claimed.job_ids)
