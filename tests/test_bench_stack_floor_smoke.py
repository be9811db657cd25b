"""bench/stack_floor.py, the stack alone that bench/footprint.py sets beside the worker, so the
floor it reports cannot silently stop building what it claims to: its steps in order, against a
real database and the fixed-latency model stub over HTTP."""

from __future__ import annotations

from app.kit.config import to_asyncpg_url
from bench.fixed_latency_llm import FixedLatencyLLM
from bench.footprint import FLOOR_LAST, measure_floor

MIB = 1024


async def test_the_stack_alone_reports_each_part_it_loads(database_url: str) -> None:
    async with FixedLatencyLLM(0.01) as stub:
        floor = await measure_floor(to_asyncpg_url(database_url), stub.base_url)

    steps = ["runtime", "settings", "database", "tokenizer", "model client", FLOOR_LAST]
    assert list(floor) == steps
    # each part is really there: the tokenizer's tables alone are ~23 MiB, the SDK's types ~20
    assert floor["tokenizer"] - floor["database"] > 10 * MIB
    assert floor["model client"] - floor["tokenizer"] > 10 * MIB
    assert floor["database"] > floor["runtime"]
