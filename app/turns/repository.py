"""SQL of the orchestrator's two calls: the single SELECT behind `/context`, the one statement
of a common `/turns` (settings read and gated write), the settings read and the single write of
the others, idempotency locks and records.

The hot statements are composed once, at import, from the fragments and row mappers their
owners export (enablement, profiles, folders, conversations), and run on a driver connection
(asyncpg): prepared once per connection, positional arguments, rows read as records. No ORM
objects, no per-request compilation, one round trip each. Never commits.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import asyncpg
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession

from app.consolidation.kinds import CONSOLIDATION
from app.conversations.repository import (
    HISTORY_COLUMNS,
    HISTORY_JOIN,
    IDEMPOTENCY_RECORD_CTE,
    TURN_LOCKS_CTE,
    TURN_ROWS_CTE,
    NewIdempotencyRecord,
    NewMessage,
    NewTurn,
    StoredHistory,
    record_params,
    stored_history_of,
    turn_locks_after,
    turn_params,
)
from app.enablement.models import DEFAULT_LANGUAGE_MODEL
from app.enablement.repository import (
    ENABLEMENT_COLUMNS,
    ENABLEMENT_JOINS,
    EnablementInputs,
    enablement_inputs_of,
    enablement_params,
    memory_enabled_sql,
)
from app.folders.acl import FolderNode, user_folder_path
from app.folders.repository import (
    FOLDER_COLUMNS,
    folder_joins,
    folder_node_of,
    user_folder_key_share,
)
from app.jobs.enqueue import (
    WAITING_JOBS_COLUMNS,
    WAITING_JOBS_JOINS,
    CoalescedItem,
    NewJob,
    coalesce_job_cte,
    coalesce_params,
    enqueue_job_cte,
    enqueue_params,
    waiting_params,
)
from app.kit.citus import HOLD_COMPANY_SHARDS_SQL, across_companies, on_company_node
from app.kit.db.driver_pool import positional
from app.kit.principal import Principal
from app.profiles.repository import (
    HEAD_PROFILE_COLUMNS,
    HEAD_PROFILE_FOLDER_ID,
    HEAD_PROFILE_JOINS,
    StoredProfile,
    stored_profile_of,
)
from app.quotas.repository import MARK_COLUMNS, marks_params, stored_usage_of, under_marks_sql
from app.quotas.rule import QuotaLimits, StoredUsage, WaitingJobs
from app.turns.batch_sql import PER_TURN, common_turns_save
from app.turns.errors import IdempotencyKeyRace

# --- /context: ONE statement --------------------------------------------------------------------


@dataclass(frozen=True)
class ContextRow:
    settings: EnablementInputs
    profile: StoredProfile | None
    folder: FolderNode | None  # the folder holding the profile, with its parent
    history: StoredHistory | None  # None when loading was not asked for


def _context_select(*, with_history: bool) -> tuple[str, tuple[str, ...]]:
    history_columns = (
        HISTORY_COLUMNS
        if with_history
        else "NULL::text[] AS history_roles, NULL::text[] AS history_contents, "
        "NULL::int[] AS history_tokens"
    )
    # constant fragments of their owners, never user input
    sql = f"""
SELECT {ENABLEMENT_COLUMNS}, {HEAD_PROFILE_COLUMNS}, {FOLDER_COLUMNS}, {history_columns}
FROM (SELECT 1) AS one
{ENABLEMENT_JOINS}
{HEAD_PROFILE_JOINS}
{folder_joins(HEAD_PROFILE_FOLDER_ID)}
{HISTORY_JOIN if with_history else ""}"""  # noqa: S608
    return positional(sql)


_CONTEXT_WITH_HISTORY = _context_select(with_history=True)
_CONTEXT_WITHOUT_HISTORY = _context_select(with_history=False)
# on a Citus coordinator: the calls of their company functions (app/kit/citus.py)
_CONTEXT_WITH_HISTORY_CALL = on_company_node("context", _CONTEXT_WITH_HISTORY).call
_CONTEXT_WITHOUT_HISTORY_CALL = on_company_node("context_no_history", _CONTEXT_WITHOUT_HISTORY).call


async def select_context(  # noqa: PLR0913 - the call's values, then how to send it
    conn: asyncpg.Connection,
    principal: Principal,
    space_id: str,
    chat_id: str,
    *,
    history_limit: int | None,
    citus: bool = False,
) -> ContextRow:
    """Everything `/context` needs, in ONE statement: both company flags, the space and user
    settings, the head profile version (content and stored tokens), the folder holding it with
    its parent and both ACLs, and, when `history_limit` is given, the newest `history_limit`
    stored messages of the chat with their stored token counts. `citus`: the database is a
    Citus coordinator (the statement's company function, run whole on the company's node).
    """
    params = enablement_params(principal.company_id, principal.user_id, space_id)
    if history_limit is None:
        sql, names = _CONTEXT_WITHOUT_HISTORY_CALL if citus else _CONTEXT_WITHOUT_HISTORY
    else:
        sql, names = _CONTEXT_WITH_HISTORY_CALL if citus else _CONTEXT_WITH_HISTORY
        params |= {"chat_id": chat_id, "history_limit": history_limit}
    row = await conn.fetchrow(sql, *[params[name] for name in names])
    return ContextRow(
        enablement_inputs_of(row),
        stored_profile_of(row),
        folder_node_of(row),
        None if history_limit is None else stored_history_of(row),
    )


# --- /turns ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IdempotencyRecord:
    request_hash: str
    response_status: int
    response_body: bytes


@dataclass(frozen=True)
class TurnSettingsRow:
    settings: EnablementInputs
    user_folder_exists: bool
    record: IdempotencyRecord | None  # the live record of the request's Idempotency-Key
    usage: StoredUsage  # where the last quota check found the caller over a quota
    # the caller's waiting consolidation jobs and where to coalesce, when asked for
    waiting: WaitingJobs | None


def _turn_settings(with_waiting: bool) -> tuple[str, tuple[str, ...]]:
    # constant fragments of their owners, never user input. No key: '' (never a key) rather
    # than NULL, which Citus folds into a false join condition together with the `company_id`
    # equality, and then reads every shard.
    return positional(f"""
SELECT {ENABLEMENT_COLUMNS},
    EXISTS (SELECT 1 FROM folders fo
            WHERE fo.company_id = :company_id AND fo.path = :folder_path) AS user_folder_exists,
    k.request_hash, k.response_status, k.response_body,
    {MARK_COLUMNS}{"," + WAITING_JOBS_COLUMNS if with_waiting else ""}
FROM (SELECT 1) AS one
{ENABLEMENT_JOINS}
LEFT JOIN idempotency_keys k
    ON k.company_id = :company_id AND k.user_id = :user_id
   AND k.key = coalesce(:idempotency_key, '') AND k.expires_at > now()
{WAITING_JOBS_JOINS if with_waiting else ""}
""")  # noqa: S608


_TURN_SETTINGS = _turn_settings(with_waiting=False)
_TURN_SETTINGS_WITH_WAITING = _turn_settings(with_waiting=True)
_TURN_SETTINGS_CALL = on_company_node("turn_settings", _TURN_SETTINGS).call
_TURN_SETTINGS_WITH_WAITING_CALL = on_company_node(
    "turn_settings_waiting", _TURN_SETTINGS_WITH_WAITING
).call


async def select_turn_settings(  # noqa: PLR0913 - the call's values, then how to send it
    conn: asyncpg.Connection,
    principal: Principal,
    space_id: str,
    idempotency_key: str | None,
    *,
    waiting_under: QuotaLimits | None = None,
    citus: bool = False,
) -> TurnSettingsRow:
    """The enablement inputs, whether the per-user folder exists, the live idempotency record
    of `idempotency_key` (expired records read as absent) and the caller's quota marks, in ONE
    statement; with `waiting_under` (a quota of waiting jobs in force), also the caller's
    waiting consolidation jobs, counted up to its `user_queued_jobs` over the index of an
    owner's waiting jobs (`ix_jobs_waiting_owner`, which matches all three of its equalities,
    so that even a plan made on stale statistics takes it), with the job a turn would be
    coalesced into once that is reached. `citus`: as `select_context`'s, outside a transaction
    block (inside one, Citus would run the function on the coordinator: the statement is sent).

    Run it after `try_lock_idempotency_key`: as a new statement it sees a record committed by
    the previous holder of the lock even if that commit happened just before we got it.
    """
    company_id, user_id = principal.company_id, principal.user_id
    params = enablement_params(company_id, user_id, space_id) | {
        "folder_path": user_folder_path(user_id),
        "idempotency_key": idempotency_key,
    }
    delegated = citus and not conn.is_in_transaction()  # see `on_company_node`
    sql, names = _TURN_SETTINGS_CALL if delegated else _TURN_SETTINGS
    if waiting_under is not None:
        quota, max_turns = waiting_under.user_queued_jobs, waiting_under.job_max_turns
        params |= waiting_params(CONSOLIDATION, quota, max_turns)
        sql, names = _TURN_SETTINGS_WITH_WAITING_CALL if delegated else _TURN_SETTINGS_WITH_WAITING
    row = await conn.fetchrow(sql, *[params[name] for name in names])
    return _settings_of(row, with_record=True, with_waiting=waiting_under is not None)


def _settings_of(row: asyncpg.Record, *, with_record: bool, with_waiting: bool) -> TurnSettingsRow:
    record = None
    if with_record and row["request_hash"] is not None:
        record = IdempotencyRecord(
            row["request_hash"], row["response_status"], bytes(row["response_body"])
        )
    waiting = None
    if with_waiting:
        waiting = WaitingJobs(int(row["waiting_jobs"]), _uuid_or_none(row["coalesce_job_id"]))
    return TurnSettingsRow(
        enablement_inputs_of(row),
        bool(row["user_folder_exists"]),
        record,
        stored_usage_of(row),
        waiting,
    )


def _uuid_or_none(value: uuid.UUID | None) -> uuid.UUID | None:
    """The driver's UUID as the standard library's (which the JSON encoder writes)."""
    return None if value is None else uuid.UUID(int=value.int)


def idempotency_lock_key(company_id: str, user_id: str, key: str) -> str:
    """The advisory-lock key of an Idempotency-Key, scoped to its (company, user)."""
    return f"turns.idempotency\x1f{company_id}\x1f{user_id}\x1f{key}"


# The write goes ahead (`planned` has a row) once the turn's locks are held and, when it queues
# a job, while the user's memory folder still exists: it is held until commit (see `write_turn`).
# A turn coalesced into a waiting job goes ahead only when, besides, its id was appended.
_PLANNED = ", planned AS MATERIALIZED (SELECT 1 FROM turn_locks)"
_PLANNED_WITH_FOLDER = f", planned AS MATERIALIZED ({user_folder_key_share('turn_locks')}\n)"
_FOLDER_HELD = f", folder_held AS MATERIALIZED ({user_folder_key_share('turn_locks')}\n)"

NO_JOB, NEW_JOB, COALESCED = "none", "new", "coalesced"


def _planned(job_mode: str, traced: bool) -> str:
    if job_mode == COALESCED:
        return _FOLDER_HELD + coalesce_job_cte("planned", "folder_held", traced=traced)
    return _PLANNED_WITH_FOLDER if job_mode == NEW_JOB else _PLANNED


def _turn_write(job_mode: str, with_record: bool, traced: bool) -> tuple[str, tuple[str, ...]]:
    """The write's statement; `traced`: its job keeps the turn's `traceparent` (the statement
    of an untraced turn binds nothing more)."""
    stored = "(SELECT count(*) FROM idempotency)" if with_record else "0"
    # a new job's `planned` is the folder itself: not planned, the folder is gone
    held = "(SELECT count(*) FROM folder_held)" if job_mode == COALESCED else "0"
    # constant fragments of their owners, never user input
    parts = [
        TURN_LOCKS_CTE,
        _planned(job_mode, traced),
        TURN_ROWS_CTE,
        enqueue_job_cte("planned", traced=traced) if job_mode == NEW_JOB else "",
        IDEMPOTENCY_RECORD_CTE if with_record else "",
        "\nSELECT (SELECT count(*) FROM planned) AS planned,"  # noqa: S608
        f" (SELECT count(*) FROM message) AS saved, {stored} AS stored,"
        f" {held} AS folder_held",
    ]
    return positional("".join(parts))


_TURN_WRITE = {
    (mode, record, traced): _turn_write(mode, record, traced)
    for mode in (NO_JOB, NEW_JOB, COALESCED)
    for record in (False, True)
    for traced in ((False, True) if mode != NO_JOB else (False,))
}
_TURN_WRITE_CALL = {
    (mode, record, traced): on_company_node(
        f"turn_write_{mode}{'_record' if record else ''}{'_traced' if traced else ''}",
        statement,
        in_transactions=True,
    ).call
    for (mode, record, traced), statement in _TURN_WRITE.items()
}


class TurnWrite(Enum):
    """What `write_turn` did."""

    WRITTEN = "written"
    PLAN_AGAIN = "plan again"  # nothing written: the memory folder is gone (erased, opted out)
    JOB_TAKEN = "job taken"  # nothing written: the waiting job was claimed or filled meanwhile


_HOLD_COMPANY_SHARDS, _ = positional(HOLD_COMPANY_SHARDS_SQL)


async def write_turn(  # noqa: PLR0913 - the call's values, then how to send it
    conn: asyncpg.Connection,
    turn: NewTurn,
    messages: Sequence[NewMessage],
    *,
    job: NewJob | CoalescedItem | None = None,
    record: NewIdempotencyRecord | None = None,
    citus: bool = False,
) -> TurnWrite:
    """Write the turn, its messages (in order) and optionally its job (a new one, or the turn's
    id appended to a waiting job) and idempotency record, in ONE statement (atomic on its own,
    or part of the caller's transaction). `WRITTEN`; else nothing was written: `JOB_TAKEN`
    when the waiting job a `CoalescedItem` names was claimed (or filled) since it was chosen,
    `PLAN_AGAIN` when the user's memory folder is gone.

    The statement first takes the user's history lock shared and the chat's lock
    (`TURN_LOCKS_CTE`: an erasure of the user waits for the write to commit, or the write
    waits for the erasure to commit; turns of one chat commit in order). With a job, it then
    key-share-locks the user's memory folder and writes only if the folder is still there:
    the settings that planned the job were read before, and an erasure or opt-out may have
    deleted the memory since, even while this statement waited for its locks. Held until
    commit, the folder is deleted, with the pending jobs, only after this turn is written.
    A coalesced turn is written only together with
    its id in the waiting job, which must still be queued (`coalesce_job_cte`): a claim that
    took the job first never loses the turn's consolidation. The job's `trace_parent`, when
    it has one, is written with it. `citus`: as `select_context`'s (the locks are then taken on
    the company's node, as every other taker of their keys does there: docs/scaling.md); inside
    a transaction block the locks are taken there in a statement of their own first, and the
    statement is sent as it is (its company function would run on the coordinator).
    """
    params = turn_params(turn, messages)
    mode = NO_JOB
    if isinstance(job, CoalescedItem):
        mode = COALESCED
        params |= coalesce_params(job) | {"folder_path": user_folder_path(turn.user_id)}
    elif job is not None:
        mode = NEW_JOB
        params |= enqueue_params(job) | {"folder_path": user_folder_path(turn.user_id)}
    if record is not None:
        params |= record_params(record)
    traced = job is not None and job.trace_parent is not None
    if citus and conn.is_in_transaction():  # held against a shard move until commit
        await conn.fetchrow(_HOLD_COMPANY_SHARDS, turn.company_id)
    form = (mode, record is not None, traced)
    sql, names = _TURN_WRITE_CALL[form] if citus else _TURN_WRITE[form]
    row = await conn.fetchrow(sql, *[params[name] for name in names])
    if not row["planned"]:
        return TurnWrite.JOB_TAKEN if row["folder_held"] else TurnWrite.PLAN_AGAIN
    if record is not None and row["stored"] != 1:
        # a live record appeared although we hold its lock: never save the turn twice
        raise IdempotencyKeyRace
    return TurnWrite.WRITTEN


# --- /turns without an Idempotency-Key: ONE statement in the common case ------------------------

CONSOLIDATION_MODEL_SQL = """CASE
        WHEN (NOT st.space_saved OR st.use_orchestrator_language_model)
             AND CAST(:request_model AS text) <> ''
        THEN CAST(:request_model AS text)
        WHEN st.space_saved THEN st.language_model
        ELSE CAST(:default_model AS text)
    END"""
"""`app.turns.plan.consolidation_model` in SQL over the settings row `st` (a test holds the two
together): the orchestrator's model when the space says so and the turn names one, else the
space's configured model (the default for a space never saved)."""


# The per-turn parts of the common turn-save, shared by its one-turn statement and its batch
# statement (app/turns/batch_sql.py); constant fragments of their owners, never user input.
SETTINGS_SELECT = f"""
    SELECT {ENABLEMENT_COLUMNS},
        EXISTS (SELECT 1 FROM folders fo
                WHERE fo.company_id = :company_id AND fo.path = :folder_path)
            AS user_folder_exists,
        {MARK_COLUMNS}, {WAITING_JOBS_COLUMNS}
    FROM (SELECT 1) AS one
    {ENABLEMENT_JOINS}
    {WAITING_JOBS_JOINS}"""  # noqa: S608
"""The settings read of `select_turn_settings` with the waiting jobs, without a record."""

DECIDED_COLUMNS = f"""{memory_enabled_sql("st")} AS queue, {CONSOLIDATION_MODEL_SQL} AS model,
           st.user_folder_exists, st.waiting_jobs"""
"""Over the settings row `st`: memory active (`queue`) and the consolidation's model."""
UNDER_MARKS = under_marks_sql("st")
"""Over the settings row `st`: no quota mark refuses the caller."""

GATE_WHERE = """CASE WHEN d.queue
               THEN d.user_folder_exists
                    AND (CAST(:waiting_quota AS int) = 0 OR d.waiting_jobs < :waiting_quota)
               ELSE NOT CAST(:refuse_skipped AS boolean) END"""
"""Over the decided row `d`: the common cases, a new job (the folder there, room in the queue)
or no job (memory off, unless a skipped turn must not be written)."""


def _common_turn_save(traced: bool) -> tuple[str, tuple[str, ...]]:
    """The settings read of `select_turn_settings` (with the waiting jobs, without a record)
    and the write of `write_turn` in one statement, the write gated in SQL by what the plan
    would decide in the common cases: memory active with the folder there, no quota refusal
    and room in the user's queue (a new job); or memory off for the turn (no job)."""
    # constant fragments of their owners, never user input
    return positional(f"""
WITH settings AS MATERIALIZED ({SETTINGS_SELECT}
), decided AS MATERIALIZED (
    SELECT {DECIDED_COLUMNS}
    FROM settings st
    WHERE {UNDER_MARKS}
), gate AS MATERIALIZED (
    SELECT d.queue, d.model FROM decided d
    WHERE {GATE_WHERE}
){turn_locks_after("gate")}
, queue_locks AS MATERIALIZED (SELECT 1 FROM turn_locks, gate WHERE gate.queue)
, held AS MATERIALIZED ({user_folder_key_share("queue_locks")}
), planned AS MATERIALIZED (
    SELECT 1 FROM turn_locks, gate WHERE NOT gate.queue
    UNION ALL SELECT 1 FROM held
){TURN_ROWS_CTE}{
        enqueue_job_cte(
            "held",
            traced=traced,
            payload_merge="jsonb_build_object('model', (SELECT model FROM gate))",
        )
    }
SELECT st.*, g.queue AS queued, EXISTS (SELECT FROM planned) AS planned
FROM settings st LEFT JOIN gate g ON true
""")  # noqa: S608


_COMMON_TURN_SAVE = {traced: _common_turn_save(traced) for traced in (False, True)}
_COMMON_TURN_SAVE_CALL = {
    traced: on_company_node(f"common_turn_save{'_traced' if traced else ''}", statement).call
    for traced, statement in _COMMON_TURN_SAVE.items()
}


@dataclass(frozen=True)
class CommonTurnSave:
    """What `save_common_turn` read and did. `written`: the turn and its messages were stored,
    with a new job when `queued`. Else `gated` says whether the statement tried (and found the
    memory folder gone meanwhile: plan again), or left the turn to the general plan, which
    starts from `settings` (read in the same statement). `settings` is None only for a turn
    written with its job: nothing more is decided from them."""

    settings: TurnSettingsRow | None
    gated: bool
    written: bool
    queued: bool

    @classmethod
    def of(cls, row: asyncpg.Record, limits: QuotaLimits) -> CommonTurnSave:
        """The answer of a row of the one-turn or the batch statement."""
        gated, written = row["queued"] is not None, bool(row["planned"])
        queued = written and bool(row["queued"])
        with_waiting = limits.user_queued_jobs > 0
        settings = (
            None if queued else _settings_of(row, with_record=False, with_waiting=with_waiting)
        )
        return cls(settings, gated, written, queued)


@dataclass(frozen=True)
class CommonTurn:
    """What `save_common_turn` writes: the turn, its messages, the job it queues when memory
    is active (its payload's model is chosen in the statement), the model the turn names, and
    whether a turn whose consolidation would be skipped must not be written."""

    turn: NewTurn
    messages: Sequence[NewMessage]
    job: NewJob
    request_model: str | None
    refuse_skipped: bool


async def save_common_turn(
    conn: asyncpg.Connection, common: CommonTurn, *, limits: QuotaLimits, citus: bool = False
) -> CommonTurnSave:
    """A turn-save without an Idempotency-Key in ONE statement, when its plan is a common one:
    the settings read of `select_turn_settings` (waiting jobs counted when `limits` has a
    quota of them), then, gated in SQL on what it read, the write of `write_turn` with the same
    locks: with the job (its payload's model chosen in SQL as `plan.consolidation_model` does)
    when memory is active, the user's folder exists, no quota mark refuses the caller and the
    user has room in the queue; without a job when memory is off for the turn (unless
    `refuse_skipped`). Anything else (the first turn, which creates the folder; a
    quota refusal; a full queue) writes nothing, and the caller plans with `settings`.
    `citus`: as `select_context`'s.
    """
    traced = common.job.trace_parent is not None
    sql, names = _COMMON_TURN_SAVE_CALL[traced] if citus else _COMMON_TURN_SAVE[traced]
    params = common_turn_params(common, limits)
    row = await conn.fetchrow(sql, *[params[name] for name in names])
    return CommonTurnSave.of(row, limits)


_COMMON_TURNS_SAVE = common_turns_save(
    SETTINGS_SELECT,
    DECIDED_COLUMNS,
    UNDER_MARKS,
    GATE_WHERE,
    payload_merge="jsonb_build_object('model', g.model)",
)
_COMMON_TURNS_SAVE_ON_CITUS = on_company_node(
    "common_turns_save",
    common_turns_save(
        SETTINGS_SELECT,
        DECIDED_COLUMNS,
        UNDER_MARKS,
        GATE_WHERE,
        payload_merge="jsonb_build_object('model', g.model)",
        folder_lock_in_exists=True,
    ),
).call


async def save_common_turns(
    conn: asyncpg.Connection,
    commons: Sequence[CommonTurn],
    *,
    limits: QuotaLimits,
    citus: bool = False,
) -> list[CommonTurnSave]:
    """`save_common_turn` for each of `commons`, in ONE statement (app/turns/batch_sql.py): each
    turn read, decided and written as its own statement would, all committed together; the
    results in the same order. The turns' jobs must share their kind and attempts. `citus`:
    the database is a Citus coordinator (the statement's form for it, in its company function:
    run whole on the company's node)."""
    sql, names = _COMMON_TURNS_SAVE_ON_CITUS if citus else _COMMON_TURNS_SAVE
    params = common_turns_params(commons, limits)
    rows = await conn.fetch(sql, *[params[name] for name in names])
    return [CommonTurnSave.of(row, limits) for row in rows]


_MESSAGE_PARAMS = ("roles", "contents", "sources")


def common_turns_params(commons: Sequence[CommonTurn], limits: QuotaLimits) -> dict[str, object]:
    """The arguments of `save_common_turns`' statement, by name: each per-turn parameter of the
    one-turn statement as an array over the turns, the messages flattened with their turn's
    position (from 1), and the parameters every turn shares bound once."""
    each = [common_turn_params(common, limits) for common in commons]
    own = {*PER_TURN, *_MESSAGE_PARAMS}
    shared = {name: value for name, value in each[0].items() if name not in own}
    for params in each[1:]:
        if any(params[name] != value for name, value in shared.items()):
            raise ValueError("the turns of a batch must share every parameter but their own")
    batch: dict[str, object] = {f"batch_{name}": [p[name] for p in each] for name in PER_TURN}
    batch["batch_message_turns"] = [
        position
        for position, p in enumerate(each, start=1)
        for _ in p["roles"]  # type: ignore[attr-defined]
    ]
    for name in _MESSAGE_PARAMS:
        batch[f"batch_{name}"] = [value for p in each for value in p[name]]  # type: ignore[attr-defined]
    return shared | batch


def common_turn_params(common: CommonTurn, limits: QuotaLimits) -> dict[str, object]:
    """The arguments of `save_common_turn`'s statement, by name."""
    turn, job = common.turn, common.job
    company_id, user_id = turn.company_id, turn.user_id
    return (
        enablement_params(company_id, user_id, turn.space_id)
        | turn_params(turn, common.messages)
        | enqueue_params(job)
        | marks_params(limits.user_history_messages, limits.company_storage_bytes)
        | waiting_params(CONSOLIDATION, limits.user_queued_jobs, limits.job_max_turns)
        | {
            "folder_path": user_folder_path(user_id),
            "request_model": common.request_model or "",
            "default_model": DEFAULT_LANGUAGE_MODEL,
            "refuse_skipped": common.refuse_skipped,
        }
    )


_TRY_LOCK = "SELECT pg_try_advisory_xact_lock(hashtextextended($1, 0))"


async def try_lock_idempotency_key(
    conn: asyncpg.Connection, company_id: str, user_id: str, key: str
) -> bool:
    """Take the key's transaction-level advisory lock without waiting; False while another
    request with the same key is in flight (the lock is released when that one commits).
    Call it inside a transaction: outside one the lock would end with the statement."""
    lock_key = idempotency_lock_key(company_id, user_id, key)
    return bool(await conn.fetchval(_TRY_LOCK, lock_key))


_PRUNE = text("DELETE FROM idempotency_keys WHERE expires_at <= now()")


async def prune_idempotency_keys(executor: AsyncSession | AsyncConnection | AsyncEngine) -> int:
    """Delete expired idempotency records; returns how many. Given an engine, commits its own
    transaction; given a session or connection, runs in the caller's."""
    if isinstance(executor, AsyncEngine):
        async with executor.begin() as conn:
            return await prune_idempotency_keys(conn)
    # housekeeping by expiry, every company at once
    async with across_companies(executor):
        result = await executor.execute(_PRUNE)
    return int(result.rowcount)  # type: ignore[attr-defined]


_DELETE_USER_KEYS = text(
    "DELETE FROM idempotency_keys WHERE company_id = :company_id AND user_id = :user_id"
)


async def delete_user_idempotency_keys(session: AsyncSession, company_id: str, user_id: str) -> int:
    """Erasure: delete every idempotency record of the user, live or expired; returns how many."""
    params = {"company_id": company_id, "user_id": user_id}
    result = await session.execute(_DELETE_USER_KEYS, params)
    return int(result.rowcount)  # type: ignore[attr-defined]
