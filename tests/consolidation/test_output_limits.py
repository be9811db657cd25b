"""Output limits by call kind: derived from what the call can answer, never a flat maximum, and
large enough for every legitimate answer (the ceiling), tight enough to bound a runaway one."""

import json
from datetime import UTC, datetime

import pytest

from app.consolidation.model_calls import answer_size, operation_item
from app.consolidation.output_limits import (
    ENVELOPE_TOKENS,
    GATE_MAX_TOKENS,
    OPERATION_TOKENS,
    TOPIC_PREFIX_TOKENS,
    condensation_limit,
    operations_limits,
    rewrite_limit,
)
from app.consolidation.rules import Exchange
from app.kit.tokens import TokenCounter
from app.profiles.document import SECTIONS, Operation, OpKind, Section, apply, empty_profile

NOW = datetime(2026, 6, 17, 11, 40, tzinfo=UTC)
count = TokenCounter(None).count


def answer(*operations: Operation) -> str:
    return json.dumps(
        {"decision": "UPDATE", "operations": [operation_item(op) for op in operations]}
    )


def test_the_constants_cover_what_they_stand_for() -> None:
    longest_title = max((s.value for s in SECTIONS), key=len)
    skeleton = {"op": "UPDATE", "section": longest_title, "target": "", "text": ""}
    assert count(json.dumps(skeleton) + ", ") <= OPERATION_TOKENS
    assert count(json.dumps({"decision": "UPDATE", "operations": []})) <= ENVELOPE_TOKENS
    assert count("2026-06-17 11:40 UTC: ") <= TOPIC_PREFIX_TOKENS
    for word in ("UPDATE", "NOOP", "NOOP.", "UPDATE\n"):
        assert count(word) < GATE_MAX_TOKENS


MODEL_ANSWERS = [
    (
        "I'm a credit risk analyst at Helvetia Private Bank, and I live in Zurich.",
        (
            Operation(OpKind.ADD, Section.IDENTITY, text="Works as a credit risk analyst."),
            Operation(OpKind.ADD, Section.IDENTITY, text="Works at Helvetia Private Bank."),
            Operation(OpKind.ADD, Section.IDENTITY, text="Based in Zurich."),
            Operation(
                OpKind.ADD,
                Section.RECENT,
                text="2026-06-17 11:40 UTC: Introduced their role at a Swiss private bank.",
            ),
        ),
    ),
    (
        "Most of my week now goes into the Basel IV output floor impact study.",
        (
            Operation(OpKind.ADD, Section.WORK, text="Working on the Basel IV output floor study."),
            Operation(
                OpKind.ADD, Section.RECENT, text="2026-06-17 11:40 UTC: Basel IV output floor."
            ),
        ),
    ),
    (
        "Ich spreche auch fließend Französisch, das hilft in Genf.",
        (
            Operation(OpKind.ADD, Section.IDENTITY, text="Speaks French fluently."),
            Operation(OpKind.ADD, Section.RECENT, text="2026-06-17 11:40 UTC: French in Geneva."),
        ),
    ),
]


@pytest.mark.parametrize(("user", "operations"), MODEL_ANSWERS)
def test_a_models_answer_fits_the_first_limit_within_four_times_its_size(
    user: str, operations: tuple[Operation, ...]
) -> None:
    profile = apply(
        empty_profile("u"),
        [Operation(OpKind.ADD, Section.COMMUNICATION, text="Prefers concise answers.")],
        NOW,
    )
    size = answer_size(profile, [Exchange(user, "Noted.", NOW)], count)

    limits = operations_limits(size)

    produced = count(answer(*operations))
    assert produced <= limits.first <= 4 * produced
    assert limits.first <= limits.ceiling


def test_forgetting_everything_fits_the_first_limit() -> None:
    bullets = {
        s: [f"Fact {n} about section {s.value} of this user." for n in range(4)] for s in SECTIONS
    }
    profile = apply(
        empty_profile("u"),
        [Operation(OpKind.ADD, s, text=t) for s, texts in bullets.items() for t in texts],
        NOW,
    )
    deletes = [Operation(OpKind.DELETE, s, target=t) for s, texts in bullets.items() for t in texts]

    limits = operations_limits(
        answer_size(profile, [Exchange("Forget everything about me.", "Done.", NOW)], count)
    )

    assert count(answer(*deletes)) <= limits.first


def test_the_ceiling_holds_every_bullet_rewritten_and_grows_with_the_profile() -> None:
    texts = [f"Bullet number {n} with a few more words in it." for n in range(20)]
    profile = apply(
        empty_profile("u"), [Operation(OpKind.ADD, Section.WORK, text=t) for t in texts], NOW
    )
    rewrite_all = [
        Operation(OpKind.UPDATE, Section.WORK, target=t, text=t.replace("few", "couple of"))
        for t in texts
    ]
    exchange = Exchange("These days I mostly review other people's models.", "Noted.", NOW)

    small = operations_limits(answer_size(empty_profile("u"), [exchange], count))
    large = operations_limits(answer_size(profile, [exchange], count))

    assert count(answer(*rewrite_all)) <= large.ceiling
    assert large.ceiling > small.ceiling


def test_chit_chat_in_a_batch_adds_nothing_to_the_first_limit() -> None:
    fact = Exchange("Most of my week goes into the ICAAP stress test.", "Noted.", NOW)
    chat = [Exchange(text, "Sure.", NOW) for text in ("Thanks!", "What does LGD stand for?")]

    alone = operations_limits(answer_size(empty_profile("u"), [fact], count))
    batch = operations_limits(answer_size(empty_profile("u"), [*chat, fact], count))

    assert batch.first == alone.first
    assert batch.ceiling > alone.ceiling


def test_rewrite_and_condensation_are_the_budget_plus_a_margin() -> None:
    assert condensation_limit(2000) == 2200
    assert condensation_limit(500) == 564
    assert rewrite_limit(2000, 300, [20]) == 2000 + 40 + 200
    assert rewrite_limit(500, 900, [10]) == 900 + 20 + 64  # a profile over its budget
