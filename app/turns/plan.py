"""What a turn-save will write, decided before any I/O: whether its consolidation is skipped and
why, the model that consolidates it, and the messages its history mode stores. Pure rules."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from app.consolidation.kinds import consolidation_payload
from app.conversations.modes import SavedMessage, messages_to_save
from app.conversations.schemas import placeholder_messages
from app.enablement.decision import effective_enablement
from app.enablement.repository import EnablementInputs, SpaceRecord
from app.jobs.queue import JobPayload
from app.turns.schemas import TurnRequest


@dataclass(frozen=True)
class TurnPlan:
    """The messages to store, and the consolidation to queue (with its model) or why not."""

    messages: tuple[SavedMessage, ...]
    model: str | None
    skipped_reason: str | None

    def job_payload(self, turn_id: uuid.UUID, space_id: str) -> JobPayload | None:
        """The consolidation job's payload for the stored turn; None when it is skipped."""
        if self.skipped_reason is not None:
            return None
        return consolidation_payload(str(turn_id), space_id, self.model)


def skip_reason(inputs: EnablementInputs) -> str | None:
    """Why this turn is not consolidated (the first blocking condition); None when memory is on."""
    decision = effective_enablement(inputs.flags, inputs.space.state, inputs.user)
    return None if decision.enabled else decision.reason()


def plan_turn(request: TurnRequest, space: SpaceRecord, skipped_reason: str | None) -> TurnPlan:
    """The plan of a turn whose consolidation is skipped for `skipped_reason` (None: queued)."""
    model = None if skipped_reason is not None else consolidation_model(space, request)
    return TurnPlan(saved_messages(request), model, skipped_reason)


def saved_messages(request: TurnRequest) -> tuple[SavedMessage, ...]:
    """The messages the turn's history mode stores, whatever its consolidation."""
    saved = messages_to_save(
        request.history_mode,
        placeholder_messages(request.placeholder_history),
        [m.to_message() for m in request.messages],
        request.response.to_message(),
    )
    return tuple(saved)


def consolidation_model(space: SpaceRecord, request: TurnRequest) -> str:
    """The model the consolidation runs with: the orchestrator's (when the space says so and the
    turn names one), else the space's configured model."""
    config = space.user_memory
    if config.use_orchestrator_language_model and request.language_model:
        return request.language_model
    return config.language_model
