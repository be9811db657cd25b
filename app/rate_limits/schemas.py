"""Request and response bodies of the rate-limit overrides (`/v1/companies/{id}/rate-limits`).

Request bodies forbid unknown fields and take strict JSON types, as the other settings do.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictInt

from app.enablement.schemas import EDITOR, EDITOR_COMPANY
from app.kit.contract import WHOLE_NUMBER
from app.rate_limits.limiter import Overrides
from app.rate_limits.policy import MAX_QUOTA, MAX_WINDOW_SECONDS, Limit, RouteClass, Scope
from app.rate_limits.service import RateLimitsView, last_saved

UNLIMITED = "unlimited"


class LimitBody(BaseModel):
    """`quota` requests per `window_seconds`, for the whole service (each process enforces
    its share)."""

    model_config = ConfigDict(extra="forbid")

    quota: Annotated[StrictInt, Field(ge=1, le=MAX_QUOTA), WHOLE_NUMBER]
    window_seconds: Annotated[StrictInt, Field(ge=1, le=MAX_WINDOW_SECONDS), WHOLE_NUMBER]

    def to_limit(self) -> Limit:
        return Limit(self.quota, self.window_seconds)


ScopeOverride = LimitBody | Literal["unlimited"] | None
SCOPE_OVERRIDE = (
    "A limit, `unlimited`, or null (or left out) for the service's default "
    "(`RATE_LIMIT_<CLASS>_<SCOPE>`)."
)


class ClassOverrideIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    user: ScopeOverride = Field(default=None, description="Per user. " + SCOPE_OVERRIDE)
    company: ScopeOverride = Field(
        default=None, description="All users of the company together. " + SCOPE_OVERRIDE
    )

    def overrides(self) -> dict[Scope, Limit | None]:
        chosen: dict[Scope, Limit | None] = {}
        for scope, value in ((Scope.USER, self.user), (Scope.COMPANY, self.company)):
            if isinstance(value, LimitBody):
                chosen[scope] = value.to_limit()
            elif value == UNLIMITED:
                chosen[scope] = None
        return chosen


_CLASS_DOC = {
    RouteClass.CONTEXT: "`POST /v1/chats/{chat_id}/context`",
    RouteClass.TURNS: "`POST /v1/chats/{chat_id}/turns`",
    RouteClass.CONSOLIDATIONS: "`POST /v1/me/memory/consolidations`",
    RouteClass.EXPORTS: "the user's and the company's exports",
    RouteClass.MEMORY_WRITES: "edits, clears, restores and imports of memories",
}


class RateLimitsIn(BaseModel):
    """The company's whole set of overrides: a class left out (or null) has the defaults."""

    model_config = ConfigDict(extra="forbid")

    context: ClassOverrideIn | None = Field(
        default=None, description=_CLASS_DOC[RouteClass.CONTEXT]
    )
    turns: ClassOverrideIn | None = Field(default=None, description=_CLASS_DOC[RouteClass.TURNS])
    consolidations: ClassOverrideIn | None = Field(
        default=None, description=_CLASS_DOC[RouteClass.CONSOLIDATIONS]
    )
    exports: ClassOverrideIn | None = Field(
        default=None, description=_CLASS_DOC[RouteClass.EXPORTS]
    )
    memory_writes: ClassOverrideIn | None = Field(
        default=None, description=_CLASS_DOC[RouteClass.MEMORY_WRITES]
    )

    def to_overrides(self) -> Overrides:
        chosen: dict[RouteClass, dict[Scope, Limit | None]] = {}
        for route_class in RouteClass:
            body: ClassOverrideIn | None = getattr(self, route_class.value)
            if body is not None and (scopes := body.overrides()):
                chosen[route_class] = scopes
        return chosen


class LimitOut(BaseModel):
    quota: int
    window_seconds: int


class ScopeLimitOut(BaseModel):
    limit: LimitOut | None = Field(description="The limit in force; null: unlimited.")
    overridden: bool = Field(description="True when the company's override sets it.")


class ClassLimitsOut(BaseModel):
    user: ScopeLimitOut
    company: ScopeLimitOut


class RateLimitsOut(BaseModel):
    company_id: str
    default: bool = Field(
        description="True when the company never saved overrides: every limit is the default."
    )
    processes: int = Field(
        description="API processes sharing every limit: each enforces 1/processes of it "
        "(RATE_LIMIT_REPLICAS x API_WORKERS)."
    )
    context: ClassLimitsOut = Field(description=_CLASS_DOC[RouteClass.CONTEXT])
    turns: ClassLimitsOut = Field(description=_CLASS_DOC[RouteClass.TURNS])
    consolidations: ClassLimitsOut = Field(description=_CLASS_DOC[RouteClass.CONSOLIDATIONS])
    exports: ClassLimitsOut = Field(description=_CLASS_DOC[RouteClass.EXPORTS])
    memory_writes: ClassLimitsOut = Field(description=_CLASS_DOC[RouteClass.MEMORY_WRITES])
    updated_at: datetime | None
    updated_by_company_id: str | None = Field(description=EDITOR_COMPANY)
    updated_by: str | None = Field(description=EDITOR)

    @classmethod
    def of(cls, view: RateLimitsView) -> RateLimitsOut:
        classes: dict[str, ClassLimitsOut] = {}
        for route_class in RouteClass:
            limits = view.limits[route_class]
            overridden = view.overrides.get(route_class, {})
            classes[route_class.value] = ClassLimitsOut(
                user=_scope_out(limits.user, Scope.USER in overridden),
                company=_scope_out(limits.company, Scope.COMPANY in overridden),
            )
        updated_at, updated_by_company_id, updated_by = last_saved(view)
        return cls(
            company_id=view.company_id,
            default=view.record is None,
            processes=view.processes,
            updated_at=updated_at,
            updated_by_company_id=updated_by_company_id,
            updated_by=updated_by,
            **classes,
        )


def _scope_out(limit: Limit | None, overridden: bool) -> ScopeLimitOut:
    shown = (
        None if limit is None else LimitOut(quota=limit.quota, window_seconds=limit.window_seconds)
    )
    return ScopeLimitOut(limit=shown, overridden=overridden)
