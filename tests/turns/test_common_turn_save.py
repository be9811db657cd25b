"""The turn-save's one statement decides in SQL what the plan decides in Python: memory active
or not (`memory_enabled_sql` = `effective_enablement`), the consolidation's model
(`CONSOLIDATION_MODEL_SQL` = `consolidation_model`) and the quota marks (`under_marks_sql` =
`stored_quota_reached is None`), each over every combination of its inputs; and a turn whose
memory folder is deleted while the statement waits for its locks is planned again, never
written with a job for memory that is gone."""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

import asyncpg
import httpx
from fastapi import FastAPI

from app.conversations.repository import user_history_lock_key
from app.enablement.decision import effective_enablement
from app.enablement.models import DEFAULT_LANGUAGE_MODEL
from app.enablement.repository import enablement_inputs_of, memory_enabled_sql
from app.folders.acl import user_folder_path
from app.kit.db.driver_pool import positional
from app.quotas.repository import marks_params, under_marks_sql
from app.quotas.rule import QuotaLimits, StoredUsage, stored_quota_reached
from app.turns.plan import consolidation_model
from app.turns.repository import CONSOLIDATION_MODEL_SQL
from app.turns.schemas import TurnRequest
from tests.helpers.apps import COMPANY, USER, AuthFactory
from tests.helpers.db import _asyncpg_dsn, rows
from tests.helpers.on_citus import not_on_citus
from tests.helpers.polling import wait_until
from tests.helpers.settings import enable_company
from tests.helpers.turns import save_turn, user

BOOLS_OR_NONE = (None, False, True)
SPACE_MODEL = "space-model"


def _enablement_rows() -> list[dict[str, Any]]:
    """Every combination of the decision's inputs, as the settings read returns them."""
    combos: list[dict[str, Any]] = []
    for flag, allow, user_setting in itertools.product(BOOLS_OR_NONE, repeat=3):
        base: dict[str, Any] = {
            "flag_context_memory": flag,
            "flag_allow": allow,
            "user_context_memory": user_setting,
        }
        never_saved = base | {
            "space_saved": False,
            "space_context_memory": None,
            "web_search": None,
            "use_orchestrator_language_model": None,
            "language_model": None,
            "max_tokens": None,
        }
        combos.append(never_saved)
        for setting, web in itertools.product(BOOLS_OR_NONE, (False, True)):
            combos.append(
                base
                | {
                    "space_saved": True,
                    "space_context_memory": setting,
                    "web_search": web,
                    "use_orchestrator_language_model": True,
                    "language_model": SPACE_MODEL,
                    "max_tokens": 1000,
                }
            )
    return combos


_ROW = """(SELECT CAST($1 AS boolean) AS flag_context_memory, CAST($2 AS boolean) AS flag_allow,
    CAST($3 AS boolean) AS space_saved, CAST($4 AS boolean) AS space_context_memory,
    CAST($5 AS boolean) AS web_search, CAST($6 AS boolean) AS use_orchestrator_language_model,
    CAST($7 AS text) AS language_model, CAST($8 AS int) AS max_tokens,
    CAST($9 AS boolean) AS user_context_memory) st"""
_COLUMNS = (
    "flag_context_memory",
    "flag_allow",
    "space_saved",
    "space_context_memory",
    "web_search",
    "use_orchestrator_language_model",
    "language_model",
    "max_tokens",
    "user_context_memory",
)


async def _connect(database_url: str) -> asyncpg.Connection:
    return await asyncpg.connect(**_asyncpg_dsn(database_url))


async def test_memory_enabled_sql_decides_as_effective_enablement(database_url: str) -> None:
    combos = _enablement_rows()
    assert len(combos) == 27 * 7
    conn = await _connect(database_url)
    try:
        query = f"SELECT {memory_enabled_sql('st')} AS enabled FROM {_ROW}"  # noqa: S608
        decided = {True: 0, False: 0}
        for combo in combos:
            enabled = await conn.fetchval(query, *[combo[c] for c in _COLUMNS])
            inputs = enablement_inputs_of(combo)
            expected = effective_enablement(inputs.flags, inputs.space.state, inputs.user).enabled
            assert enabled is expected, combo
            decided[expected] += 1
    finally:
        await conn.close()
    assert decided[True] > 0
    assert decided[False] > 0


async def test_the_models_sql_chooses_as_consolidation_model(database_url: str) -> None:
    conn = await _connect(database_url)
    try:
        model_sql = CONSOLIDATION_MODEL_SQL.replace(":request_model", "$10")
        model_sql = model_sql.replace(":default_model", "$11")
        query = f"SELECT {model_sql} FROM {_ROW}"  # noqa: S608
        chosen = set()
        for saved, use_orchestrator, request_model in itertools.product(
            (False, True), (False, True), (None, "orchestrator-model")
        ):
            combo = _enablement_rows()[0] | {
                "space_saved": saved,
                "space_context_memory": None,
                "web_search": False,
                "use_orchestrator_language_model": use_orchestrator if saved else None,
                "language_model": SPACE_MODEL if saved else None,
                "max_tokens": 1000 if saved else None,
            }
            request = TurnRequest.model_validate(
                {
                    "space_id": "space-1",
                    "messages": [{"role": "user", "content": "Hi"}],
                    "response": {"role": "assistant", "content": "Hello"},
                    "language_model": request_model,
                }
            )
            args = [combo[c] for c in _COLUMNS] + [request_model or "", DEFAULT_LANGUAGE_MODEL]
            model = await conn.fetchval(query, *args)
            space = enablement_inputs_of(combo).space
            assert model == consolidation_model(space, request), combo
            chosen.add(model)
    finally:
        await conn.close()
    assert chosen == {SPACE_MODEL, "orchestrator-model", DEFAULT_LANGUAGE_MODEL}


async def test_the_marks_sql_refuses_as_the_stored_quota_rule(database_url: str) -> None:
    conn = await _connect(database_url)
    try:
        # bound as the app binds it: the limits by `marks_params`, the marks as columns
        sql, names = positional(
            f"SELECT {under_marks_sql('st')} FROM (SELECT"  # noqa: S608
            " CAST(:history AS bigint) AS quota_history_messages,"
            " CAST(:storage AS bigint) AS quota_storage_bytes) st"
        )
        outcomes = set()
        used_values = (None, 0, 9, 10, 11)
        for history, storage, history_limit, storage_limit in itertools.product(
            used_values, used_values, (0, 10), (0, 10)
        ):
            limits = QuotaLimits(
                user_history_messages=history_limit, company_storage_bytes=storage_limit
            )
            params = marks_params(limits.user_history_messages, limits.company_storage_bytes)
            params |= {"history": history, "storage": storage}
            under = await conn.fetchval(sql, *[params[name] for name in names])
            expected = stored_quota_reached(StoredUsage(history, storage), limits) is None
            assert under is expected, (history, storage, history_limit, storage_limit)
            outcomes.add(expected)
    finally:
        await conn.close()
    assert outcomes == {True, False}


@not_on_citus(
    "the test's eraser takes the user's lock in a statement of its own, on the coordinator, and"
    " counts the waits there; on the cluster the turn-save takes it on the company's worker"
    " (tests/citus/test_locks_on_cluster.py holds the erasure's lock there)"
)
async def test_a_folder_deleted_while_the_statement_waits_is_planned_again(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory, database_url: str
) -> None:
    """An erasure holds the user's history lock; the turn-save's one statement reads the
    settings (folder there), then waits for the lock; the erasure deletes the folder and
    commits. The statement writes nothing, and the turn is planned again on what is stored
    now: a new folder, the turn and its job written once."""
    await enable_company(client, auth)
    first = await save_turn(client, auth, "chat-a", [user("I know Go.")], "Noted.")
    assert first.status_code == 202
    [old_folder] = await rows(
        app,
        "SELECT id FROM folders WHERE company_id = :c AND path = :p",
        c=COMPANY,
        p=user_folder_path(USER),
    )

    eraser = await _connect(database_url)
    try:
        transaction = eraser.transaction()
        await transaction.start()
        await eraser.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))",
            user_history_lock_key(COMPANY, USER),
        )
        saving = asyncio.create_task(
            save_turn(client, auth, "chat-b", [user("I know Rust.")], "Noted.")
        )

        async def the_save_waits_for_the_lock() -> bool:
            waiting = await eraser.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
            )
            assert waiting <= 1, waiting
            return bool(waiting == 1)

        await wait_until(the_save_waits_for_the_lock, what="the save waiting for the lock")
        await eraser.execute(
            "DELETE FROM folders WHERE company_id = $1 AND id = $2", COMPANY, old_folder.id
        )
        await transaction.commit()
        response = await saving
    finally:
        await eraser.close()

    assert response.status_code == 202, response.text
    body = response.json()
    jobs = await rows(
        app,
        "SELECT id FROM jobs WHERE company_id = :c AND payload->>'turn_id' = :t",
        c=COMPANY,
        t=body["turn_id"],
    )
    assert [str(j.id) for j in jobs] == [body["consolidation"]["job_id"]]
    [new_folder] = await rows(
        app,
        "SELECT id FROM folders WHERE company_id = :c AND path = :p",
        c=COMPANY,
        p=user_folder_path(USER),
    )
    assert new_folder.id != old_folder.id
    messages = await rows(
        app,
        "SELECT count(*) AS n FROM chat_messages WHERE company_id = :c AND turn_id = "
        "CAST(:t AS uuid)",
        c=COMPANY,
        t=body["turn_id"],
    )
    assert messages[0].n == 2
