"""The freshness benchmark's harness at toy scale, so bench/freshness.py cannot silently rot: a
real `serve` and `python -m app worker` against the fixed-latency model stub, open-loop turns,
and probes that see each fact reach `/context`."""

from __future__ import annotations

import math
from pathlib import Path

from bench.freshness import markdown, parse_args, run


async def test_every_fact_of_an_open_loop_load_reaches_context_and_is_timed(
    database_url: str, tmp_path: Path
) -> None:
    args = parse_args(
        [
            "--workers", "1",
            "--users", "20",
            "--latency", "0.05",
            "--start-rate", "2",
            "--max-rate", "3",
            "--step-seconds", "3",
            "--level-seconds", "2",
            "--settle-seconds", "0.5",
            "--admin-url", database_url,
            "--out-dir", str(tmp_path),
        ]
    )  # fmt: skip
    result = await run(args)

    assert result["startup"]["serve_ready_seconds"] > 0
    assert result["startup"]["worker_first_claim_seconds"] > 0
    (workers,) = result["runs"]
    assert workers["capacity"] >= 2.0  # the first step at least: its facts all seen in time
    for step in [*workers["steps"], *workers["levels"]]:
        assert step["errors"] == 0
        assert step["missing"] == 0
        assert step["facts"] == 0 or math.isfinite(step["fresh_p99"])
    assert sum(level["facts"] for level in workers["levels"]) > 0
    assert workers["serve_rss_mib"] > 0
    assert all(rss > 0 for rss in workers["worker_rss_mib"])
    assert "| 1 |" in markdown(result)
