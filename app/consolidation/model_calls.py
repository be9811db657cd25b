"""The language-model calls of a consolidation: the gate, the operations or rewrite call and the
condensation call; the size check on every answer, the tokens they spend, and the job failure
each model failure becomes."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Literal

from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer

from app.consolidation.output_limits import (
    GATE_MAX_TOKENS,
    OperationsInput,
    condensation_limit,
    operations_limits,
    rewrite_limit,
)
from app.consolidation.prefilter import is_clearly_non_durable
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
from app.consolidation.snapshot import Snapshot
from app.jobs.worker import JobFailure
from app.kit.config import Settings
from app.kit.llm import (
    ChatModel,
    ChatRequest,
    ChatResult,
    ChatUsage,
    ModelError,
    ModelOutputTruncated,
    resolve_model_name,
)
from app.kit.observability import Metrics
from app.kit.tokens import TokenCounters
from app.kit.tracing import NO_TRACER
from app.profiles.document import Operation, Profile, diff_operations, render_body

CallKind = Literal["gate", "operations", "rewrite", "condensation"]
CONDENSATION_TARGET_SHARE: Final = 0.9
MAX_CHARS_PER_OUTPUT_TOKEN: Final = 8
"""A token is a few characters; an answer longer than this many per allowed output token came
from a server that ignored the output limit and is refused unread."""

INVALID_OUTPUT: Final = "invalid_model_output"
OVERSIZED_OUTPUT: Final = "oversized_model_output"
_INVALID_OUTPUT_MESSAGE: Final = (
    "The language model's answer was not valid consolidation output; the memory is unchanged."
)
_OVERSIZED_MESSAGE: Final = (
    "The language model's answer was far larger than its output limit; the memory is unchanged."
)


AnswerHook = Callable[[CallKind, ChatUsage], Awaitable[None]]
"""Told of every completion the provider answered, right after the call (usage metering)."""


@dataclass
class Usage:
    """Tokens spent on the model calls of one run, and the model that answered last.

    `on_answer` is told of each answered call, whatever becomes of its answer; `offline` says
    the run was decided by the offline engine because the company's model budget was spent."""

    tokens_in: int = 0
    tokens_out: int = 0
    model: str | None = None
    calls: list[str] = field(default_factory=list)
    on_answer: AnswerHook | None = None
    offline: bool = False

    async def answered(self, kind: CallKind, billed: ChatUsage | None) -> None:
        if billed is not None and self.on_answer is not None:
            await self.on_answer(kind, billed)


def answer_size(
    profile: Profile, exchanges: Sequence[Exchange], count: Callable[[str], int]
) -> OperationsInput:
    """What an operations answer on `profile` for `exchanges` depends on (`OperationsInput`):
    each exchange read by the offline engine on its own, or measured by its size."""
    read_answer = 0
    unread: list[int] = []
    for exchange in exchanges:
        if is_clearly_non_durable(exchange.user):
            continue
        read = consolidate_with_rules(profile, [exchange], keep_unread=False)
        if read.operations:
            read_answer += sum(count(json.dumps(operation_item(op))) for op in read.operations)
        else:
            unread.append(count(exchange.user))
    bullets = [bullet for _, section in profile.sections for bullet in section]
    return OperationsInput(
        read_answer=read_answer,
        unread_users=unread,
        all_users=[count(exchange.user) for exchange in exchanges],
        longest_bullet=max((count(bullet) for bullet in bullets), default=0),
        bullets=len(bullets),
        profile=count(render_body(profile)),
    )


def chat_request(
    model: str, prompt: tuple[str, str], max_tokens: int, *, json: bool = False
) -> ChatRequest:
    system, user = prompt
    return ChatRequest(model, system, user, max_output_tokens=max_tokens, json_mode=json)


def operation_item(op: Operation) -> dict[str, str]:
    """An operation as the operations answer spells it."""
    item = {"op": op.kind.value, "section": op.section.value}
    if op.target is not None:
        item["target"] = op.target
    if op.text is not None:
        item["text"] = op.text
    return item


def model_failure(error: ModelError) -> JobFailure:
    """The job failure of a failed model call: its class, its operator message, its retry."""
    return JobFailure(
        error.error_class,
        error.operator_message,
        retryable=error.retryable,
        retry_after_seconds=error.retry_after_seconds,
    )


class ModelCalls:
    """Asks `chat_model` on behalf of consolidation runs. Holds no state between runs: each call
    adds its tokens and a word about its answer to the run's `Usage`, and is counted in the
    metrics by kind (`model_calls_total`, `model_prompt_tokens_total`, ...).

    The gate asks `LLM_GATE_MODEL`; the other calls ask the snapshot's model (the space's
    `language_model`, or the orchestrator's).

    Each call is a span of `tracer` after the GenAI semantic conventions (`chat <model>`: the
    model asked and the one that answered, the output limit, the tokens billed, the finish
    reason, `error.type` when it failed) with its kind (`context_memory.model_call.kind`);
    never the prompt or the answer."""

    def __init__(  # noqa: PLR0913 - the last two by keyword
        self,
        chat_model: ChatModel,
        settings: Settings,
        metrics: Metrics,
        tokens: TokenCounters,
        *,
        clock: Callable[[], datetime],
        tracer: Tracer = NO_TRACER,
    ) -> None:
        self.chat_model = chat_model
        self.settings = settings
        self.metrics = metrics
        self.tokens = tokens
        self.clock = clock
        self.tracer = tracer
        self.gate_model = resolve_model_name(settings.llm_gate_model)

    async def operations(self, snapshot: Snapshot, usage: Usage, *, gate: bool) -> list[Operation]:
        """The gate when `gate` (only an explicit NOOP skips), then the configured strategy's
        call, its output limit derived from the exchanges (`output_limits`).

        An answer that is not valid output fails the jobs (`invalid_model_output`).
        """
        body, exchanges, now = render_body(snapshot.profile), snapshot.exchanges, self.clock()
        if gate and await self._gate_says_noop(gate_prompt(body, exchanges, now), usage):
            return []
        count = self.tokens.for_model(snapshot.model).count
        kind: CallKind = (
            "rewrite" if self.settings.consolidation_strategy == "rewrite" else "operations"
        )
        try:
            if kind == "rewrite":
                user_tokens = [count(exchange.user) for exchange in exchanges]
                limit = rewrite_limit(snapshot.budget, count(body), user_tokens)
                prompt = rewrite_prompt(body, exchanges, now)
                return await self._rewrite(snapshot, prompt, limit, usage)
            limits = operations_limits(answer_size(snapshot.profile, exchanges, count))
            prompt = operations_prompt(body, exchanges, now)
            try:
                result = await self._ask(
                    kind, chat_request(snapshot.model, prompt, limits.first, json=True), usage
                )
            except ModelOutputTruncated:
                if limits.ceiling <= limits.first:
                    raise
                usage.calls.append("operations=truncated")
                result = await self._ask(
                    kind, chat_request(snapshot.model, prompt, limits.ceiling, json=True), usage
                )
            reply = parse_operations(result.text)
        except MalformedModelOutput:
            self._count(kind, "invalid")
            raise JobFailure(INVALID_OUTPUT, _INVALID_OUTPUT_MESSAGE, retryable=False) from None
        self._count(kind, reply.decision)
        usage.calls.append(f"operations={reply.decision}")
        return list(reply.operations)

    async def condensation(
        self, snapshot: Snapshot, profile: Profile, usage: Usage
    ) -> Profile | Literal["NOOP"]:
        """The model's `profile` condensed to about `CONDENSATION_TARGET_SHARE` of the budget.

        Raises `ModelError` or `MalformedModelOutput` when the call or its answer fails.
        """
        budget = snapshot.budget
        target = max(1, int(budget * CONDENSATION_TARGET_SHARE))
        prompt = condensation_prompt(render_body(profile), budget, target)
        limit = condensation_limit(budget)
        result = await self._ask("condensation", chat_request(snapshot.model, prompt, limit), usage)
        try:
            condensed = parse_rewrite(result.text, profile.user_id)
        except MalformedModelOutput:
            self._count("condensation", "invalid")
            raise
        self._count("condensation", "NOOP" if condensed == "NOOP" else "UPDATE")
        return condensed

    async def _gate_says_noop(self, prompt: tuple[str, str], usage: Usage) -> bool:
        try:
            gate = await self._ask(
                "gate", chat_request(self.gate_model, prompt, GATE_MAX_TOKENS), usage
            )
        except ModelOutputTruncated:  # a long-winded gate answer is not an explicit NOOP
            usage.calls.append("gate=truncated")
            return False
        decision = parse_gate(gate.text)
        self._count("gate", decision)
        usage.calls.append(f"gate={decision}")
        return decision == "NOOP"

    async def _rewrite(
        self, snapshot: Snapshot, prompt: tuple[str, str], limit: int, usage: Usage
    ) -> list[Operation]:
        result = await self._ask("rewrite", chat_request(snapshot.model, prompt, limit), usage)
        rewritten = parse_rewrite(result.text, snapshot.profile.user_id)
        self._count("rewrite", "NOOP" if rewritten == "NOOP" else "UPDATE")
        usage.calls.append("rewrite=NOOP" if rewritten == "NOOP" else "rewrite=UPDATE")
        if rewritten == "NOOP":
            return []
        return diff_operations(snapshot.profile, rewritten)

    async def _ask(self, kind: CallKind, request: ChatRequest, usage: Usage) -> ChatResult:
        """One request; an answer far past its output limit fails the jobs
        (`oversized_model_output`) before it is read. Failed calls are counted here
        (`truncated`, `error`), answered ones by the caller once it has read the answer.

        Every completion the provider answered, cut off or refused included, is passed to
        `usage.answered` before anything else is done with it."""
        max_tokens = request.max_output_tokens
        self.metrics.model_output_limit_tokens.labels(kind).inc(max_tokens)
        with self.tracer.start_as_current_span(
            f"chat {request.model}",
            kind=SpanKind.CLIENT,
            attributes=_call_attributes(kind, request),
        ) as span:
            try:
                result = await self.chat_model.complete(request)
            except ModelOutputTruncated as error:
                _record_billed(span, error.usage, "length")
                span.set_attribute("error.type", error.error_class)
                span.set_status(StatusCode.ERROR)
                await usage.answered(kind, error.usage)
                self._count(kind, "truncated")
                self._spent(kind, usage, error.tokens_in, error.tokens_out)
                raise
            except ModelError as error:
                _record_billed(span, error.usage, None)
                span.set_attribute("error.type", error.error_class)
                await usage.answered(kind, error.usage)
                self._count(kind, "error")
                raise
            _record_billed(span, result.usage, result.finish_reason)
        await usage.answered(kind, result.usage)
        self._spent(kind, usage, result.tokens_in, result.tokens_out)
        if len(result.text) > max_tokens * MAX_CHARS_PER_OUTPUT_TOKEN:
            self._count(kind, "invalid")
            raise JobFailure(OVERSIZED_OUTPUT, _OVERSIZED_MESSAGE, retryable=False)
        usage.model = result.model
        return result

    def _spent(self, kind: CallKind, usage: Usage, tokens_in: int, tokens_out: int) -> None:
        usage.tokens_in += tokens_in
        usage.tokens_out += tokens_out
        self.metrics.model_tokens.labels("in").inc(tokens_in)
        self.metrics.model_tokens.labels("out").inc(tokens_out)
        self.metrics.model_prompt_tokens.labels(kind).inc(tokens_in)
        self.metrics.model_completion_tokens.labels(kind).inc(tokens_out)

    def _count(self, kind: CallKind, outcome: str) -> None:
        self.metrics.model_calls.labels(kind, outcome.lower()).inc()


def _call_attributes(kind: CallKind, request: ChatRequest) -> dict[str, str | int]:
    """A model call's span attributes known before it is sent (GenAI semantic conventions)."""
    return {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "openai",
        "gen_ai.request.model": request.model,
        "gen_ai.request.max_tokens": request.max_output_tokens,
        "gen_ai.output.type": "json" if request.json_mode else "text",
        "context_memory.model_call.kind": kind,
    }


def _record_billed(span: Span, billed: ChatUsage | None, finish_reason: str | None) -> None:
    """What the server said it billed for the call, on its span (nothing when it did not)."""
    if billed is not None:
        span.set_attribute("gen_ai.response.model", billed.model)
        span.set_attribute("gen_ai.usage.input_tokens", billed.tokens_in)
        span.set_attribute("gen_ai.usage.output_tokens", billed.tokens_out)
    if finish_reason is not None:
        span.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
