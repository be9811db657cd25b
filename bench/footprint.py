"""Resident memory and start-up time of the service's two processes, as a Markdown report.

    .venv/bin/python bench/footprint.py [--runs 3] [--requests 2000] [--turns 100]

With the admin connection DATABASE_URL (default postgresql://postgres@127.0.0.1:5432/postgres)
it creates a scratch database `cms_footprint_<random>`, migrates it with `python -m app migrate`
and drops it at the end (also on a failure, Ctrl-C or SIGTERM). Then, `--runs` times each:

1. `python -m app serve` with WORKER_ENABLED=false (the API process of a deployment whose
   workers run apart): seconds from spawning it to the first 200 of `GET /readyz`, its resident
   set idle (a second after that) and after `--requests` requests over HTTP, half
   `POST /v1/chats/{id}/context` and half `POST /v1/chats/{id}/turns`, 8 at a time, spread
   over 200 users of a company with the context-memory flag on.
2. The same with the default in-process worker, consolidating the load's turns against the
   fixed-latency model stub (bench/fixed_latency_llm.py, 200 ms a call).
3. `python -m app worker` against the same stub, started with `--turns` turns (of 20 users)
   already queued and no other job waiting: seconds from spawning it to its first claim (a
   job of the run no longer `queued`), and its resident set once it has drained them.

Resident memory is VmRSS (now) and VmHWM (peak) from /proc. The report is printed and written to
var/bench/footprint_last_run.md; each process's log is in var/bench/footprint/.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import asyncpg
import httpx
from sqlalchemy import make_url

from app.kit.auth.mint import issue_token
from app.kit.config import Settings, to_asyncpg_url
from app.kit.principal import Principal
from bench.fixed_latency_llm import FixedLatencyLLM
from bench.run_bench import finish_waiting_jobs
from bench.worker_drain import (
    PROJECT_ROOT,
    SPACE,
    Memory,
    TurnQueue,
    WorkerSetup,
    app_settings,
    asyncpg_dsn,
    exchange,
    read_memory,
    user_id,
)

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
COMPANY = "footprint-co"
RUN_DIR = PROJECT_ROOT / "var" / "bench"
LOG_DIR = RUN_DIR / "footprint"
REPORT_PATH = RUN_DIR / "footprint_last_run.md"
LATENCY_SECONDS = 0.2
LOAD_USERS = 200
LOAD_CONCURRENCY = 8
WORKER_USERS = 20
POLL_SECONDS = 0.01
IDLE_SECONDS = 1.0
START_TIMEOUT_SECONDS = 60.0
DRAIN_TIMEOUT_SECONDS = 300.0
STOP_TIMEOUT_SECONDS = 30.0
FLOOR_LAST = "after work"
CONTEXT_QUESTION = "What should I know about this user before answering?"


@dataclass(frozen=True)
class Sample:
    """One process: seconds to ready (serve) or to its first claim (worker), its memory idle
    (serve only) and after its work."""

    seconds: float
    idle: Memory | None
    after: Memory


# --- processes --------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def environment(database_url: str, log_dir: Path, llm_base_url: str | None) -> dict[str, str]:
    """A process's environment as bench/worker_drain.py builds the worker's (the app's own
    settings dropped, so the defaults are the app's), with the model stub when given."""
    concurrency = Settings.model_fields["worker_concurrency"].default
    setup = WorkerSetup("stub" if llm_base_url else "rules", concurrency)
    return setup.environment(database_url, log_dir / "worker.heartbeat", llm_base_url)


@contextlib.asynccontextmanager
async def spawned(command: Sequence[str], env: dict[str, str], log_dir: Path) -> AsyncIterator[int]:
    """The process of `command`, logging to `log_dir`, stopped (SIGTERM, then SIGKILL) at the
    end of the block; yields its pid."""
    log = _open_log(log_dir)
    with log:
        process = await asyncio.create_subprocess_exec(
            *command, cwd=log_dir, env=env, stdout=log, stderr=log
        )
    try:
        yield process.pid
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.terminate()
            try:
                await asyncio.wait_for(process.wait(), STOP_TIMEOUT_SECONDS)
            except TimeoutError:
                process.kill()
                await process.wait()


def _open_log(log_dir: Path) -> BinaryIO:
    log_dir.mkdir(parents=True, exist_ok=True)
    (log_dir / "worker.heartbeat").unlink(missing_ok=True)
    return (log_dir / "process.log").open("wb")


def log_tail(log_dir: Path, lines: int = 30) -> str:
    with contextlib.suppress(OSError):
        text = (log_dir / "process.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])
    return ""


# --- serve ------------------------------------------------------------------------------------


async def wait_ready(http: httpx.AsyncClient, base: str, started: float, log_dir: Path) -> float:
    """Seconds from `started` to the first 200 of `/readyz`."""
    while time.monotonic() - started < START_TIMEOUT_SECONDS:
        with contextlib.suppress(httpx.TransportError):
            if (await http.get(f"{base}/readyz")).status_code == 200:
                return time.monotonic() - started
        await asyncio.sleep(POLL_SECONDS)
    raise RuntimeError(
        f"serve was not ready within {START_TIMEOUT_SECONDS:g} s:\n{log_tail(log_dir)}"
    )


async def load(
    http: httpx.AsyncClient, base: str, settings: Settings, requests: int, tag: str
) -> None:
    """`requests` requests, alternating `/context` and `/turns`, LOAD_CONCURRENCY at a time over
    LOAD_USERS users; any unexpected status fails the run."""
    tokens = [
        issue_token(settings, Principal(user_id(tag, user), COMPANY, frozenset()))
        for user in range(LOAD_USERS)
    ]
    numbers = iter(range(requests))

    async def one_client() -> None:
        for number in numbers:
            user = number // 2 % LOAD_USERS
            chat = f"{base}/v1/chats/{user_id(tag, user)}-chat"
            headers = {"Authorization": f"Bearer {tokens[user]}"}
            if number % 2:
                said, answer = exchange(user, number)
                body = {
                    "space_id": SPACE,
                    "messages": [{"role": "user", "content": said}],
                    "response": {"role": "assistant", "content": answer},
                }
                path, expected = f"{chat}/turns", 202
            else:
                body = {
                    "space_id": SPACE,
                    "messages": [{"role": "user", "content": CONTEXT_QUESTION}],
                }
                path, expected = f"{chat}/context", 200
            response = await http.post(path, json=body, headers=headers)
            if response.status_code != expected:
                raise RuntimeError(f"{path} answered {response.status_code}: {response.text[:300]}")

    await asyncio.gather(*(one_client() for _ in range(LOAD_CONCURRENCY)))


async def measure_serve(
    database_url: str, settings: Settings, requests: int, run: str, llm_base_url: str | None
) -> Sample:
    """One `serve` process: with the worker off, or (`llm_base_url`) on against the stub."""
    log_dir = LOG_DIR / run
    env = environment(database_url, log_dir, llm_base_url)
    if llm_base_url is None:
        env["WORKER_ENABLED"] = "false"
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "app", "serve", "--port", str(port)]
    limits = httpx.Limits(max_connections=LOAD_CONCURRENCY)
    async with httpx.AsyncClient(timeout=30, limits=limits) as http:
        started = time.monotonic()
        async with spawned(command, env, log_dir) as pid:
            seconds = await wait_ready(http, base, started, log_dir)
            await asyncio.sleep(IDLE_SECONDS)
            idle = read_memory(pid)
            await load(http, base, settings, requests, run)
            after = read_memory(pid)
    return Sample(seconds, idle, after)


# --- worker -----------------------------------------------------------------------------------

_LEFT_QUEUED = "SELECT count(*) FROM jobs WHERE user_id LIKE $1 AND status <> 'queued'"
_PENDING = """SELECT count(*) FROM jobs
 WHERE user_id LIKE $1 AND status IN ('queued', 'running', 'retrying')"""


async def measure_worker(  # noqa: PLR0917 - the run's parts, each once
    database_url: str,
    queue: TurnQueue,
    db: asyncpg.Connection,
    turns: int,
    run: str,
    llm_base_url: str,
) -> Sample:
    """One `worker` process, started with `turns` turns of the run's users queued (and no
    other job waiting: the serve runs' turns are marked done first, as a worker would)."""
    await finish_waiting_jobs(asyncpg_dsn(database_url))
    await queue.queue(run, WORKER_USERS, max(1, turns // WORKER_USERS))
    await db.execute("VACUUM ANALYZE jobs")
    log_dir = LOG_DIR / run
    env = environment(database_url, log_dir, llm_base_url)
    users = f"{run}-u%"
    started = time.monotonic()
    async with spawned([sys.executable, "-m", "app", "worker"], env, log_dir) as pid:
        while not await db.fetchval(_LEFT_QUEUED, users):
            if time.monotonic() - started > START_TIMEOUT_SECONDS:
                raise RuntimeError(f"the worker claimed nothing:\n{log_tail(log_dir)}")
            await asyncio.sleep(POLL_SECONDS)
        seconds = time.monotonic() - started
        while await db.fetchval(_PENDING, users):
            if time.monotonic() - started > DRAIN_TIMEOUT_SECONDS:
                raise RuntimeError(f"the worker did not drain:\n{log_tail(log_dir)}")
            await asyncio.sleep(POLL_SECONDS * 5)
        after = read_memory(pid)
    return Sample(seconds, None, after)


async def measure_floor(database_url: str, llm_base_url: str) -> dict[str, int]:
    """bench/stack_floor.py's VmRSS (KiB) after each of its steps, in order."""
    floor = await asyncio.create_subprocess_exec(
        sys.executable,
        str(PROJECT_ROOT / "bench" / "stack_floor.py"),
        database_url,
        llm_base_url,
        cwd=PROJECT_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    output, errors = await asyncio.wait_for(floor.communicate(), DRAIN_TIMEOUT_SECONDS)
    if floor.returncode:
        raise RuntimeError(f"bench/stack_floor.py failed:\n{errors.decode(errors='replace')}")
    steps = [json.loads(line) for line in output.decode().splitlines() if line.strip()]
    return {str(step["step"]): int(step["rss_kb"]) for step in steps}


# --- the run ----------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def scratch_database(admin_url: str) -> AsyncIterator[str]:
    """A new database migrated by `python -m app migrate`, dropped at the end."""
    name = f"cms_footprint_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(asyncpg_dsn(admin_url))
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = make_url(to_asyncpg_url(admin_url)).set(database=name)
    database_url = url.render_as_string(hide_password=False)
    try:
        env = {key: value for key, value in os.environ.items() if key != "DATABASE_URL"}
        migrate = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "app",
            "migrate",
            cwd=PROJECT_ROOT,
            env=env | {"DATABASE_URL": database_url},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        output, _ = await migrate.communicate()
        if migrate.returncode:
            raise RuntimeError(f"python -m app migrate failed:\n{output.decode(errors='replace')}")
        yield database_url
    finally:
        admin = await asyncpg.connect(asyncpg_dsn(admin_url))
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


@dataclass(frozen=True)
class Results:
    serve: list[Sample]
    serve_worker: list[Sample]
    worker: list[Sample]
    floor: list[dict[str, int]]


async def measure(args: argparse.Namespace) -> Results:
    results = Results([], [], [], [])
    async with scratch_database(args.admin_url) as database_url:
        settings = app_settings(database_url)
        db = await asyncpg.connect(asyncpg_dsn(database_url))
        try:
            async with (
                FixedLatencyLLM(LATENCY_SECONDS) as stub,
                TurnQueue(database_url, COMPANY) as queue,
            ):
                for run in range(1, args.runs + 1):
                    print(f"run {run}/{args.runs}", file=sys.stderr)
                    sample = await measure_serve(
                        database_url, settings, args.requests, f"s{run}", None
                    )
                    print(f"    serve, worker off: {describe(sample)}", file=sys.stderr)
                    results.serve.append(sample)
                    sample = await measure_serve(
                        database_url, settings, args.requests, f"w{run}", stub.base_url
                    )
                    print(f"    serve, in-process worker: {describe(sample)}", file=sys.stderr)
                    results.serve_worker.append(sample)
                    sample = await measure_worker(
                        database_url, queue, db, args.turns, f"k{run}", stub.base_url
                    )
                    print(f"    worker: {describe(sample)}", file=sys.stderr)
                    results.worker.append(sample)
                    floor = await measure_floor(database_url, stub.base_url)
                    print(f"    stack alone: {mib(floor[FLOOR_LAST]):.0f} MiB", file=sys.stderr)
                    results.floor.append(floor)
        finally:
            await db.close()
    return results


# --- the report -------------------------------------------------------------------------------


def mib(kb: int) -> float:
    return kb / 1024


def describe(sample: Sample) -> str:
    idle = f"idle {mib(sample.idle.rss_kb):.0f} MiB, " if sample.idle else ""
    return (
        f"{sample.seconds:.2f} s, {idle}after {mib(sample.after.rss_kb):.0f} MiB "
        f"(peak {mib(sample.after.hwm_kb):.0f} MiB)"
    )


def spread(values: Sequence[float], digits: int) -> str:
    if not values:
        return "–"
    middle = statistics.median(values)
    if len(values) == 1:
        return f"{middle:.{digits}f}"
    return f"**{middle:.{digits}f}** ({min(values):.{digits}f}–{max(values):.{digits}f})"


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


def render(results: Results, args: argparse.Namespace) -> str:
    commit = _git("rev-parse", "--short", "HEAD") or "unknown"
    dirty = " (with uncommitted changes in app/)" if _git("status", "--porcelain", "app") else ""
    options = f"--runs {args.runs} --requests {args.requests} --turns {args.turns}"
    lines = [
        "# Footprint: resident memory and start-up "
        f"({time.strftime('%Y-%m-%d')}, commit {commit}{dirty})",
        "",
        f"{os.cpu_count()} cores; `{options}`; medians (min–max); memory in MiB.",
        "",
        "| process | seconds to ready / first claim | RSS idle | RSS after work | peak (VmHWM) |",
        "|---|---:|---:|---:|---:|",
    ]
    rows = (
        ("`serve`, WORKER_ENABLED=false", results.serve),
        ("`serve`, in-process worker (model stub)", results.serve_worker),
        ("`worker` (model stub)", results.worker),
    )
    for label, samples in rows:
        idle = [mib(s.idle.rss_kb) for s in samples if s.idle is not None]
        lines.append(
            f"| {label} | {spread([s.seconds for s in samples], 2)} | {spread(idle, 0)} "
            f"| {spread([mib(s.after.rss_kb) for s in samples], 0)} "
            f"| {spread([mib(s.after.hwm_kb) for s in samples], 0)} |"
        )
    floors = [mib(floor[FLOOR_LAST]) for floor in results.floor]
    lines.append(f"| the stack alone (bench/stack_floor.py) | – | – | {spread(floors, 0)} | – |")
    lines += ["", "The stack alone, VmRSS after each step (MiB):", ""]
    steps = list(results.floor[0]) if results.floor else []
    lines += ["| " + " | ".join(steps) + " |", "|" + "---:|" * len(steps)]
    lines.append(
        "| " + " | ".join(spread([mib(f[step]) for f in results.floor], 0) for step in steps) + " |"
    )
    lines += [
        "",
        f"Work: `serve` answered {args.requests} requests (half `/context`, half `/turns`, "
        f"{LOAD_CONCURRENCY} at a time); the worker drained {args.turns} turns of "
        f"{WORKER_USERS} users against a model stub at {LATENCY_SECONDS * 1000:.0f} ms a call.",
    ]
    return "\n".join(lines) + "\n"


async def main_async(args: argparse.Namespace) -> int:
    # SIGTERM (e.g. `timeout`) cancels the run, so the processes stop and the database is dropped
    task = asyncio.current_task()
    if task is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    results = await measure(args)
    report = render(results, args)
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    REPORT_PATH.write_text(report, encoding="utf-8")
    print(report)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=3, help="processes of each kind (median)")
    parser.add_argument("--requests", type=int, default=2000, help="requests to each serve")
    parser.add_argument("--turns", type=int, default=100, help="turns queued for each worker")
    parser.add_argument(
        "--admin-url",
        default=os.environ.get("DATABASE_URL", DEFAULT_ADMIN_URL),
        help="admin connection (default DATABASE_URL, else the local postgres)",
    )
    args = parser.parse_args(argv)
    return asyncio.run(main_async(args))


if __name__ == "__main__":
    sys.exit(main())
