"""The worker as it runs in production: several slots on one queue, the in-process worker of
`serve`, and `python -m app worker [--check]` as a separate process."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI

from app.kit.config import PROJECT_ROOT
from app.kit.llm import OpenAIChatModel
from app.profiles.document import parse
from tests.helpers.apps import USER, AuthFactory, app_with, client_of
from tests.helpers.db import rows
from tests.helpers.jobs import job_row
from tests.helpers.llm_stub import StubLLMServer, delay, reply
from tests.helpers.memory import head_content, versions
from tests.helpers.polling import wait_until
from tests.helpers.profiles import bullets
from tests.helpers.settings import enable_company
from tests.helpers.turns import queue_turn
from tests.helpers.worker import (
    add_bullet_answer,
    make_handler,
    make_worker,
    start_worker_process,
    wait_for,
    worker_process_env,
)

SKILLS = [
    "Python", "Rust", "Go", "Kotlin", "Scala", "Haskell", "Elixir", "Julia", "Terraform", "Ansible",
    "Kafka", "Spark", "Airflow", "dbt", "Snowflake", "BigQuery", "Redis", "Kubernetes", "Docker",
    "PostgreSQL",
]  # fmt: skip


GATED_TEXT = "These days the data platform at Acme is where I spend my time."
"""Read by no rule of the offline engine: the gate is asked first."""
ADD_WORKS_AT_ACME = add_bullet_answer("Identity", "Works at Acme.")


async def pending_jobs(app: FastAPI) -> int:
    (row,) = await rows(app, "SELECT count(*) AS n FROM jobs WHERE status <> 'succeeded'")
    return int(row.n)


async def test_twenty_turns_in_four_chats_on_two_slots_keep_every_fact_and_a_linear_history(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    handler, metrics, _ = make_handler(app)
    worker = make_worker(app, handler, metrics, concurrency=2, batch_size=3)
    running = asyncio.create_task(worker.run())
    try:
        for number, skill in enumerate(SKILLS):
            await queue_turn(client, auth, f"I know {skill}", chat_id=f"chat-{number % 4}")
            await asyncio.sleep(0.01)

        async def drained() -> bool:
            return await pending_jobs(app) == 0

        await wait_for(drained)
    finally:
        worker.stop()
        await running

    stored = await versions(app)
    assert [v.version for v in stored] == list(range(1, len(stored) + 1))  # no gap, no fork
    known = bullets(stored[-1].content, "Skills & Expertise")
    assert sorted(known) == sorted(f"Knows {skill}." for skill in SKILLS)
    for older, newer in itertools.pairwise(stored):  # each builds on the one before
        assert set(bullets(older.content, "Skills & Expertise")) <= set(
            bullets(newer.content, "Skills & Expertise")
        )
    turn_ids = [turn for v in stored for turn in v.source_turn_ids]
    assert len(turn_ids) == len(set(turn_ids)) == len(SKILLS)
    assert parse(stored[-1].content).frontmatter.turn_count == len(stored)


async def test_a_running_worker_holds_no_more_tasks_after_jobs_than_before(
    app: FastAPI, client: httpx.AsyncClient, auth: AuthFactory
) -> None:
    await enable_company(client, auth)
    handler, metrics, _ = make_handler(app)
    worker = make_worker(app, handler, metrics, concurrency=2)
    running = asyncio.create_task(worker.run())
    try:

        def slots() -> int:
            return sum(t.get_name().startswith("worker-slot-") for t in asyncio.all_tasks())

        await wait_until(lambda: slots() == 2, what="the worker's two slots")
        # a slot waits out its poll interval in a task of its own: one each, now or later
        idle = len(asyncio.all_tasks()) + 2
        for number, skill in enumerate(SKILLS[:12]):
            await queue_turn(client, auth, f"I know {skill}", user=f"user-{number}")

        async def settled() -> bool:
            return await pending_jobs(app) == 0 and len(asyncio.all_tasks()) <= idle

        await wait_for(settled)  # a task left behind per job would never settle
    finally:
        worker.stop()
        await running


async def test_serve_runs_the_worker_in_process_when_enabled(
    database_url: str, auth: AuthFactory, tmp_path: Path
) -> None:
    async with (
        app_with(
            database_url,
            worker_enabled=True,
            worker_poll_seconds=0.05,
            worker_heartbeat_file=tmp_path / "worker.heartbeat",
        ) as application,
        client_of(application) as client,
    ):
        await enable_company(client, auth)
        job_id = await queue_turn(client, auth, "I work as a data engineer at Acme")

        async def finished() -> bool:
            return str((await job_row(application, job_id)).status) == "succeeded"

        await wait_for(finished)
        response = await client.get("/v1/me/memory", headers=auth(USER))
        assert response.status_code == 200
        assert "Works as a data engineer." in response.json()["content"]
    assert (tmp_path / "worker.heartbeat").exists()


def _check(env: dict[str, str]) -> int:
    result = subprocess.run(
        [sys.executable, "-m", "app", "worker", "--check"],
        cwd=PROJECT_ROOT,
        env=env,
        capture_output=True,
        check=False,
        timeout=60,
    )
    return result.returncode


def test_worker_check_reads_the_heartbeat_file_age(tmp_path: Path) -> None:
    env = worker_process_env(tmp_path)
    heartbeat = tmp_path / "worker.heartbeat"
    assert _check(env) == 1  # never touched

    heartbeat.touch()
    assert _check(env) == 0

    stale = time.time() - 60  # older than a lease (5 s) and five polls
    os.utime(heartbeat, (stale, stale))
    assert _check(env) == 1


async def test_python_m_app_worker_finishes_the_job_in_hand_and_claims_no_more_on_sigterm(  # noqa: PLR0917
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    database_url: str,
    tmp_path: Path,
    llm_stub: StubLLMServer,
) -> None:
    """SIGTERM while the worker waits for the model: the job in hand finishes within the
    shutdown grace on its one attempt, the next waiting job is not claimed, the process exits 0.
    (Past the grace the job is released instead: tests/consolidation/test_worker_faults.py.)"""
    await enable_company(client, auth)
    job_id = await queue_turn(client, auth, GATED_TEXT)
    waiting = await queue_turn(client, auth, "I work as a designer at Globex", user="bob")
    llm_stub.script(delay(3, then=reply("UPDATE")), reply(ADD_WORKS_AT_ACME))
    env = worker_process_env(
        tmp_path,
        DATABASE_URL=database_url,
        LLM_PROVIDER="openai",
        OPENAI_BASE_URL=llm_stub.base_url,
        WORKER_CONCURRENCY="1",
    )
    log = tmp_path / "worker.log"
    process = await start_worker_process(env, log)
    try:

        async def mid_call() -> bool:
            return len(llm_stub.requests) == 1

        await wait_for(mid_call, seconds=60)
        assert str((await job_row(app, job_id)).status) == "running"
        process.send_signal(signal.SIGTERM)
        assert _check(env) == 0  # alive while it finishes the job in hand
        await asyncio.wait_for(process.wait(), timeout=30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, log.read_text()[-2000:]
    job = await job_row(app, job_id)
    assert (job.status, job.outcome, job.attempts, job.version) == ("succeeded", "updated", 1, 1)
    assert [v.version for v in await versions(app)] == [1]
    assert uuid.UUID(str((await versions(app))[0].job_id)) == job_id
    untouched = await job_row(app, waiting)
    assert (untouched.status, untouched.attempts) == ("queued", 0)


@pytest.mark.slow
async def test_python_m_app_worker_starts_and_migrates_the_embedded_database_when_unconfigured(
    tmp_path: Path,
) -> None:
    (PROJECT_ROOT / "var").mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=PROJECT_ROOT / "var", prefix="emb-worker-") as data:
        env = worker_process_env(tmp_path, EMBEDDED_PG_DIR=str(Path(data) / "pg"))
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "app",
            "worker",
            cwd=PROJECT_ROOT,
            env=env,
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:

            async def polling() -> bool:  # the loop runs: the database is up and migrated
                return (tmp_path / "worker.heartbeat").exists()

            await wait_for(polling, seconds=120)
        finally:
            if process.returncode is None:
                process.send_signal(signal.SIGTERM)
            _, stderr = await asyncio.wait_for(process.communicate(), timeout=60)
        assert process.returncode == 0, stderr.decode()[-2000:]
        assert not (Path(data) / "pg" / "postmaster.pid").exists()  # released on the way out


@pytest.mark.slow
async def test_a_worker_killed_mid_call_loses_nothing_and_the_profile_advances_once(  # noqa: PLR0917
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    database_url: str,
    tmp_path: Path,
    llm_stub: StubLLMServer,
) -> None:
    """SIGKILL a `python -m app worker` process while it waits for the model: its lease runs
    out, another worker re-claims the job (attempt 2) and exactly one version is written."""
    await enable_company(client, auth)
    job_id = await queue_turn(client, auth, GATED_TEXT)
    llm_stub.script(
        delay(60, then=reply("UPDATE")),  # the first worker's gate call: it never returns
        reply("UPDATE"),
        reply(ADD_WORKS_AT_ACME),
    )
    env = worker_process_env(
        tmp_path,
        DATABASE_URL=database_url,
        LLM_PROVIDER="openai",
        OPENAI_BASE_URL=llm_stub.base_url,
        LLM_TIMEOUT_SECONDS="120",
    )
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "app", "worker", cwd=PROJECT_ROOT, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
    )  # fmt: skip
    try:

        async def mid_call() -> bool:
            return len(llm_stub.requests) == 1

        await wait_for(mid_call, seconds=60)
        assert str((await job_row(app, job_id)).status) == "running"
    finally:
        process.kill()
        await process.wait()
    assert process.returncode == -signal.SIGKILL

    async with OpenAIChatModel(
        api_key=None, base_url=llm_stub.base_url, timeout_seconds=10
    ) as chat_model:
        handler, metrics, _ = make_handler(app, chat_model)
        worker = make_worker(app, handler, metrics)
        # claimable once the lease (5 s) of the killed process has run out
        claimed = await wait_until(worker.run_once, 30, what="the killed worker's lease to end")
    assert claimed.jobs[0].id == job_id
    job = await job_row(app, job_id)
    assert (job.status, job.outcome, job.attempts, job.version) == ("succeeded", "updated", 2, 1)
    assert [v.version for v in await versions(app)] == [1]
    content = await head_content(app)
    assert content is not None
    assert bullets(content, "Identity") == ["Works at Acme."]
