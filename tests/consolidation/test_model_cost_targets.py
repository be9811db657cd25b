"""bench/model_cost.py's conversation as a test, so the cost targets cannot regress unseen: at
most one model call per turn, at most 650 prompt tokens per turn, output limits within four
times the answers, and every scripted fact in the final profile."""

from __future__ import annotations

from datetime import UTC, datetime

from app.profiles.document import SECTIONS, Operation, OpKind, Section, apply, empty_profile, parse
from bench.model_cost import CONVERSATION, OracleModel, run_conversation, summarise


def expected_profile() -> dict[Section, list[str]]:
    """The scripted operations applied in order: what a model that never misses writes (the
    Recent Topics aside, which are dated)."""
    profile = empty_profile("dana")
    for turn in CONVERSATION:
        operations = [
            Operation(
                OpKind(op["op"]),
                Section(op["section"]),
                text=op.get("text"),
                target=op.get("target"),
            )
            for op in turn.ops
        ]
        profile = apply(profile, operations, datetime.now(UTC))
    return {section: list(profile.bullets(section)) for section in SECTIONS}


async def test_the_scripted_conversation_meets_the_cost_targets_and_keeps_every_fact(
    database_url: str,
) -> None:
    model = OracleModel()
    async with model.running():
        result = await run_conversation(database_url, model)
    summary = summarise(result, model.recorder)

    assert summary["fact_share"] == 0.4
    assert summary["phases"]["paced"]["calls_per_turn"] <= 1.0
    assert summary["phases"]["burst"]["calls_per_turn"] <= 0.2
    assert summary["paced_prompt_tokens_per_turn"] <= 650
    operations = summary["by_kind"]["operations"]
    assert operations["max_tokens_over_output_p95"] <= 4
    assert max(operations["max_tokens"]) < 4096
    assert set(summary["by_kind"]["gate"]["models"]) == {"gpt-4o-mini"}
    assert set(operations["models"]) == {"gpt-4o-2024-11-20"}
    profile = parse(result.profile)
    expected = expected_profile()
    for section in SECTIONS:
        if section is not Section.RECENT:
            assert list(profile.bullets(section)) == expected[section], section.value
    assert summary["metrics"]["model_calls_total{kind=gate,outcome=update}"] == 4
