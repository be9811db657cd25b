"""Wire shapes of the orchestrator's two calls: load/inject (`/context`), turn-save (`/turns`)."""

from __future__ import annotations

import uuid
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool

from app.conversations.modes import HistoryMode, MessageSource, Role
from app.conversations.schemas import MessageIn, MessageOut, ModelName, ResponseIn, SpaceId, Text
from app.enablement.decision import Condition


class ContextRequest(BaseModel):
    """The current input of a model call, before the service adds memory and history."""

    model_config = ConfigDict(extra="forbid")

    space_id: SpaceId
    history_mode: HistoryMode = HistoryMode.AUTO
    system_prompt: Text | None = None
    placeholder_history: list[MessageIn] | None = Field(
        default=None, description="Messages the caller's template put in a history placeholder"
    )
    messages: list[MessageIn] = Field(min_length=1, description="The current input")
    debug: StrictBool = False  # JSON true/false only, as the schema says (not 0 or 1)


class ConditionOut(BaseModel):
    key: str
    level: str
    satisfied: bool
    reason: str

    @classmethod
    def of(cls, condition: Condition) -> ConditionOut:
        return cls(
            key=condition.key,
            level=condition.level.value,
            satisfied=condition.satisfied,
            reason=condition.reason,
        )


class MemoryOut(BaseModel):
    """Whether memory is active and was injected; `version`/`tokens` of what was injected."""

    enabled: bool
    injected: bool
    version: int | None
    tokens: int | None
    conditions: list[ConditionOut]
    reason: str


class HistoryOut(BaseModel):
    mode: HistoryMode
    placeholder_detected: bool
    detected_by: Literal["explicit", "heuristic"] | None
    loaded: bool
    loaded_messages: int


class DebugMessage(BaseModel):
    role: Role
    source: MessageSource
    content: str | None = Field(description="null stands for the model's response")


class DebugPlaceholder(BaseModel):
    given: bool = Field(description="`placeholder_history` was present in the request")
    detected: bool
    detected_by: Literal["explicit", "heuristic"] | None


class DebugHistory(BaseModel):
    load: bool
    reason: str
    stored_messages_read: int
    loaded_messages: int
    loaded_tokens: int
    max_messages: int
    max_tokens: int


class DebugMemory(BaseModel):
    enabled: bool
    reason: str
    conditions: list[ConditionOut]
    profile_exists: bool
    profile_version: int | None
    access: Literal["allowed", "denied"] | None = Field(
        description="READ on the memory folder; null when not checked"
    )
    injected: bool
    truncated: bool
    condensation_job_id: uuid.UUID | None


class DebugTokens(BaseModel):
    profile: int | None = Field(description="stored tokens of the head profile version")
    injected: int | None = Field(description="tokens of the injected profile body")
    budget: int = Field(description="the space's memory token budget")
    history: int = Field(description="stored tokens of the loaded history")
    history_budget: int


class ContextDebug(BaseModel):
    """Every decision of the call, in the order it was taken."""

    mode: HistoryMode
    placeholder: DebugPlaceholder
    memory: DebugMemory
    history: DebugHistory
    would_save: list[DebugMessage] = Field(
        description="What a turn-save of this input would append, in this mode"
    )
    tokens: DebugTokens


class ContextResponse(BaseModel):
    messages: list[MessageOut]
    system_prompt: str | None
    memory: MemoryOut
    history: HistoryOut
    debug: ContextDebug | None = None


class TurnRequest(BaseModel):
    """The exchange of a finished turn: the same input `/context` got, and the model's answer."""

    model_config = ConfigDict(extra="forbid")

    space_id: SpaceId
    history_mode: HistoryMode = HistoryMode.AUTO
    placeholder_history: list[MessageIn] | None = None
    messages: list[MessageIn] = Field(min_length=1)
    response: ResponseIn
    language_model: ModelName | None = Field(
        default=None, description="The model the orchestrator used for this turn"
    )


class ConsolidationOut(BaseModel):
    status: Literal["queued", "skipped"]
    job_id: uuid.UUID | None
    reason: str | None


class TurnSaved(BaseModel):
    turn_id: uuid.UUID
    saved_messages: int
    consolidation: ConsolidationOut
