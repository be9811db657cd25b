"""Load and inject (`POST /v1/chats/{chat_id}/context`): one SELECT, then pure rules.

The read (`repository.select_context`, on a driver connection) brings flags, settings, the head
profile, its folder ACL and the newest stored history together; `effective_enablement`,
`acl.is_allowed`, `plan_history`/`select_history`/`compose_messages` and the injection module
decide the rest, and the answer is built as plain JSON-ready values (its shape is
`schemas.ContextResponse`, which the tests hold it to). Never calls a language model. The only
extra statements are on the rare over-budget path, which queues one condensation job in a
transaction of its own, committed before the answer.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Literal

from app.consolidation.kinds import CONDENSATION, condensation_payload
from app.conversations.modes import (
    HistoryPlan,
    Message,
    Role,
    compose_messages,
    messages_to_save,
    plan_history,
    select_history,
)
from app.conversations.schemas import check_message_limits, placeholder_messages
from app.enablement.decision import Condition, Decision, effective_enablement
from app.folders.acl import Permission, is_allowed
from app.folders.service import actor_of
from app.jobs.enqueue import NewJob, enqueue_job_once
from app.jobs.queue import JobPayload
from app.kit.citus import runs_citus
from app.kit.config import Settings
from app.kit.db.engine import Database
from app.kit.principal import Principal
from app.kit.tokens import TokenCounter, TokenCounters, utf8_bound
from app.kit.tracing import current_traceparent
from app.profiles.document import ProfileFormatError
from app.profiles.injection import compose_system_prompt
from app.turns import repository
from app.turns.memory import memory_to_inject
from app.turns.repository import ContextRow
from app.turns.schemas import (
    ConditionOut,
    ContextDebug,
    ContextRequest,
    DebugHistory,
    DebugMemory,
    DebugMessage,
    DebugPlaceholder,
    DebugTokens,
)

logger = logging.getLogger("app.turns.context")

NO_PROFILE_REASON = "Context memory is enabled, but there is no profile yet; nothing to inject."
DENIED_REASON = "The access check on the memory folder did not grant READ; nothing injected."
EMPTY_REASON = "Context memory is enabled, but the profile holds no notes yet; nothing to inject."
UNREADABLE_REASON = "The stored profile could not be read; nothing injected."


@dataclass(frozen=True)
class MemoryOutcome:
    """What happened to memory in this call (section is None when nothing is injected).

    `condense`: the payload of the condensation to queue (the profile is over its budget);
    `condensation_job_id`: the job that then holds it.
    """

    section: str | None
    version: int | None
    tokens: int | None
    reason: str
    access: Literal["allowed", "denied"] | None = None
    truncated: bool = False
    condense: JobPayload | None = None
    condensation_job_id: uuid.UUID | None = None


@dataclass(frozen=True)
class ResolvedContext:
    """Every decision of one load: the request's messages and placeholder history as read, the
    history plan, the stored row, enablement, memory and the history forwarded."""

    messages: list[Message]
    placeholder: list[Message] | None
    plan: HistoryPlan
    row: ContextRow
    decision: Decision
    memory: MemoryOutcome
    history: list[Message]
    history_tokens: int


@dataclass(frozen=True)
class ContextCall:
    """One load: by whom, for which chat, with what."""

    principal: Principal
    chat_id: str
    request: ContextRequest


async def load_context(
    database: Database, call: ContextCall, *, settings: Settings, tokens: TokenCounters
) -> dict[str, object]:
    """The final message list for the model call, with memory injected and history resolved:
    the `ContextResponse` document, as JSON-ready values."""
    principal, request = call.principal, call.request
    check_message_limits(
        settings,
        messages=request.messages,
        placeholder_history=request.placeholder_history,
        texts=[("system_prompt", request.system_prompt)],
    )
    messages = [m.to_message() for m in request.messages]
    placeholder = placeholder_messages(request.placeholder_history)
    plan = plan_history(request.history_mode, messages, placeholder)
    citus = await runs_citus(database.engine)  # asked once per engine, then known
    reads = database.worker_reads if citus else None
    connection = (
        database.driver.connection()
        if reads is None
        else reads.connection(principal.company_id)  # one statement, outside a transaction
    )
    async with connection as conn:
        row = await repository.select_context(
            conn,
            principal,
            request.space_id,
            call.chat_id,
            history_limit=settings.history_max_messages if plan.load else None,
            citus=citus,
        )
    inputs = row.settings
    decision = effective_enablement(inputs.flags, inputs.space.state, inputs.user)
    memory = _memory(principal, request.space_id, row, decision, tokens.stored)
    if memory.condense is not None:
        job_id = await _queue_condensation(database, principal, memory.condense, settings)
        memory = replace(memory, condensation_job_id=job_id)

    history: list[Message] = []
    history_tokens = 0
    if row.history is not None:
        count, upper = _history_counts(row.history.tokens, tokens)
        history = select_history(
            row.history.messages,
            settings.history_max_messages,
            settings.history_max_tokens,
            count,
            upper,
        )
        if request.debug:  # the loaded tokens are reported only there: counted only then
            history_tokens = sum(count(m.content) for m in history)

    system_prompt = compose_system_prompt(_base_system_prompt(request, messages), memory.section)
    final = compose_messages(system_prompt, history, placeholder, messages)
    conditions = [_condition(c) for c in decision.conditions]
    document: dict[str, object] = {
        "messages": [{"role": m.role, "content": m.content} for m in final],
        "system_prompt": system_prompt,
        "memory": {
            "enabled": decision.enabled,
            "injected": memory.section is not None,
            "version": memory.version,
            "tokens": memory.tokens,
            "conditions": conditions,
            "reason": memory.reason,
        },
        "history": {
            "mode": plan.mode,
            "placeholder_detected": plan.detection.detected,
            "detected_by": plan.detection.detected_by,
            "loaded": plan.load,
            "loaded_messages": len(history),
        },
        "debug": None,
    }
    if request.debug:
        resolved = ResolvedContext(
            messages, placeholder, plan, row, decision, memory, history, history_tokens
        )
        document["debug"] = _debug(request, settings, resolved).model_dump(mode="json")
    return document


def _history_counts(
    stored: dict[str, int], tokens: TokenCounters
) -> tuple[Callable[[str], int], Callable[[str], int]]:
    """(exact count, cheap upper bound) of a stored message's tokens: the count stored with it
    when there is one; else counted (remembered per process), or bounded by its UTF-8 length."""

    def count(content: str) -> int:
        known = stored.get(content)
        return tokens.history.count(content) if known is None else known

    def upper(content: str) -> int:
        known = stored.get(content)
        return utf8_bound(content) if known is None else known

    return count, upper


def _condition(condition: Condition) -> dict[str, object]:
    """A condition as `ConditionOut` serialises it."""
    return {
        "key": condition.key,
        "level": condition.level.value,
        "satisfied": condition.satisfied,
        "reason": condition.reason,
    }


def _base_system_prompt(request: ContextRequest, messages: list[Message]) -> str | None:
    """The system prompt the memory section joins: the one `compose_messages` would pick."""
    first = compose_messages(request.system_prompt, (), None, messages)
    return first[0].content if first and first[0].role == Role.SYSTEM else None


def _memory(
    principal: Principal,
    space_id: str,
    row: ContextRow,
    decision: Decision,
    counter: TokenCounter,
) -> MemoryOutcome:
    """What to inject and why; over its budget, the condensation to queue for `space_id`."""
    if not decision.enabled:
        return MemoryOutcome(None, None, None, decision.reason())
    profile = row.profile
    if profile is None:
        return MemoryOutcome(None, None, None, NO_PROFILE_REASON)
    if row.folder is None or not is_allowed(actor_of(principal), row.folder, Permission.READ):
        return MemoryOutcome(None, None, None, DENIED_REASON, access="denied")
    budget = row.settings.space.user_memory.max_tokens
    try:
        injected = memory_to_inject(profile.content, profile.tokens, budget, counter)
    except ProfileFormatError:
        logger.warning("unreadable stored profile version %s", profile.version)
        return MemoryOutcome(None, None, None, UNREADABLE_REASON, access="allowed")
    if injected is None:
        return MemoryOutcome(None, None, None, EMPTY_REASON, access="allowed")
    reason = f"Context memory is enabled; profile version {profile.version} is injected."
    condense = None
    if profile.tokens > budget:
        config = row.settings.space.user_memory
        # the orchestrator's model is unknown at load time: without a configured one the worker
        # uses its default
        model = None if config.use_orchestrator_language_model else config.language_model
        condense = condensation_payload(space_id, profile.version, model)
        reason += (
            f" It holds {profile.tokens} tokens, over the space's budget of {budget}, so a "
            "truncated copy is injected and a condensation is queued."
        )
    return MemoryOutcome(
        injected.section,
        profile.version,
        injected.tokens,
        reason,
        access="allowed",
        truncated=injected.truncated,
        condense=condense,
    )


async def _queue_condensation(
    database: Database, principal: Principal, payload: JobPayload, settings: Settings
) -> uuid.UUID:
    """The user's pending condensation, queued now if there is none, committed before the
    answer (a transaction of its own: the rare extra statements of an over-budget load)."""
    async with database.sessionmaker() as session, session.begin():
        job = NewJob(
            CONDENSATION, payload, settings.job_max_attempts, trace_parent=current_traceparent()
        )
        job_id, _ = await enqueue_job_once(session, principal.company_id, principal.user_id, job)
    return job_id


def _debug(request: ContextRequest, settings: Settings, resolved: ResolvedContext) -> ContextDebug:
    """The trace of every decision (seed 000 "Debug Mode", plus memory and tokens)."""
    plan, row, decision, memory = resolved.plan, resolved.row, resolved.decision, resolved.memory
    history, history_tokens = resolved.history, resolved.history_tokens
    profile = row.profile
    would_save = messages_to_save(
        request.history_mode,
        resolved.placeholder,
        resolved.messages,
        Message(Role.ASSISTANT, ""),  # the response is not known yet: a stand-in
    )
    return ContextDebug(
        mode=plan.mode,
        placeholder=DebugPlaceholder(
            given=request.placeholder_history is not None,
            detected=plan.detection.detected,
            detected_by=plan.detection.detected_by,
        ),
        memory=DebugMemory(
            enabled=decision.enabled,
            reason=memory.reason,
            conditions=[ConditionOut.of(c) for c in decision.conditions],
            profile_exists=profile is not None,
            profile_version=None if profile is None else profile.version,
            access=memory.access,
            injected=memory.section is not None,
            truncated=memory.truncated,
            condensation_job_id=memory.condensation_job_id,
        ),
        history=DebugHistory(
            load=plan.load,
            reason=plan.reason,
            stored_messages_read=0 if row.history is None else len(row.history.messages),
            loaded_messages=len(history),
            loaded_tokens=history_tokens,
            max_messages=settings.history_max_messages,
            max_tokens=settings.history_max_tokens,
        ),
        would_save=[
            DebugMessage(
                role=saved.message.role,
                source=saved.source,
                content=None if saved.source == "response" else saved.message.content,
            )
            for saved in would_save
        ],
        tokens=DebugTokens(
            profile=None if profile is None else profile.tokens,
            injected=memory.tokens,
            budget=row.settings.space.user_memory.max_tokens,
            history=history_tokens,
            history_budget=settings.history_max_tokens,
        ),
    )
