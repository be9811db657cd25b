"""The consolidation worker's throughput, backlog drain time and memory, as a Markdown report.

    .venv/bin/python bench/worker_bench.py [--quick] [--runs 3] [--latency-ms 200]
        [--concurrency 1,4,16] [--only rules,stub,statements]

With the admin connection DATABASE_URL (default postgresql://postgres@127.0.0.1:5432/postgres)
it creates a scratch database `cms_worker_bench_<random>`, migrates it and drops it at the end
(also on a failure or Ctrl-C). Turns are saved through the app's turn-save route
(bench/worker_drain.py), one worker process (`python -m app worker`) per setup drains them:

1. throughput, offline engine (LLM_PROVIDER=rules): one turn for each of 150 new users per
   drain, at each WORKER_CONCURRENCY; consolidations (claims) per second.
2. throughput, model at a fixed latency (LLM_PROVIDER=openai against bench/fixed_latency_llm.py,
   200 ms per call): 24 × concurrency users with one turn each; consolidations and model calls
   per second against the ideal, concurrency ÷ latency model calls per second.
3. backlog: 1,000 turns of 100 users (10 each) queued before the worker runs, with each engine
   at concurrency 16; and once more with JOB_BATCH_SIZE=1 (no coalescing), to count what
   coalescing saves.
4. memory: the worker's resident set (VmRSS sampled while it drains, VmHWM) across the
   consecutive drains of each process.
5. statements per consolidation, offline engine, at each concurrency: the same worker run in
   the harness's process, 100 one-turn users (bench/worker_statements.py).

Each setup's drains run `--runs` times in the same process, on new users each time; tables show
medians. About 15 minutes; `--quick` (concurrency 4, one small drain of each kind, no
JOB_BATCH_SIZE=1 runs) under a minute. The report is printed and written to
var/bench/worker_last_run.md; each worker's log is in var/bench/worker-N/.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import signal
import statistics
import subprocess
import sys
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import asyncpg
from sqlalchemy import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.kit.config import to_asyncpg_url
from app.kit.db.migrations import run_migrations
from bench.fixed_latency_llm import FixedLatencyLLM
from bench.worker_drain import (
    PROJECT_ROOT,
    DrainResult,
    Memory,
    TurnQueue,
    WorkerProcess,
    WorkerSetup,
    asyncpg_dsn,
    connect,
    run_drain,
)
from bench.worker_statements import (
    OWNER_QUERY,
    TRANSACTION,
    StatementCount,
    count_statements,
)

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
COMPANY = "bench-co"
RUN_DIR = PROJECT_ROOT / "var" / "bench"
REPORT_PATH = RUN_DIR / "worker_last_run.md"
THROUGHPUT, BACKLOG = "throughput", "backlog"


@dataclass(frozen=True)
class Drain:
    kind: str
    users: int
    turns_per_user: int


@dataclass(frozen=True)
class Plan:
    setup: WorkerSetup
    drains: tuple[Drain, ...]


def plans(args: argparse.Namespace) -> list[Plan]:
    """Setups in the order they run, each one worker process."""
    runs = 1 if args.quick else args.runs
    levels = [4] if args.quick else args.concurrency
    rules_users, backlog_users, backlog_turns = (50, 10, 3) if args.quick else (150, 100, 10)
    backlog_level = max(levels) if args.quick else 16
    backlog = (Drain(BACKLOG, backlog_users, backlog_turns),)
    result: list[Plan] = []
    for engine in ("rules", "stub"):
        if engine not in args.only:
            continue
        for level in sorted(set(levels) | {backlog_level}):
            drains: tuple[Drain, ...] = ()
            if level in levels:
                users = rules_users if engine == "rules" else (20 if args.quick else 24 * level)
                drains += (Drain(THROUGHPUT, users, 1),) * runs
            if level == backlog_level:
                drains += backlog * runs
            result.append(Plan(WorkerSetup(engine, level), drains))
        if not args.quick:
            result.append(Plan(WorkerSetup(engine, backlog_level, batch_size=1), backlog))
    return result


# --- running ----------------------------------------------------------------------------------


async def measure(
    admin_url: str, latency_seconds: float, todo: Sequence[Plan], counted: Sequence[int], users: int
) -> tuple[list[Result], list[StatementCount]]:
    name = f"cms_worker_bench_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(asyncpg_dsn(admin_url))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = make_url(to_asyncpg_url(admin_url)).set(database=name)
    database_url = url.render_as_string(hide_password=False)
    results: list[Result] = []
    counts: list[StatementCount] = []
    try:
        await asyncio.to_thread(run_migrations, database_url)
        db = await connect(database_url)
        try:
            async with (
                FixedLatencyLLM(latency_seconds) as stub,
                TurnQueue(database_url, COMPANY) as queue,
            ):
                for number, plan in enumerate(todo, 1):
                    print(f"[{number}/{len(todo)}] {plan.setup.label}", file=sys.stderr)
                    workdir = RUN_DIR / f"worker-{number}"
                    base_url = stub.base_url if plan.setup.engine == "stub" else None
                    async with WorkerProcess(plan.setup, database_url, workdir, base_url) as worker:
                        startup = worker.startup_memory
                        for index, drain in enumerate(plan.drains):
                            result = await run_drain(
                                queue,
                                worker,
                                db,
                                tag=f"s{number}d{index}",
                                users=drain.users,
                                turns_per_user=drain.turns_per_user,
                                stub=stub if plan.setup.engine == "stub" else None,
                            )
                            print(f"    {drain.kind}: {summary(result)}", file=sys.stderr)
                            results.append(Result(drain.kind, index, startup, result))
                for level in counted:
                    print(f"statements, in process, WORKER_CONCURRENCY={level}", file=sys.stderr)
                    counts.append(
                        await count_statements(
                            database_url, queue, db, tag=f"c{level}", users=users, concurrency=level
                        )
                    )
        finally:
            await db.close()
    finally:
        admin = await asyncpg.connect(asyncpg_dsn(admin_url))
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()
    return results, counts


@dataclass(frozen=True)
class Result:
    kind: str
    index: int
    startup: Memory | None
    drain: DrainResult


def summary(r: DrainResult) -> str:
    return (
        f"{r.turns} turns, {r.claims} claims, {r.calls} model calls in {r.seconds:.2f} s"
        f" = {r.claims_per_second:.1f} claims/s; dead {r.dead}, pending {r.pending},"
        f" versions {r.versions}, CPU {r.cpu_share:.0%}, RSS {r.peak_rss_kb / 1024:.0f} MB"
    )


# --- the report -------------------------------------------------------------------------------


def _git(*args: str) -> str:
    try:
        done = subprocess.run(  # noqa: S603 - fixed git command, read-only
            ["git", "-C", str(PROJECT_ROOT), *args],  # noqa: S607
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return ""
    return done.stdout.strip()


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.partition(":")[2].strip()
    return platform.processor() or "unknown"


def _median(results: Sequence[DrainResult], value: Callable[[DrainResult], float]) -> float:
    return statistics.median(value(r) for r in results)


def _spread(results: Sequence[DrainResult], value: Callable[[DrainResult], float]) -> str:
    values = [value(r) for r in results]
    if len(values) == 1:
        return f"{values[0]:.1f}"
    return f"**{statistics.median(values):.1f}** ({min(values):.1f}–{max(values):.1f})"


def _mb(kb: float) -> str:
    return f"{kb / 1024:.0f}"


def _groups(results: Sequence[Result], kind: str, engine: str) -> list[list[DrainResult]]:
    by_setup: dict[WorkerSetup, list[DrainResult]] = {}
    for result in results:
        if result.kind == kind and result.drain.setup.engine == engine:
            by_setup.setdefault(result.drain.setup, []).append(result.drain)
    return list(by_setup.values())


def render(
    results: Sequence[Result],
    counts: Sequence[StatementCount],
    args: argparse.Namespace,
    server_version: str,
) -> str:
    latency = args.latency_ms / 1000
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = " (app/ had uncommitted changes)" if _git("status", "--porcelain", "--", "app") else ""
    command = " ".join([".venv/bin/python", "bench/worker_bench.py", *sys.argv[1:]])
    lines = [
        "# Worker benchmark",
        "",
        f"- Command: `{command}`",
        f"- Commit: {commit}{dirty}",
        f"- Date: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
        f"- Machine: {os.cpu_count()} CPUs ({_cpu_model()}), PostgreSQL {server_version},"
        f" Python {platform.python_version()}",
        "- Worker: one `python -m app worker` process per setup, LOG_LEVEL=WARNING, other settings"
        " at the app's defaults (WORKER_POLL_SECONDS=1, JOB_BATCH_SIZE=10, DB_POOL_SIZE=20)."
        " Turns are queued with the worker stopped (SIGSTOP), then VACUUM ANALYZE; a drain is"
        " timed from SIGCONT until no job is queued, running or retrying (polled every 20 ms).",
        "- A consolidation (claim) is one pipeline run over one user's coalesced jobs;"
        f" medians of {1 if args.quick else args.runs} drain(s) on new users, (min–max).",
        "",
    ]
    lines += ["## 1. Offline engine (`LLM_PROVIDER=rules`), one turn per user", ""]
    lines += [
        "| WORKER_CONCURRENCY | turns | drain s | consolidations/s | versions | worker CPU"
        " | CPU ms/consolidation |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for group in _groups(results, THROUGHPUT, "rules"):
        first = group[0]
        lines.append(
            f"| {first.setup.concurrency} | {first.turns} | {_spread(group, lambda r: r.seconds)}"
            f" | {_spread(group, lambda r: r.claims_per_second)} | {first.versions}"
            f" | {_median(group, lambda r: r.cpu_share):.0%}"
            f" | {_median(group, lambda r: 1000 * r.cpu_seconds / r.claims):.1f} |"
        )
    lines += [
        "",
        f"## 2. Model stub answering after {args.latency_ms:g} ms (`LLM_PROVIDER=openai`),"
        " one turn per user",
        "",
        "Ideal: concurrency ÷ latency model calls per second, i.e. concurrency ÷ (latency ×"
        " calls per consolidation) consolidations per second.",
        "",
        "| WORKER_CONCURRENCY | turns | model calls/consolidation | drain s | consolidations/s"
        " | ideal | model calls/s | ideal | **achieved** | mean / peak calls in flight"
        " | slowest call ms | worker CPU | CPU ms/consolidation |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for group in _groups(results, THROUGHPUT, "stub"):
        first, level = group[0], group[0].setup.concurrency
        per_claim = _median(group, lambda r: r.calls_per_claim)
        calls = _median(group, lambda r: r.calls_per_second)
        lines.append(
            f"| {level} | {first.turns} | {per_claim:.2f}"
            f" | {_spread(group, lambda r: r.seconds)}"
            f" | {_spread(group, lambda r: r.claims_per_second)}"
            f" | {level / latency / per_claim:.1f}"
            f" | {calls:.1f} | {level / latency:.1f} | **{calls / (level / latency):.0%}**"
            f" | {_median(group, lambda r: r.stub_busy_seconds / r.seconds):.1f} /"
            f" {max(r.stub_peak_in_flight for r in group)}"
            f" | {max(r.stub_slowest_seconds for r in group) * 1000:.0f}"
            f" | {_median(group, lambda r: r.cpu_share):.0%}"
            f" | {_median(group, lambda r: 1000 * r.cpu_seconds / r.claims):.1f} |"
        )
    lines += [
        "",
        "## 3. Backlog: turns of many users queued before the worker runs",
        "",
        "| engine | WORKER_CONCURRENCY | JOB_BATCH_SIZE | turns | users | consolidations"
        " | model calls | versions | drain s | turns/s | worker CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for engine in ("rules", "stub"):
        for group in _groups(results, BACKLOG, engine):
            first = group[0]
            made = f"{_median(group, lambda r: r.calls):.0f}" if engine == "stub" else "–"
            lines.append(
                f"| {engine} | {first.setup.concurrency} | {first.setup.batch_size}"
                f" | {first.turns} | {first.users} | {_median(group, lambda r: r.claims):.0f}"
                f" | {made} | {_median(group, lambda r: r.versions):.0f}"
                f" | {_spread(group, lambda r: r.seconds)}"
                f" | {_spread(group, lambda r: r.turns_per_second)}"
                f" | {_median(group, lambda r: r.cpu_seconds):.1f} |"
            )
    lines += [
        "",
        "## 4. Worker memory (MB resident)",
        "",
        "| setup | at start | after drain 1, 2, ... | peak while draining, drain 1, 2, ..."
        " | VmHWM at the end |",
        "|---|---:|---|---|---:|",
    ]
    by_setup: dict[WorkerSetup, list[Result]] = {}
    for result in results:
        by_setup.setdefault(result.drain.setup, []).append(result)
    for setup, drains in by_setup.items():
        start, last = drains[0].startup, drains[-1].drain.memory_after
        after = ", ".join(_mb(r.drain.memory_after.rss_kb) for r in drains if r.drain.memory_after)
        peaks = ", ".join(_mb(r.drain.peak_rss_kb) for r in drains)
        lines.append(
            f"| {setup.label} | {_mb(start.rss_kb) if start else '?'} | {after} | {peaks}"
            f" | {_mb(last.hwm_kb) if last else '?'} |"
        )
    lines += [
        "",
        "## 5. Statements per consolidation (offline engine, worker in the harness's process)",
        "",
        "| WORKER_CONCURRENCY | consolidations | statements | transactions | owner queries"
        " | CPU ms/consolidation | consolidations/s |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [
        f"| {c.concurrency} | {c.claims} | {c.per_claim():.1f} | {c.per_claim(TRANSACTION):.1f}"
        f" | {c.per_claim(OWNER_QUERY):.2f} | {1000 * c.cpu_seconds / c.claims:.1f}"
        f" | {c.claims / c.seconds:.1f} |"
        for c in counts
    ]
    failed = [r.drain for r in results if not r.drain.clean]
    lines += ["", f"Drains with dead, pending or timed-out jobs: {len(failed)}."]
    lines += [f"- {r.setup.label} {r.tag}: {summary(r)}" for r in failed]
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> int:
    # SIGTERM (e.g. `timeout`) cancels the run, so the worker is stopped and the database dropped
    task = asyncio.current_task()
    if task is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    todo = plans(args)
    counted, users = ([4], 20) if args.quick else (args.concurrency, 100)
    if "statements" not in args.only:
        counted = []
    results, counts = await measure(args.admin_url, args.latency_ms / 1000, todo, counted, users)
    admin = await asyncpg.connect(asyncpg_dsn(args.admin_url))
    try:
        server_version = await admin.fetchval("SHOW server_version")
    finally:
        await admin.close()
    report = render(results, counts, args, str(server_version).split()[0])
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    REPORT_PATH.write_text(report, encoding="utf-8")
    print(report)
    return 0 if all(r.drain.clean for r in results) else 1


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a small version (under a minute): concurrency 4, 1 drain, no JOB_BATCH_SIZE=1 runs",
    )
    parser.add_argument("--runs", type=int, default=3, help="drains per setup (median)")
    parser.add_argument("--latency-ms", type=float, default=200.0, help="the stub's latency")
    parser.add_argument(
        "--concurrency",
        type=lambda value: [int(part) for part in value.split(",")],
        default=[1, 4, 16],
        help="WORKER_CONCURRENCY levels of the throughput drains",
    )
    parser.add_argument(
        "--only",
        type=lambda value: set(value.split(",")),
        default={"rules", "stub", "statements"},
        help="what to run, a subset of rules,stub,statements (default: all)",
    )
    parser.add_argument("--admin-url", default=os.environ.get("DATABASE_URL") or DEFAULT_ADMIN_URL)
    return asyncio.run(main_async(parser.parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
