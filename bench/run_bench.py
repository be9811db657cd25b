"""`make bench`: our two hot-path calls side by side with the reference app, over HTTP, with wrk.

    .venv/bin/python bench/run_bench.py [--duration 10] [--runs 3] [--connections 16,64]
        [--users 2000] [--only context,turns,ceiling] [--variants pre-ping,fixed-pool]
        [--profile]

What it does (see bench/README.md and docs/benchmarks.md):

1. With the admin connection DATABASE_URL (default postgresql://postgres@127.0.0.1:5432/postgres)
   it (re)creates two scratch databases: `cms_bench` (ours, migrated to head) and `appbench`
   (the reference app's, seeded per its docstring), both at the same scale (--users, default
   2,000 instead of the docstring's 10,000, to keep seeding fast).
2. Seeds ours with the same shape: N users of one company with the context-memory flag on, each
   with the per-user folder and ACL, a head profile version of ~8 KB (~1,800 tokens, under the
   default budget of 2,000, tokens stored) and one chat of 20 stored messages (10 turns) whose
   contents are byte-for-byte the reference's (512 hex chars, tokens stored). bench/seed.py
   writes them with set-based SQL and COPY (100,000 users in minutes) and checks sampled users
   against what the app's own services write; both sides end with VACUUM ANALYZE.
   One JWT per user goes into the request lists wrk replays (bench/wrk_requests.lua).
3. Starts the reference app (`uvicorn --workers 1 --loop uvloop --http httptools
   --no-access-log`) and our service (bench/serve_ours.py: the same uvicorn settings on
   `app.main.create_app`, WORKER_ENABLED=false, LOG_LEVEL=WARNING, ENVIRONMENT=test, its own
   JWT_SECRET) on free loopback ports, and checks one answer of every call before measuring.
4. Runs `wrk -t1 -d DURATION --latency` at each concurrency, `--runs` times, alternating which
   side goes first: ours POST /context vs GET /apg/inject/{uid}, ours POST /turns vs
   POST /apg/turn/{cid}, ours GET /healthz vs GET /const. Prints the medians and ours/reference
   ratios as Markdown, and exits 1 if any answer was not the expected status. Before each run
   of our turn-saves, the jobs they queued are marked succeeded, as a worker that keeps up
   would leave them (`--backlog` keeps them waiting: users then pass the quota of waiting
   jobs, and the turn-saves after that coalesce into their newest job).
5. Stops the servers and drops both databases, also on failure or Ctrl-C.

--variants adds more instances of our service with other pool settings, measured in the same
runs (see VARIANTS): `pre-ping` (DB_POOL_PRE_PING=true), `fixed-pool` (DB_MAX_OVERFLOW=0: a fixed
pool of DB_POOL_SIZE, like the reference's 20), `pool10-pre-ping` (10 + 10 overflow with pre-ping,
the defaults before commit c2deb0e), `workers2` (API_WORKERS=2: two processes, as
`python -m app serve --workers 2`; its server CPU counts both), `workers4` (four, with hot-path
pools of 10), `tracing-off` (nothing configured, as `ours`: the noise floor beside it),
`tracing-0pct` (tracing on, nothing sampled: what every request pays for it being on),
`tracing-10pct` (traces sampled at 10 %, exported over OTLP/HTTP to a local sink that counts and
discards them, bench/otlp_sink.py).
--citus adds `citus`: the same service on a Citus cluster started for the run (a coordinator and
two workers on this machine, bench/citus_cluster.py), seeded alike, measured in the same runs
as `ours` on the single PostgreSQL; and `citus-worker-reads`, the same with
`CITUS_WORKER_READS=true`; the variant table gives cluster / one node.
--profile instead runs our service under cProfile during one wrk run per call (c=16) and prints
where the process time goes.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import pstats
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import asyncpg
from pydantic import SecretStr
from sqlalchemy import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.kit.auth.mint import issue_token
from app.kit.config import Settings
from app.kit.principal import Principal
from app.profiles.document import parse
from bench import explain
from bench.citus_cluster import BenchCluster
from bench.otlp_sink import OtlpSink
from bench.seed import (
    COMPANY,
    HISTORY_MESSAGES,
    SPACE,
    check_against_reference,
    context_chat,
    profile_document,
    seed_ours,
    turns_chat,
    user_id,
)
from bench.seed import seed_reference as seed_reference  # noqa: PLC0414 - hot_path_quick.py

BENCH_DIR = Path(__file__).resolve().parent
PROJECT_ROOT = BENCH_DIR.parent
DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
OURS_DB, REFERENCE_DB = "cms_bench", "appbench"
JWT_SECRET = "bench-only-secret-not-the-development-default"  # noqa: S105 - scratch service
LUA_SCRIPT = BENCH_DIR / "wrk_requests.lua"
REFERENCE_APP = BENCH_DIR / "reference_app.py"
RUN_DIR = PROJECT_ROOT / "var" / "bench"
WRK_TIMEOUT_SECONDS = 10  # wrk's default (2 s) drops slow answers from the latency figures
STATS_SETTLE_SECONDS = 1.0

# The reference's turn body: 500 chars of user text and 500 of answer, the same on both sides.
TURN_TEXT = "".join(chr(97 + (i * 7) % 26) for i in range(1, 501))
CONTEXT_QUESTION = "What should I focus on this week, given what you know about my work?"


class BenchError(RuntimeError):
    """A setup step failed; the message says which."""


# --- databases --------------------------------------------------------------------------------


def plain_dsn(url: str, database: str | None = None) -> str:
    """`url` as a libpq-style DSN (postgresql://), optionally for another database."""
    parsed = make_url(url.replace("postgresql+asyncpg://", "postgresql://", 1))
    if database is not None:
        parsed = parsed.set(database=database)
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


async def recreate_databases(admin_dsn: str, names: Sequence[str]) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        for name in names:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()


async def drop_databases(admin_dsn: str, names: Sequence[str]) -> None:
    conn = await asyncpg.connect(admin_dsn)
    try:
        for name in names:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    finally:
        await conn.close()


async def database_sessions(admin_dsn: str) -> dict[str, int]:
    """Connections ever opened per scratch database (pg_stat_database.sessions, PostgreSQL 14+).

    Backends report statistics when idle, at most once a second and up to ~10 s late once
    the load stops, so a run's delta can include a few connections of the run before it on the
    same database: read it as the order of magnitude of pool churn, not an exact count.
    """
    conn = await asyncpg.connect(admin_dsn)
    try:
        rows = await conn.fetch(
            "SELECT datname, sessions FROM pg_stat_database WHERE datname = ANY($1::text[])",
            [OURS_DB, REFERENCE_DB],
        )
    except asyncpg.UndefinedColumnError:  # PostgreSQL before 14
        return {}
    finally:
        await conn.close()
    return {str(r["datname"]): int(r["sessions"] or 0) for r in rows}


# --- request lists (read by wrk_requests.lua) ---------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One endpoint under load: which server, the request list wrk replays, what must come back."""

    key: str
    server: str
    label: str
    requests_file: Path
    body_file: Path | None
    expect: frozenset[int]


def write_request_lists(
    run_dir: Path, settings: Settings, users: int, variants: Sequence[str]
) -> dict[str, Target]:
    tokens = {
        user: issue_token(
            settings, Principal(user_id(user), COMPANY, frozenset()), ttl_seconds=6 * 3600
        )
        for user in range(1, users + 1)
    }
    (run_dir / "tokens.tsv").write_text(
        "".join(f"{user_id(u)}\t{context_chat(u)}\t{tokens[u]}\n" for u in tokens)
    )

    def write(name: str, lines: Iterator[str]) -> Path:
        path = run_dir / name
        path.write_text("".join(f"{line}\n" for line in lines))
        return path

    def write_json(name: str, body: dict[str, Any]) -> Path:
        path = run_dir / name
        path.write_text(json.dumps(body))
        return path

    users_range = range(1, users + 1)
    context = write(
        "ours_context.tsv",
        (f"POST\t/v1/chats/{context_chat(u)}/context\t{tokens[u]}" for u in users_range),
    )
    turns = write(
        "ours_turns.tsv",
        (f"POST\t/v1/chats/{turns_chat(u)}/turns\t{tokens[u]}" for u in users_range),
    )
    healthz = write("ours_healthz.tsv", iter(["GET\t/healthz\t-"]))
    inject = write("ref_inject.tsv", (f"GET\t/apg/inject/{u}\t-" for u in users_range))
    # the reference's turn-saves go to conversations of their own too (users+1 .. 2*users)
    ref_turn = write("ref_turn.tsv", (f"POST\t/apg/turn/{users + u}\t-" for u in users_range))
    const = write("ref_const.tsv", iter(["GET\t/const\t-"]))
    context_body = write_json(
        "context_body.json",
        {"space_id": SPACE, "messages": [{"role": "user", "content": CONTEXT_QUESTION}]},
    )
    turn_body = write_json(
        "turn_body.json",
        {
            "space_id": SPACE,
            "messages": [{"role": "user", "content": TURN_TEXT}],
            "response": {"role": "assistant", "content": TURN_TEXT},
        },
    )
    ref_turn_body = write_json("ref_turn_body.json", {"user": TURN_TEXT, "assistant": TURN_TEXT})

    targets: dict[str, Target] = {}
    for variant in variants:
        suffix = "" if variant == "ours" else f"[{variant}]"
        targets[f"{variant}:context"] = Target(
            "context", variant, f"POST /context{suffix}", context, context_body, frozenset({200})
        )
        targets[f"{variant}:turns"] = Target(
            "turns", variant, f"POST /turns{suffix}", turns, turn_body, frozenset({202})
        )
        targets[f"{variant}:ceiling"] = Target(
            "ceiling", variant, f"GET /healthz{suffix}", healthz, None, frozenset({200})
        )
    targets["ref:context"] = Target(
        "context", "ref", "GET /apg/inject", inject, None, frozenset({200})
    )
    targets["ref:turns"] = Target(
        "turns", "ref", "POST /apg/turn", ref_turn, ref_turn_body, frozenset({200})
    )
    targets["ref:ceiling"] = Target("ceiling", "ref", "GET /const", const, None, frozenset({200}))
    return targets


# --- servers ----------------------------------------------------------------------------------


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"


def process_cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads) and of its child processes
    (the workers of a multi-process server) from /proc; None elsewhere."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    fields = stat.rsplit(")", 1)[1].split()
    utime, stime = int(fields[11]), int(fields[12])  # fields 14 and 15 of proc(5)
    own = (utime + stime) / os.sysconf("SC_CLK_TCK")
    return own + sum(process_cpu_seconds(int(child)) or 0.0 for child in children)


def database_cpu_seconds() -> float | None:
    """User + system CPU seconds of every PostgreSQL process of this machine (backends,
    WAL writer, checkpointer, autovacuum) from /proc; None when none is visible (a database
    elsewhere). Runs are sequential, so the difference over a run is that run's database
    work, give or take the background processes' own."""
    total, seen = 0.0, False
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if (proc / "comm").read_text().strip() != "postgres":
                continue
            fields = (proc / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        seen = True
    return total if seen else None


def machine_cpu_seconds() -> tuple[float, float] | None:
    """(busy, all) CPU seconds of the whole machine, summed over its cores, from /proc/stat;
    None elsewhere. Busy is everything but idle and iowait: the servers, PostgreSQL, wrk and
    anything else running. Over a run, busy / elapsed is how many cores were in use."""
    try:
        first = Path("/proc/stat").read_text().splitlines()[0].split()
    except (OSError, IndexError):
        return None
    ticks = [int(value) for value in first[1:9]]  # user nice system idle iowait irq softirq steal
    every, tick = sum(ticks), os.sysconf("SC_CLK_TCK")
    return (every - ticks[3] - ticks[4]) / tick, every / tick


def process_memory_mb(pid: int) -> tuple[float, float] | None:
    """(resident, peak resident) MiB of a process and its child processes, from /proc (VmRSS,
    VmHWM); None elsewhere."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    kib = {
        key: int(value.split()[0])
        for key, _, value in (line.partition(":") for line in status.splitlines())
        if key in ("VmRSS", "VmHWM")
    }
    try:
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        children = []
    rss, peak = kib.get("VmRSS", 0) / 1024, kib.get("VmHWM", 0) / 1024
    for child in children:
        measured = process_memory_mb(int(child))
        if measured is not None:
            rss, peak = rss + measured[0], peak + measured[1]
    return rss, peak


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_server(
    name: str, command: list[str], env: dict[str, str], port: int, run_dir: Path
) -> Server:
    log_path = run_dir / f"{name}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(  # noqa: S603 - our own interpreter and scripts
            command,
            cwd=run_dir,  # no stray .env is read
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C reaches the harness, which stops it in order
        )
    return Server(name, port, process, log_path)


def wait_until_up(server: Server, path: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise BenchError(
                f"{server.name} exited with {server.process.returncode}:\n{server.log_tail()}"
            )
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(server.url + path, timeout=2) as answer,  # noqa: S310
        ):
            if answer.status == 200:
                return
        time.sleep(0.2)
    raise BenchError(f"{server.name} did not answer {path} within {timeout:.0f} s")


def stop_server(server: Server) -> None:
    if server.process.poll() is not None:
        return
    server.process.terminate()
    try:
        server.process.wait(timeout=30)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait(timeout=10)


# The rate limits: "ours" checks every request against them, at limits the load never reaches
# (it would measure 429s otherwise: wrk sends thousands a second to one company). The quota of
# waiting jobs keeps its default (20). No worker drains the queue here: each turn-save run starts
# with the jobs of the runs before marked done (`finish_waiting_jobs`); with `--backlog` they
# stay, and past a user's 20th turn every turn is coalesced into a waiting job (the worst case;
# "no-job-quota" is without).
RATE_LIMIT_SETTINGS = tuple(
    f"RATE_LIMIT_{route_class}_{scope}"
    for route_class in ("CONTEXT", "TURNS", "CONSOLIDATIONS", "EXPORTS", "MEMORY_WRITES")
    for scope in ("USER", "COMPANY")
)
NEVER_REACHED = "10000000/1"

# Instances of our service: "ours" runs with the app's default settings, the others with these
# on top (the app's own settings, read from the environment).
OTLP_SINK = "<the bench's OTLP sink>"
"""Stands for the URL of the sink `ours_env` starts for a variant that exports traces."""
VARIANTS: dict[str, dict[str, str]] = {
    "ours": {},
    "pre-ping": {"DB_POOL_PRE_PING": "true"},
    "fixed-pool": {"DB_MAX_OVERFLOW": "0"},
    "pool10-pre-ping": {"DB_POOL_SIZE": "10", "DB_MAX_OVERFLOW": "10", "DB_POOL_PRE_PING": "true"},
    # `serve --workers 2`: two processes on one port, each with its own pool
    "workers2": {"API_WORKERS": "2"},
    # four processes, each with a hot-path pool of 10 (4 x 20 would pass PostgreSQL's default 100
    # connections beside the reference's 20)
    "workers4": {"API_WORKERS": "4", "DB_HOT_POOL_SIZE": "10"},
    # a hot-path pool of 48 (64 would exceed PostgreSQL's default 100 connections beside the
    # other servers): far fewer requests wait for a connection at c=64
    "hot-pool-48": {"DB_HOT_POOL_SIZE": "48"},
    # no group commit: every common turn-save is a statement of its own (app/turns/batching.py)
    "turn-batch-off": {"TURN_BATCH_MAX": "1"},
    # group commit with one statement in flight: the largest batches
    "turn-batch-1": {"TURN_BATCH_IN_FLIGHT": "1"},
    # every request verifies its token's signature again
    "no-token-cache": {"JWT_CACHE_SIZE": "0"},
    # the default settings on a Citus cluster of the run's own (`--citus`)
    "citus": {},
    # on the same cluster, /context's read sent to the company's worker node, not through the
    # coordinator (app/kit/citus_reads.py)
    "citus-worker-reads": {"CITUS_WORKER_READS": "true"},
    # no rate limit at all: "ours" minus the limiter's work, to measure what the limits cost
    "no-rate-limits": dict.fromkeys(RATE_LIMIT_SETTINGS, "off"),
    # no quota of waiting jobs per user: every turn queues a job of its own, as before quotas
    "no-job-quota": {"QUOTA_USER_QUEUED_JOBS": "0"},
    # a quota of waiting jobs the bench never reaches: every turn-save counts the user's
    # waiting jobs (all of them, a backlog of dozens here) and queues a job of its own
    "job-quota-unreached": {"QUOTA_USER_QUEUED_JOBS": "10000"},
    # tracing off: nothing configured, as "ours" (a second instance: the noise floor beside it)
    "tracing-off": {},
    # tracing on with nothing sampled: what every request pays for tracing being on (the
    # sampler's decision at the door, asyncpg's wrapped methods), without any span
    "tracing-0pct": {
        "OTEL_EXPORTER_OTLP_ENDPOINT": OTLP_SINK,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0",
        "OTEL_SERVICE_NAME": "context-memory-bench",
    },
    # tracing on, 10 % of the traces sampled, exported over OTLP/HTTP to a local sink that
    # accepts and discards the posts (bench/otlp_sink.py)
    "tracing-10pct": {
        "OTEL_EXPORTER_OTLP_ENDPOINT": OTLP_SINK,
        "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
        "OTEL_TRACES_SAMPLER_ARG": "0.1",
        "OTEL_SERVICE_NAME": "context-memory-bench",
    },
}
# Inherited from the caller's environment, these would change what "ours" means.
_POOL_SETTINGS = (
    "DB_POOL_SIZE",
    "DB_MAX_OVERFLOW",
    "DB_POOL_PRE_PING",
    "DB_HOT_POOL_SIZE",
    "JWT_CACHE_SIZE",
    "API_WORKERS",
    "TURN_BATCH_MAX",
    "TURN_BATCH_IN_FLIGHT",
)


def ours_env(database_url: str, variant: str, cprofile: Path | None = None) -> dict[str, str]:
    # the caller's OTEL_* would turn tracing on in "ours"
    env = {
        k: v
        for k, v in os.environ.items()
        if k.upper() not in _POOL_SETTINGS and not k.upper().startswith("OTEL_")
    }
    env.update(
        {
            "DATABASE_URL": database_url,
            "ENVIRONMENT": "test",
            "JWT_SECRET": JWT_SECRET,
            "WORKER_ENABLED": "false",
            "LOG_LEVEL": "WARNING",
        }
        | dict.fromkeys(RATE_LIMIT_SETTINGS, NEVER_REACHED)
        | VARIANTS[variant]
    )
    env.pop("BENCH_CPROFILE", None)
    if env.get("OTEL_EXPORTER_OTLP_ENDPOINT") == OTLP_SINK:
        env["OTEL_EXPORTER_OTLP_ENDPOINT"] = OtlpSink.endpoint().url
    if cprofile is not None:
        env["BENCH_CPROFILE"] = str(cprofile)
    return env


def start_ours(
    variant: str, database_url: str, run_dir: Path, *, cprofile: Path | None = None, name: str = ""
) -> Server:
    port = free_port()
    command = [sys.executable, str(BENCH_DIR / "serve_ours.py"), "--port", str(port)]
    env = ours_env(database_url, variant, cprofile)
    server = start_server(name or variant, command, env, port, run_dir)
    try:
        wait_until_up(server, "/healthz")
    except BaseException:
        stop_server(server)
        raise
    return server


def code_version() -> str:
    """The commit being measured (read-only git calls), and whether app/ differs from it."""
    env = dict(os.environ) | {"GIT_OPTIONAL_LOCKS": "0"}  # never touch the index
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],  # noqa: S607 - git on PATH
            cwd=PROJECT_ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "diff", "--quiet", "HEAD", "--", "app", "migrations"],  # noqa: S607
            cwd=PROJECT_ROOT,
            env=env,
            check=False,
        ).returncode
    except (OSError, subprocess.CalledProcessError):
        return "commit unknown"
    return f"commit {head}" + (" + uncommitted changes in app/" if dirty else "")


def start_reference(dsn: str, run_dir: Path) -> Server:
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "uvicorn",
        "reference_app:app",
        "--app-dir",
        str(BENCH_DIR),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
        "--loop",
        "uvloop",
        "--http",
        "httptools",
        "--no-access-log",
    ]
    env = dict(os.environ) | {"PG_DSN": dsn}
    server = start_server("reference", command, env, port, run_dir)
    try:
        wait_until_up(server, "/const")
    except BaseException:
        stop_server(server)
        raise
    return server


# --- pre-flight: one real answer of every call, checked -----------------------------------------


def http(
    method: str, url: str, body: bytes | None = None, token: str | None = None
) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"} if body is not None else {}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    request = urllib.request.Request(url, data=body, headers=headers, method=method)  # noqa: S310
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310
            return int(answer.status), json.loads(answer.read())
    except urllib.error.HTTPError as error:
        return int(error.code), error.read().decode(errors="replace")


def first_line(path: Path) -> tuple[str, str, str]:
    method, route, token = path.read_text().splitlines()[0].split("\t")
    return method, route, token


def preflight(
    servers: dict[str, Server], targets: dict[str, Target], profile_tokens: int
) -> list[str]:
    """One request per target, its answer checked; returns what was wrong (empty when fine)."""
    problems: list[str] = []
    for name, target in targets.items():
        server = servers.get(target.server)
        if server is None:
            continue
        method, route, bearer = first_line(target.requests_file)
        body = target.body_file.read_bytes() if target.body_file else None
        status, answer = http(method, server.url + route, body, None if bearer == "-" else bearer)
        if status not in target.expect:
            problems.append(f"{name}: {method} {route} answered {status}: {str(answer)[:300]}")
            continue
        if target.server != "ref" and target.key == "context":
            memory, history = answer["memory"], answer["history"]
            expected = {
                "memory.injected": (memory["injected"], True),
                "memory.tokens": (memory["tokens"], profile_tokens),
                "history.mode": (history["mode"], "auto"),
                "history.loaded": (history["loaded"], True),
                "history.loaded_messages": (history["loaded_messages"], HISTORY_MESSAGES),
            }
            for field_name, (got, want) in expected.items():
                if got != want:
                    problems.append(f"{name}: {field_name} is {got!r}, expected {want!r}")
        if (
            target.server != "ref"
            and target.key == "turns"
            and (answer["consolidation"]["status"] != "queued" or answer["saved_messages"] != 2)
        ):
            problems.append(f"{name}: turn not saved and queued: {answer}")
        if (
            target.server == "ref"
            and target.key == "context"
            and len(answer["messages"]) != HISTORY_MESSAGES
        ):
            problems.append(f"{name}: {len(answer['messages'])} messages")
    return problems


# --- wrk --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class WrkResult:
    """One wrk run, plus what the harness saw around it."""

    rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    statuses: dict[int, int]
    socket_errors: int  # connect/read/write errors and timeouts (wrk --timeout)
    non_2xx: int
    server_cpu_seconds: float | None = None  # user+system CPU of the server process
    new_connections: int | None = None  # opened on the server's database (approximate)
    server_rss_mb: float | None = None  # resident memory of the server after the run
    server_peak_rss_mb: float | None = None  # its high-water mark since the server started
    database_cpu_seconds: float | None = None  # all local PostgreSQL processes, over the run
    machine_busy_share: float | None = None  # of all cores' time over the run, 0..1

    def wrong_status(self, expect: frozenset[int]) -> int:
        """Answers that were not the expected status (the run does not measure the call)."""
        return sum(n for status, n in self.statuses.items() if status not in expect)

    def cpu_us(self) -> float:
        if self.server_cpu_seconds is None or not self.requests:
            return math.nan
        return self.server_cpu_seconds * 1e6 / self.requests

    def database_cpu_us(self) -> float:
        if self.database_cpu_seconds is None or not self.requests:
            return math.nan
        return self.database_cpu_seconds * 1e6 / self.requests

    def sessions(self) -> float:
        return math.nan if self.new_connections is None else float(self.new_connections)

    def busy_cores(self) -> float:
        """Cores of this machine in use during the run (servers, database, wrk and the rest)."""
        if self.machine_busy_share is None:
            return math.nan
        return self.machine_busy_share * (os.cpu_count() or 1)


_UNITS_MS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60_000.0}


def _latency_ms(output: str, percentile: str) -> float:
    match = re.search(rf"^\s*{percentile}%\s+([\d.]+)(us|ms|s|m)\s*$", output, re.MULTILINE)
    if match is None:
        raise BenchError(f"no {percentile}% latency in wrk output:\n{output}")
    return float(match.group(1)) * _UNITS_MS[match.group(2)]


def parse_wrk(output: str) -> WrkResult:
    rps = re.search(r"^Requests/sec:\s+([\d.]+)", output, re.MULTILINE)
    total = re.search(r"(\d+) requests in", output)
    if rps is None or total is None:
        raise BenchError(f"unexpected wrk output:\n{output}")
    socket_errors = 0
    errors = re.search(
        r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", output
    )
    if errors is not None:
        socket_errors = sum(int(n) for n in errors.groups())
    non_2xx = re.search(r"Non-2xx or 3xx responses: (\d+)", output)
    statuses = {
        int(m.group(1)): int(m.group(2))
        for m in re.finditer(r"^STATUS (\d+) (\d+)$", output, re.MULTILINE)
    }
    return WrkResult(
        rps=float(rps.group(1)),
        p50_ms=_latency_ms(output, "50"),
        p99_ms=_latency_ms(output, "99"),
        requests=int(total.group(1)),
        statuses=statuses,
        socket_errors=socket_errors,
        non_2xx=int(non_2xx.group(1)) if non_2xx else 0,
    )


def run_wrk(wrk: str, url: str, target: Target, connections: int, duration: float) -> WrkResult:
    command = [
        wrk,
        "-t1",
        f"-c{connections}",
        f"-d{duration:g}s",
        f"--timeout={WRK_TIMEOUT_SECONDS}s",
        "--latency",
        "-s",
        str(LUA_SCRIPT),
        url,
        "--",
        str(target.requests_file),
    ]
    if target.body_file is not None:
        command.append(str(target.body_file))
    done = subprocess.run(  # noqa: S603 - wrk found on PATH, fixed arguments
        command, capture_output=True, text=True, timeout=duration + 60, check=False
    )
    if done.returncode != 0:
        raise BenchError(f"wrk failed ({done.returncode}): {done.stderr or done.stdout}")
    return parse_wrk(done.stdout)


# --- the comparison ---------------------------------------------------------------------------


@dataclass
class Measurements:
    runs: dict[tuple[str, int], list[WrkResult]] = field(default_factory=dict)
    # (server, run, RSS MiB, peak RSS MiB) after every wrk run, in the order they ran
    memory: list[tuple[str, int, float, float]] = field(default_factory=list)

    def add(self, target: str, connections: int, result: WrkResult, run: int = 0) -> None:
        self.runs.setdefault((target, connections), []).append(result)
        if result.server_rss_mb is not None and result.server_peak_rss_mb is not None:
            server = target.split(":", 1)[0]
            self.memory.append((server, run, result.server_rss_mb, result.server_peak_rss_mb))

    def has(self, target: str, connections: int) -> bool:
        return bool(self.runs.get((target, connections)))

    def median(self, target: str, connections: int, metric: Callable[[WrkResult], float]) -> float:
        """The median of `metric` over the runs (NaN values left out; NaN when none is left)."""
        values = [metric(r) for r in self.runs.get((target, connections), [])]
        values = [v for v in values if not math.isnan(v)]
        return statistics.median(values) if values else math.nan

    def medians(
        self, first: str, second: str, connections: int, metric: Callable[[WrkResult], float]
    ) -> tuple[float, float]:
        return self.median(first, connections, metric), self.median(second, connections, metric)

    def wrong_status(self, target: str, connections: int, expect: frozenset[int]) -> int:
        return sum(r.wrong_status(expect) for r in self.runs.get((target, connections), []))

    def socket_errors(self, target: str, connections: int) -> int:
        return sum(r.socket_errors for r in self.runs.get((target, connections), []))

    def to_json(self) -> list[dict[str, Any]]:
        return [
            {"target": target, "connections": c, "run": n + 1, **dataclasses.asdict(result)}
            for (target, c), results in self.runs.items()
            for n, result in enumerate(results)
        ]


PAIR_TITLES = {
    "context": "load/inject",
    "turns": "turn-save",
    "ceiling": "framework ceiling",
}


def _rps(r: WrkResult) -> float:
    return r.rps


def _p50(r: WrkResult) -> float:
    return r.p50_ms


def _p99(r: WrkResult) -> float:
    return r.p99_ms


# what the tables show, in this order: req/s, p50, p99, server CPU µs/request, PostgreSQL
# connections opened per run, database CPU µs/request, busy cores of the machine
METRICS: tuple[Callable[[WrkResult], float], ...] = (
    _rps,
    _p50,
    _p99,
    WrkResult.cpu_us,
    WrkResult.sessions,
    WrkResult.database_cpu_us,
    WrkResult.busy_cores,
)


def ratio(ours: float, reference: float) -> str:
    if math.isnan(ours) or math.isnan(reference) or not reference:
        return "n/a"
    return f"{ours / reference:.2f}"


def number(value: float, digits: int = 0) -> str:
    return "?" if math.isnan(value) else f"{value:,.{digits}f}"


def render_table(measurements: Measurements, setup: Setup, connections: Sequence[int]) -> str:
    """Ours vs the reference, one line per call, variant and concurrency."""
    header = (
        "| call | c | ours | req/s | reference | req/s | ours/ref req/s "
        "| p50 ms ours / ref | ×p50 | p99 ms ours / ref | ×p99 "
        "| server CPU µs/req ours / ref | ×CPU | database CPU µs/req ours / ref | ×DB "
        "| new PG conns/run ours / ref | busy cores ours / ref "
        "| wrong status, socket errors ours / ref |\n"
        "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n"
    )
    lines = []
    for pair in setup.pairs:
        ref_name = f"ref:{pair}"
        reference = setup.targets[ref_name]
        for variant in setup.variants:
            name = f"{variant}:{pair}"
            ours = setup.targets[name]
            for c in connections:
                if not (measurements.has(name, c) and measurements.has(ref_name, c)):
                    continue
                rps, p50, p99, cpu, conns, db_cpu, busy = (
                    measurements.medians(name, ref_name, c, metric) for metric in METRICS
                )
                database = f"{number(db_cpu[0])} / {number(db_cpu[1])} | {ratio(*db_cpu)}"
                if max(db_cpu) < 1.0:  # no database work: the background processes' noise
                    database = "– | –"
                errors = (
                    f"{measurements.wrong_status(name, c, ours.expect)}, "
                    f"{measurements.socket_errors(name, c)} / "
                    f"{measurements.wrong_status(ref_name, c, reference.expect)}, "
                    f"{measurements.socket_errors(ref_name, c)}"
                )
                lines.append(
                    f"| {PAIR_TITLES[pair]} | {c} | {ours.label} | {number(rps[0])} "
                    f"| {reference.label} | {number(rps[1])} | **{ratio(*rps)}** "
                    f"| {number(p50[0], 1)} / {number(p50[1], 1)} | {ratio(*p50)} "
                    f"| {number(p99[0], 1)} / {number(p99[1], 1)} | {ratio(*p99)} "
                    f"| {number(cpu[0])} / {number(cpu[1])} | {ratio(*cpu)} "
                    f"| {database} "
                    f"| {number(conns[0])} / {number(conns[1])} "
                    f"| {number(busy[0], 2)} / {number(busy[1], 2)} | {errors} |"
                )
    return header + "\n".join(lines) + "\n"


def render_memory_table(measurements: Measurements) -> str:
    """Resident memory of each server at the end of each round of runs, and its peak: a server
    that keeps growing from round to round under the same load leaks."""
    rounds = sorted({run for _, run, _, _ in measurements.memory})
    lines = [
        "| server | " + " | ".join(f"RSS after round {r} MiB" for r in rounds) + " | peak MiB |",
        "|---|" + "---:|" * (len(rounds) + 1),
    ]
    for server in dict.fromkeys(server for server, _, _, _ in measurements.memory):
        samples = [(run, rss, peak) for s, run, rss, peak in measurements.memory if s == server]
        last = {run: rss for run, rss, _ in samples}  # the last sample of each round
        peak = max(peak for _, _, peak in samples)
        cells = " | ".join(number(last.get(r, math.nan)) for r in rounds)
        lines.append(f"| {server} | {cells} | {number(peak)} |")
    return "\n".join(lines) + "\n"


def render_variant_table(
    measurements: Measurements, setup: Setup, connections: Sequence[int]
) -> str:
    """Each extra instance of our service against the default one (same runs)."""
    lines = [
        "| call | c | variant | req/s ours → variant | ×req/s | ×p50 | ×p99 "
        "| server CPU µs/req ours → variant | ×CPU | database CPU µs/req ours → variant | ×DB "
        "| new PG conns/run ours → variant | busy cores ours → variant |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for pair in setup.pairs:
        base = f"ours:{pair}"
        for c in connections:
            for variant in setup.variants[1:]:
                name = f"{variant}:{pair}"
                if not (measurements.has(base, c) and measurements.has(name, c)):
                    continue
                rps, p50, p99, cpu, conns, db, busy = (
                    measurements.medians(name, base, c, metric) for metric in METRICS
                )
                lines.append(
                    f"| {PAIR_TITLES[pair]} | {c} | {variant} "
                    f"| {number(rps[1])} → {number(rps[0])} | **{ratio(*rps)}** "
                    f"| {ratio(*p50)} | {ratio(*p99)} "
                    f"| {number(cpu[1])} → {number(cpu[0])} | {ratio(*cpu)} "
                    f"| {number(db[1])} → {number(db[0])} | {ratio(*db)} "
                    f"| {number(conns[1])} → {number(conns[0])} "
                    f"| {number(busy[1], 2)} → {number(busy[0], 2)} |"
                )
    return "\n".join(lines) + "\n"


def measure_one(
    setup: Setup, server: Server, target: Target, connections: int, duration: float
) -> WrkResult:
    """One wrk run, with the server's CPU and its database's new connections around it."""
    database = REFERENCE_DB if target.server == "ref" else OURS_DB
    if target.key == "turns" and target.server != "ref" and not setup.backlog:
        asyncio.run(finish_waiting_jobs(setup.admin_dsns.get(target.server, setup.ours_url)))
    # a variant on a database of its own: the local server's statistics are not its
    local = target.server not in setup.admin_dsns
    before = asyncio.run(database_sessions(setup.admin_dsn)).get(database) if local else None
    cpu_before = process_cpu_seconds(server.process.pid)
    database_before = database_cpu_seconds()
    machine_before = machine_cpu_seconds()
    result = run_wrk(setup.wrk, server.url, target, connections, duration)
    machine_after = machine_cpu_seconds()
    cpu_after = process_cpu_seconds(server.process.pid)
    database_after = database_cpu_seconds()
    time.sleep(STATS_SETTLE_SECONDS)  # backends report their statistics when idle, late
    after = asyncio.run(database_sessions(setup.admin_dsn)).get(database) if local else None
    memory = process_memory_mb(server.process.pid)
    cpu = None if cpu_before is None or cpu_after is None else cpu_after - cpu_before
    database_cpu = (
        None
        if database_before is None or database_after is None
        else database_after - database_before
    )
    opened = None if before is None or after is None else after - before
    busy_share = None
    if machine_before is not None and machine_after is not None:
        elapsed = machine_after[1] - machine_before[1]
        busy_share = (machine_after[0] - machine_before[0]) / elapsed if elapsed > 0 else None
    return dataclasses.replace(
        result,
        server_cpu_seconds=cpu,
        new_connections=opened,
        server_rss_mb=None if memory is None else memory[0],
        server_peak_rss_mb=None if memory is None else memory[1],
        database_cpu_seconds=database_cpu,
        machine_busy_share=busy_share,
    )


def measure(args: argparse.Namespace, setup: Setup, servers: dict[str, Server]) -> Measurements:
    targets, pairs = setup.targets, setup.pairs
    print(f"\nwarm-up: {args.warmup:g} s per endpoint at c={args.connections[0]}", flush=True)
    for name, target in targets.items():
        if target.key in pairs and target.server in servers:
            run_wrk(setup.wrk, servers[target.server].url, target, args.connections[0], args.warmup)
            print(f"  {name} warm", flush=True)

    measurements = Measurements()
    for run in range(args.runs):
        for c in args.connections:
            for pair in pairs:
                sides = [*setup.variants, "ref"]
                if run % 2 == 1:  # alternate who goes first, so drift hits both sides alike
                    sides.reverse()
                for side in sides:
                    name = f"{side}:{pair}"
                    target = targets[name]
                    result = measure_one(setup, servers[side], target, c, args.duration)
                    measurements.add(name, c, result, run + 1)
                    wrong = result.wrong_status(target.expect)
                    errors = result.socket_errors
                    print(
                        f"  run {run + 1}/{args.runs} c={c:<3} {target.label:<30} "
                        f"{result.rps:7,.0f} req/s  p50 {result.p50_ms:7.2f} ms  "
                        f"p99 {result.p99_ms:7.2f} ms  CPU {number(result.cpu_us())} µs/req  "
                        f"DB CPU {number(result.database_cpu_us())} µs/req  "
                        f"new PG conns {number(result.sessions())}  "
                        f"RSS {number(result.server_rss_mb or math.nan)} MiB "
                        f"(peak {number(result.server_peak_rss_mb or math.nan)})  "
                        f"{result.statuses}"
                        f"{f'  WRONG STATUS {wrong}' if wrong else ''}"
                        f"{f'  socket errors {errors}' if errors else ''}",
                        flush=True,
                    )
    return measurements


# --- cProfile of our process under load ---------------------------------------------------------


def _short_path(filename: str) -> str:
    """A profiled file as a short path: app/..., <package>/..., stdlib/... or "~" (C)."""
    path = filename.replace("\\", "/")
    if "/site-packages/" in path:
        return path.split("/site-packages/", 1)[1]
    root = str(PROJECT_ROOT) + "/"
    if path.startswith(root):
        return path[len(root) :]
    if "/lib/python3" in path:
        return "stdlib/" + path.rsplit("/lib/python3", 1)[1].split("/", 2)[-1]
    return path


def _category(filename: str) -> str:
    """What a profiled function belongs to: a package, a module of app/, the stdlib, or C."""
    if filename == "~":
        return "C functions called from Python (str.join, tiktoken, pydantic-core, ...)"
    path = _short_path(filename)
    if path.startswith("app/"):
        return path
    if path.startswith("stdlib/"):
        return "stdlib: " + path.removeprefix("stdlib/").split("/", 1)[0].removesuffix(".py")
    return path.split("/", 1)[0].removesuffix(".py")


def summarize_profile(path: Path, requests: int, top: int = 25) -> str:
    """Where the Python time of the profiled process went, per request.

    cProfile slows Python calls down (a few times for call-heavy code), so read the shares, not
    the absolute µs. `cumtime` of coroutines is unreliable (every resume counts as a call), so
    the cumulative table keeps functions of app/ whose cumtime fits in the time per request.
    """
    stats = pstats.Stats(str(path))
    raw: dict[tuple[str, int, str], tuple[int, int, float, float, Any]]
    raw = stats.stats  # type: ignore[attr-defined]
    by_category: dict[str, float] = {}
    busy = 0.0
    rows = []
    for (filename, line, function), (_cc, calls, tottime, cumtime, _callers) in raw.items():
        busy += tottime
        category = _category(filename)
        by_category[category] = by_category.get(category, 0.0) + tottime
        where = function if filename == "~" else f"{_short_path(filename)}:{line} {function}"
        rows.append((tottime, cumtime, calls, where))
    per_request = 1e6 / max(requests, 1)
    out = [
        f"{requests:,} requests profiled; Python time {busy:.2f} s, "
        f"{busy * per_request:,.0f} µs per request under cProfile",
        "",
        "| where (own time) | share | µs/request |",
        "|---|---:|---:|",
    ]
    for category, seconds in sorted(by_category.items(), key=lambda kv: -kv[1])[:15]:
        share = f"{seconds / busy:.0%}" if busy else "-"
        out.append(f"| {category} | {share} | {seconds * per_request:,.0f} |")
    out += [
        "",
        "| function (own time) | µs/req | calls/req |",
        "|---|---:|---:|",
    ]
    for tottime, _cumtime, calls, where in sorted(rows, reverse=True)[:top]:
        out.append(
            f"| `{where}` | {tottime * per_request:,.1f} | {calls / max(requests, 1):,.1f} |"
        )
    out += ["", "| app/ function (cumulative) | µs/req |", "|---|---:|"]
    app_rows = [r for r in rows if r[3].startswith("app/") and r[1] <= busy / 2]
    for _tottime, cumtime, _calls, where in sorted(app_rows, key=lambda r: -r[1])[:top]:
        out.append(f"| `{where}` | {cumtime * per_request:,.1f} |")
    return "\n".join(out) + "\n"


def profile_ours(args: argparse.Namespace, setup: Setup) -> str:
    wrk, ours_url, run_dir = setup.wrk, setup.ours_url, RUN_DIR
    reports = [
        f"## cProfile of our service, {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {code_version()}\n"
    ]
    c = args.connections[0]
    for pair in ("context", "turns"):
        target = setup.targets[f"ours:{pair}"]
        stats_path = run_dir / f"ours_{pair}.pstats"
        stats_path.unlink(missing_ok=True)
        server = start_ours(
            "ours", ours_url, run_dir, cprofile=stats_path, name=f"ours-profile-{pair}"
        )
        try:
            warm = run_wrk(wrk, server.url, target, c, args.warmup)
            result = run_wrk(wrk, server.url, target, c, args.duration)
        finally:
            stop_server(server)
        if not stats_path.exists():
            raise BenchError(f"no profile written:\n{server.log_tail()}")
        server_requests = warm.requests + result.requests  # the profile covers the warm-up too
        wrong = result.wrong_status(target.expect)
        if wrong:
            raise BenchError(f"{wrong} answers of {target.label} were not {set(target.expect)}")
        reports.append(
            f"### {target.label}, c={c}, {args.duration:g} s under cProfile "
            f"({result.rps:,.0f} req/s while profiled; statuses {result.statuses})\n\n"
            + summarize_profile(stats_path, server_requests, top=args.profile_top)
        )
    return "\n".join(reports)


# --- main -------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per wrk run")
    parser.add_argument("--runs", type=int, default=3, help="runs per endpoint and concurrency")
    parser.add_argument(
        "--connections",
        type=lambda s: [int(c) for c in s.split(",") if c],
        default=[16, 64],
        help="comma-separated wrk concurrencies (default 16,64)",
    )
    parser.add_argument("--users", type=int, default=2000, help="users/conversations seeded")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of warm-up each")
    parser.add_argument(
        "--only",
        type=lambda s: [p for p in s.split(",") if p],
        default=["context", "turns", "ceiling"],
        help="pairs to measure: context,turns,ceiling",
    )
    parser.add_argument(
        "--variants",
        type=lambda s: [v for v in s.split(",") if v],
        default=[],
        help=f"extra instances of our service, same runs: {','.join(list(VARIANTS)[1:])}",
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="instead of the comparison: cProfile our process under wrk, one run per call",
    )
    parser.add_argument(
        "--backlog",
        action="store_true",
        help="let our queue grow over the runs (no worker): turn-saves past the quota of "
        "waiting jobs coalesce; by default every turn-save run starts with no job waiting",
    )
    parser.add_argument(
        "--citus",
        action="store_true",
        help="also our service on a Citus cluster started for the run (coordinator and two "
        "workers on this machine), beside ours on the single PostgreSQL",
    )
    parser.add_argument("--profile-top", type=int, default=25)
    parser.add_argument("--keep", action="store_true", help="keep the scratch databases")
    parser.add_argument(
        "--explain",
        action="store_true",
        help="after the runs: EXPLAIN (ANALYZE, BUFFERS) of the hot statements (bench/explain.py)",
    )
    args = parser.parse_args(argv)
    unknown_variants = set(args.variants) - set(VARIANTS)
    if unknown_variants:
        parser.error(
            f"--variants: unknown {sorted(unknown_variants)}; choose from {list(VARIANTS)}"
        )
    unknown = set(args.only) - set(PAIR_TITLES)
    if unknown:
        parser.error(f"--only: unknown {sorted(unknown)}; choose from {sorted(PAIR_TITLES)}")
    if args.runs < 1 or args.users < 1 or not args.connections:
        parser.error("--runs, --users and --connections must be positive")
    return args


def _stop_on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


@dataclass(frozen=True)
class Setup:
    """Where things are, and what was seeded."""

    wrk: str
    admin_dsn: str
    ours_url: str
    reference_dsn: str
    targets: dict[str, Target]
    variants: list[str]
    pairs: list[str]
    profile_tokens: int
    backlog: bool = False
    # a variant's own database (`--citus`): its service's URL, and the admin's
    urls: dict[str, str] = field(default_factory=dict)
    admin_dsns: dict[str, str] = field(default_factory=dict)


# What a worker that keeps up leaves between turn-save runs: no job of ours waiting. Without it
# every bench user passes the quota of waiting jobs (20) in the second run, and the runs after
# measure the coalescing of a backlog no deployment with a running worker has (`--backlog`).
_JOBS_DONE = (
    "UPDATE jobs SET status = 'succeeded', outcome = 'noop', attempts = 1"
    " WHERE status IN ('queued', 'retrying')"
)


async def finish_waiting_jobs(dsn: str) -> int:
    """Mark every waiting job of ours succeeded, as a worker would, and vacuum the queue as
    autovacuum would soon after (the dead entries in its partial indexes would otherwise slow
    the next run by whenever autovacuum happens to come); returns how many."""
    conn = await asyncpg.connect(dsn)
    try:
        done = await conn.execute(_JOBS_DONE)
        await conn.execute("VACUUM (ANALYZE) jobs")
    finally:
        await conn.close()
    return int(done.split()[-1])


def prepare(args: argparse.Namespace, wrk: str, cluster: BenchCluster | None = None) -> Setup:
    """(Re)create and seed both scratch databases (and ours on `cluster`); write the request
    lists."""
    admin_url = os.environ.get("DATABASE_URL") or DEFAULT_ADMIN_URL
    admin_dsn = plain_dsn(admin_url)
    ours_url = plain_dsn(admin_url, OURS_DB)
    reference_dsn = plain_dsn(admin_url, REFERENCE_DB)
    settings = Settings(
        _env_file=None,
        database_url=ours_url,
        environment="test",
        jwt_secret=SecretStr(JWT_SECRET),
        worker_enabled=False,
    )
    print(f"scratch databases {OURS_DB}, {REFERENCE_DB} on {make_url(admin_dsn).host}")
    asyncio.run(recreate_databases(admin_dsn, [OURS_DB, REFERENCE_DB]))
    print(f"seeding {args.users:,} users/conversations on both sides ...", flush=True)
    started = time.monotonic()
    asyncio.run(seed_reference(reference_dsn, args.users))
    print(
        f"  reference seeded in {time.monotonic() - started:.1f} s (its docstring's SQL, "
        "VACUUM ANALYZE)",
        flush=True,
    )
    started = time.monotonic()
    profile_tokens = asyncio.run(seed_ours(ours_url, settings, args.users))
    document = profile_document(1)[0]
    parse(document)  # a valid memory.md, or this raises
    asyncio.run(check_against_reference(ours_url, reference_dsn, args.users))
    print(
        f"  ours seeded in {time.monotonic() - started:.1f} s (bench/seed.py: SQL and COPY, "
        f"VACUUM ANALYZE, checked); user 1's profile {len(document):,} chars, "
        f"{profile_tokens:,} tokens; {HISTORY_MESSAGES} messages of 512 chars per chat",
        flush=True,
    )
    on_cluster = ("citus", "citus-worker-reads")
    variants = ["ours", *(v for v in args.variants if v != "ours" and v not in on_cluster)]
    urls, admin_dsns = {}, {}
    if cluster is not None:
        started = time.monotonic()
        asyncio.run(seed_ours(cluster.admin_dsn, settings, args.users))
        print(
            f"  ours seeded on the Citus cluster in {time.monotonic() - started:.1f} s",
            flush=True,
        )
        for variant in on_cluster:
            variants.append(variant)
            urls[variant], admin_dsns[variant] = cluster.service_dsn, cluster.admin_dsn
    return Setup(
        wrk=wrk,
        admin_dsn=admin_dsn,
        ours_url=ours_url,
        reference_dsn=reference_dsn,
        targets=write_request_lists(RUN_DIR, settings, args.users, variants),
        variants=variants,
        pairs=[p for p in PAIR_TITLES if p in args.only],
        profile_tokens=profile_tokens,
        backlog=args.backlog,
        urls=urls,
        admin_dsns=admin_dsns,
    )


def compare(args: argparse.Namespace, setup: Setup, servers: dict[str, Server]) -> int:
    """Start the servers (into `servers`, which the caller stops), check, measure, report."""
    version = code_version()  # what the servers are about to import
    servers["ref"] = start_reference(setup.reference_dsn, RUN_DIR)
    for variant in setup.variants:
        servers[variant] = start_ours(variant, setup.urls.get(variant, setup.ours_url), RUN_DIR)
    print(
        "servers: " + ", ".join(f"{n} {s.url}" for n, s in servers.items()) + f"; {version}",
        flush=True,
    )
    problems = preflight(servers, setup.targets, setup.profile_tokens)
    if problems:
        raise BenchError("pre-flight check failed:\n  " + "\n  ".join(problems))
    print("pre-flight: every call answers as expected (200/202, memory and history in)")

    load_before = os.getloadavg()
    measurements = measure(args, setup, servers)
    load_after = os.getloadavg()
    report = [
        f"\n## Results {datetime.now(UTC):%Y-%m-%d %H:%M} UTC, {version}: medians of "
        f"{args.runs} runs of {args.duration:g} s, wrk -t1, {args.users:,} users; load "
        f"average (1 min) {load_before[0]:.2f} before the runs, {load_after[0]:.2f} after, "
        f"{os.cpu_count()} cores\n",
        render_table(measurements, setup, args.connections),
    ]
    if len(setup.variants) > 1:
        report += [
            "\nVariants of our service vs the default one (same runs):\n",
            render_variant_table(measurements, setup, args.connections),
        ]
    if measurements.memory:
        report += ["\nMemory of the servers under this load:\n", render_memory_table(measurements)]
    sink = OtlpSink.started()
    if sink is not None:
        report.append(
            f"\nOTLP sink (tracing variants): {sink.posts} exports, {sink.received_bytes:,} bytes"
        )
    if args.explain:
        user = max(1, args.users // 2)
        plans = asyncio.run(
            explain.hot_plans(setup.ours_url, COMPANY, user_id(user), context_chat(user), SPACE)
        )
        report.append(
            "\n" + explain.report(plans, f"Plans at {args.users:,} users, after the runs")
        )
    text_report = "\n".join(report)
    print(text_report)
    (RUN_DIR / "last_run.md").write_text(text_report)
    (RUN_DIR / "last_run.json").write_text(json.dumps(measurements.to_json(), indent=1))
    print(f"(also in {RUN_DIR / 'last_run.md'}; every run in {RUN_DIR / 'last_run.json'})")
    wrong = sum(
        measurements.wrong_status(name, c, target.expect)
        for name, target in setup.targets.items()
        for c in args.connections
    )
    if wrong:
        print(f"{wrong} answers were not the expected status: those figures are not valid")
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    wrk = shutil.which("wrk")
    if wrk is None:
        print(
            "wrk is not installed; it is a system tool: `apt-get install wrk` (Debian/Ubuntu)",
            file=sys.stderr,
        )
        return 2
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    RUN_DIR.mkdir(parents=True, exist_ok=True)
    admin_dsn = plain_dsn(os.environ.get("DATABASE_URL") or DEFAULT_ADMIN_URL)
    servers: dict[str, Server] = {}
    started = time.monotonic()
    status = 1
    cluster: BenchCluster | None = None
    try:
        if args.citus:
            print("starting a Citus cluster (coordinator and two workers) ...", flush=True)
            cluster = BenchCluster.start(RUN_DIR, OURS_DB)
        setup = prepare(args, wrk, cluster)
        if args.profile:
            report = profile_ours(args, setup)
            print("\n" + report)
            (RUN_DIR / "profile.md").write_text(report)
            status = 0
        else:
            status = compare(args, setup, servers)
    except (BenchError, RuntimeError) as error:
        print(f"bench: {error}", file=sys.stderr)
    except KeyboardInterrupt:
        print("bench: interrupted", file=sys.stderr)
        status = 130
    finally:
        for server in servers.values():
            stop_server(server)
        if status not in (0, 130):
            for server in servers.values():
                print(f"--- {server.name} log ({server.log_path}):\n{server.log_tail()}")
        if not args.keep:
            try:
                asyncio.run(drop_databases(admin_dsn, [OURS_DB, REFERENCE_DB]))
                print(f"dropped {OURS_DB} and {REFERENCE_DB}")
            except (OSError, asyncpg.PostgresError) as error:
                print(f"bench: could not drop {OURS_DB}, {REFERENCE_DB}: {error}", file=sys.stderr)
        if cluster is not None:
            cluster.stop()
            print("stopped the Citus cluster")
        print(f"wall time {time.monotonic() - started:.0f} s")
    return status


if __name__ == "__main__":
    sys.exit(main())
