"""`python -m app worker` serves no API, so with WORKER_METRICS_PORT it serves its own Prometheus
metrics: the queue, the jobs it ran and its model calls, which no API process sees."""

from __future__ import annotations

import asyncio
import signal
import socket
import urllib.request
from contextlib import suppress
from pathlib import Path

import httpx
from fastapi import FastAPI

from tests.helpers.apps import AuthFactory
from tests.helpers.jobs import job_row
from tests.helpers.settings import enable_company
from tests.helpers.turns import queue_turn
from tests.helpers.worker import start_worker_process, wait_for, worker_process_env


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def scrape(port: int) -> str:
    def get() -> str:
        url = f"http://127.0.0.1:{port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as answer:
            return str(answer.read().decode())

    return await asyncio.to_thread(get)


def sample(text: str, line_start: str) -> float:
    values = [
        float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith(line_start)
    ]
    assert len(values) == 1, f"{line_start!r} in:\n{text}"
    return values[0]


async def test_the_standalone_worker_serves_its_metrics_on_its_own_port(
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    database_url: str,
    tmp_path: Path,
) -> None:
    await enable_company(client, auth)
    job_id = await queue_turn(client, auth, "I work as a credit risk analyst at Helvetia Bank.")
    port = free_port()
    env = worker_process_env(tmp_path, DATABASE_URL=database_url, WORKER_METRICS_PORT=str(port))
    log = tmp_path / "worker.log"
    process = await start_worker_process(env, log)
    try:

        async def finished() -> bool:
            return str((await job_row(app, job_id)).status) == "succeeded"

        await wait_for(finished, seconds=60)

        async def counted() -> bool:
            # the job's counters and the queue gauges, refreshed on the worker's own schedule
            with suppress(OSError):
                text = await scrape(port)
                return all(
                    name in text
                    for name in (
                        'jobs_total{kind="consolidation",outcome="updated"}',
                        'queue_depth{status="queued"}',
                    )
                )
            return False

        await wait_for(counted, seconds=30)
        text = await scrape(port)
        assert sample(text, 'jobs_total{kind="consolidation",outcome="updated"}') == 1.0
        assert sample(text, 'consolidations_total{result="updated"}') == 1.0
        assert 'queue_depth{status="queued"}' in text  # the queue gauges are refreshed here too
        process.send_signal(signal.SIGTERM)
        await asyncio.wait_for(process.wait(), timeout=30)
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert process.returncode == 0, log.read_text()[-2000:]
    assert f"worker metrics on http://127.0.0.1:{port}/metrics" in log.read_text()
    with socket.socket() as probe:  # the server went with the process
        assert probe.connect_ex(("127.0.0.1", port)) != 0
