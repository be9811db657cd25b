"""The CPU a request costs with tracing off, on with nothing sampled, sampled at 10 % and sampled
always, measured in one process: one app per setting over the same database, called in
alternating blocks whose order rotates every round, so that the machine's drift (this one is
shared and noisy) falls on every setting alike.

    .venv/bin/python bench/tracing_cost.py [--block 300] [--rounds 12]

Uses DATABASE_URL when set, else the embedded PostgreSQL (var/pg). The apps export over
OTLP/HTTP to `bench/otlp_sink.py` on 127.0.0.1, in a process of its own (it accepts and
discards), so the exporting thread's work is in the figures and the sink's is not: CPU is the
whole measuring process's (`time.process_time`). Each block is `--block` sequential requests
handed straight to one app (ASGI, as `bench/hot_path_quick.py` does), then that app's spans
flushed to the sink, so that no block pays for another's export. Each setting's figure is the
median over `--rounds` blocks; its ratio to tracing off is the median over the rounds of the
ratio between the two blocks of the same round. The throughput view of the same question is
`make bench BENCH_ARGS="--variants tracing-off,tracing-10pct"`; see docs/benchmarks.md.

The apps share the process, so asyncpg is wrapped once the first traced app starts: the app
with tracing off pays the wrapper's check (one context lookup per statement) here, which it
does not in a process of its own.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

import asyncpg
import httpx
import orjson
from asgi_lifespan import LifespanManager
from sqlalchemy import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.kit.auth.mint import issue_token
from app.kit.config import PROJECT_ROOT, to_asyncpg_url
from app.kit.db.migrations import run_migrations
from app.kit.embedded_pg import EmbeddedPostgres
from app.kit.observability import configure_logging
from app.kit.principal import Principal
from app.kit.tracing import Tracing
from app.main import create_app
from bench import hot_path_quick as quick
from bench.run_bench import TURN_TEXT


def settings_of(sink: str) -> dict[str, dict[str, str]]:
    exported = {"OTEL_EXPORTER_OTLP_ENDPOINT": sink, "OTEL_SERVICE_NAME": "tracing-cost"}
    return {
        "off": {},
        "0%": exported
        | {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0"},
        "10%": exported
        | {"OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.1"},
        "always": exported | {"OTEL_TRACES_SAMPLER": "always_on"},
    }


async def measure(server_url: str, sink_url: str, block: int, rounds: int) -> None:
    name = f"cms_tracing_{uuid.uuid4().hex[:8]}"
    admin = await asyncpg.connect(**quick.asyncpg_params(server_url))
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    try:
        await asyncio.to_thread(run_migrations, url)
        settings = quick.bench_settings(url)
        apps = {
            label: create_app(settings, Tracing.from_environment(environ))
            for label, environ in settings_of(sink_url).items()
        }
        configure_logging("WARNING")
        token = issue_token(settings, Principal(quick.USER, quick.COMPANY, frozenset()))
        headers = {"Authorization": f"Bearer {token}"}
        async with AsyncExitStack() as stack:
            for app in apps.values():
                await stack.enter_async_context(LifespanManager(app))
            first = apps["off"]
            transport = httpx.ASGITransport(app=first)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:
                await quick.seed(first, client, headers)
            await alternate(
                {label: quick.AsgiCaller(app, headers) for label, app in apps.items()},
                {label: _flush_of(app.state.tracing) for label, app in apps.items()},
                block,
                rounds,
            )
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()


async def alternate(
    callers: dict[str, quick.AsgiCaller],
    flushes: dict[str, Callable[[], object] | None],
    block: int,
    rounds: int,
) -> None:
    context_body = orjson.dumps(
        {"space_id": quick.SPACE, "messages": [{"role": "user", "content": "Hi there"}]}
    )
    turn_body = orjson.dumps(  # the sizes `make bench` sends
        {
            "space_id": quick.SPACE,
            "messages": [{"role": "user", "content": TURN_TEXT}],
            "response": {"role": "assistant", "content": TURN_TEXT},
        }
    )
    calls = {
        "POST /context": (f"/v1/chats/{quick.CHAT}/context", context_body, 200),
        "POST /turns": (f"/v1/chats/{quick.CHAT}-t/turns", turn_body, 202),
    }
    cpu: dict[tuple[str, str], list[float]] = {(c, s): [] for c in calls for s in callers}
    for round_number in range(rounds + 1):  # the first round warms up
        for call, (path, body, expected) in calls.items():
            labels = list(callers)
            shift = round_number % len(labels)  # each setting takes each place in turn
            for label in labels[shift:] + labels[:shift]:
                caller = callers[label]
                started = time.process_time()
                for _ in range(block):
                    status, answer = await caller("POST", path, body)
                    assert status == expected, answer
                flush = flushes[label]
                if flush is not None:  # this block's spans exported in this block's time
                    await asyncio.to_thread(flush)
                if round_number:
                    cpu[(call, label)].append((time.process_time() - started) / block * 1e6)
    print(
        f"\nCPU µs per request, median of {rounds} blocks of {block} (min–max); each ratio is"
        " the median over the rounds of the ratio within a round:\n"
    )
    others = [label for label in callers if label != "off"]
    header = [*callers, *(f"{label} ÷ off" for label in others)]
    print("| call | " + " | ".join(header) + " |")
    print("|---|" + "---:|" * len(header))
    for call in calls:
        cells = []
        for label in callers:
            blocks = cpu[(call, label)]
            cells.append(
                f"{statistics.median(blocks):,.0f} ({min(blocks):,.0f}–{max(blocks):,.0f})"
            )
        off = cpu[(call, "off")]
        for label in others:  # paired: each round's blocks ran back to back
            ratios = [ours / base for ours, base in zip(cpu[(call, label)], off, strict=True)]
            cells.append(f"**{statistics.median(ratios):.2f}**")
        print(f"| {call} | " + " | ".join(cells) + " |")


def _flush_of(tracing: Tracing) -> Callable[[], object] | None:
    return None if tracing.provider is None else tracing.provider.force_flush


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--block", type=int, default=300, help="requests per block")
    parser.add_argument("--rounds", type=int, default=12, help="blocks per setting and call")
    args = parser.parse_args()
    configured = os.environ.get("DATABASE_URL")
    embedded = None if configured else EmbeddedPostgres(PROJECT_ROOT / "var" / "pg")
    server_url = to_asyncpg_url(configured or embedded.start())  # type: ignore[union-attr]
    sink = subprocess.Popen(  # noqa: S603 - this interpreter, a file of this repository
        [sys.executable, str(Path(__file__).with_name("otlp_sink.py"))],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert sink.stdout is not None
        sink_url = sink.stdout.readline().strip()
        asyncio.run(measure(server_url, sink_url, args.block, args.rounds))
    finally:
        posts, received = sink.communicate()[0].split()
        print(f"OTLP sink: {int(posts)} exports, {int(received):,} bytes")
        if embedded is not None:
            embedded.stop()


if __name__ == "__main__":
    main()
