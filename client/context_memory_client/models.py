"""The request and response bodies of the service, as frozen dataclasses.

Class names follow the schema names of `openapi.yaml` (where two schemas share a name the one is
prefixed: `ContextMemoryOut`, `ExportAuditEventOut`); field names are the JSON member names,
except that a Python keyword gets a trailing underscore (`VersionDiffOut.from_`,
`JobError.class_`). Enumerations are `Literal` types, not checked on the way in, so a value
added by a newer service does not break an older client. Timestamps are ISO 8601 strings.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

T = TypeVar("T")

Role = Literal["system", "user", "assistant"]
HistoryMode = Literal["auto", "always", "never", "record_all"]
JobStatus = Literal["queued", "running", "retrying", "succeeded", "dead"]
VersionReason = Literal[
    "consolidation", "condensation", "truncation", "user_edit", "restore", "retention"
]
MessageSource = Literal["request", "response", "placeholder"]
PolicyAction = Literal["drop", "redact", "allow"]
FeatureFlag = Literal[
    "FEATURE_FLAG_ENABLE_CONTEXT_MEMORY_UN_22033", "ALLOW_CONTEXT_MEMORY_WITH_WEB_SEARCH_UN_22591"
]
FLAG_CONTEXT_MEMORY: FeatureFlag = "FEATURE_FLAG_ENABLE_CONTEXT_MEMORY_UN_22033"
FLAG_MEMORY_WITH_WEB_SEARCH: FeatureFlag = "ALLOW_CONTEXT_MEMORY_WITH_WEB_SEARCH_UN_22591"


class Unset:
    """The type of `UNSET`: a PATCH member left out of the request (not the same as null)."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET = Unset()


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a list; pass `next_cursor` back as `cursor` for the next (None: the last)."""

    items: list[T]
    next_cursor: str | None


# --- the orchestrator's two calls ----------------------------------------------------------------


@dataclass(frozen=True)
class MessageIn:
    role: Role
    content: str


@dataclass(frozen=True)
class MessageOut:
    role: Role
    content: str


@dataclass(frozen=True)
class ContextRequest:
    """`POST /v1/chats/{chat_id}/context`: what the orchestrator is about to send the model."""

    space_id: str
    messages: list[MessageIn]
    history_mode: HistoryMode = "auto"
    system_prompt: str | None = None
    placeholder_history: list[MessageIn] | None = None
    debug: bool = False


@dataclass(frozen=True)
class ConditionOut:
    key: str
    level: str
    satisfied: bool
    reason: str


@dataclass(frozen=True)
class ContextMemoryOut:
    """The `memory` member of a context response (schema `app__turns__schemas__MemoryOut`)."""

    enabled: bool
    injected: bool
    version: int | None
    tokens: int | None
    conditions: list[ConditionOut]
    reason: str


@dataclass(frozen=True)
class HistoryOut:
    mode: HistoryMode
    placeholder_detected: bool
    detected_by: Literal["explicit", "heuristic"] | None
    loaded: bool
    loaded_messages: int


@dataclass(frozen=True)
class DebugPlaceholder:
    given: bool
    detected: bool
    detected_by: Literal["explicit", "heuristic"] | None


@dataclass(frozen=True)
class DebugMemory:
    enabled: bool
    reason: str
    conditions: list[ConditionOut]
    profile_exists: bool
    profile_version: int | None
    access: Literal["allowed", "denied"] | None
    injected: bool
    truncated: bool
    condensation_job_id: str | None


@dataclass(frozen=True)
class DebugHistory:
    load: bool
    reason: str
    stored_messages_read: int
    loaded_messages: int
    loaded_tokens: int
    max_messages: int
    max_tokens: int


@dataclass(frozen=True)
class DebugMessage:
    role: Role
    source: MessageSource
    content: str | None


@dataclass(frozen=True)
class DebugTokens:
    profile: int | None
    injected: int | None
    budget: int
    history: int
    history_budget: int


@dataclass(frozen=True)
class ContextDebug:
    mode: HistoryMode
    placeholder: DebugPlaceholder
    memory: DebugMemory
    history: DebugHistory
    would_save: list[DebugMessage]
    tokens: DebugTokens


@dataclass(frozen=True)
class ContextResponse:
    """The final messages and system prompt for the model call, and why they are what they are."""

    messages: list[MessageOut]
    system_prompt: str | None
    memory: ContextMemoryOut
    history: HistoryOut
    debug: ContextDebug | None = None


@dataclass(frozen=True)
class ResponseIn:
    content: str
    role: Literal["assistant"] = "assistant"


@dataclass(frozen=True)
class TurnRequest:
    """`POST /v1/chats/{chat_id}/turns`: the exchange to save after the model answered."""

    space_id: str
    messages: list[MessageIn]
    response: ResponseIn
    history_mode: HistoryMode = "auto"
    placeholder_history: list[MessageIn] | None = None
    language_model: str | None = None


@dataclass(frozen=True)
class ConsolidationOut:
    status: Literal["queued", "skipped"]
    job_id: str | None
    reason: str | None


@dataclass(frozen=True)
class TurnSaved:
    turn_id: str
    saved_messages: int
    consolidation: ConsolidationOut


# --- the user's own memory -----------------------------------------------------------------------


@dataclass(frozen=True)
class Me:
    user_id: str
    company_id: str
    roles: list[str]


@dataclass(frozen=True)
class MemoryOut:
    """The current profile; `version` is its ETag (pass it as `if_match`)."""

    content: str
    version: int
    tokens: int
    updated_at: str


@dataclass(frozen=True)
class OperationOut:
    op: str
    section: str
    old: str | None
    new: str | None


@dataclass(frozen=True)
class VersionSummaryOut:
    version: int
    sha256: str
    tokens: int
    reason: VersionReason
    created_at: str
    model: str | None
    tokens_in: int | None
    tokens_out: int | None
    source_turn_ids: list[str]
    job_id: str | None
    operation_counts: dict[str, int]


@dataclass(frozen=True)
class VersionOut(VersionSummaryOut):
    content: str
    operations: list[OperationOut]


@dataclass(frozen=True)
class VersionDiffOut:
    from_: int
    to: int
    diff: str


@dataclass(frozen=True)
class ExportSettingsOut:
    context_memory: bool


@dataclass(frozen=True)
class ChatMessageOut:
    id: int
    turn_id: str
    role: str
    content: str
    source: str
    created_at: str


@dataclass(frozen=True)
class TurnOut:
    id: str
    space_id: str
    history_mode: str
    language_model: str | None
    created_at: str


@dataclass(frozen=True)
class ChatOut:
    chat_id: str
    turns: list[TurnOut]
    messages: list[ChatMessageOut]


@dataclass(frozen=True)
class JobOut:
    id: str
    kind: str
    status: str
    outcome: str | None
    version: int | None
    created_at: str
    finished_at: str | None


@dataclass(frozen=True)
class ExportAuditEventOut:
    """An audit event in the export (schema `app__profiles__schemas__AuditEventOut`)."""

    id: int
    occurred_at: str
    action: str
    old: dict[str, object] | None
    new: dict[str, object] | None


@dataclass(frozen=True)
class PolicyActionOut:
    """One thing the company's memory policy kept out of the memory (never the value):
    `drop`, a line not remembered; `redact`, a value replaced by `[redacted: <kind>]`."""

    occurred_at: str
    description: str
    category: str
    kind: str
    action: Literal["drop", "redact"]
    section: str
    version: int | None
    reason: str
    source_turn_ids: list[str]
    job_id: str | None


@dataclass(frozen=True)
class MemoryExportOut:
    user_id: str
    company_id: str
    exported_at: str
    settings: ExportSettingsOut
    profile: MemoryOut | None
    versions: list[VersionOut]
    chats: list[ChatOut]
    jobs: list[JobOut]
    audit_events: list[ExportAuditEventOut]
    policy_actions: list[PolicyActionOut]


@dataclass(frozen=True)
class ExportedProfileIn:
    """An export's `profile`: its `content` is imported; the rest says what it was."""

    content: str
    version: int | None = None
    tokens: int | None = None
    updated_at: str | None = None


@dataclass(frozen=True)
class MemoryImportIn:
    """`POST /v1/me/memory/import`: a memory export; only `profile.content` is read.
    `MemoryImportIn.of(export)` makes one of a `MemoryExportOut`."""

    profile: ExportedProfileIn
    user_id: str | None = None
    company_id: str | None = None
    exported_at: str | None = None
    settings: dict[str, object] | None = None
    versions: list[object] | None = None
    chats: list[object] | None = None
    jobs: list[object] | None = None
    audit_events: list[object] | None = None
    policy_actions: list[object] | None = None

    @classmethod
    def of(cls, export: MemoryExportOut) -> MemoryImportIn:
        """The profile of `export` (a `ValueError` when it was taken without one)."""
        if export.profile is None:
            raise ValueError("the export holds no profile to import")
        profile = export.profile
        return cls(
            ExportedProfileIn(profile.content, profile.version, profile.tokens, profile.updated_at),
            export.user_id,
            export.company_id,
            export.exported_at,
        )


@dataclass(frozen=True)
class UserSettingsOut:
    context_memory: bool


@dataclass(frozen=True)
class MemoryDeletionOut:
    profile: bool
    versions: int
    jobs: int
    folder: bool


@dataclass(frozen=True)
class UserSettingsUpdateOut:
    """Turning context memory off deletes the memory for good; `deleted` counts what went."""

    context_memory: bool
    deleted: MemoryDeletionOut | None


@dataclass(frozen=True)
class DecisionOut:
    enabled: bool
    conditions: list[ConditionOut]
    reason: str


@dataclass(frozen=True)
class ConsolidationRequest:
    """`POST /v1/me/memory/consolidations`: one exchange to consolidate now."""

    space_id: str
    user: str
    assistant: str


@dataclass(frozen=True)
class JobError:
    class_: str
    message: str


@dataclass(frozen=True)
class JobView:
    """A consolidation job as its owner sees it (`GET /v1/jobs/{job_id}`)."""

    id: str
    status: JobStatus
    outcome: Literal["noop", "updated"] | None
    version: int | None
    attempts: int
    error: JobError | None


@dataclass(frozen=True)
class StoredMessageOut:
    id: int
    role: Role
    content: str
    source: MessageSource
    turn_id: str
    created_at: str


@dataclass(frozen=True)
class DeletedOut:
    profile: bool
    versions: int
    folder: bool
    chats: int
    turns: int
    messages: int
    jobs: int
    idempotency_keys: int
    settings: bool
    audit_events: int


@dataclass(frozen=True)
class AnonymisedOut:
    audit_events: int
    settings: int


@dataclass(frozen=True)
class ErasureOut:
    deleted: DeletedOut
    anonymised: AnonymisedOut


# --- space admins and operators ------------------------------------------------------------------


@dataclass(frozen=True)
class UserMemoryConfigOut:
    use_orchestrator_language_model: bool
    language_model: str
    max_tokens: int


@dataclass(frozen=True)
class SwitchOut:
    visible: bool
    editable: bool
    tooltip: str | None


@dataclass(frozen=True)
class SpaceSettingsOut:
    space_id: str
    context_memory: bool | None
    context_memory_effective: bool
    web_search: bool
    user_memory: UserMemoryConfigOut
    switch: SwitchOut
    decision: DecisionOut
    updated_at: str | None
    updated_by_company_id: str | None
    updated_by: str | None


@dataclass(frozen=True)
class UserMemoryPatch:
    """Members left `UNSET` are not sent (and not changed)."""

    use_orchestrator_language_model: bool | Unset = UNSET
    language_model: str | Unset = UNSET
    max_tokens: int | Unset = UNSET


@dataclass(frozen=True)
class SpacePatch:
    """`PATCH /v1/spaces/{space_id}`: members left `UNSET` are not sent (and not changed);
    `context_memory=None` is sent as null."""

    context_memory: bool | Unset | None = UNSET
    web_search: bool | Unset = UNSET
    user_memory: UserMemoryPatch | Unset = UNSET


@dataclass(frozen=True)
class FeatureFlagOut:
    flag: str
    enabled: bool
    updated_at: str | None
    updated_by_company_id: str | None
    updated_by: str | None


@dataclass(frozen=True)
class FeatureFlagsOut:
    company_id: str
    flags: list[FeatureFlagOut]


@dataclass(frozen=True)
class MemoryPolicyIn:
    """`PUT /v1/companies/{company_id}/memory-policy`: the whole policy, every member."""

    secrets: PolicyAction
    payment_cards: PolicyAction
    bank_accounts: PolicyAction
    national_ids: PolicyAction
    email_addresses: PolicyAction
    phone_numbers: PolicyAction
    instructions: PolicyAction
    recent_topics_days: int
    inactive_memory_days: int


@dataclass(frozen=True)
class MemoryPolicyOut(MemoryPolicyIn):
    """A company's memory policy; `default`: never saved, these are the service's defaults."""

    company_id: str
    default: bool
    updated_at: str | None
    updated_by_company_id: str | None
    updated_by: str | None


@dataclass(frozen=True)
class AuditEventOut:
    """A company audit event (schema `app__enablement__schemas__AuditEventOut`)."""

    id: int
    occurred_at: str
    actor_company_id: str
    actor_id: str
    action: str
    target_kind: str
    target_id: str
    old: dict[str, object] | None
    new: dict[str, object] | None


@dataclass(frozen=True)
class JobSummary:
    """A job as an operator sees it (`GET /v1/companies/{id}/jobs`)."""

    id: str
    user_id: str
    kind: Literal["consolidation", "condensation"]
    status: JobStatus
    attempts: int
    max_attempts: int
    error: JobError | None
    created_at: str
    updated_at: str


@dataclass(frozen=True)
class AclEntryOut:
    principal_kind: Literal["user", "group"]
    principal_id: str
    permission: Literal["READ", "WRITE", "MANAGE"]


@dataclass(frozen=True)
class FolderOut:
    path: str
    inherit_access: bool
    entries: list[AclEntryOut]


@dataclass(frozen=True)
class LimitOut:
    quota: int
    window_seconds: int


@dataclass(frozen=True)
class ScopeLimitOut:
    """The limit in force for a user or the whole company (`limit` None: unlimited), and
    whether the company's override sets it."""

    limit: LimitOut | None
    overridden: bool


@dataclass(frozen=True)
class ClassLimitsOut:
    user: ScopeLimitOut
    company: ScopeLimitOut


@dataclass(frozen=True)
class RateLimitsOut:
    """A company's rate limits by class; `processes` API processes each enforce their share."""

    company_id: str
    default: bool
    processes: int
    context: ClassLimitsOut
    turns: ClassLimitsOut
    consolidations: ClassLimitsOut
    exports: ClassLimitsOut
    memory_writes: ClassLimitsOut
    updated_at: str | None
    updated_by_company_id: str | None
    updated_by: str | None


@dataclass(frozen=True)
class LimitBody:
    """`quota` requests per `window_seconds`, for the whole service."""

    quota: int
    window_seconds: int


Unlimited = Literal["unlimited"]
UNLIMITED: Unlimited = "unlimited"


@dataclass(frozen=True)
class ClassOverrideIn:
    """One class's override: a limit, `UNLIMITED`, or None for the service's default."""

    user: LimitBody | Unlimited | None = None
    company: LimitBody | Unlimited | None = None


@dataclass(frozen=True)
class RateLimitsIn:
    """`PUT /v1/companies/{company_id}/rate-limits`: the company's whole set of overrides; a
    class left None has the defaults (`RateLimitsIn()` puts every default back)."""

    context: ClassOverrideIn | None = None
    turns: ClassOverrideIn | None = None
    consolidations: ClassOverrideIn | None = None
    exports: ClassOverrideIn | None = None
    memory_writes: ClassOverrideIn | None = None


@dataclass(frozen=True)
class ConsolidationsOut:
    updated: int
    noop: int
    failed: int
    deferred: int
    offline: int


@dataclass(frozen=True)
class ModelCallsOut:
    kind: str
    model: str
    calls: int
    prompt_tokens: int
    completion_tokens: int
    estimated_cost: float | None


@dataclass(frozen=True)
class UsageTotalsOut:
    turns_saved: int
    contexts_served: int
    consolidations: ConsolidationsOut
    model_calls: list[ModelCallsOut]
    prompt_tokens: int
    completion_tokens: int
    estimated_cost: float | None


@dataclass(frozen=True)
class DayUsageOut(UsageTotalsOut):
    day: str


@dataclass(frozen=True)
class UsageReportOut:
    """`GET /v1/companies/{company_id}/usage`: every UTC day from `from_` to `to`, and totals."""

    company_id: str
    from_: str
    to: str
    days: list[DayUsageOut]
    totals: UsageTotalsOut
    unpriced_models: list[str]


WhenSpent = Literal["offline", "defer"]


@dataclass(frozen=True)
class ModelBudgetIn:
    """`PUT /v1/companies/{company_id}/model-budget`: tokens a UTC month (None: unlimited) and
    what consolidations do once they are spent."""

    monthly_tokens: int | None
    when_spent: WhenSpent


@dataclass(frozen=True)
class ModelBudgetOut:
    company_id: str
    monthly_tokens: int | None
    when_spent: WhenSpent
    default: bool
    updated_at: str | None
    period_start: str
    period_end: str
    spent_tokens: int
    used_share: float | None


@dataclass(frozen=True)
class CompanyImportOut:
    """What a company import loaded; `replayed`: this very stream had been imported before and
    nothing was written now."""

    company_id: str
    sha256: str
    records: dict[str, int]
    replayed: bool


# --- operations ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Health:
    status: str


@dataclass(frozen=True)
class Readiness:
    status: str
    database: str
    migration: str | None
    expected_migration: str | None


# --- the control plane: companies, offboarding, erasure requests ---------------------------------


@dataclass(frozen=True)
class CompanyIn:
    """`POST /v1/companies`: the company's id as its tokens name it, and a name for people
    (None: the id)."""

    company_id: str
    display_name: str | None = None


@dataclass(frozen=True)
class CompanyOut:
    company_id: str
    display_name: str
    origin: str
    created_at: str
    users_with_memory: int
    last_activity: str | None
    usage_month: str
    usage_this_month: UsageTotalsOut


@dataclass(frozen=True)
class OffboardingOut:
    """The receipt of an offboarding: rows erased per table, and when; never content."""

    offboarding_id: str
    company_id: str
    status: str
    requested_at: str
    started_at: str | None
    finished_at: str | None
    erased: dict[str, int]
    erased_rows: int


@dataclass(frozen=True)
class UserErasureOut:
    company_id: str
    user_id: str
    erased_at: str
    deleted: DeletedOut
    anonymised: AnonymisedOut
