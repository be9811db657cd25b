"""Request and response bodies of the settings, memory policy, enablement and audit routes.

Request bodies forbid unknown fields and take strict JSON types (`"true"` or `1` is not a bool,
`"859"` is not an integer; `859.0` is, as JSON Schema says).
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, ClassVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    ValidationInfo,
    field_validator,
)

from app.conversations.schemas import ModelName
from app.detectors import Category
from app.enablement.audit import ERASED_ACTOR, AuditRecord
from app.enablement.decision import Decision
from app.enablement.memory_policy import Action, MemoryPolicy
from app.enablement.models import MAX_MAX_TOKENS, MAX_POLICY_DAYS, MIN_MAX_TOKENS
from app.kit.contract import WHOLE_NUMBER
from app.kit.pagination import Page
from app.kit.schemas import Schema

if TYPE_CHECKING:
    from app.enablement.views import MemoryPolicyView, SpaceView


# who last changed a flag or a space: a person is (company, user id), as in the audit log
EDITOR_COMPANY = "The company of whoever changed it last (for an operator, their own company)."
EDITOR = f"Whoever changed it last, a user id of that company; `{ERASED_ACTOR}` once erased."

# the name a turn may give (`ModelName`: 1..128 printable ASCII, no spaces), so a space never
# stores a model name the turn API would refuse, and the schema states the whole rule
LanguageModelName = ModelName
MaxTokens = Annotated[StrictInt, Field(ge=MIN_MAX_TOKENS, le=MAX_MAX_TOKENS), WHOLE_NUMBER]


def _hide_null(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """Document the refused `null` honestly: drop it from the fields that refuse it."""
    nullable: frozenset[str] = getattr(model, "nullable", frozenset())
    for name, prop in schema.get("properties", {}).items():
        options = prop.get("anyOf")
        if name in nullable or not isinstance(options, list):
            continue
        kept = [option for option in options if option != {"type": "null"}]
        if len(kept) == 1:
            del prop["anyOf"]
            prop.update(kept[0])


class _Patch(BaseModel):
    """A partial update: absent fields keep their value; `null` is refused unless the field is
    in `nullable`."""

    model_config = ConfigDict(extra="forbid", json_schema_extra=_hide_null)
    nullable: ClassVar[frozenset[str]] = frozenset()

    @field_validator("*", mode="before")
    @classmethod
    def _no_null(cls, value: object, info: ValidationInfo) -> object:
        if value is None and info.field_name not in cls.nullable:
            raise ValueError("must not be null; leave the field out to keep its value")
        return value


# --- feature flags ------------------------------------------------------------------------------


class FeatureFlagIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: StrictBool


class FeatureFlagOut(Schema):
    flag: str
    enabled: bool = Field(description="A flag that was never set is off.")
    updated_at: datetime | None
    updated_by_company_id: str | None = Field(description=EDITOR_COMPANY)
    updated_by: str | None = Field(description=EDITOR)


class FeatureFlagsOut(BaseModel):
    company_id: str
    flags: list[FeatureFlagOut]


# --- the company's memory policy ----------------------------------------------------------------

PolicyDays = Annotated[StrictInt, Field(ge=0, le=MAX_POLICY_DAYS), WHOLE_NUMBER]
_ACTION = "`drop` the bullet, `redact` the value (the rest of the bullet is kept), or `allow` it"


def _category(what: str) -> Any:
    return Field(description=f"{what}: {_ACTION}.")


class _MemoryPolicyFields(BaseModel):
    """One action per category of content, and the retention (SPEC: what may be remembered)."""

    secrets: Action = _category("Passwords, API keys, access tokens and other credentials")
    payment_cards: Action = _category("Payment card numbers")
    bank_accounts: Action = _category("Bank account numbers (IBAN and national formats)")
    national_ids: Action = _category(
        "National identity numbers: social security, passport, tax and identity card numbers"
    )
    email_addresses: Action = _category("E-mail addresses")
    phone_numbers: Action = _category("Phone numbers")
    instructions: Action = _category(
        "Text addressed to the assistant (such as an order to ignore its rules) rather than "
        "describing the user"
    )
    recent_topics_days: PolicyDays = Field(
        description=f"Recent Topics older than this many days are removed; 0 keeps them "
        f"(0..{MAX_POLICY_DAYS})."
    )
    inactive_memory_days: PolicyDays = Field(
        description=f"A memory unused this many days is erased like an opt-out; 0 never "
        f"(0..{MAX_POLICY_DAYS})."
    )


class MemoryPolicyIn(_MemoryPolicyFields):
    """The whole policy: every category and both retention fields are required."""

    model_config = ConfigDict(extra="forbid")

    def to_policy(self) -> MemoryPolicy:
        return MemoryPolicy(
            actions={category: getattr(self, category.value) for category in Category},
            recent_topics_days=self.recent_topics_days,
            inactive_memory_days=self.inactive_memory_days,
        )


class MemoryPolicyOut(_MemoryPolicyFields):
    company_id: str
    default: bool = Field(
        description="True when the company never saved a policy: these are the service's "
        "defaults, and nobody changed them."
    )
    updated_at: datetime | None
    updated_by_company_id: str | None = Field(description=EDITOR_COMPANY)
    updated_by: str | None = Field(description=EDITOR)

    @classmethod
    def of(cls, view: MemoryPolicyView) -> MemoryPolicyOut:
        policy = view.policy
        return cls.model_validate(
            {
                "company_id": view.company_id,
                **{category.value: policy.action(category) for category in Category},
                "recent_topics_days": policy.recent_topics_days,
                "inactive_memory_days": policy.inactive_memory_days,
                "default": view.default,
                "updated_at": view.updated_at,
                "updated_by_company_id": view.updated_by_company_id,
                "updated_by": view.updated_by,
            }
        )


# --- decisions ----------------------------------------------------------------------------------


class ConditionOut(BaseModel):
    key: str
    level: str
    satisfied: bool
    reason: str


class DecisionOut(BaseModel):
    enabled: bool
    conditions: list[ConditionOut]
    reason: str

    @classmethod
    def of(cls, decision: Decision, reason: str | None = None) -> DecisionOut:
        return cls(
            enabled=decision.enabled,
            conditions=[
                ConditionOut(key=c.key, level=c.level.value, satisfied=c.satisfied, reason=c.reason)
                for c in decision.conditions
            ],
            reason=reason or decision.reason(),
        )


# --- space settings -----------------------------------------------------------------------------


class UserMemoryConfigOut(Schema):
    use_orchestrator_language_model: bool
    language_model: str
    max_tokens: int


class UserMemoryPatch(_Patch):
    use_orchestrator_language_model: StrictBool | None = None
    language_model: LanguageModelName | None = None
    max_tokens: MaxTokens | None = Field(
        default=None, description=f"{MIN_MAX_TOKENS}..{MAX_MAX_TOKENS}"
    )


class SpacePatch(_Patch):
    nullable: ClassVar[frozenset[str]] = frozenset({"context_memory"})

    context_memory: StrictBool | None = Field(
        default=None,
        description="`null` removes the setting, which then reads as enabled (the default).",
    )
    web_search: StrictBool | None = None
    user_memory: UserMemoryPatch | None = None


class SwitchOut(Schema):
    visible: bool
    editable: bool
    tooltip: str | None


class SpaceSettingsOut(BaseModel):
    space_id: str
    context_memory: bool | None = Field(description="`null`: never set, which means enabled.")
    context_memory_effective: bool
    web_search: bool
    user_memory: UserMemoryConfigOut
    switch: SwitchOut
    decision: DecisionOut = Field(description="Company and space conditions (no user's).")
    updated_at: datetime | None
    updated_by_company_id: str | None = Field(description=EDITOR_COMPANY)
    updated_by: str | None = Field(description=EDITOR)

    @classmethod
    def of(cls, view: SpaceView) -> SpaceSettingsOut:
        space = view.settings
        return cls(
            space_id=view.space_id,
            context_memory=space.context_memory,
            context_memory_effective=space.context_memory is not False,
            web_search=space.web_search,
            user_memory=UserMemoryConfigOut.model_validate(space.user_memory),
            switch=SwitchOut.model_validate(view.switch),
            decision=DecisionOut.of(view.decision, view.decision_reason),
            updated_at=space.updated_at,
            updated_by_company_id=space.updated_by_company_id,
            updated_by=space.updated_by,
        )


# --- audit log ----------------------------------------------------------------------------------


class AuditEventOut(Schema):
    id: int
    occurred_at: datetime
    actor_company_id: str = Field(
        description="The actor's company; an operator's events name their own company, not the "
        "one whose log this is."
    )
    actor_id: str = Field(
        description=f"The actor's user id within `actor_company_id`; `{ERASED_ACTOR}` once that "
        "user was erased."
    )
    action: str
    target_kind: str
    target_id: str
    old: dict[str, Any] | None
    new: dict[str, Any] | None

    @classmethod
    def page(cls, records: Page[AuditRecord]) -> Page[AuditEventOut]:
        return Page[AuditEventOut](
            items=[cls.model_validate(record) for record in records.items],
            next_cursor=records.next_cursor,
        )
