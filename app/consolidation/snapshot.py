"""What one claim's read step sees (`Snapshot`) and the step that reads it: ONE statement over
the spaces' enablement, the user's folder and its ACL, the head profile, the claimed turns and
the company's model budget.

The statement is composed once, at import, of the fragments the hot path's `/context` read is
made of (their owners export them: enablement, profiles, folders, usage) and of the
exchanges' own, and runs on the engine's asyncpg connection (`app.jobs.driver`): one round
trip, no transaction (one statement is one snapshot), no statement compilation per claim.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from app.consolidation.exchanges import EXCHANGE_COLUMNS, EXCHANGE_JOIN, exchanges_of
from app.consolidation.kinds import CONSOLIDATION
from app.consolidation.rules import Exchange
from app.enablement.decision import effective_enablement
from app.enablement.repository import (
    ENABLEMENT_COLUMNS,
    ENABLEMENT_JOINS,
    enablement_inputs_of,
    enablement_params,
)
from app.folders.acl import Permission, is_allowed, user_folder_path
from app.folders.errors import NoMemory
from app.folders.repository import FOLDER_COLUMNS, folder_joins, folder_node_of
from app.folders.service import actor_of
from app.jobs.driver import Statement, driver_connection
from app.jobs.queue import ClaimedJob, JobRef
from app.kit.db.engine import Database
from app.kit.llm import resolve_model_name
from app.kit.principal import Principal
from app.profiles.document import Profile, empty_profile, parse
from app.profiles.repository import HEAD_PROFILE_COLUMNS, HEAD_PROFILE_JOINS, stored_profile_of
from app.usage.budget import BudgetStatus, Period
from app.usage.repository import (
    BUDGET_STATUS_COLUMNS,
    BUDGET_STATUS_JOINS,
    budget_status_of,
    budget_status_params,
)


@dataclass(frozen=True)
class Snapshot:
    """What the read step saw. The decision is made against it and written on `version`."""

    profile: Profile
    version: int
    exchanges: tuple[Exchange, ...]
    turn_ids: tuple[str, ...]
    budget: int
    model: str
    model_budget: BudgetStatus | None = None
    """The company's model budget and its spend in the period read, as the claim was read
    (`usage.repository.select_budget_status`); None without a budget."""


_USER_FOLDER_ID = (
    "(SELECT uf.id FROM folders uf WHERE uf.company_id = :company_id AND uf.path = :folder_path)"
)

# constant fragments of their owners, never user input
_READ: Final = Statement(f"""
SELECT {ENABLEMENT_COLUMNS}, mf.head_version AS head_version, {HEAD_PROFILE_COLUMNS},
       {FOLDER_COLUMNS}, {EXCHANGE_COLUMNS}, {BUDGET_STATUS_COLUMNS}
FROM (SELECT 1) AS one
{ENABLEMENT_JOINS}
{HEAD_PROFILE_JOINS}
{folder_joins(_USER_FOLDER_ID)}
{EXCHANGE_JOIN}{BUDGET_STATUS_JOINS}""")  # noqa: S608
"""Enablement of one space, memory.md's head number and head version, the user's folder with
its parent and both ACLs, the claimed turns' messages, and the company's model budget with its
month's spend: always exactly one row."""

_ENABLEMENT: Final = Statement(
    f"SELECT {ENABLEMENT_COLUMNS}\nFROM (SELECT 1) AS one{ENABLEMENT_JOINS}"
)
"""The enablement of each further space of a claim whose jobs name several (rare)."""


async def read_snapshot(
    database: Database, claimed: ClaimedJob, default_model: str, period: Period
) -> Snapshot | None:
    """One statement (one more per further space the claim's jobs name). None when nothing is
    left to do (memory off in every job's space, turns gone).

    Raises `NoMemory` when the memory was deleted (opt-out) after the jobs were queued: the
    user's folder is gone or denies the owner READ, the access check of `load_profile`.
    """
    company_id, user_id = claimed.company_id, claimed.user_id
    named = (_text(job.payload.get("space_id")) for job in claimed.jobs)
    spaces = [space_id for space_id in dict.fromkeys(named) if space_id is not None]
    if not spaces:
        return None
    turn_ids = [turn for job in claimed.jobs for turn in _turn_ids(job)]
    async with driver_connection(database.engine) as conn:
        params = enablement_params(company_id, user_id, spaces[0])
        params |= {"folder_path": user_folder_path(user_id), "turn_ids": turn_ids}
        params |= budget_status_params(period)
        row = await conn.fetchrow(_READ.sql, *_READ.args(**params))
        budgets = {spaces[0]: _budget(row)}
        for space_id in spaces[1:]:
            params = enablement_params(company_id, user_id, space_id)
            more = await conn.fetchrow(_ENABLEMENT.sql, *_ENABLEMENT.args(**params))
            budgets[space_id] = _budget(more)
    enabled = [
        (job, budget)
        for job in claimed.jobs
        if (named_space := _text(job.payload.get("space_id"))) is not None
        and (budget := budgets[named_space]) is not None
    ]
    if not enabled:
        return None
    owner = Principal(user_id=user_id, company_id=company_id, roles=frozenset())
    folder = folder_node_of(row)
    if folder is None or not is_allowed(actor_of(owner), folder, Permission.READ):
        raise NoMemory
    stored = stored_profile_of(row)
    profile = empty_profile(user_id) if stored is None else parse(stored.content)
    enabled_turns = [turn for job, _ in enabled for turn in _turn_ids(job)]
    found = exchanges_of(row, enabled_turns)
    if claimed.kind == CONSOLIDATION and not found:
        return None
    newest, budget = enabled[-1]  # the newest turn's space sets the budget and the model
    return Snapshot(
        profile=profile,
        version=row["head_version"] or 0,
        exchanges=tuple(exchange for _, exchange in found),
        turn_ids=tuple(str(turn_id) for turn_id, _ in found),
        budget=budget,
        model=resolve_model_name(_text(newest.payload.get("model")) or default_model),
        model_budget=budget_status_of(row, period),
    )


def _budget(row: Mapping[str, Any]) -> int | None:
    """The space's token budget where memory is on for the user; None where it is off."""
    inputs = enablement_inputs_of(row)
    decision = effective_enablement(inputs.flags, inputs.space.state, inputs.user)
    return inputs.space.user_memory.max_tokens if decision.enabled else None


def _text(value: object) -> str | None:
    return value if isinstance(value, str) and value else None


def _turn_ids(job: JobRef) -> list[uuid.UUID]:
    """`turn_id` (turn-save) and `turn_ids` (a list) are both read; malformed ids are skipped."""
    raw = job.payload.get("turn_ids")
    values = list(raw) if isinstance(raw, list) else []
    single = job.payload.get("turn_id")
    if isinstance(single, str):
        values.append(single)
    ids = []
    for value in values:
        with contextlib.suppress(ValueError):
            ids.append(uuid.UUID(value))
    return ids
