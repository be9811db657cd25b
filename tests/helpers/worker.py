"""The consolidation worker in a test: its handler and worker built on the test app (with metrics
of their own), `python -m app worker` as a process of its own, and polling until something the
worker does has happened."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from app.consolidation.kinds import COALESCING, KINDS
from app.consolidation.pipeline import make_consolidation_handler
from app.jobs.worker import JobHandler, Worker, WorkerConfig
from app.kit.config import PROJECT_ROOT, Settings
from app.kit.llm import ChatModel
from app.kit.observability import Metrics
from tests.helpers.apps import TEST_JWT_SECRET, make_settings
from tests.helpers.db import database_of
from tests.helpers.jobs import job_row
from tests.helpers.polling import wait_until


def make_handler(
    app: FastAPI, chat_model: ChatModel | None = None, **overrides: Any
) -> tuple[JobHandler, Metrics, Settings]:
    """The consolidation handler on the app's database, with the app's settings or, given
    `overrides`, settings built from them."""
    settings: Settings = app.state.settings
    if overrides:
        settings = make_settings(str(settings.database_url), **overrides)
    metrics = Metrics()
    tokens = app.state.tokens
    handler = make_consolidation_handler(database_of(app), settings, chat_model, metrics, tokens)
    return handler, metrics, settings


def make_worker(
    app: FastAPI,
    handler: JobHandler,
    metrics: Metrics,
    *,
    concurrency: int = 1,
    batch_size: int = 10,
    lease_seconds: float = 30,
) -> Worker:
    config = WorkerConfig(
        concurrency=concurrency,
        poll_seconds=0.05,
        lease_seconds=lease_seconds,
        batch_size=batch_size,
        shutdown_grace_seconds=5,
        coalesce=COALESCING,
        worker_id="test-worker",
    )
    return Worker(database_of(app).engine, dict.fromkeys(KINDS, handler), config, metrics)


async def run_one(app: FastAPI, chat_model: ChatModel, **settings: Any) -> tuple[Any, Metrics]:
    """One worker claim with a consolidation handler on `chat_model` (settings overridden by
    `settings`): the claimed job's row afterwards, and the metrics it counted."""
    handler, metrics, _ = make_handler(app, chat_model, **settings)
    claimed = await make_worker(app, handler, metrics).run_once()
    assert claimed is not None
    return await job_row(app, claimed.jobs[0].id), metrics


# `tests/helpers/polling.py`'s helper, by the name the worker's tests know it
wait_for = wait_until


def worker_process_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a `python -m app worker` a test starts: the test's own without its
    database URLs, the offline rules, a heartbeat file in `tmp_path`, fast polls and the
    shortest lease (5 s); `extra` on top."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"DATABASE_URL", "TEST_DATABASE_URL"}
    }
    env.update(
        {
            "ENVIRONMENT": "test",
            "JWT_SECRET": TEST_JWT_SECRET,
            "LLM_PROVIDER": "rules",
            "WORKER_HEARTBEAT_FILE": str(tmp_path / "worker.heartbeat"),
            "WORKER_POLL_SECONDS": "0.1",
            "JOB_LEASE_SECONDS": "5",
        }
    )
    env.update(extra)
    return env


async def start_worker_process(env: dict[str, str], log: Path) -> asyncio.subprocess.Process:
    """`python -m app worker` with `env`, its output (JSON log lines) written to `log`."""
    with log.open("wb") as out:
        return await asyncio.create_subprocess_exec(
            *(sys.executable, "-m", "app", "worker"),
            cwd=PROJECT_ROOT,
            env=env,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=out,
            stderr=asyncio.subprocess.STDOUT,
        )


def logged_jobs(log: Path) -> list[dict[str, Any]]:
    """The `job finished` records a worker process wrote to `log` (job_id, outcome, ...)."""
    records = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            record = json.loads(line)
            if record.get("msg") == "job finished":
                records.append(record)
    return records


def add_bullet_answer(section: str, text: str) -> str:
    """The model's answer to the `operations` call that adds one bullet to `section`."""
    operation = {"op": "ADD", "section": section, "text": text}
    return json.dumps({"decision": "UPDATE", "operations": [operation]})
