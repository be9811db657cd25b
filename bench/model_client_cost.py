"""The model client's own CPU per call: the openai SDK on its default transport (httpcore)
against its aiohttp transport (`openai.DefaultAioHttpClient`, what `app.kit.llm` uses), through
`OpenAIChatModel.complete`, 16 calls in flight.

    .venv/bin/python bench/model_client_cost.py [--calls 1000] [--rounds 3] [--latency-ms 50]

The model is bench/fixed_latency_llm.py in a child process, so that only the client's CPU is
counted (this process's `time.process_time()` over each block of calls). Rounds alternate the
two transports; each figure is the median over the rounds, in ms of CPU per call.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time
from pathlib import Path

import openai

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from app.kit.llm import ChatRequest, OpenAIChatModel
from bench.fixed_latency_llm import FixedLatencyLLM

IN_FLIGHT = 16
REQUEST = ChatRequest(
    model="bench-model",
    system="You keep a user's profile.",
    user="<User1>\nI work as a data engineer in Berlin.\n</User1>\n" + "context " * 600,
    max_output_tokens=500,
    json_mode=True,
)


async def serve(latency_seconds: float) -> None:
    async with FixedLatencyLLM(latency_seconds) as server:
        print(server.base_url, flush=True)
        await asyncio.Event().wait()


async def cpu_per_call(base_url: str, transport: str, calls: int) -> float:
    model = OpenAIChatModel(api_key="bench-key-not-a-secret", base_url=base_url, timeout_seconds=10)
    if transport == "httpcore":  # the SDK's default client, as app.kit.llm used before
        await model.aclose()
        model._client = openai.AsyncOpenAI(  # the one thing compared
            api_key="bench-key-not-a-secret", base_url=base_url, timeout=10, max_retries=0
        )
    limit = asyncio.Semaphore(IN_FLIGHT)

    async def one() -> None:
        async with limit:
            await model.complete(REQUEST)

    async with model:
        await asyncio.gather(*(one() for _ in range(IN_FLIGHT * 4)))  # warm the pool
        before = time.process_time()
        await asyncio.gather(*(one() for _ in range(calls)))
        return (time.process_time() - before) * 1000 / calls


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        await serve(args.latency_ms / 1000)
        return
    server = subprocess.Popen(  # noqa: S603, ASYNC220 - this file, started once before any call is timed
        [sys.executable, __file__, "--serve", "--latency-ms", str(args.latency_ms)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        base_url = server.stdout.readline().strip()
        figures: dict[str, list[float]] = {"httpcore": [], "aiohttp": []}
        for _ in range(args.rounds):
            for transport, seen in figures.items():
                seen.append(await cpu_per_call(base_url, transport, args.calls))
    finally:
        server.terminate()
        server.wait()
    for transport, seen in figures.items():
        runs = ", ".join(f"{value:.2f}" for value in seen)
        print(f"{transport:>8}: {statistics.median(seen):.2f} ms CPU per call ({runs})")


if __name__ == "__main__":
    asyncio.run(main())
