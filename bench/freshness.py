"""How soon memory is true: the time from a turn-save's answer until `/context` for that user
carries the fact the turn stated, under an open-loop load, with 1, 2 and 4 worker processes.

    .venv/bin/python bench/freshness.py                       # ~15 minutes
    .venv/bin/python bench/freshness.py --workers 1 --quick   # a look in about a minute

The service runs as it does in production: one `python -m app serve` process (its worker off)
and separate `python -m app worker` processes, with the app's defaults (`WORKER_CONCURRENCY`,
`WORKER_POLL_SECONDS`, `JOB_NOTIFY_INTERVAL_MS`, ...), against the fixed-latency model stub
(`bench/fixed_latency_llm.py`, 200 ms a call). Only the rate limits are off: the harness is one
company whose users chat faster than the limits allow a person to.

Arrivals are a Poisson process at a fixed rate, independent of the answers (open loop): each is
a chat turn of a random user of the step's fresh users, `/context` then `/turns`, as an
orchestrator sends them; `--fact-share` of them state a new fact ("I use Kestrel 3.41 every
day."), the others are chit-chat. After each fact's turn-save answered, a probe asks `/context`
for that user (in another chat, so the fact cannot come from the history) every
`PROBE_SECONDS` (after a second every 250 ms, after three every 500 ms, so the probes of a
worker falling behind do not load the service ever more) until the injected memory
(`system_prompt`) holds the fact: the freshness is the time from the turn-save's answer to the
first probe that saw it (so it is overstated by up to one probe interval, half of it on
average).

For each worker count: a search for the capacity (steps of `--step-seconds` at rising fact
rates, x1.5 each, until a step's freshness p99 exceeds 5 s or a fact is still missing
`GRACE_SECONDS` after the step; then `--refine` steps halving the gap between the last rate
that held and the first that did not, on a log scale), then runs at 25 %, 50 % and 75 % of that
capacity (`--level-seconds` each): freshness p50/p95/p99 and the hot calls' latency. Before
each step the queue is drained. It also times the start of `serve` (spawn to `/readyz` 200)
and of the first worker (spawn to its first claim of a job queued before it started), and reads
every process's resident memory at the end of its runs.

Needs only PostgreSQL (`DATABASE_URL`, default `postgresql://postgres@127.0.0.1:5432/postgres`,
as the admin connection): it creates a scratch database `cms_freshness_<random>` and drops it at
the end, also on a failure or Ctrl-C. The report goes to `var/bench/freshness_last_run.md` (and
`.json`), the processes' logs to `var/bench/freshness/`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from sqlalchemy import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.kit.auth.mint import issue_token
from app.kit.config import Settings
from app.kit.principal import Principal
from bench.fixed_latency_llm import FixedLatencyLLM
from bench.worker_drain import (
    CHIT_CHAT,
    JWT_SECRET,
    PENDING_JOBS,
    PROJECT_ROOT,
    asyncpg_dsn,
    read_memory,
)

COMPANY = "fresh"
SPACE = "space-1"
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
OUT_DIR = PROJECT_ROOT / "var" / "bench"
PROBE_SECONDS = 0.1
GRACE_SECONDS = 15.0
FRESHNESS_LIMIT_SECONDS = 5.0
LEVELS = (0.25, 0.50, 0.75)
STARTUP_TIMEOUT_SECONDS = 60.0
FACT_ANSWER = "Noted. I'll keep that in mind."
PROBE_MESSAGE = "What do you know about me?"
RATE_LIMITS_OFF = {
    f"RATE_LIMIT_{kind}_{scope}": "off"
    for kind in ("CONTEXT", "TURNS")
    for scope in ("USER", "COMPANY")
}


# --- the processes ----------------------------------------------------------------------------


def base_environment(database_url: str) -> dict[str, str]:
    """The inherited environment without any of the app's settings (the app's defaults hold),
    plus the scratch database and the bench's signing key."""
    fields = {name.upper() for name in Settings.model_fields}
    env = {key: value for key, value in os.environ.items() if key.upper() not in fields}
    return env | {
        "PYTHONPATH": os.pathsep.join(filter(None, (str(PROJECT_ROOT), env.get("PYTHONPATH")))),
        "ENVIRONMENT": "test",
        "DATABASE_URL": database_url,
        "JWT_SECRET": JWT_SECRET,
        "JWT_PLATFORM": "true",  # the harness's operator registers the company
        "LOG_LEVEL": "WARNING",
    }


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


class Process:
    """A child process of the harness with its log in `log_path`."""

    def __init__(self, command: Sequence[str], env: dict[str, str], log_path: Path) -> None:
        self.command = list(command)
        self.env = env
        self.log_path = log_path
        self.proc: asyncio.subprocess.Process | None = None
        self.spawned_at = 0.0

    async def spawn(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("wb") as log:
            self.spawned_at = time.perf_counter()
            self.proc = await asyncio.create_subprocess_exec(
                *self.command, cwd=PROJECT_ROOT, env=self.env, stdout=log, stderr=log
            )

    @property
    def pid(self) -> int:
        if self.proc is None:
            raise RuntimeError("not started")
        return self.proc.pid

    def check_alive(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            tail = self.log_path.read_text(errors="replace").splitlines()[-30:]
            raise RuntimeError(f"{self.command[3]} exited:\n" + "\n".join(tail))

    def rss_mib(self) -> float:
        return read_memory(self.pid).rss_kb / 1024

    async def stop(self) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(proc.wait(), 30)
        except TimeoutError:
            proc.kill()
            await proc.wait()


async def start_serve(env: dict[str, str], port: int, logs: Path) -> tuple[Process, float]:
    """`python -m app serve` with its worker off; returns it and its seconds to `/readyz` 200."""
    serve = Process(
        [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port)],
        env | {"WORKER_ENABLED": "false"} | RATE_LIMITS_OFF,
        logs / "serve.log",
    )
    await serve.spawn()
    deadline = time.perf_counter() + STARTUP_TIMEOUT_SECONDS
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as client:
        while True:
            serve.check_alive()
            with contextlib.suppress(httpx.TransportError):
                if (await client.get("/readyz")).status_code == 200:
                    return serve, time.perf_counter() - serve.spawned_at
            if time.perf_counter() > deadline:
                raise RuntimeError("serve was not ready in time")
            await asyncio.sleep(0.01)


def worker_process(env: dict[str, str], number: int, llm_url: str, logs: Path) -> Process:
    return Process(
        [sys.executable, "-m", "app", "worker"],
        env
        | {
            "LLM_PROVIDER": "openai",
            "OPENAI_BASE_URL": llm_url,
            "OPENAI_API_KEY": "bench-key-not-a-secret",
            "WORKER_HEARTBEAT_FILE": str(logs / f"worker-{number}.heartbeat"),
        },
        logs / f"worker-{number}.log",
    )


# --- the load ---------------------------------------------------------------------------------


def percentile(values: Sequence[float], share: float) -> float:
    """Nearest-rank percentile; inf when a value is missing (inf) at that rank."""
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(share * len(ordered)) - 1))]


@dataclass
class StepResult:
    label: str
    workers: int
    fact_rate: float
    seconds: float
    turns: int = 0
    facts: int = 0
    errors: int = 0
    freshness: list[float] = field(default_factory=list)
    context_ms: list[float] = field(default_factory=list)
    turns_ms: list[float] = field(default_factory=list)
    probe_ms: list[float] = field(default_factory=list)

    @property
    def missing(self) -> int:
        return sum(1 for value in self.freshness if math.isinf(value))

    @property
    def passed(self) -> bool:
        return (
            self.errors == 0
            and self.missing == 0
            and percentile(self.freshness, 0.99) <= FRESHNESS_LIMIT_SECONDS
        )

    def summary(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "workers": self.workers,
            "fact_rate": round(self.fact_rate, 2),
            "facts": self.facts,
            "turns": self.turns,
            "errors": self.errors,
            "missing": self.missing,
            "fresh_p50": percentile(self.freshness, 0.50),
            "fresh_p95": percentile(self.freshness, 0.95),
            "fresh_p99": percentile(self.freshness, 0.99),
            "context_p50_ms": percentile(self.context_ms, 0.50),
            "context_p99_ms": percentile(self.context_ms, 0.99),
            "turns_p50_ms": percentile(self.turns_ms, 0.50),
            "turns_p99_ms": percentile(self.turns_ms, 0.99),
            "passed": self.passed,
        }


class Load:
    """Chat turns at a Poisson rate for many users of one company, over HTTP."""

    def __init__(self, client: httpx.AsyncClient, settings: Settings, args: argparse.Namespace):
        self.client = client
        self.settings = settings
        self.users = args.users
        self.fact_share = args.fact_share
        self.rng = random.Random(args.seed)  # noqa: S311 - arrivals, reproducible per seed
        self._tokens: dict[str, str] = {}
        self._steps = 0

    def headers(self, user: str) -> dict[str, str]:
        token = self._tokens.get(user)
        if token is None:
            token = issue_token(self.settings, Principal(user, COMPANY, frozenset()))
            self._tokens[user] = token
        return {"Authorization": f"Bearer {token}"}

    async def step(self, label: str, workers: int, fact_rate: float, seconds: float) -> StepResult:
        self._steps += 1
        tag = f"s{self._steps}"
        result = StepResult(label, workers, fact_rate, seconds)
        turn_rate = fact_rate / self.fact_share
        tasks: set[asyncio.Task[None]] = set()
        started = time.perf_counter()
        next_at = started
        n = 0
        while True:
            next_at += self.rng.expovariate(turn_rate)
            if next_at - started > seconds:
                break
            await asyncio.sleep(max(0.0, next_at - time.perf_counter()))
            n += 1
            user = f"{tag}-u{self.rng.randrange(self.users):04d}"
            fact = f"Kestrel {self._steps}.{n}" if self.rng.random() < self.fact_share else None
            task = asyncio.create_task(self._turn(result, user, n, fact))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        if tasks:
            await asyncio.wait(set(tasks), timeout=GRACE_SECONDS)
        for task in set(tasks):  # turns unanswered, facts never seen: counted by their task
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        return result

    async def _turn(self, result: StepResult, user: str, n: int, fact: str | None) -> None:
        headers = self.headers(user)
        said, answer = (
            (f"I use {fact} every day.", FACT_ANSWER) if fact else CHIT_CHAT[n % len(CHIT_CHAT)]
        )
        messages = [{"role": "user", "content": said}]
        chat = f"/v1/chats/{user}-chat"
        result.turns += 1
        try:
            t0 = time.perf_counter()
            context = await self.client.post(
                f"{chat}/context", json={"space_id": SPACE, "messages": messages}, headers=headers
            )
            t1 = time.perf_counter()
            saved = await self.client.post(
                f"{chat}/turns",
                json={
                    "space_id": SPACE,
                    "messages": messages,
                    "response": {"role": "assistant", "content": answer},
                },
                headers=headers,
            )
            t2 = time.perf_counter()
        except (httpx.HTTPError, asyncio.CancelledError) as error:
            result.errors += 1  # unanswered, or not before the step's grace ran out
            if isinstance(error, asyncio.CancelledError):
                raise
            return
        if context.status_code != 200 or saved.status_code not in (201, 202):
            result.errors += 1
            return
        result.context_ms.append((t1 - t0) * 1000)
        result.turns_ms.append((t2 - t1) * 1000)
        if fact is None:
            return
        result.facts += 1
        try:
            result.freshness.append(await self._probe(result, user, f"{fact} ", t2))
        except asyncio.CancelledError:
            result.freshness.append(math.inf)
            raise

    async def _probe(self, result: StepResult, user: str, needle: str, saved_at: float) -> float:
        headers = self.headers(user)
        body = {"space_id": SPACE, "messages": [{"role": "user", "content": PROBE_MESSAGE}]}
        while True:
            # every PROBE_SECONDS for a second, then less often: probes of facts that wait long
            # (a worker behind) must not load the service they measure ever more
            waited = time.perf_counter() - saved_at
            await asyncio.sleep(PROBE_SECONDS if waited < 1 else 0.25 if waited < 3 else 0.5)
            t0 = time.perf_counter()
            try:
                response = await self.client.post(
                    f"/v1/chats/{user}-probe/context", json=body, headers=headers
                )
            except httpx.HTTPError:
                result.errors += 1
                continue
            seen = time.perf_counter()
            result.probe_ms.append((seen - t0) * 1000)
            if response.status_code == 200 and needle in (
                response.json().get("system_prompt") or ""
            ):
                return seen - saved_at


# --- the run ----------------------------------------------------------------------------------


async def drained(db: asyncpg.Connection, within: float = 120.0) -> None:
    deadline = time.perf_counter() + within
    while await db.fetchval(PENDING_JOBS):
        if time.perf_counter() > deadline:
            raise RuntimeError("the queue did not drain")
        await asyncio.sleep(0.1)


async def register(client: httpx.AsyncClient, settings: Settings) -> None:
    operator = issue_token(
        settings, Principal("bench-operator", "platform", frozenset({"operator"}))
    )
    headers = {"Authorization": f"Bearer {operator}"}
    (
        await client.post("/v1/companies", json={"company_id": COMPANY}, headers=headers)
    ).raise_for_status()
    (
        await client.put(
            f"/v1/companies/{COMPANY}/feature-flags/{FLAG_CONTEXT_MEMORY}",
            json={"enabled": True},
            headers=headers,
        )
    ).raise_for_status()


async def first_claim_seconds(load: Load, db: asyncpg.Connection, worker: Process) -> float:
    """Queue one turn with no worker running, spawn `worker`, and time its first claim."""
    response = await load.client.post(
        "/v1/chats/start-u0-chat/turns",
        json={
            "space_id": SPACE,
            "messages": [{"role": "user", "content": "I use Kestrel 0.1 every day."}],
            "response": {"role": "assistant", "content": FACT_ANSWER},
        },
        headers=load.headers("start-u0"),
    )
    response.raise_for_status()
    job_id = response.json()["consolidation"]["job_id"]
    await worker.spawn()
    deadline = time.perf_counter() + STARTUP_TIMEOUT_SECONDS
    while (await db.fetchval("SELECT status FROM jobs WHERE id = $1::uuid", job_id)) in (
        "queued",
        "retrying",
    ):
        worker.check_alive()
        if time.perf_counter() > deadline:
            raise RuntimeError("the worker claimed nothing in time")
        await asyncio.sleep(0.01)
    return time.perf_counter() - worker.spawned_at


@dataclass
class WorkerRun:
    workers: int
    capacity: float
    steps: list[dict[str, Any]]
    levels: list[dict[str, Any]]
    worker_rss_mib: list[float]
    serve_rss_mib: float


async def run_workers(
    count: int,
    load: Load,
    *,
    db: asyncpg.Connection,
    env: dict[str, str],
    stub: FixedLatencyLLM,
    serve: Process,
    args: argparse.Namespace,
    startup: dict[str, float],
) -> WorkerRun:
    logs = args.out_dir / "freshness"
    processes = [worker_process(env, n, stub.base_url, logs) for n in range(count)]
    for number in range(count):
        (logs / f"worker-{number}.heartbeat").unlink(missing_ok=True)
    try:
        if "worker_first_claim_seconds" not in startup:
            startup["worker_first_claim_seconds"] = await first_claim_seconds(
                load, db, processes[0]
            )
        else:
            await processes[0].spawn()
        for process in processes[1:]:
            await process.spawn()
        for number, process in enumerate(processes):  # each worker's loop runs
            heartbeat = logs / f"worker-{number}.heartbeat"
            while not heartbeat.exists():
                process.check_alive()
                await asyncio.sleep(0.05)
        await asyncio.sleep(args.settle_seconds)  # and listens
        for process in processes:
            process.check_alive()
        await drained(db)
        steps: list[StepResult] = []
        rate = args.start_rate
        capacity = 0.0
        over = math.inf
        while rate <= args.max_rate:
            step = await load.step("search", count, rate, args.step_seconds)
            steps.append(step)
            report(step)
            await drained(db)
            if not step.passed:
                over = rate
                break
            capacity = rate
            rate *= args.rate_factor
        for _ in range(args.refine if capacity and math.isfinite(over) else 0):
            rate = math.sqrt(capacity * over)  # halfway between on a log scale
            step = await load.step("refine", count, rate, args.step_seconds)
            steps.append(step)
            report(step)
            await drained(db)
            if step.passed:
                capacity = rate
            else:
                over = rate
        levels = []
        for share in LEVELS if capacity else ():
            level = await load.step(f"{share:.0%}", count, capacity * share, args.level_seconds)
            report(level)
            levels.append(level.summary())
            await drained(db)
        for process in processes:
            process.check_alive()
        return WorkerRun(
            count,
            capacity,
            [step.summary() for step in steps],
            levels,
            [process.rss_mib() for process in processes],
            serve.rss_mib(),
        )
    finally:
        for process in processes:
            await process.stop()


def report(step: StepResult) -> None:
    s = step.summary()
    print(
        f"  {s['label']:>6} W={s['workers']} {s['fact_rate']:6.2f} facts/s: "
        f"{s['facts']} facts, fresh p50 {s['fresh_p50']:.2f} p95 {s['fresh_p95']:.2f} "
        f"p99 {s['fresh_p99']:.2f} s, missing {s['missing']}, errors {s['errors']}, "
        f"/context p50 {s['context_p50_ms']:.1f} ms, /turns p50 {s['turns_p50_ms']:.1f} ms"
        f"{'' if s['passed'] else '  (over)'}",
        flush=True,
    )


async def run(args: argparse.Namespace) -> dict[str, Any]:
    admin_url = args.admin_url
    name = f"cms_freshness_{secrets.token_hex(4)}"
    admin = await asyncpg.connect(asyncpg_dsn(admin_url))
    await admin.execute(f'CREATE DATABASE "{name}"')
    database_url = asyncpg_dsn(
        make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    )
    serve: Process | None = None
    try:
        env = base_environment(database_url) | dict(item.split("=", 1) for item in args.env)
        await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "app", "migrate"],
            cwd=PROJECT_ROOT,
            env=env,
            check=True,
        )
        settings = Settings(_env_file=None, jwt_secret=JWT_SECRET, environment="test")
        port = free_port()
        serve, ready = await start_serve(env, port, args.out_dir / "freshness")
        startup = {"serve_ready_seconds": ready}
        db = await asyncpg.connect(database_url)
        limits = httpx.Limits(
            max_connections=args.connections, max_keepalive_connections=args.connections
        )
        async with (
            FixedLatencyLLM(args.latency) as stub,
            httpx.AsyncClient(
                base_url=f"http://127.0.0.1:{port}", limits=limits, timeout=30
            ) as client,
        ):
            await register(client, settings)
            load = Load(client, settings, args)
            runs = []
            for count in args.workers:
                print(f"{count} worker process(es):", flush=True)
                runs.append(
                    await run_workers(
                        count,
                        load,
                        db=db,
                        env=env,
                        stub=stub,
                        serve=serve,
                        args=args,
                        startup=startup,
                    )
                )
        await db.close()
        return {
            "startup": startup,
            "runs": [asdict(run) for run in runs],
            "options": {
                key: value
                for key, value in vars(args).items()
                if key not in ("workers", "out_dir", "admin_url")
            }
            | {"workers": list(args.workers)},
        }
    finally:
        if serve is not None:
            await serve.stop()
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


def markdown(result: dict[str, Any]) -> str:
    options = result["options"]
    lines = [
        "# Freshness: from a turn-save's answer to the fact in `/context`",
        "",
        f"Model stub {options['latency'] * 1000:.0f} ms a call; {options['users']} users a step, "
        f"{options['fact_share']:.0%} of turns state a fact; probes every "
        f"{PROBE_SECONDS * 1000:.0f} ms; settings {' '.join(options['env']) or 'defaults'}. "
        "`serve` ready in "
        f"{result['startup']['serve_ready_seconds']:.2f} s; first worker's first claim "
        f"{result['startup'].get('worker_first_claim_seconds', math.nan):.2f} s after spawn.",
        "",
        "| workers | capacity (facts/s, p99 ≤ 5 s) | load | facts/s "
        "| freshness p50 / p95 / p99 (s) | /context p50 / p99 (ms) | /turns p50 / p99 (ms) "
        "| RSS serve / workers (MiB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        rss = f"{run['serve_rss_mib']:.0f} / " + ", ".join(
            f"{v:.0f}" for v in run["worker_rss_mib"]
        )
        for level in run["levels"] or [{}]:
            if not level:
                lines.append(f"| {run['workers']} | {run['capacity']:.1f} | – | | | | | {rss} |")
                continue
            lines.append(
                f"| {run['workers']} | {run['capacity']:.1f} | {level['label']} "
                f"| {level['fact_rate']:.1f} "
                f"| {level['fresh_p50']:.2f} / {level['fresh_p95']:.2f} / {level['fresh_p99']:.2f} "
                f"| {level['context_p50_ms']:.1f} / {level['context_p99_ms']:.1f} "
                f"| {level['turns_p50_ms']:.1f} / {level['turns_p99_ms']:.1f} | {rss} |"
            )
    lines += [
        "",
        "Search steps:",
        "",
        "| workers | facts/s | p50 / p99 (s) | missing | errors | passed |",
        "|---|---|---|---|---|---|",
    ]
    for run in result["runs"]:
        for step in run["steps"]:
            lines.append(
                f"| {run['workers']} | {step['fact_rate']:.2f} | {step['fresh_p50']:.2f} / "
                f"{step['fresh_p99']:.2f} | {step['missing']} | {step['errors']} | "
                f"{'yes' if step['passed'] else 'no'} |"
            )
    return "\n".join(lines) + "\n"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--workers", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2, 4]
    )
    parser.add_argument("--users", type=int, default=400, help="fresh users per step")
    parser.add_argument("--fact-share", type=float, default=0.5)
    parser.add_argument("--latency", type=float, default=0.2, help="model stub seconds a call")
    parser.add_argument("--start-rate", type=float, default=2.0, help="facts/s of the first step")
    parser.add_argument("--rate-factor", type=float, default=1.5)
    parser.add_argument("--max-rate", type=float, default=200.0)
    parser.add_argument(
        "--refine", type=int, default=2, help="steps halving the gap around the capacity"
    )
    parser.add_argument("--step-seconds", type=float, default=20.0)
    parser.add_argument("--level-seconds", type=float, default=30.0)
    parser.add_argument("--settle-seconds", type=float, default=2.0)
    parser.add_argument("--connections", type=int, default=256)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for serve and the workers (e.g. JOB_NOTIFY_INTERVAL_MS=0); repeatable",
    )
    parser.add_argument("--quick", action="store_true", help="short steps, a look only")
    parser.add_argument("--out-dir", type=Path, default=OUT_DIR, help="report and logs")
    parser.add_argument(
        "--admin-url",
        default=os.environ.get("DATABASE_URL", ADMIN_URL),
        help="PostgreSQL to create the scratch database on (default DATABASE_URL)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.step_seconds, args.level_seconds, args.max_rate = 5.0, 5.0, 8.0
    return args


async def run_to_sigterm(args: argparse.Namespace) -> dict[str, Any]:
    """`run`, cancelled by SIGTERM (e.g. `timeout`) too: the processes are stopped and the
    scratch database dropped."""
    task = asyncio.current_task()
    if task is not None:
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await run(args)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    result = asyncio.run(run_to_sigterm(args))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    text = markdown(result)
    (args.out_dir / "freshness_last_run.md").write_text(text)
    (args.out_dir / "freshness_last_run.json").write_text(json.dumps(result, indent=2, default=str))
    print(text)


if __name__ == "__main__":
    main()
