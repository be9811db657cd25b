"""bench/claim_fairness.py at toy scale, so it cannot silently rot: its flood and its simulated
busy slots run the real claim, the fresh company's job is taken at once, and the plan it prints
is the owner query's."""

from __future__ import annotations

from sqlalchemy.ext.asyncio import AsyncEngine

from bench.claim_fairness import FLOOD, FRESH, measure, parse_args, report
from tests.helpers.on_citus import not_on_citus


@not_on_citus(
    "bench/claim_fairness.py measures the single-node claim, whose recursive walk over every"
    " company Citus refuses (the cluster's claim is app/jobs/cluster_claim.py, tested in"
    " tests/citus/)"
)
async def test_the_claim_benchmark_sees_the_fresh_job_taken_next_and_plans_the_owner_query(
    engine: AsyncEngine,
) -> None:
    args = parse_args(["--backlog", "60", "--users", "12", "--claims", "30", "--finished", "200"])
    run = await measure(engine, args)
    assert len(run.latencies_ms) == 30
    assert run.flood_before_fresh() == 0
    assert set(run.served) >= {FLOOD, FRESH}
    assert any("CTE pending_companies" in line for line in run.owner_plan)
    assert "flood claims before it was taken: 0" in report(run, args)
