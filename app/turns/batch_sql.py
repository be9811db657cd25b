"""The one statement of a common `/turns` for several turns at once: what
`repository.save_common_turn` does for one turn, set-based over a batch of them.

A turn-save's database time is mostly fixed cost per statement (opening and locking each of the
dozen relations it reads and writes, the executor's start, the commit), not per row
(docs/benchmarks.md). Written as one statement, the turn-saves that concurrent requests hand in
together share that cost. Each turn is read, decided and written exactly as its own statement
would: the per-turn fragments are the single statement's own (`repository.SETTINGS_SELECT`,
`DECIDED_COLUMNS`, `UNDER_MARKS`, `GATE_WHERE`), with each turn's parameters read from its row
of the batch's input (`i.<name>`) instead of bound once, and the write's rows are the single
write's rows, one set per planned turn. The batch is one transaction: it commits all its turns
or none.

What differs from N statements, and why it is safe:

- **One snapshot for the batch.** Two turns of one user in a batch count the same waiting jobs,
  so both may queue a job: the user's waiting jobs reach at most the quota plus the turns in
  flight, as they already may when turn-saves of one user run in parallel (`save._plan_and_write`).
- **The locks.** Each turn's locks (the user's history lock shared, the chat's lock) are taken in
  one order for every batch, sorted by their keys, so two batches never wait for each other in a
  cycle; a lone statement takes one pair and cannot close a cycle either. They are held until the
  batch commits, so an erasure of any of its users waits for the whole batch, as it waits for a
  lone turn-save.
- **The folders.** Each queued turn's folder is key-share-locked after the locks above (on a
  Citus coordinator in an `EXISTS` of its own: `_HELD_IN_EXISTS`).
- **Message order.** The messages of a batch are inserted in (turn, position) order: turns of one
  chat in one batch get their ids in the order they were handed in, each turn's contiguous.
"""

from __future__ import annotations

import re
from typing import Final

from app.kit.db.driver_pool import positional

PER_TURN: Final = (
    "user_id",
    "space_id",
    "chat_id",
    "folder_path",
    "request_model",
    "refuse_skipped",
    "user_lock_key",
    "chat_lock_key",
    "turn_id",
    "history_mode",
    "language_model",
    "job_id",
    "job_payload",
    "job_trace_parent",
)
"""The parameters of the single statement that differ from turn to turn: in the batch, columns of
its input rows. Every other parameter is the same for every turn of a batch and stays bound once:
the company (a batch holds the turns of one company, so that every table it touches is pinned to
one company, as on a cluster distributed by company, docs/scaling.md), and what is the same for
every turn of a process (flags' names, limits, the job's kind and attempts, the default model)."""

_ARRAY_TYPES: Final = {
    "refuse_skipped": "boolean[]",
    "turn_id": "uuid[]",
    "job_id": "uuid[]",
}

_PER_TURN_PARAM = re.compile(r"(?<![:\w]):(" + "|".join(PER_TURN) + r")\b")


def per_turn(fragment: str) -> str:
    """A fragment of the single statement with each per-turn `:name` read from the input row `i`
    (the fragments are constants of their owners, never user input)."""
    return _PER_TURN_PARAM.sub(r"i.\1", fragment)


def _input() -> str:
    arrays = ", ".join(
        f"CAST(:batch_{name} AS {_ARRAY_TYPES.get(name, 'text[]')})" for name in PER_TURN
    )
    return f"""
WITH input AS MATERIALIZED (
    SELECT * FROM unnest({arrays}) WITH ORDINALITY AS i({", ".join(PER_TURN)}, ord)
), batch_messages AS MATERIALIZED (
    SELECT * FROM unnest(CAST(:batch_message_turns AS bigint[]),
                         CAST(:batch_roles AS varchar[]), CAST(:batch_contents AS varchar[]),
                         CAST(:batch_sources AS varchar[]))
        WITH ORDINALITY AS bm(ord, role, content, source, position)
)"""  # noqa: S608


_HELD_IN_JOIN: Final = """
    SELECT g.ord FROM gate g JOIN input i ON i.ord = g.ord
    JOIN folders fo ON fo.company_id = :company_id AND fo.path = i.folder_path
    WHERE g.queue AND (SELECT turns FROM locked) > 0
    FOR KEY SHARE OF fo"""

_HELD_IN_EXISTS: Final = """
    SELECT g.ord FROM gate g JOIN input i ON i.ord = g.ord
    WHERE g.queue AND (SELECT turns FROM locked) > 0
      AND EXISTS (SELECT FROM folders fo
                   WHERE fo.company_id = :company_id AND fo.path = i.folder_path
                     FOR KEY SHARE)"""
"""The Citus form of the queued turns' folder locks (`folder_lock_in_exists`): `FOR KEY SHARE
OF` a join with the batch's rows makes Citus mark whole joined rows in the step it splits off,
which it writes as binary and reads as text (`invalid input syntax for type bigint:
"PGCOPY"`); in an `EXISTS` of its own only the folder is marked. On one PostgreSQL the join is
kept: it measured a little cheaper at 16 and 32 turns to a statement."""


def common_turns_save(  # noqa: PLR0913 - the fragments, then how to lock the folders
    settings_select: str,
    decided_columns: str,
    under_marks: str,
    gate_where: str,
    *,
    payload_merge: str,
    folder_lock_in_exists: bool = False,
) -> tuple[str, tuple[str, ...]]:
    """The batch statement from the single statement's fragments: `settings_select` (a SELECT of
    one turn's settings), `decided_columns` and `under_marks` (the columns deciding over its row
    `st`, and the condition that no quota mark refuses it), `gate_where` (the gate's condition
    over the decided row `d`) and `payload_merge` (the job payload's model, over the turn's
    `gate` row `g`). One row per input turn, in input order: its settings,
    `queued` (NULL when the gate let it through to the general plan) and `planned`."""
    # constant fragments of their owners, never user input
    sql = f"""{_input()}
, settings AS MATERIALIZED (
    SELECT i.ord, x.* FROM input i CROSS JOIN LATERAL ({per_turn(settings_select)}
    ) x
), decided AS MATERIALIZED (
    SELECT st.ord, {per_turn(decided_columns)}
    FROM settings st JOIN input i ON i.ord = st.ord
    WHERE {per_turn(under_marks)}
), gate AS MATERIALIZED (
    SELECT d.ord, d.queue, d.model FROM decided d JOIN input i ON i.ord = d.ord
    WHERE {per_turn(gate_where)}
), turn_locks AS MATERIALIZED (
    SELECT g.ord,
           pg_advisory_xact_lock_shared(hashtextextended(i.user_lock_key, 0)) IS NOT NULL
               AS user_held,
           pg_advisory_xact_lock(hashtextextended(i.chat_lock_key, 0)) IS NOT NULL
               AS chat_held
    FROM gate g JOIN input i ON i.ord = g.ord
    ORDER BY i.user_lock_key, i.chat_lock_key, g.ord
), locked AS MATERIALIZED (
    SELECT count(*) AS turns FROM turn_locks
), held AS MATERIALIZED ({_HELD_IN_EXISTS if folder_lock_in_exists else _HELD_IN_JOIN}
), planned AS MATERIALIZED (
    SELECT g.ord FROM gate g WHERE NOT g.queue AND (SELECT turns FROM locked) > 0
    UNION ALL SELECT ord FROM held
), turn AS (
    INSERT INTO turns (company_id, id, user_id, chat_id, space_id, history_mode, language_model)
    SELECT :company_id, i.turn_id, i.user_id, i.chat_id, i.space_id, i.history_mode,
           i.language_model
    FROM planned p JOIN input i ON i.ord = p.ord
), message AS (
    INSERT INTO chat_messages
        (company_id, user_id, chat_id, turn_id, role, content, source)
    SELECT :company_id, i.user_id, i.chat_id, i.turn_id, bm.role, bm.content, bm.source
    FROM planned p JOIN input i ON i.ord = p.ord JOIN batch_messages bm ON bm.ord = p.ord
    ORDER BY p.ord, bm.position
), job AS (
    INSERT INTO jobs
        (company_id, id, user_id, kind, status, payload, attempts, max_attempts,
         created_at, trace_context)
    SELECT :company_id, i.job_id, i.user_id, :job_kind, 'queued',
           CAST(i.job_payload AS jsonb) || {payload_merge}, 0, :job_max_attempts,
           clock_timestamp(),
           CASE WHEN i.job_trace_parent IS NOT NULL THEN ARRAY[i.job_trace_parent] END
    FROM held h JOIN input i ON i.ord = h.ord JOIN gate g ON g.ord = h.ord
    ORDER BY h.ord
)
SELECT st.*, g.queue AS queued, EXISTS (SELECT FROM planned p WHERE p.ord = st.ord) AS planned
FROM settings st LEFT JOIN gate g ON g.ord = st.ord
ORDER BY st.ord"""  # noqa: S608
    return positional(sql)
