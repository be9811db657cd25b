"""SQL for company flags, space and user settings, the hot-path enablement read, the deletion
of a user's memory on opt-out, and what an erasure forgets (flushes, never commits). The flags'
and spaces' tables are audited settings (`app.kit.audited_setting`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from sqlalchemy import RowMapping, delete, func, select, text
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.ext.asyncio import AsyncSession

from app.enablement.decision import (
    FLAG_ALLOW_WITH_WEB_SEARCH,
    FLAG_CONTEXT_MEMORY,
    CompanyFlags,
    SpaceState,
    UserState,
)
from app.enablement.models import (
    DEFAULT_LANGUAGE_MODEL,
    DEFAULT_MAX_TOKENS,
    CompanyFeatureFlag,
    SpaceSettings,
    UserSettings,
)
from app.kit.audited_setting import SettingTable, Stored


@dataclass(frozen=True)
class UserMemoryConfig:
    """How a space consolidates memory (seed: "Advanced Configuration")."""

    use_orchestrator_language_model: bool = True
    language_model: str = DEFAULT_LANGUAGE_MODEL
    max_tokens: int = DEFAULT_MAX_TOKENS


@dataclass(frozen=True)
class SpaceRecord:
    """A space's settings as stored; the defaults when `saved` is False."""

    context_memory: bool | None = None
    web_search: bool = False
    user_memory: UserMemoryConfig = field(default_factory=UserMemoryConfig)
    saved: bool = False
    updated_at: datetime | None = None
    updated_by_company_id: str | None = None
    updated_by: str | None = None

    @property
    def state(self) -> SpaceState | None:
        """What the decision sees; None for a space that was never saved."""
        if not self.saved:
            return None
        return SpaceState(context_memory=self.context_memory, web_search=self.web_search)


@dataclass(frozen=True)
class EnablementInputs:
    flags: CompanyFlags
    space: SpaceRecord
    user: UserState | None


# --- company feature flags ----------------------------------------------------------------------


FEATURE_FLAGS: Final = SettingTable[bool](
    CompanyFeatureFlag,
    key=("flag",),
    columns=("enabled",),
    to_row=lambda enabled: {"enabled": enabled},
    of_row=lambda row: bool(row["enabled"]),
)
"""A company's flags, one row per flag set; a flag never set is off."""


async def select_flags(session: AsyncSession, company_id: str) -> dict[str, Stored[bool]]:
    """The company's flags ever set, by name."""
    statement = select(
        CompanyFeatureFlag.flag,
        CompanyFeatureFlag.enabled,
        CompanyFeatureFlag.updated_at,
        CompanyFeatureFlag.updated_by_company_id,
        CompanyFeatureFlag.updated_by,
    ).where(CompanyFeatureFlag.company_id == company_id)
    rows = (await session.execute(statement)).all()
    return {
        row.flag: Stored(row.enabled, row.updated_at, row.updated_by_company_id, row.updated_by)
        for row in rows
    }


# --- space settings -----------------------------------------------------------------------------

_SPACE_VALUES = (
    "context_memory",
    "web_search",
    "use_orchestrator_language_model",
    "language_model",
    "max_tokens",
)


def _space_record(row: RowMapping) -> SpaceRecord:
    return SpaceRecord(
        context_memory=row["context_memory"],
        web_search=row["web_search"],
        user_memory=UserMemoryConfig(
            row["use_orchestrator_language_model"], row["language_model"], row["max_tokens"]
        ),
        saved=True,
        updated_at=row["updated_at"],
        updated_by_company_id=row["updated_by_company_id"],
        updated_by=row["updated_by"],
    )


def _space_values(space: SpaceRecord) -> dict[str, object]:
    return {
        "context_memory": space.context_memory,
        "web_search": space.web_search,
        "use_orchestrator_language_model": space.user_memory.use_orchestrator_language_model,
        "language_model": space.user_memory.language_model,
        "max_tokens": space.user_memory.max_tokens,
    }


SPACE_SETTINGS: Final = SettingTable[SpaceRecord](
    SpaceSettings,
    key=("space_id",),
    columns=_SPACE_VALUES,
    to_row=_space_values,
    of_row=_space_record,
)
"""A space's settings, one row per space saved; a space never saved is at its defaults."""


async def select_spaces(
    session: AsyncSession, company_id: str, *, after: str | None, limit: int
) -> list[tuple[str, SpaceRecord]]:
    """Up to `limit` saved spaces of the company by space id, after `after`."""
    columns = (*_SPACE_VALUES, "updated_at", "updated_by_company_id", "updated_by")
    statement = (
        select(SpaceSettings.space_id, *(SpaceSettings.__table__.c[name] for name in columns))
        .where(SpaceSettings.company_id == company_id)
        .order_by(SpaceSettings.space_id)
        .limit(limit)
    )
    if after is not None:
        statement = statement.where(SpaceSettings.space_id > after)
    rows = await session.execute(statement)
    return [(row.space_id, _space_record(row._mapping)) for row in rows]


# --- user settings ------------------------------------------------------------------------------


async def lock_user_setting(session: AsyncSession, company_id: str, user_id: str) -> bool | None:
    """The user's stored context_memory (None when never saved), row-locked when it exists."""
    statement = (
        select(UserSettings.context_memory)
        .where(UserSettings.company_id == company_id, UserSettings.user_id == user_id)
        .with_for_update()
    )
    return (await session.execute(statement)).scalar_one_or_none()


async def select_user_setting(session: AsyncSession, company_id: str, user_id: str) -> bool | None:
    statement = select(UserSettings.context_memory).where(
        UserSettings.company_id == company_id, UserSettings.user_id == user_id
    )
    return (await session.execute(statement)).scalar_one_or_none()


async def upsert_user_setting(
    session: AsyncSession, company_id: str, user_id: str, context_memory: bool
) -> None:
    statement = insert(UserSettings).values(
        company_id=company_id, user_id=user_id, context_memory=context_memory, updated_at=func.now()
    )
    statement = statement.on_conflict_do_update(
        index_elements=[UserSettings.company_id, UserSettings.user_id],
        set_={
            "context_memory": statement.excluded.context_memory,
            "updated_at": statement.excluded.updated_at,
        },
    )
    await session.execute(statement)


async def delete_user_setting(session: AsyncSession, company_id: str, user_id: str) -> bool:
    """Erasure: forget the user's stored setting (it reads as never saved again)."""
    statement = (
        delete(UserSettings)
        .where(UserSettings.company_id == company_id, UserSettings.user_id == user_id)
        .returning(UserSettings.user_id)
    )
    return (await session.execute(statement)).first() is not None


# --- the hot-path read, and its fragments for the orchestrator's one-statement reads (app/turns) --

# Columns and joins over `FROM (SELECT 1) AS one`, with the parameters of `enablement_params`.
ENABLEMENT_COLUMNS = """
    (SELECT f.enabled FROM company_feature_flags f
     WHERE f.company_id = :company_id AND f.flag = :flag_context_memory) AS flag_context_memory,
    (SELECT f.enabled FROM company_feature_flags f
     WHERE f.company_id = :company_id AND f.flag = :flag_allow) AS flag_allow,
    s.space_id IS NOT NULL AS space_saved, s.context_memory AS space_context_memory,
    s.web_search, s.use_orchestrator_language_model, s.language_model, s.max_tokens,
    u.context_memory AS user_context_memory"""

ENABLEMENT_JOINS = """
LEFT JOIN space_settings s ON s.company_id = :company_id AND s.space_id = :space_id
LEFT JOIN user_settings u ON u.company_id = :company_id AND u.user_id = :user_id"""


def memory_enabled_sql(alias: str) -> str:
    """`effective_enablement(...).enabled` (`app.enablement.decision`) in SQL, over the
    `ENABLEMENT_COLUMNS` of the row `alias` (a constant of the composing statement, never user
    input): the company flag on; the space never saved, or its setting not off; web search off
    for the space, or allowed alongside it by the second flag; the user's setting not off.
    A test holds the two together over every combination of the inputs."""
    a = alias
    return f"""(coalesce({a}.flag_context_memory, false)
        AND (NOT {a}.space_saved OR {a}.space_context_memory IS DISTINCT FROM false)
        AND (NOT {a}.space_saved OR {a}.web_search IS NOT TRUE
             OR coalesce({a}.flag_allow, false))
        AND {a}.user_context_memory IS DISTINCT FROM false)"""


def enablement_params(company_id: str, user_id: str, space_id: str) -> dict[str, object]:
    return {
        "company_id": company_id,
        "user_id": user_id,
        "space_id": space_id,
        "flag_context_memory": FLAG_CONTEXT_MEMORY,
        "flag_allow": FLAG_ALLOW_WITH_WEB_SEARCH,
    }


def enablement_inputs_of(row: Mapping[Any, Any]) -> EnablementInputs:
    """The `ENABLEMENT_COLUMNS` of a row as the decision's inputs."""
    flags = CompanyFlags(
        context_memory=bool(row["flag_context_memory"]),
        allow_with_web_search=bool(row["flag_allow"]),
    )
    space = SpaceRecord()
    if row["space_saved"]:
        config = UserMemoryConfig(
            bool(row["use_orchestrator_language_model"]),
            str(row["language_model"]),
            int(row["max_tokens"]),
        )
        space = SpaceRecord(
            context_memory=row["space_context_memory"],
            web_search=bool(row["web_search"]),
            user_memory=config,
            saved=True,
        )
    user_setting = row["user_context_memory"]
    user = None if user_setting is None else UserState(bool(user_setting))
    return EnablementInputs(flags, space, user)


_ENABLEMENT_INPUTS = text(f"SELECT {ENABLEMENT_COLUMNS}\nFROM (SELECT 1) AS one{ENABLEMENT_JOINS}")


async def select_enablement_inputs(
    session: AsyncSession, company_id: str, space_id: str, user_id: str
) -> EnablementInputs:
    """Both flags, the space's settings and the user's setting in ONE statement, composed of the
    same fragments as the orchestrator's reads: always exactly one row, with NULLs for whatever
    was never saved."""
    params = enablement_params(company_id, user_id, space_id)
    row = (await session.execute(_ENABLEMENT_INPUTS, params)).one()
    return enablement_inputs_of(row._mapping)
