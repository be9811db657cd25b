"""The worker under faults: a worker frozen past its lease is fenced out when it resumes, a job
that fails every attempt is dead-lettered after the maximum, and a worker stopped mid-call hands
its job back without spending the attempt.

The stopped workers are real `python -m app worker` processes (SIGSTOP/SIGCONT, SIGTERM); the
language model is the local stub server, its delays holding a worker in the middle of a call.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import httpx
from fastapi import FastAPI

from app.jobs.queue import ClaimedJob
from app.jobs.worker import Worker
from app.kit.llm import ModelUnavailable, OpenAIChatModel
from tests.helpers.apps import AuthFactory, client_with
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
    logged_jobs,
    make_handler,
    make_worker,
    start_worker_process,
    wait_for,
    worker_process_env,
)

USER_TEXT = "These days the data platform at Acme is where I spend my time."  # the gate decides


def _model_worker_env(tmp_path: Path, database_url: str, llm_stub: StubLLMServer) -> dict[str, str]:
    """A worker process on the test database asking the stub, one job at a time."""
    return worker_process_env(
        tmp_path,
        DATABASE_URL=database_url,
        LLM_PROVIDER="openai",
        OPENAI_BASE_URL=llm_stub.base_url,
        LLM_TIMEOUT_SECONDS="120",  # a call outlives the lease: only the lease decides
        WORKER_CONCURRENCY="1",
        LOG_LEVEL="INFO",
    )


async def _claim_when_free(worker: Worker, seconds: float = 30) -> ClaimedJob:
    """Run one job with `worker` as soon as one is claimable (a lease ran out)."""
    return await wait_until(worker.run_once, seconds, what="a claimable job", every=0.1)


async def _stop(process: asyncio.subprocess.Process) -> None:
    """SIGTERM (after SIGCONT, should it still be frozen); SIGKILL if it does not exit."""
    if process.returncode is not None:
        return
    process.send_signal(signal.SIGCONT)
    process.send_signal(signal.SIGTERM)
    try:
        await asyncio.wait_for(process.wait(), timeout=30)
    except TimeoutError:
        process.kill()
        await process.wait()


async def test_a_worker_frozen_past_its_lease_is_fenced_out_when_it_resumes(  # noqa: PLR0917
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    database_url: str,
    tmp_path: Path,
    llm_stub: StubLLMServer,
) -> None:
    """SIGSTOP a worker process mid-call past its lease (5 s); another worker claims the job.
    The frozen one is resumed while the new holder is itself mid-call, so the job is `running`
    again and only the lease token tells the two claims apart: the resumed worker writes no
    version and leaves the job alone, and the new holder's version is the only one."""
    await enable_company(client, auth)
    job_id = await queue_turn(client, auth, USER_TEXT)
    llm_stub.script(
        delay(1, then=reply("UPDATE")),  # 1. the frozen worker's gate, answered while frozen
        delay(4, then=reply("UPDATE")),  # 2. the new holder's gate: it is mid-call meanwhile
        reply(add_bullet_answer("Identity", "Works at Globex.")),  # 3. the resumed worker's
        reply(add_bullet_answer("Identity", "Works at Acme.")),  # 4. the new holder's
    )
    log = tmp_path / "frozen-worker.log"
    frozen = await start_worker_process(_model_worker_env(tmp_path, database_url, llm_stub), log)
    try:

        async def requests(count: int) -> bool:
            return len(llm_stub.requests) == count

        await wait_for(lambda: requests(1), seconds=60)
        frozen.send_signal(signal.SIGSTOP)
        assert (await job_row(app, job_id)).attempts == 1

        async with OpenAIChatModel(
            api_key=None, base_url=llm_stub.base_url, timeout_seconds=30
        ) as chat_model:
            handler, metrics, _ = make_handler(app, chat_model)
            new_holder = asyncio.create_task(_claim_when_free(make_worker(app, handler, metrics)))
            await wait_for(lambda: requests(2), seconds=30)
            taken_over = await job_row(app, job_id)
            assert (taken_over.status, taken_over.attempts) == ("running", 2)

            frozen.send_signal(signal.SIGCONT)

            async def frozen_worker_gave_up() -> bool:
                return any(record["job_id"] == str(job_id) for record in logged_jobs(log))

            await wait_for(frozen_worker_gave_up, seconds=30)
            claimed = await asyncio.wait_for(new_holder, timeout=30)
    finally:
        await _stop(frozen)

    assert frozen.returncode == 0, log.read_text()[-2000:]
    [record] = logged_jobs(log)
    assert record["outcome"] == "lease_lost"
    assert claimed.job_ids == [job_id]
    job = await job_row(app, job_id)
    assert (job.status, job.outcome, job.attempts, job.version) == ("succeeded", "updated", 2, 1)
    assert [v.version for v in await versions(app)] == [1]
    content = await head_content(app)
    assert content is not None
    assert bullets(content, "Identity") == ["Works at Acme."]


async def test_a_job_that_fails_every_attempt_is_dead_lettered_after_the_maximum_attempts(
    app: FastAPI,
    auth: AuthFactory,
    database_url: str,
    llm_stub: StubLLMServer,
    chat_model: OpenAIChatModel,
) -> None:
    """A poison job (the model answers 500 to every call: retryable) runs exactly
    `JOB_MAX_ATTEMPTS` times with backoff, then is dead with a fixed message; the worker
    keeps running and never picks it up again."""
    async with client_with(database_url, job_max_attempts=3) as queueing:
        await enable_company(queueing, auth)
        job_id = await queue_turn(queueing, auth, USER_TEXT)
    # nothing scripted: the stub answers every call 500
    handler, metrics, _ = make_handler(app, chat_model)
    worker = make_worker(app, handler, metrics)
    running = asyncio.create_task(worker.run())
    try:

        async def dead() -> bool:
            return str((await job_row(app, job_id)).status) == "dead"

        await wait_for(dead, seconds=60)  # backoff: up to 2 s, then up to 4 s
        calls = len(llm_stub.requests)
        assert await worker.run_once() is None  # the running worker's claim finds nothing
        assert not running.done()  # and the worker keeps running
    finally:
        worker.stop()
        await running

    job = await job_row(app, job_id)
    assert (job.status, job.outcome, job.attempts) == ("dead", None, 3)
    assert (job.error_class, job.error_message) == (
        ModelUnavailable.error_class,
        ModelUnavailable.operator_message,
    )
    assert calls == len(llm_stub.requests) == 3  # one gate call per attempt, none after
    assert await versions(app) == []


async def test_a_worker_stopped_mid_call_past_its_grace_hands_the_job_back_unspent(  # noqa: PLR0917
    app: FastAPI,
    client: httpx.AsyncClient,
    auth: AuthFactory,
    database_url: str,
    tmp_path: Path,
    llm_stub: StubLLMServer,
) -> None:
    """SIGTERM while the model does not answer within the shutdown grace (10 s): the call is
    cancelled, the job goes back to `queued` with its attempt given back and no lease, nothing is
    written, and the next worker's run is attempt 1 again."""
    await enable_company(client, auth)
    job_id = await queue_turn(client, auth, USER_TEXT)
    llm_stub.script(
        delay(60, then=reply("UPDATE")),  # the stopping worker's gate: never in time
        reply("UPDATE"),
        reply(add_bullet_answer("Identity", "Works at Acme.")),
    )
    log = tmp_path / "stopping-worker.log"
    stopping = await start_worker_process(_model_worker_env(tmp_path, database_url, llm_stub), log)
    try:

        async def mid_call() -> bool:
            return len(llm_stub.requests) == 1

        await wait_for(mid_call, seconds=60)
        assert (await job_row(app, job_id)).attempts == 1
        stopping.send_signal(signal.SIGTERM)
        await asyncio.wait_for(stopping.wait(), timeout=30)
    finally:
        await _stop(stopping)

    assert stopping.returncode == 0, log.read_text()[-2000:]
    assert "released 1 job(s) on shutdown" in log.read_text()
    [released] = await rows(
        app,
        "SELECT status, attempts, lease_token, lease_expires_at, locked_by FROM jobs"
        " WHERE id = :id",
        id=job_id,
    )
    assert tuple(released) == ("queued", 0, None, None, None)
    assert await versions(app) == []

    async with OpenAIChatModel(
        api_key=None, base_url=llm_stub.base_url, timeout_seconds=10
    ) as chat_model:
        handler, metrics, _ = make_handler(app, chat_model)
        claimed = await make_worker(app, handler, metrics).run_once()
    assert claimed is not None
    assert claimed.jobs[0].attempts == 1
    job = await job_row(app, job_id)
    assert (job.status, job.outcome, job.attempts, job.version) == ("succeeded", "updated", 1, 1)
