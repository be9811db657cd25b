"""The user export's memory under load: users with a large chat history each export their memory
(`GET /v1/me/memory/export`) at the same time from a real `python -m app serve` process, whose
resident set (VmRSS) is sampled from /proc while they stream.

    .venv/bin/python bench/export_memory.py [--users 10] [--mib-per-user 40]

With the admin connection DATABASE_URL (default postgresql://postgres@127.0.0.1:5432/postgres)
it creates a scratch database `cms_export_bench_<random>`, migrates it, seeds the histories by
SQL (set-based, not through the API) and drops it at the end, also on a failure or Ctrl-C. The
served process runs without its consolidation worker. Prints the baseline RSS (after one small
warm-up export), the peak during the exports, and what each export sent; about 30 s with the
defaults. Results: docs/benchmarks.md#the-users-export. `tests/profiles/test_memory_export_load.py`
runs the same harness at a smaller scale with a bound on the peak.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import asyncpg
import httpx
from pydantic import SecretStr
from sqlalchemy import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.kit.auth.mint import issue_token
from app.kit.config import Settings, to_asyncpg_url
from app.kit.db.migrations import run_migrations
from app.kit.principal import Principal

PROJECT_ROOT = Path(__file__).resolve().parent.parent
JWT_SECRET = "bench-only-secret-not-the-development-default"  # noqa: S105 - scratch service
COMPANY = "acme"
MESSAGE_BYTES = 8192
CHATS_PER_USER = 40
START_TIMEOUT_SECONDS = 60.0
SAMPLE_SECONDS = 0.01


def user_id(n: int) -> str:
    return f"export-user-{n:02d}"


# --- the histories, by SQL ---------------------------------------------------------------------


async def seed_histories(
    dsn: str, users: Sequence[str], *, mib_per_user: float, message_bytes: int = MESSAGE_BYTES
) -> int:
    """Give each of `users` (company `COMPANY`) a chat history of about `mib_per_user` MiB of
    message text: turns of two messages of `message_bytes` each, spread over `CHATS_PER_USER`
    chats, one second apart. Set-based statements; returns the messages per user."""
    turns = max(1, round(mib_per_user * 2**20 / (2 * message_bytes)))
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute(
                "INSERT INTO turns (company_id, id, user_id, chat_id, space_id, history_mode,"
                " created_at)"
                " SELECT $1, md5(u || '/' || t)::uuid, u, 'chat-' || (t % $3), 'space-1', 'auto',"
                "  now() - make_interval(secs => $2 - t)"
                " FROM unnest($4::text[]) AS u, generate_series(1, $2) AS t",
                COMPANY,
                turns,
                CHATS_PER_USER,
                list(users),
            )
            # text that neither compresses to nothing nor is all ASCII: what a chat holds
            await conn.execute(
                "INSERT INTO chat_messages (company_id, user_id, chat_id, turn_id, role, content,"
                " source, tokens, created_at)"
                " SELECT $1, u, 'chat-' || (t % $3), md5(u || '/' || t)::uuid, r.role,"
                "  left(repeat(md5(u || t || r.role) || ' Grüße — ', $5 / 40 + 1), $5 - 1)"
                "   || '\"', r.source, $5 / 4, now() - make_interval(secs => $2 - t)"
                " FROM unnest($4::text[]) AS u, generate_series(1, $2) AS t,"
                "  (VALUES (1, 'user', 'request'), (2, 'assistant', 'response'))"
                "   AS r(n, role, source)"
                " ORDER BY u, t, r.n",
                COMPANY,
                turns,
                CHATS_PER_USER,
                list(users),
                message_bytes,
            )
    finally:
        await conn.close()
    return 2 * turns


# --- the served process and its resident set ---------------------------------------------------


def rss_bytes(pid: int) -> int:
    """The process's resident set now (VmRSS), in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise LookupError(f"no VmRSS for process {pid}")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass(frozen=True)
class Served:
    pid: int
    base_url: str
    log: Path


def _start_serving(database_url: str, port: int, log: Path) -> subprocess.Popen[bytes]:
    """`python -m app serve` (one process, no consolidation worker) in its own session, reading
    as many snapshots at once as there are exports (the run measures that many at once, of one
    company, whose default share of the read slots is smaller)."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(PROJECT_ROOT),
        "ENVIRONMENT": "test",
        "DATABASE_URL": database_url,
        "JWT_SECRET": JWT_SECRET,
        "LLM_PROVIDER": "rules",
        "WORKER_ENABLED": "false",
        "LOG_LEVEL": "WARNING",
        "EXPORT_READ_CONCURRENCY": "64",
        "EXPORT_READ_COMPANY_CONCURRENCY": "64",
    }
    with log.open("wb") as out:
        return subprocess.Popen(  # noqa: S603 - our own interpreter, fixed arguments
            [sys.executable, "-m", "app", "serve", "--port", str(port)],
            cwd=log.parent,  # no .env of the project is read
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@asynccontextmanager
async def served(database_url: str, workdir: Path) -> AsyncIterator[Served]:
    """`python -m app serve` on a free port of 127.0.0.1, its log in `workdir`, until the block
    ends (SIGTERM, then SIGKILL of its process group)."""
    port = _free_port()
    log = workdir / "serve.log"
    process = _start_serving(database_url, port, log)
    base_url = f"http://127.0.0.1:{port}"
    try:
        await _wait_until_answering(process, base_url, log)
        yield Served(process.pid, base_url, log)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(process.wait, 10)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                await asyncio.to_thread(process.wait, 10)


async def _wait_until_answering(process: subprocess.Popen[bytes], base_url: str, log: Path) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    async with httpx.AsyncClient(base_url=base_url, timeout=2) as http:
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"serve exited early:\n{_tail(log)}")
            with suppress(httpx.HTTPError):
                if (await http.get("/healthz")).status_code == 200:
                    return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"serve did not answer in time:\n{_tail(log)}")


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


# --- the exports -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExportRun:
    baseline_rss: int
    peak_rss: int
    statuses: list[int]
    sizes: list[int]
    seconds: float

    @property
    def growth(self) -> int:
        return self.peak_rss - self.baseline_rss


def bearer(users: Sequence[str]) -> dict[str, str]:
    """A token of each user of `COMPANY`, signed with the served process's secret."""
    settings = Settings(_env_file=None, environment="test", jwt_secret=SecretStr(JWT_SECRET))
    return {user: issue_token(settings, Principal(user, COMPANY, frozenset())) for user in users}


async def _export(http: httpx.AsyncClient, token: str) -> tuple[int, int]:
    """(status, bytes received); the body is read and dropped as it arrives."""
    size = 0
    last = b""
    headers = {"Authorization": f"Bearer {token}"}
    async with http.stream("GET", "/v1/me/memory/export", headers=headers) as response:
        async for chunk in response.aiter_raw():
            size += len(chunk)
            last = chunk or last
    if response.status_code == 200 and not last.endswith(b"]}"):
        raise AssertionError("an export ended before its document did")
    return response.status_code, size


async def export_at_once(served: Served, tokens: Sequence[str], warm_up: str) -> ExportRun:
    """One small export (`warm_up`'s token) to settle the process, then every token's export at
    the same time, VmRSS sampled every 10 ms from the first request to the last byte."""
    limits = httpx.Limits(max_connections=len(tokens) + 1)
    async with httpx.AsyncClient(base_url=served.base_url, timeout=120, limits=limits) as http:
        await _export(http, warm_up)
        baseline = rss_bytes(served.pid)
        peak = baseline
        done = asyncio.Event()

        async def sample() -> None:
            nonlocal peak
            while not done.is_set():
                peak = max(peak, rss_bytes(served.pid))
                await asyncio.sleep(SAMPLE_SECONDS)

        sampler = asyncio.create_task(sample())
        started = time.monotonic()
        try:
            answers = await asyncio.gather(*(_export(http, token) for token in tokens))
        finally:
            done.set()
            await sampler
        seconds = time.monotonic() - started
        peak = max(peak, rss_bytes(served.pid))
    return ExportRun(
        baseline,
        peak,
        [status for status, _ in answers],
        [size for _, size in answers],
        seconds,
    )


# --- the run -----------------------------------------------------------------------------------


@asynccontextmanager
async def scratch_database(admin_url: str) -> AsyncIterator[str]:
    """A migrated database of its own (asyncpg URL), dropped at the end."""
    name = f"cms_export_bench_{uuid.uuid4().hex[:8]}"
    admin_dsn = plain_dsn(admin_url)
    conn = await asyncpg.connect(admin_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    url = make_url(to_asyncpg_url(admin_url)).set(database=name)
    try:
        await asyncio.to_thread(run_migrations, url.render_as_string(hide_password=False))
        yield url.render_as_string(hide_password=False)
    finally:
        conn = await asyncpg.connect(admin_dsn)
        try:
            await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await conn.close()


def plain_dsn(url: str) -> str:
    """`url` as a libpq-style DSN for asyncpg."""
    parsed = make_url(url.replace("postgresql+asyncpg://", "postgresql://", 1))
    return parsed.set(drivername="postgresql").render_as_string(hide_password=False)


async def run(users: int, mib_per_user: float, workdir: Path) -> ExportRun:
    admin_url = os.environ.get("DATABASE_URL", "postgresql://postgres@127.0.0.1:5432/postgres")
    names = [user_id(n) for n in range(1, users + 1)]
    warm_up = "export-warm-up"
    async with scratch_database(admin_url) as url:
        started = time.monotonic()
        messages = await seed_histories(plain_dsn(url), names, mib_per_user=mib_per_user)
        await seed_histories(plain_dsn(url), [warm_up], mib_per_user=0.05)
        print(
            f"seeded {users} users x {messages} messages of {MESSAGE_BYTES} B "
            f"({mib_per_user:g} MiB each) in {time.monotonic() - started:.1f} s",
            flush=True,
        )
        tokens = bearer([*names, warm_up])
        async with served(url, workdir) as process:
            result = await export_at_once(process, [tokens[n] for n in names], tokens[warm_up])
    return result


def report(result: ExportRun, users: int) -> str:
    mib = 2**20
    return "\n".join(
        [
            f"{users} exports at once: statuses {sorted(set(result.statuses))}, "
            f"{min(result.sizes) / mib:.1f}-{max(result.sizes) / mib:.1f} MiB each, "
            f"{result.seconds:.1f} s",
            f"RSS: baseline {result.baseline_rss / mib:.0f} MiB, peak {result.peak_rss / mib:.0f} "
            f"MiB, growth {result.growth / mib:.0f} MiB",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--users", type=int, default=10)
    parser.add_argument("--mib-per-user", type=float, default=40.0)
    args = parser.parse_args()
    workdir = PROJECT_ROOT / "var" / "bench" / "export"
    workdir.mkdir(parents=True, exist_ok=True)
    result = asyncio.run(run(args.users, args.mib_per_user, workdir))
    print(report(result, args.users), flush=True)


if __name__ == "__main__":
    main()
