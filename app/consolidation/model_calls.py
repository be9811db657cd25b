"""The language-model calls of a consolidation: the gate, the operations or rewrite call and the
condensation call; the size check on every answer, the tokens they spend, and the job failure
each model failure becomes."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final, Literal

from app.config import Settings
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
from app.consolidation.snapshot import Snapshot
from app.jobs.worker import JobFailure
from app.llm import ChatModel, ChatRequest, ChatResult, ModelError, ModelOutputTruncated
from app.observability import Metrics
from app.profiles.document import Operation, Profile, diff_operations, render_body

GATE_MAX_TOKENS: Final = 16
CHANGE_MAX_TOKENS: Final = 4096
CONDENSATION_TARGET_SHARE: Final = 0.9
CONDENSATION_SLACK_TOKENS: Final = 512
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


@dataclass
class Usage:
    """Tokens spent on the model calls of one run, and the model that answered last."""

    tokens_in: int = 0
    tokens_out: int = 0
    model: str | None = None
    calls: list[str] = field(default_factory=list)


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
    adds its tokens and a word about its answer to the run's `Usage`."""

    def __init__(
        self,
        chat_model: ChatModel,
        settings: Settings,
        metrics: Metrics,
        *,
        clock: Callable[[], datetime],
    ) -> None:
        self.chat_model = chat_model
        self.settings = settings
        self.metrics = metrics
        self.clock = clock

    async def operations(self, snapshot: Snapshot, usage: Usage) -> list[Operation]:
        """The gate (only an explicit NOOP skips), then the configured strategy's call.

        An answer that is not valid output fails the jobs (`invalid_model_output`).
        """
        body, exchanges, now = render_body(snapshot.profile), snapshot.exchanges, self.clock()
        if self.settings.consolidation_gate and await self._gate_says_noop(
            snapshot, gate_prompt(body, exchanges, now), usage
        ):
            return []
        try:
            if self.settings.consolidation_strategy == "rewrite":
                return await self._rewrite(snapshot, rewrite_prompt(body, exchanges, now), usage)
            prompt = operations_prompt(body, exchanges, now)
            result = await self._ask(
                snapshot.model, prompt, max_tokens=CHANGE_MAX_TOKENS, usage=usage, json_mode=True
            )
            reply = parse_operations(result.text)
        except MalformedModelOutput:
            raise JobFailure(INVALID_OUTPUT, _INVALID_OUTPUT_MESSAGE, retryable=False) from None
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
        limit = budget + CONDENSATION_SLACK_TOKENS
        result = await self._ask(snapshot.model, prompt, max_tokens=limit, usage=usage)
        return parse_rewrite(result.text, profile.user_id)

    async def _gate_says_noop(
        self, snapshot: Snapshot, prompt: tuple[str, str], usage: Usage
    ) -> bool:
        try:
            gate = await self._ask(snapshot.model, prompt, max_tokens=GATE_MAX_TOKENS, usage=usage)
        except ModelOutputTruncated:  # a long-winded gate answer is not an explicit NOOP
            usage.calls.append("gate=truncated")
            return False
        decision = parse_gate(gate.text)
        usage.calls.append(f"gate={decision}")
        return decision == "NOOP"

    async def _rewrite(
        self, snapshot: Snapshot, prompt: tuple[str, str], usage: Usage
    ) -> list[Operation]:
        limit = max(CHANGE_MAX_TOKENS, 2 * snapshot.budget)
        result = await self._ask(snapshot.model, prompt, max_tokens=limit, usage=usage)
        rewritten = parse_rewrite(result.text, snapshot.profile.user_id)
        usage.calls.append("rewrite=NOOP" if rewritten == "NOOP" else "rewrite=UPDATE")
        if rewritten == "NOOP":
            return []
        return diff_operations(snapshot.profile, rewritten)

    async def _ask(
        self,
        model: str,
        prompt: tuple[str, str],
        *,
        max_tokens: int,
        usage: Usage,
        json_mode: bool = False,
    ) -> ChatResult:
        """One request; an answer far past `max_tokens` fails the jobs (`oversized_model_output`)
        before it is read or counted."""
        system, user = prompt
        request = ChatRequest(
            model=model,
            system=system,
            user=user,
            max_output_tokens=max_tokens,
            json_mode=json_mode,
        )
        result = await self.chat_model.complete(request)
        if len(result.text) > max_tokens * MAX_CHARS_PER_OUTPUT_TOKEN:
            raise JobFailure(OVERSIZED_OUTPUT, _OVERSIZED_MESSAGE, retryable=False)
        usage.tokens_in += result.tokens_in
        usage.tokens_out += result.tokens_out
        usage.model = result.model
        self.metrics.model_tokens.labels("in").inc(result.tokens_in)
        self.metrics.model_tokens.labels("out").inc(result.tokens_out)
        return result
