"""`make eval`: the corpus is well formed, the stub model reads the service's real prompts and
answers each call in its form, the scoring and cost figures follow their definitions, and a
reduced corpus replayed through the real service on the stub gives the figures its known
outcome implies, with call and token counts equal to what the stub recorded."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
import yaml
from openai import AsyncOpenAI

from app.consolidation.prompts import (
    condensation_prompt,
    gate_prompt,
    operations_prompt,
    rewrite_prompt,
)
from app.consolidation.rules import Exchange
from app.kit.tokens import TokenCounter
from app.profiles.document import Profile, Section, empty_profile, parse_body, render_body
from eval.corpus import CorpusError, load_corpus, parse_corpus
from eval.model_stub import call_kind, prompt_tokens, read_prompt, stub_answer
from eval.recorder import ModelCall, ModelRecorder
from eval.report import Prices, cost_of, percentile, render
from eval.run import RunOptions, run_eval
from eval.scoring import score_profile

NOW = datetime(2026, 12, 1, 9, 30, tzinfo=UTC)
COUNTER = TokenCounter()


def _profile(**bullets: list[str]) -> Profile:
    sections = {Section[name]: texts for name, texts in bullets.items()}
    return Profile.from_sections(empty_profile("u").frontmatter, sections)


def _body(prompt: tuple[str, str], *, json_mode: bool = False, max_tokens: int = 64) -> Any:
    """A chat completion request as the service's adapter sends it."""
    system, user = prompt
    body: dict[str, Any] = {
        "model": "gpt-4o-mini",
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": user}],
        "max_completion_tokens": max_tokens,
    }
    if json_mode:
        body["response_format"] = {"type": "json_object"}
    return body


PROFILE = _profile(IDENTITY=["Works at Globex."], RECENT=["2026-11-30 08:00 UTC: Globex."])
EXCHANGES = [
    Exchange("What's a lakehouse?", "A lake with tables.", datetime(2026, 12, 1, 9, 1, tzinfo=UTC)),
    Exchange("I live in Berlin.", "Nice city.", datetime(2026, 12, 1, 9, 2, tzinfo=UTC)),
]


# --- the corpus ---------------------------------------------------------------------------------


def test_the_corpus_mixes_facts_chit_chat_bursts_contradictions_and_forget_requests() -> None:
    corpus = load_corpus()
    assert len(corpus.users) >= 4
    facts = sum(user.fact_turns for user in corpus.users)
    assert 0.3 <= facts / corpus.turns <= 0.5
    for user in corpus.users:
        assert any(turn.burst for turn in user.turns), user.id
        assert user.expect.contradictions, user.id
    assert sum(len(user.expect.forgotten) for user in corpus.users) >= 3
    assert sum(len(user.expect.never_stored) for user in corpus.users) >= 3


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"section": "Identities"}, "fact role: `section` must be one or more of"),
        ({"match": []}, "fact role: `match` must be a non-empty list"),
        ({"id": None}, "fact 1: `id` is required"),
    ],
)
def test_a_malformed_expectation_names_the_user_and_the_field(
    change: dict[str, Any], message: str
) -> None:
    fact = {"id": "role", "section": "Identity", "match": ["engineer"]} | change
    turns = [{"user": "hi", "assistant": "hello"}]
    data = {"users": [{"id": "ann", "turns": turns, "expect": {"facts": [fact]}}]}
    with pytest.raises(CorpusError, match="user ann") as raised:
        parse_corpus(data)
    assert message in str(raised.value)


# --- the stub model -----------------------------------------------------------------------------


def test_every_consolidation_prompt_is_recognised_by_its_call_kind() -> None:
    body = render_body(PROFILE)
    assert call_kind(_body(gate_prompt(body, EXCHANGES, NOW))) == "gate"
    ops = _body(operations_prompt(body, EXCHANGES, NOW), json_mode=True)
    assert call_kind(ops) == "operations"
    assert call_kind(_body(rewrite_prompt(body, EXCHANGES, NOW))) == "rewrite"
    assert call_kind(_body(condensation_prompt(body, 500, 450))) == "condense"


def test_the_stub_reads_the_profile_and_the_exchanges_of_a_real_prompt() -> None:
    _, user = operations_prompt(render_body(PROFILE), EXCHANGES, NOW)
    read = read_prompt(user)
    assert read is not None
    profile, exchanges = read
    assert profile.sections == PROFILE.sections
    assert exchanges == EXCHANGES


def test_the_stub_also_reads_the_fences_of_earlier_prompt_versions() -> None:
    def old(label: str, text: str) -> str:
        return f"<<<{label}_0123abcd>>>\n{text}\n<<<END_{label}_0123abcd>>>"

    user = "\n".join(
        [
            "Current UTC time: 2026-12-01 09:30 UTC",
            old("PROFILE", render_body(PROFILE)),
            "Exchange 1 of 1, at 2026-12-01 09:02 UTC:",
            old("USER_TEXT", "I live in Berlin."),
            old("ASSISTANT_TEXT", "Nice city."),
        ]
    )
    read = read_prompt(user)
    assert read is not None
    assert read[0].sections == PROFILE.sections
    assert read[1] == EXCHANGES[1:]


def test_the_stub_answers_each_call_in_the_form_the_service_parses() -> None:
    body = render_body(PROFILE)
    gate = stub_answer("gate", _body(gate_prompt(body, EXCHANGES, NOW)), COUNTER)
    assert (gate.text, gate.understood) == ("UPDATE", True)
    ops_body = _body(operations_prompt(body, EXCHANGES, NOW), json_mode=True)
    ops = json.loads(stub_answer("operations", ops_body, COUNTER).text)
    assert ops["decision"] == "UPDATE"
    assert {"op": "ADD", "section": "Identity", "text": "Based in Berlin."} in ops["operations"]
    rewritten = stub_answer("rewrite", _body(rewrite_prompt(body, EXCHANGES, NOW)), COUNTER)
    assert "Based in Berlin." in parse_body(rewritten.text, "u").bullets(Section.IDENTITY)
    chit_chat = EXCHANGES[:1]
    assert stub_answer("gate", _body(gate_prompt(body, chit_chat, NOW)), COUNTER).text == "NOOP"


def test_the_stub_condenses_to_the_target_dropping_the_oldest_topics_first() -> None:
    topics = [f"2026-11-{day:02d} 08:00 UTC: topic number {day} of many" for day in range(1, 29)]
    long = _profile(IDENTITY=["Works at Globex."], RECENT=topics)
    answer = stub_answer(
        "condense", _body(condensation_prompt(render_body(long), 200, 180)), COUNTER
    )
    condensed = parse_body(answer.text, "u")
    assert COUNTER.count(answer.text) <= 180
    assert condensed.bullets(Section.IDENTITY) == ("Works at Globex.",)
    kept = condensed.bullets(Section.RECENT)
    assert 0 < len(kept) < len(topics)
    assert kept == tuple(topics[-len(kept) :])


def test_an_unreadable_prompt_is_answered_noop_and_flagged() -> None:
    answer = stub_answer("operations", _body(("rules", "no fences here")), COUNTER)
    assert json.loads(answer.text) == {"decision": "NOOP"}
    assert not answer.understood


def test_prompt_tokens_count_each_message_with_the_chat_format_overhead() -> None:
    body = _body(("You are terse.", "Hello there"))
    expected = (
        3 + (3 + 1 + COUNTER.count("You are terse.")) + (3 + 1 + COUNTER.count("Hello there"))
    )
    assert prompt_tokens(body, COUNTER) == expected


async def test_the_proxy_records_the_usage_the_endpoint_reports() -> None:
    endpoint, proxy = ModelRecorder(), None
    await endpoint.start()
    try:
        proxy = ModelRecorder(upstream=endpoint.base_url, api_key="k")
        await proxy.start()
        client = AsyncOpenAI(base_url=proxy.base_url, api_key="unused", max_retries=0)
        system, user = gate_prompt(render_body(PROFILE), EXCHANGES, NOW)
        answer = await client.chat.completions.create(
            model="m",
            messages=[{"role": "system", "content": system}, {"role": "user", "content": user}],
            max_completion_tokens=16,
        )
        await client.close()
    finally:
        if proxy is not None:
            await proxy.stop()
        await endpoint.stop()
    assert answer.choices[0].message.content == "UPDATE"
    assert answer.usage is not None
    [seen] = proxy.calls
    assert (seen.kind, seen.model, seen.max_tokens) == ("gate", "m", 16)
    assert (seen.prompt_tokens, seen.completion_tokens) == (
        answer.usage.prompt_tokens,
        answer.usage.completion_tokens,
    )
    assert endpoint.calls[0].prompt_tokens == seen.prompt_tokens


# --- figures ------------------------------------------------------------------------------------

SCORED = parse_corpus(
    {
        "users": [
            {
                "id": "ann",
                "turns": [{"user": "hi", "assistant": "hello"}],
                "expect": {
                    "facts": [
                        {"id": "role", "section": "Identity", "match": ["data engineer"]},
                        {"id": "city", "section": "Identity", "match": ["Lisbon|Lisboa"]},
                        {"id": "dbt", "section": "Work Context", "match": ["dbt"]},
                    ],
                    "contradictions": [
                        {"old": {"section": "Identity", "match": ["Berlin"]}, "new": "city"}
                    ],
                    "forgotten": [{"match": ["Globex"]}],
                    "never_stored": [{"match": ["hunter2"]}],
                },
            }
        ]
    }
).users[0]


def test_recall_counts_expected_facts_and_precision_counts_durable_bullets() -> None:
    quality = score_profile(
        SCORED.expect,
        {
            Section.IDENTITY: ["Works as a data engineer.", "Based in Lisboa.", "Likes dbtx."],
            Section.WORK: ["Moving to dbt."],
            Section.RECENT: ["2026-12-01 09:00 UTC: I live in Berlin."],
        },
    )
    assert (quality.facts_found, quality.facts_expected) == (3, 3)
    # "Likes dbtx." matches nothing (whole words only); Recent Topics is not counted.
    assert (quality.bullets_matching, quality.bullets) == (3, 4)
    assert quality.unexpected == ("Likes dbtx.",)
    assert quality.contradictions_resolved == 1  # a dated topic may still name the old city
    assert (quality.forgotten_honoured, quality.never_stored_kept_out) == (1, 1)


def test_an_old_value_a_forgotten_fact_or_a_secret_anywhere_is_a_violation() -> None:
    quality = score_profile(
        SCORED.expect,
        {
            Section.IDENTITY: ["Based in Berlin.", "Based in Lisbon."],
            Section.RECENT: ["2026-12-01 09:00 UTC: I work at Globex.", "Password hunter2."],
        },
    )
    assert quality.contradictions_resolved == 0
    assert quality.forgotten_honoured == 0
    assert quality.never_stored_kept_out == 0
    assert len(quality.violations) == 3
    assert quality.precision == 0.5
    assert quality.missing == ("role", "dbt")


def _call(kind: str, max_tokens: int, tokens_in: int, tokens_out: int) -> ModelCall:
    return ModelCall("ann", kind, "m", max_tokens, tokens_in, tokens_out, 200, "stop", True)  # type: ignore[arg-type]


def test_cost_figures_follow_their_definitions() -> None:
    calls = [
        _call("gate", 16, 300, 2),
        _call("gate", 16, 320, 1),
        _call("operations", 400, 900, 100),
    ]
    cost = cost_of(4, calls, Prices(prompt_per_million=0.5, completion_per_million=2.0))
    assert cost.calls_per_turn == 0.75
    assert cost.kind_per_turn("gate") == 0.5
    assert cost.prompt_per_turn == 380
    assert cost.completion_per_turn == 25.75
    assert cost.cost_per_turn == pytest.approx((380 * 0.5 + 25.75 * 2.0) / 1e6)
    # ratios 8, 16, 4: nearest rank p50 is the 2nd smallest, p95 the largest
    assert (cost.ratio_p50, cost.ratio_p95) == (8, 16)


def test_percentiles_are_nearest_rank() -> None:
    values = list(range(1, 21))
    assert (percentile(values, 50), percentile(values, 95), percentile(values, 100)) == (10, 19, 20)
    assert percentile([], 95) is None


# --- a reduced corpus through the real service --------------------------------------------------

SMALL = """
users:
  - id: ann
    turns:
      - {user: "Hi! I'm a data engineer at Globex.", assistant: "Hello!", fact: true}
      - {user: "What's a lakehouse?", assistant: "A data lake with tables on top."}
      - {user: "I live in Berlin.", assistant: "Nice.", fact: true}
      - {user: "Thanks!", assistant: "You're welcome."}
      - user: "Most of my week goes into porting our pipelines to dbt."
        assistant: "Ok."
        fact: true
      - {user: "Actually, I live in Lisbon now.", assistant: "Noted.", fact: true, burst: true}
      - {user: "Forget my employer.", assistant: "Done.", fact: true}
      - {user: "Bye!", assistant: "Bye!", burst: true}
    expect:
      facts:
        - {id: role, section: Identity, match: [data engineer]}
        - {id: city, section: Identity, match: [Lisbon]}
        - {id: dbt, section: Work Context, match: [dbt]}
      contradictions:
        - {old: {section: Identity, match: [Berlin]}, new: city}
      forgotten:
        - {match: [Globex]}
"""


async def test_a_reduced_corpus_through_the_service_on_the_stub(server_url: str) -> None:
    corpus = parse_corpus(yaml.safe_load(SMALL))
    prices = Prices(prompt_per_million=1.0, completion_per_million=4.0)
    options = RunOptions(engine="stub", model="gpt-4o-mini", prices=prices)
    report, recorder = await run_eval(corpus, options, server=server_url)
    assert recorder is not None
    [user] = report.users
    # The stub decides as the offline engine does: it reads the role, both cities (the newer
    # wins) and the forget request, and misses "Most of my week goes into porting ... to dbt".
    assert (user.quality.facts_found, user.quality.facts_expected) == (2, 3)
    assert user.quality.missing == ("dbt",)
    assert user.quality.precision == 1.0
    assert (user.quality.contradictions_resolved, user.quality.forgotten_honoured) == (1, 1)
    assert user.fact_turns == 5
    assert user.versions_written >= 1
    assert sum(user.jobs.values()) == 8
    cost, calls = report.total.cost, recorder.calls
    assert cost.calls == len(calls) > 0
    assert sum(cost.calls_by_kind.values()) == len(calls)
    assert cost.calls_by_kind["operations"] >= 1
    assert cost.unread_prompts == 0
    assert cost.prompt_tokens == sum(call.prompt_tokens for call in calls)
    # The service counted the same tokens from the stub's usage as the stub recorded.
    assert report.service_metrics["model_tokens_total_in"] == cost.prompt_tokens
    assert report.service_metrics["model_tokens_total_out"] == cost.completion_tokens
    assert cost.calls_per_turn == len(calls) / 8
    assert cost.cost_per_turn == pytest.approx(
        (cost.prompt_tokens * 1.0 + cost.completion_tokens * 4.0) / 8 / 1e6
    )
    text = render(report)
    assert "0.67 (2/3)" in text
    assert "missing dbt" in text
