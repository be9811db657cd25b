"""One user floods turn-saves as fast as they can while another company works: the flooder is
refused (429, `Retry-After`) from the configured limit on, nothing acknowledged is lost, and the
other company's `/context` and consolidations keep their unloaded pace.

The service runs as `python -m app serve` (the offline engine consolidates), the flooder in
a process of its own, the measuring client here, and the worker as `python -m app worker`: in
production the clients are not the server, and a service under load runs its worker apart."""

from __future__ import annotations

import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.kit.config import PROJECT_ROOT
from tests.helpers.apps import OPERATOR, TokenFactory
from tests.helpers.db import admin_fetchval, scratch_database
from tests.helpers.polling import wait_until
from tests.test_serve_workers import serve_env, serving, wait_until_answering

FLOOD_TURNS = 2_000
FLOOD_CONNECTIONS = 64
USER_LIMIT = 120  # per minute: the default RATE_LIMIT_TURNS_USER
SAMPLES = 150
SAMPLE_GAP_SECONDS = 0.02  # the samples span ~3 s of the flood's ~15
VICTIM_TURNS = 4
MALLORYS_TURNS = "SELECT count(*) FROM turns WHERE company_id = 'acme' AND user_id = 'mallory'"


async def context_p50(client: httpx.AsyncClient, headers: dict[str, str]) -> float:
    body = {"space_id": "space-1", "messages": [{"role": "user", "content": "What do I like?"}]}
    timings = []
    for _ in range(SAMPLES):
        started = time.perf_counter()
        response = await client.post("/v1/chats/victim-chat/context", json=body, headers=headers)
        timings.append(time.perf_counter() - started)
        assert response.status_code == 200, response.text
        await asyncio.sleep(SAMPLE_GAP_SECONDS)
    return statistics.median(timings)


async def consolidation_seconds(client: httpx.AsyncClient, headers: dict[str, str]) -> float:
    """Seconds from saving VICTIM_TURNS turns (in a row) to all their jobs succeeded."""
    started = time.perf_counter()
    jobs = []
    for i in range(VICTIM_TURNS):
        body = {
            "space_id": "space-1",
            "messages": [{"role": "user", "content": f"I work as a pilot, fact {i}."}],
            "response": {"role": "assistant", "content": "Noted."},
        }
        response = await client.post(f"/v1/chats/victim-{i}/turns", json=body, headers=headers)
        assert response.status_code == 202, response.text
        jobs.append(response.json()["consolidation"]["job_id"])
    pending = set(jobs)

    async def all_succeeded() -> bool:
        for job_id in list(pending):
            response = await client.get(f"/v1/jobs/{job_id}", headers=headers)
            assert response.status_code == 200, response.text
            assert response.json()["status"] != "dead", response.text
            if response.json()["status"] == "succeeded":
                pending.discard(job_id)
        return not pending

    await wait_until(all_succeeded, 120, what="the consolidation of every turn saved")
    return time.perf_counter() - started


async def test_a_flooding_user_is_held_to_the_limit_and_another_company_keeps_its_pace(
    server_url: str, make_token: TokenFactory
) -> None:
    async with scratch_database(server_url, "flood") as database_url:
        with tempfile.TemporaryDirectory() as workdir:
            env = serve_env(
                DATABASE_URL=database_url,
                WORKER_ENABLED="false",
                WORKER_CONCURRENCY="2",
                WORKER_POLL_SECONDS="0.05",
                LOG_LEVEL="WARNING",
            )
            with (
                serving(1, env, Path(workdir)) as (process, port, log_path),
                working(env, Path(workdir)),
            ):
                base = f"http://127.0.0.1:{port}"
                wait_until_answering(process, f"{base}/readyz", log_path)
                try:
                    await flood_and_measure(base, make_token, database_url)
                except AssertionError as failure:
                    raise AssertionError(f"{failure}\n{log_path.read_text()[-4000:]}") from None


@contextmanager
def working(env: dict[str, str], workdir: Path) -> Iterator[None]:
    """`python -m app worker` beside `serve`, as a deployment that scales them apart runs it."""
    log_path = workdir / "worker.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "app", "worker"],
            cwd=workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        yield
    finally:
        worker.terminate()
        worker.wait(timeout=30)


async def flood_and_measure(base: str, make_token: TokenFactory, database_url: str) -> None:
    victim = {"Authorization": f"Bearer {make_token('bob', 'globex')}"}
    operator = {"Authorization": f"Bearer {make_token('olga', 'platform', OPERATOR)}"}
    async with httpx.AsyncClient(base_url=base, timeout=30) as client:
        for company in ("acme", "globex"):
            registered = await client.post(
                "/v1/companies", json={"company_id": company}, headers=operator
            )
            assert registered.status_code == 201, registered.text
            response = await client.put(
                f"/v1/companies/{company}/feature-flags/{FLAG_CONTEXT_MEMORY}",
                json={"enabled": True},
                headers=operator,
            )
            assert response.status_code == 200, response.text
        await context_p50(client, victim)  # warm: connections, caches
        solo_context = await context_p50(client, victim)
        solo_consolidation = await consolidation_seconds(client, victim)

        flooder = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.helpers.flood",
            base,
            make_token("mallory", "acme"),
            str(FLOOD_TURNS),
            str(FLOOD_CONNECTIONS),
            cwd=PROJECT_ROOT,
            stdout=subprocess.PIPE,
        )

        async def flood_under_way() -> bool:
            assert flooder.returncode is None, "the flood ended before it was measured"
            saved = await admin_fetchval(database_url, MALLORYS_TURNS)
            return bool(saved > 0)

        await wait_until(flood_under_way, 30, what="the flood's first turns saved")
        loaded_context = await context_p50(client, victim)
        loaded_consolidation = await consolidation_seconds(client, victim)
        output, _ = await flooder.communicate()
    assert flooder.returncode == 0
    flood = json.loads(output)
    statuses: list[int] = flood["statuses"]
    refill = int(flood["seconds"] * USER_LIMIT / 60) + 1

    # refused from the limit on: the first USER_LIMIT pass, then (bar refills) only 429s
    assert set(statuses) <= {202, 429}, sorted(set(statuses))
    assert statuses[:USER_LIMIT].count(202) >= USER_LIMIT - FLOOD_CONNECTIONS
    assert USER_LIMIT <= statuses.count(202) <= USER_LIMIT + refill
    assert statuses.count(429) >= FLOOD_TURNS - USER_LIMIT - refill
    assert flood["refusals_well_formed"]

    # every acknowledged turn is stored, once; nothing refused is
    acknowledged = set(flood["acknowledged"])
    assert len(acknowledged) == statuses.count(202)
    stored = await admin_fetchval(database_url, MALLORYS_TURNS)
    assert stored == len(acknowledged)
    ids = "', '".join(acknowledged)
    matching = await admin_fetchval(
        database_url,
        f"SELECT count(DISTINCT id) FROM turns WHERE id::text IN ('{ids}')",  # noqa: S608
    )
    assert matching == len(acknowledged)

    # the other company: its pace within 2x of its unloaded pace
    report = (
        f"/context p50 {solo_context * 1000:.1f} ms alone, {loaded_context * 1000:.1f} ms "
        f"under the flood; consolidations {solo_consolidation:.2f} s alone, "
        f"{loaded_consolidation:.2f} s under the flood; the flood took {flood['seconds']:.1f} s"
    )
    print(report)
    assert loaded_context <= 2 * solo_context, report
    assert loaded_consolidation <= 2 * solo_consolidation, report
