"""`make demo`: a scripted five-turn conversation that shows memory appear, change and hold still.

Runs against the service at `--url` / `CMS_URL` (default http://127.0.0.1:8000, what `make run`
serves); when none answers there it starts `python -m app serve` itself on a free port (the
embedded PostgreSQL unless `DATABASE_URL` is set) and stops it at the end. The token is
`--token` / `CMS_TOKEN`, or one minted with `python -m app token` for a fresh demo user (with the
operator role, so the demo can switch the company's context-memory flag on). After each turn it
waits for the consolidation job and prints the profile diff, the "What I know about you" section
the next turn will inject, and the version. No network and no key needed: without a model the
orchestrator answers with a canned reply and the service consolidates with its offline engine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from examples.orchestrator import (
    DEFAULT_URL,
    ChatModel,
    OpenAICompatibleModel,
    Orchestrator,
    memory_section,
    model_from_env,
    service_client,
)

SCRIPT: tuple[str, ...] = (
    "Hi! I'm a data engineer at Globex.",  # a job
    "I live in Berlin, and I'm working on a migration to dbt.",  # a city
    "I prefer concise answers. Please use bullet points when you compare tools.",  # preferences
    "Sorry, a correction: I moved to Lisbon last spring. I live in Lisbon now.",  # a correction
    "Thanks, that helps! What's a fun fact about octopuses?",  # chit-chat: nothing to remember
)
SPACE_ID = "demo-space"
COMPANY_FLAG = "FEATURE_FLAG_ENABLE_CONTEXT_MEMORY_UN_22033"
START_TIMEOUT_SECONDS = 120.0  # a first start initialises the embedded PostgreSQL
PROJECT_ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class TurnReport:
    """One scripted turn as the demo saw it."""

    number: int
    user: str
    reply: str
    consolidation: str  # "updated", "noop", "dead", or "skipped: <reason>"
    version: int | None  # the profile's version after the turn's consolidation
    diff: list[str]
    injected: str | None  # the memory section the next turn's model call gets


def _answers(url: str) -> bool:
    with suppress(httpx.HTTPError):
        return httpx.get(f"{url}/readyz", timeout=2.0).status_code == 200
    return False


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def service_at(url: str) -> Iterator[str]:
    """`url` when a service answers there, else a `python -m app serve` of our own, stopped
    on exit (its log in var/demo-serve.log)."""
    if _answers(url):
        yield url
        return
    port = _free_port()
    log_path = PROJECT_ROOT / "var" / "demo-serve.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    print(f"No service answers at {url}: starting one on port {port} (log: {log_path})")
    with log_path.open("wb") as log:
        process = subprocess.Popen(  # noqa: S603 - this interpreter, our own CLI
            [sys.executable, "-m", "app", "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=PROJECT_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    own = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not _answers(own):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise SystemExit(f"the service did not start:\n{tail}")
            time.sleep(0.2)
        yield own
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        print("Stopped the service the demo started.")


def mint_token(user: str) -> str:
    """A token from `python -m app token`, signed with the key this environment configures (the
    same the service started from here uses)."""
    command = [sys.executable, "-m", "app", "token", "--sub", user, "--company", "demo"]
    command += ["--role", "operator", "--role", "space_admin"]
    done = subprocess.run(  # noqa: S603 - this interpreter, our own CLI
        command, cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


async def ensure_enabled(http: httpx.AsyncClient, company: str) -> None:
    """Switch the company's context-memory flag on when that is what keeps memory off."""
    decision = await _enablement(http)
    if decision["enabled"]:
        return
    blocked = {c["key"] for c in decision["conditions"] if not c["satisfied"]}
    if blocked == {"company_flag"}:
        answer = await http.put(
            f"/v1/companies/{company}/feature-flags/{COMPANY_FLAG}", json={"enabled": True}
        )
        if answer.is_success:
            print(f"Switched {COMPANY_FLAG} on for company {company!r}.")
            decision = await _enablement(http)
    if not decision["enabled"]:
        raise SystemExit(
            f"Context memory is off for this user in {SPACE_ID!r}: {decision['reason']} "
            "(the demo needs an operator token to switch the company flag on)"
        )


async def _enablement(http: httpx.AsyncClient) -> dict[str, Any]:
    answer = await http.get("/v1/me/memory/enablement", params={"space_id": SPACE_ID})
    answer.raise_for_status()
    decision: dict[str, Any] = answer.json()
    return decision


async def profile_version(http: httpx.AsyncClient) -> int | None:
    answer = await http.get("/v1/me/memory")
    if answer.status_code == 404:
        return None
    answer.raise_for_status()
    version: int = answer.json()["version"]
    return version


async def profile_diff(http: httpx.AsyncClient, version: int, before: int | None) -> list[str]:
    """The bullets removed (`- ...`) and added (`+ ...`) from `before` (None: the empty
    document) to `version`, read from the service's unified diff of the two versions."""
    answer = await http.get(
        f"/v1/me/memory/versions/{version}/diff", params={"against": before or 0}
    )
    answer.raise_for_status()
    lines = answer.json()["diff"].splitlines()
    return [f"{line[0]} {line[3:]}" for line in lines if line[:3] in ("+- ", "-- ")]


async def injected_section(http: httpx.AsyncClient, chat_id: str) -> str | None:
    """What the next turn's model call will be told: a context call that saves nothing."""
    answer = await http.post(
        f"/v1/chats/{chat_id}/context",
        json={
            "space_id": SPACE_ID,
            "history_mode": "never",
            "system_prompt": "(preview)",
            "messages": [{"role": "user", "content": "(preview)"}],
        },
    )
    answer.raise_for_status()
    return memory_section(answer.json()["system_prompt"])


async def run_demo(
    url: str, token: str, *, model: ChatModel, script: Sequence[str] = SCRIPT
) -> list[TurnReport]:
    """Run the scripted turns in a fresh chat, printing each; returns what each turn did."""
    chat_id = f"demo-{uuid.uuid4().hex[:8]}"
    reports: list[TurnReport] = []
    async with service_client(url, token) as http:
        me = (await http.get("/v1/me")).raise_for_status().json()
        print(
            f"User {me['user_id']!r} of company {me['company_id']!r}, chat {chat_id}, "
            f"model {model.name}"
        )
        await ensure_enabled(http, me["company_id"])
        orchestrator = Orchestrator(http, model, space_id=SPACE_ID, chat_id=chat_id)
        version = await profile_version(http)
        for number, text in enumerate(script, start=1):
            report = await _turn(http, orchestrator, number, text, version)
            version = report.version
            reports.append(report)
            _print(report, len(script))
    return reports


async def _turn(
    http: httpx.AsyncClient, orchestrator: Orchestrator, number: int, text: str, before: int | None
) -> TurnReport:
    outcome = await orchestrator.run_turn(text)
    consolidation = outcome.saved["consolidation"]
    if outcome.job_id is None:
        status = f"skipped: {consolidation['reason']}"
    else:
        job = await orchestrator.wait_for_job(outcome.job_id)
        status = job["outcome"] or job["status"]
    version = await profile_version(http)
    diff = await profile_diff(http, version, before) if version and version != before else []
    injected = await injected_section(http, orchestrator.chat_id)
    return TurnReport(number, text, outcome.reply, status, version, diff, injected)


def _print(report: TurnReport, total: int) -> None:
    print(f"\n=== Turn {report.number}/{total} " + "=" * 60)
    print(f"user      > {report.user}")
    print(f"assistant > {report.reply}")
    print(f"memory    : consolidation {report.consolidation}; profile version {report.version}")
    if report.diff:
        print("profile diff:")
        for line in report.diff:
            print(f"    {line}")
    else:
        print("profile diff: (no change)")
    if report.injected is None:
        print("injected next turn: (no memory section yet)")
        return
    heading, _instructions, body = report.injected.split("\n\n", 2)
    print(f"injected next turn:\n    {heading}\n    (instructions to the model)")
    for line in body.splitlines():
        if line.strip() and line.strip() != "_(empty)_":
            print(f"    {line}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", default=os.environ.get("CMS_URL", DEFAULT_URL))
    parser.add_argument("--token", default=os.environ.get("CMS_TOKEN"))
    args = parser.parse_args(argv)
    with service_at(args.url.rstrip("/")) as url:
        token = args.token or mint_token(f"demo-{uuid.uuid4().hex[:6]}")
        reports = asyncio.run(_demo_with_model_from_env(url, token))
    versions = [r.version for r in reports]
    print(f"\n{len(reports)} turns; profile version after each: {versions}")
    return 0


async def _demo_with_model_from_env(url: str, token: str) -> list[TurnReport]:
    model = model_from_env()
    try:
        return await run_demo(url, token, model=model)
    finally:
        if isinstance(model, OpenAICompatibleModel):
            await model.aclose()


if __name__ == "__main__":
    sys.exit(main())
