"""Request and response bodies of the control plane's routes."""

from __future__ import annotations

import uuid
from datetime import date, datetime
from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from app.erasure.schemas import AnonymisedOut, DeletedOut
from app.kit.schemas import IDENTIFIER_PATTERN
from app.usage.schemas import UsageTotalsOut

DISPLAY_NAME_PATTERN: Final = r"^[^\x00-\x1f\x7f]{1,200}$"


class CompanyIn(BaseModel):
    """A company to register. Unknown fields are refused."""

    model_config = ConfigDict(extra="forbid")

    company_id: str = Field(
        pattern=IDENTIFIER_PATTERN,
        description="The company's id exactly as its users' tokens name it (`company_id`): 1..128 "
        "letters, digits and `._:-`.",
    )
    display_name: str | None = Field(
        default=None,
        pattern=DISPLAY_NAME_PATTERN,
        description="A name for people (1..200 characters, no control characters); the id when "
        "left out.",
    )


class CompanyOut(BaseModel):
    company_id: str
    display_name: str
    origin: str = Field(
        description="How it was registered: `operator` (`POST /v1/companies`), `first_use` (its "
        "own operators' first call) or `import` (a company import)."
    )
    created_at: datetime
    users_with_memory: int = Field(description="Users of the company with a memory profile.")
    last_activity: date | None = Field(
        description="The last UTC day a turn, a context or a consolidation of the company was "
        "counted; null before any."
    )
    usage_month: date = Field(
        description="The first UTC day of the month `usage_this_month` covers."
    )
    usage_this_month: UsageTotalsOut = Field(
        description="This UTC month so far, as `GET /v1/companies/{company_id}/usage` counts it."
    )


class OffboardingOut(BaseModel):
    """The receipt of a company's offboarding: what was erased, table by table, and when; never
    any content."""

    offboarding_id: uuid.UUID
    company_id: str
    status: str = Field(
        description="`queued` (accepted), `running` (tables being erased), `done` (nothing of "
        "the company is left)."
    )
    requested_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    erased: dict[str, int] = Field(
        description="Rows erased per table, so far (all of them once `done`)."
    )
    erased_rows: int = Field(description="The sum of `erased`.")


class UserErasureOut(BaseModel):
    """The receipt of a user's erasure on request: the same counts as `DELETE /v1/me`."""

    company_id: str
    user_id: str
    erased_at: datetime
    deleted: DeletedOut
    anonymised: AnonymisedOut
