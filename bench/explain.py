"""`EXPLAIN (ANALYZE, BUFFERS)` of the hot path's statements, as the app runs them.

    .venv/bin/python bench/explain.py --dsn postgresql://postgres@127.0.0.1:5432/cms_bench \
        [--company bench-co] [--user user-1] [--chat chat-1] [--space space-1]

Runs on a seeded database (`bench/run_bench.py --keep`, or `--explain` there): the one SELECT of
`/context` (history loaded), the settings read of `/turns` (with an Idempotency-Key that has no
record) and its write (turn + 2 messages + job + idempotency record, rolled back). The statements
and their arguments are the app's own (`app.turns.repository`, `app.conversations.repository`),
so the plans are the plans the service gets. Prints Markdown: each plan, whether any node is a
sequential scan, and the shared buffers it touched.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.conversations import repository as history
from app.enablement.repository import enablement_params
from app.folders.acl import user_folder_path
from app.jobs.enqueue import waiting_params
from app.turns import repository as turns


@dataclass(frozen=True)
class Plan:
    name: str
    text: str
    table_pages: dict[str, int]  # pages of every table the plan reads sequentially

    @property
    def sequential_scans(self) -> list[str]:
        return sorted(set(re.findall(r"Seq Scan on (\w+)", self.text)))


async def explain(conn: asyncpg.Connection, name: str, sql: str, args: list[object]) -> Plan:
    """The plan PostgreSQL runs for these arguments; with `generic` in the name, the plan
    built without looking at them (what a prepared statement may switch to after five
    executions), forced by `plan_cache_mode`; with `no seqscan`, the plan with sequential scans
    priced out, which shows an index path exists for every table."""
    if "generic" in name:
        await conn.execute("SET plan_cache_mode = force_generic_plan")
    if "no seqscan" in name:
        await conn.execute("SET enable_seqscan = off")
    try:
        rows = await conn.fetch(f"EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {sql}", *args)
    finally:
        await conn.execute("RESET plan_cache_mode; RESET enable_seqscan")
    text = "\n".join(str(row[0]) for row in rows)
    tables = sorted(set(re.findall(r"Seq Scan on (\w+)", text)))
    pages = await conn.fetch(
        "SELECT relname, relpages FROM pg_class WHERE relname = ANY($1::text[])", tables
    )
    return Plan(name, text, {str(r["relname"]): int(r["relpages"]) for r in pages})


async def hot_plans(dsn: str, company: str, user: str, chat: str, space: str) -> list[Plan]:
    conn = await asyncpg.connect(dsn)
    try:
        plans = []
        params = enablement_params(company, user, space) | {"chat_id": chat, "history_limit": 50}
        sql, names = turns._CONTEXT_WITH_HISTORY
        for kind in ("", ", generic plan", ", no seqscan"):
            plans.append(
                await explain(
                    conn, f"/context: the one SELECT{kind}", sql, [params[n] for n in names]
                )
            )

        key = f"explain-{uuid.uuid4()}"
        params = (
            enablement_params(company, user, space)
            | {"folder_path": user_folder_path(user), "idempotency_key": key}
            | waiting_params("consolidation", 20, 25)  # the default quota of waiting jobs
        )
        sql, names = turns._TURN_SETTINGS_WITH_WAITING
        for kind in ("", ", generic plan", ", no seqscan"):
            plans.append(
                await explain(
                    conn, f"/turns: the settings read{kind}", sql, [params[n] for n in names]
                )
            )

        turn_id, job_id = uuid.uuid4(), uuid.uuid4()
        params = {
            "user_lock_key": history.user_history_lock_key(company, user),
            "chat_lock_key": history.chat_lock_key(company, user, f"{chat}-explain"),
            "folder_path": user_folder_path(user),
            "company_id": company,
            "user_id": user,
            "chat_id": f"{chat}-explain",
            "turn_id": turn_id,
            "space_id": space,
            "history_mode": "auto",
            "language_model": None,
            "roles": ["user", "assistant"],
            "contents": ["question", "answer"],
            "sources": ["request", "response"],
            "tokens": [1, 1],
            "job_id": job_id,
            "job_kind": "consolidation",
            "job_payload": orjson.dumps({"turn_id": str(turn_id)}).decode(),
            "job_max_attempts": 5,
            "idempotency_key": key,
            "request_hash": "0" * 64,
            "response_status": 202,
            "response_body": b"{}",
            "ttl_hours": 24,
        }
        sql, names = turns._TURN_WRITE[(turns.NEW_JOB, True, False)]  # an untraced turn
        for kind in ("", ", no seqscan"):
            transaction = conn.transaction()
            await transaction.start()
            try:
                plans.append(
                    await explain(
                        conn,
                        f"/turns: the write (turn, messages, job, record; rolled back){kind}",
                        sql,
                        [params[n] for n in names],
                    )
                )
            finally:
                await transaction.rollback()
        return plans
    finally:
        await conn.close()


def buffers(plan: Plan) -> int:
    """Shared buffers (hit + read + dirtied + written) of the statement's top node."""
    first = next((line for line in plan.text.splitlines() if "Buffers:" in line), "")
    shared = first.split("shared", 1)[-1].split(",", 1)[0] if "shared" in first else ""
    return sum(int(n) for n in re.findall(r"=(\d+)", shared))


def report(plans: list[Plan], title: str) -> str:
    lines = [f"### {title}", ""]
    for plan in plans:
        scans = plan.sequential_scans
        verdict = (
            "no sequential scan"
            if not scans
            else "sequential scans of "
            + ", ".join(f"{t} ({plan.table_pages.get(t, '?')} pages)" for t in scans)
        )
        lines += [
            f"**{plan.name}**: {verdict}; {buffers(plan)} shared buffers",
            "",
            "```",
            plan.text,
            "```",
            "",
        ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--company", default="bench-co")
    parser.add_argument("--user", default="user-1")
    parser.add_argument("--chat", default="chat-1")
    parser.add_argument("--space", default="space-1")
    args = parser.parse_args()
    plans = asyncio.run(hot_plans(args.dsn, args.company, args.user, args.chat, args.space))
    print(report(plans, f"Plans on {args.dsn.rsplit('/', 1)[-1]} for {args.user}"))


if __name__ == "__main__":
    main()
