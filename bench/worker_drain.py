"""One measured drain of the consolidation worker, for bench/worker_bench.py and its smoke test.

`TurnQueue` saves turns through the app's real turn-save route (`POST /v1/chats/{id}/turns`,
in process over ASGI), which queues one consolidation job per turn. `WorkerProcess` runs
`python -m app worker` as a child process with settings from its environment, and holds it
stopped (SIGSTOP) while turns are queued, so every drain starts with its whole backlog queued.
`run_drain` queues the turns, lets the worker go (SIGCONT), polls the jobs table until no job is
queued, running or retrying, and reads what happened: jobs, claims, versions, model calls, the
worker's CPU time and its resident memory.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import asyncpg
import httpx
from asgi_lifespan import LifespanManager
from pydantic import SecretStr
from sqlalchemy import make_url

from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.kit.auth.mint import issue_token
from app.kit.config import Settings
from app.kit.principal import Principal
from app.main import create_app
from bench.fixed_latency_llm import FixedLatencyLLM, StubStats

PROJECT_ROOT = Path(__file__).resolve().parent.parent
SPACE = "space-1"
JWT_SECRET = "worker-bench-only-secret-not-the-development-default"  # noqa: S105 - scratch
POLL_SECONDS = 0.02
# How often an idle worker looks for jobs (WORKER_POLL_SECONDS, 1 s by default). A drain resumes
# a worker that went idle when the previous drain ended; at the default it may sleep out the
# rest of its second first, which is no throughput of the worker's (a worker with a backlog
# never sleeps) but up to a quarter of a four-second drain.
WORKER_POLL_SECONDS = "0.05"
STARTUP_TIMEOUT_SECONDS = 60.0
STOP_TIMEOUT_SECONDS = 30.0
QUEUE_CONCURRENCY = 8

# --- the exchanges ----------------------------------------------------------------------------

_ROLES = ("data engineer", "credit risk analyst", "product manager", "backend developer")
_CITIES = ("Berlin", "Zurich", "Lisbon", "Toronto", "Osaka")
_PROJECTS = ("Atlas", "Borealis", "Cobalt", "Delta", "Ember", "Falcon", "Granite")
_TOOLS = ("dbt", "pandas", "Terraform", "Kubernetes", "Power BI")
CHIT_CHAT = (
    ("Thanks, that was helpful!", "You're welcome. Happy to help with anything else."),
    ("What is the capital of Australia?", "Canberra, not Sydney, is the capital of Australia."),
    (
        "Can you explain how a hash map works?",
        "A hash map stores values in buckets chosen by a hash of the key, so a lookup "
        "computes the hash and reads one bucket instead of scanning every entry.",
    ),
    (
        "Write a SQL query that counts orders per day.",
        "SELECT date_trunc('day', created_at) AS day, count(*) FROM orders GROUP BY 1 ORDER BY 1;",
    ),
    ("Haha, nice one. Anything else?", "That is all for now. Ask me anything when you need."),
)
FACT_ANSWER = "Noted. I'll keep that in mind and tailor my answers to it."


def exchange(user: int, turn: int) -> tuple[str, str]:
    """The user's message and the answer of a user's n-th turn: every other turn states a
    durable fact (role and city, a preference, a project, a tool, a follow-up), the others are
    chit-chat, factual questions and code requests."""
    k = user + turn
    if k % 2:
        return CHIT_CHAT[k % len(CHIT_CHAT)]
    facts = (
        f"I work as a {_ROLES[k % len(_ROLES)]} in {_CITIES[k // 2 % len(_CITIES)]}.",
        f"I prefer {'short' if k % 4 else 'detailed'} answers with examples.",
        f"I'm working on the {_PROJECTS[k % len(_PROJECTS)]} migration this quarter.",
        f"I use {_TOOLS[k // 2 % len(_TOOLS)]} every day.",
        f"Remind me to review the {_PROJECTS[k // 2 % len(_PROJECTS)]} budget next week.",
    )
    return facts[(turn // 2 + user) % len(facts)], FACT_ANSWER


def user_id(tag: str, user: int) -> str:
    return f"{tag}-u{user:04d}"


def asyncpg_dsn(url: str) -> str:
    """A plain `postgresql://` DSN for asyncpg from any SQLAlchemy PostgreSQL URL."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def app_settings(database_url: str, **overrides: Any) -> Settings:
    """The settings of the in-process app that saves the turns (its own worker off)."""
    values: dict[str, Any] = {
        "environment": "test",
        "database_url": database_url,
        "jwt_secret": SecretStr(JWT_SECRET),
        "jwt_platform": True,  # the harness's operator switches a company's flag on
        "worker_enabled": False,
        "llm_provider": "rules",
        "log_level": "WARNING",
        "db_pool_size": QUEUE_CONCURRENCY,
        "db_max_overflow": 0,
        # the harness queues a drain's turns of one company as fast as it can: its company's
        # rate limit of turn-saves would answer 429 (the worker is what is measured here)
        "rate_limit_turns_company": "off",
    }
    return Settings(_env_file=None, **(values | overrides))


# --- saving turns -----------------------------------------------------------------------------


class TurnQueue:
    """The app in process with the context-memory flag on for `company`; saves turns over HTTP."""

    def __init__(self, database_url: str, company: str) -> None:
        self.settings = app_settings(database_url)
        self.company = company
        self._app = create_app(self.settings)
        self._stack = contextlib.AsyncExitStack()
        self._client: httpx.AsyncClient | None = None

    async def __aenter__(self) -> Self:
        await self._stack.enter_async_context(LifespanManager(self._app))
        transport = httpx.ASGITransport(app=self._app)
        self._client = await self._stack.enter_async_context(
            httpx.AsyncClient(transport=transport, base_url="http://bench")
        )
        operator = self._token("bench-operator", "platform", ("operator",))
        registered = await self._client.post(
            "/v1/companies",
            json={"company_id": self.company},
            headers={"Authorization": f"Bearer {operator}"},
        )
        registered.raise_for_status()
        response = await self._client.put(
            f"/v1/companies/{self.company}/feature-flags/{FLAG_CONTEXT_MEMORY}",
            json={"enabled": True},
            headers={"Authorization": f"Bearer {operator}"},
        )
        response.raise_for_status()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._stack.aclose()

    def _token(self, sub: str, company: str, roles: tuple[str, ...] = ()) -> str:
        return issue_token(self.settings, Principal(sub, company, frozenset(roles)))

    async def queue(self, tag: str, users: int, turns_per_user: int) -> int:
        """Save `turns_per_user` turns for each of `users` new users (each user's in order);
        returns how many were queued (202). Any other answer is an error."""
        if self._client is None:
            raise RuntimeError("TurnQueue is not entered")
        client = self._client
        limit = asyncio.Semaphore(QUEUE_CONCURRENCY)

        async def one_user(user: int) -> int:
            sub = user_id(tag, user)
            headers = {"Authorization": f"Bearer {self._token(sub, self.company)}"}
            async with limit:
                for turn in range(turns_per_user):
                    said, answer = exchange(user, turn)
                    body = {
                        "space_id": SPACE,
                        "messages": [{"role": "user", "content": said}],
                        "response": {"role": "assistant", "content": answer},
                    }
                    response = await client.post(
                        f"/v1/chats/{sub}-chat/turns", json=body, headers=headers
                    )
                    if response.status_code != 202:
                        raise RuntimeError(
                            f"turn-save answered {response.status_code}: {response.text[:300]}"
                        )
            return turns_per_user

        return sum(await asyncio.gather(*(one_user(user) for user in range(users))))


# --- the worker process -----------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerSetup:
    """One worker process: the engine (`rules`, or `stub` for the fixed-latency model server)
    and the settings that shape its throughput."""

    engine: str
    concurrency: int
    batch_size: int = 10

    @property
    def label(self) -> str:
        batch = "" if self.batch_size == 10 else f", JOB_BATCH_SIZE={self.batch_size}"
        return f"{self.engine}, WORKER_CONCURRENCY={self.concurrency}{batch}"

    def environment(
        self, database_url: str, heartbeat: Path, llm_base_url: str | None
    ) -> dict[str, str]:
        """The worker's environment: the inherited one without any of the app's settings (so
        "defaults" means the app's defaults), plus these."""
        fields = {name.upper() for name in Settings.model_fields}
        env = {key: value for key, value in os.environ.items() if key.upper() not in fields}
        env |= {
            "PYTHONPATH": os.pathsep.join(filter(None, (str(PROJECT_ROOT), env.get("PYTHONPATH")))),
            "ENVIRONMENT": "test",
            "DATABASE_URL": database_url,
            "JWT_SECRET": JWT_SECRET,
            "LOG_LEVEL": "WARNING",
            "WORKER_CONCURRENCY": str(self.concurrency),
            "JOB_BATCH_SIZE": str(self.batch_size),
            "WORKER_HEARTBEAT_FILE": str(heartbeat),
            "WORKER_POLL_SECONDS": WORKER_POLL_SECONDS,
        }
        if self.engine == "rules":
            return env | {"LLM_PROVIDER": "rules"}
        if llm_base_url is None:
            raise ValueError("the stub engine needs the stub server's URL")
        return env | {
            "LLM_PROVIDER": "openai",
            "OPENAI_BASE_URL": llm_base_url,
            "OPENAI_API_KEY": "bench-key-not-a-secret",
        }


@dataclass(frozen=True)
class Memory:
    rss_kb: int
    hwm_kb: int


def read_memory(pid: int) -> Memory:
    """VmRSS (now) and VmHWM (peak since the process started) from /proc."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            values[key] = int(rest.split()[0])
    return Memory(values["VmRSS"], values["VmHWM"])


def read_cpu_seconds(pid: int) -> float:
    """User + system CPU time of the process so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class WorkerProcess:
    """`python -m app worker` in `workdir` (its log, heartbeat file; no `.env` read from the
    project), started, waited for until its loop runs, then held stopped until `resume`."""

    def __init__(
        self,
        setup: WorkerSetup,
        database_url: str,
        workdir: Path,
        llm_base_url: str | None = None,
    ) -> None:
        self.setup = setup
        self.workdir = workdir
        self.heartbeat = workdir / "worker.heartbeat"
        self.log_path = workdir / "worker.log"
        self._env = setup.environment(database_url, self.heartbeat, llm_base_url)
        self._process: asyncio.subprocess.Process | None = None
        self.startup_memory: Memory | None = None

    @property
    def pid(self) -> int:
        if self._process is None:
            raise RuntimeError("the worker is not running")
        return self._process.pid

    @property
    def exited(self) -> bool:
        return self._process is None or self._process.returncode is not None

    def command(self) -> list[str]:
        return [sys.executable, "-m", "app", "worker"]

    async def __aenter__(self) -> Self:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.heartbeat.unlink(missing_ok=True)
        with self.log_path.open("wb") as log:
            self._process = await asyncio.create_subprocess_exec(
                *self.command(), cwd=self.workdir, env=self._env, stdout=log, stderr=log
            )
        try:
            deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
            while not self.heartbeat.exists():
                if self._process.returncode is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the worker did not start:\n{self.log_tail()}")
                await asyncio.sleep(0.05)
            self.pause()
            self.startup_memory = read_memory(self.pid)
        except BaseException:  # also cancelled (SIGTERM, Ctrl-C): no orphaned worker
            await self._stop()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self._stop()

    def pause(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def log_tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        return ""

    async def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGCONT)
            process.terminate()
        try:
            await asyncio.wait_for(process.wait(), STOP_TIMEOUT_SECONDS)
        except TimeoutError:
            process.kill()
            await process.wait()


# --- one drain --------------------------------------------------------------------------------


@dataclass
class DrainResult:
    """What one drain did and cost. A claim is one consolidation: one run of the pipeline over
    one user's coalesced jobs (up to JOB_BATCH_SIZE), committed in one transaction."""

    setup: WorkerSetup
    tag: str
    users: int
    turns: int
    seconds: float
    timed_out: bool
    jobs: int
    succeeded: int
    dead: int
    pending: int
    claims: int
    updated_claims: int
    versions: int
    extra_attempts: int
    model_calls: Counter[str] = field(default_factory=Counter)
    stub_busy_seconds: float = 0.0
    stub_peak_in_flight: int = 0
    stub_slowest_seconds: float = 0.0
    cpu_seconds: float = 0.0
    memory_before: Memory | None = None
    peak_rss_kb: int = 0
    memory_after: Memory | None = None

    @property
    def calls(self) -> int:
        return sum(self.model_calls.values())

    @property
    def claims_per_second(self) -> float:
        return self.claims / self.seconds

    @property
    def turns_per_second(self) -> float:
        return self.turns / self.seconds

    @property
    def calls_per_second(self) -> float:
        return self.calls / self.seconds

    @property
    def calls_per_claim(self) -> float:
        return self.calls / self.claims if self.claims else 0.0

    @property
    def cpu_share(self) -> float:
        """The worker's CPU time over the drain's wall time: 1.0 is one core busy throughout."""
        return self.cpu_seconds / self.seconds

    @property
    def clean(self) -> bool:
        return not self.timed_out and self.dead == 0 and self.pending == 0


_COUNTS = """
SELECT count(*) AS jobs,
       count(*) FILTER (WHERE status = 'succeeded') AS succeeded,
       count(*) FILTER (WHERE status = 'dead') AS dead,
       count(*) FILTER (WHERE status IN ('queued', 'running', 'retrying')) AS pending,
       count(DISTINCT (user_id, finished_at)) FILTER (WHERE status = 'succeeded') AS claims,
       count(DISTINCT (user_id, finished_at)) FILTER (WHERE outcome = 'updated') AS updated,
       coalesce(sum(attempts), 0) - count(*) AS extra_attempts,
       (SELECT count(*) FROM memory_versions v
         WHERE v.company_id = $1 AND v.user_id LIKE $2) AS versions
  FROM jobs WHERE company_id = $1 AND user_id LIKE $2
"""
"""Jobs of one claim are completed in one transaction, so they share `finished_at` (its
`now()`); a user's claims never overlap, so (user, finished_at) identifies a claim."""

PENDING_JOBS = "SELECT count(*) FROM jobs WHERE status IN ('queued', 'running', 'retrying')"


async def run_drain(
    queue: TurnQueue,
    worker: WorkerProcess,
    db: Any,
    *,
    tag: str,
    users: int,
    turns_per_user: int,
    stub: FixedLatencyLLM | None = None,
    timeout_seconds: float = 600.0,
) -> DrainResult:
    """Queue the turns with the worker stopped, VACUUM ANALYZE, let it run until no job is
    pending in the database (`db`: an asyncpg connection to it), stop it again and read the
    outcome."""
    turns = await queue.queue(tag, users, turns_per_user)
    # Statistics as autovacuum would keep them: on a table it has not analyzed yet, the planner
    # probes the claim's live-lease check through the company index (all of the company's jobs,
    # for every queued job), and the first drains of a fresh database get slower and slower.
    await db.execute("VACUUM ANALYZE")
    if stub is not None:
        stub.reset()
    memory_before = read_memory(worker.pid)
    cpu_before = read_cpu_seconds(worker.pid)
    peak_rss = memory_before.rss_kb
    started = time.perf_counter()
    worker.resume()
    timed_out = False
    while await db.fetchval(PENDING_JOBS):
        if worker.exited:
            raise RuntimeError(f"the worker exited during the drain:\n{worker.log_tail()}")
        peak_rss = max(peak_rss, read_memory(worker.pid).rss_kb)
        if time.perf_counter() - started > timeout_seconds:
            timed_out = True
            break
        await asyncio.sleep(POLL_SECONDS)
    seconds = time.perf_counter() - started
    cpu_seconds = read_cpu_seconds(worker.pid) - cpu_before
    worker.pause()
    memory_after = read_memory(worker.pid)
    seen = stub.reset() if stub is not None else StubStats()
    row = await db.fetchrow(_COUNTS, queue.company, f"{tag}-u%")
    return DrainResult(
        setup=worker.setup,
        tag=tag,
        users=users,
        turns=turns,
        seconds=seconds,
        timed_out=timed_out,
        jobs=row["jobs"],
        succeeded=row["succeeded"],
        dead=row["dead"],
        pending=row["pending"],
        claims=row["claims"],
        updated_claims=row["updated"],
        versions=row["versions"],
        extra_attempts=row["extra_attempts"],
        model_calls=seen.calls,
        stub_busy_seconds=seen.busy_seconds,
        stub_peak_in_flight=seen.peak_in_flight,
        stub_slowest_seconds=seen.slowest_seconds,
        cpu_seconds=cpu_seconds,
        memory_before=memory_before,
        peak_rss_kb=max(peak_rss, memory_after.rss_kb),
        memory_after=memory_after,
    )


async def connect(database_url: str) -> Any:
    """An asyncpg connection for polling (the harness's own, not the app's pool)."""
    return await asyncpg.connect(asyncpg_dsn(database_url))
