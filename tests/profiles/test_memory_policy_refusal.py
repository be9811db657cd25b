"""Which lines of a user's edit the memory policy refuses, and the 422 that names them: line
numbers as the user's text has them (frontmatter, CR/LF and blank lines included), only new or
changed bullets, only categories the policy drops, and never the value in the problem."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from app.detectors import Category
from app.enablement.memory_policy import DEFAULT_POLICY, Action, MemoryPolicy
from app.profiles.document import Section
from app.profiles.errors import MemoryPolicyRefusal
from app.profiles.policy import PolicyAction
from app.profiles.refusal import RefusedLine, refusal, refused_lines
from tests.helpers.profiles import profile_of

PASSWORD_BULLET = "My password is hunter2horse"
BODY = f"""# User Memory

## Identity
- Works at Acme.
- {PASSWORD_BULLET}

## Communication Preferences

## Work Context
- Card 4111 1111 1111 1111 for travel.
- Mail alice@example.com

## Skills & Expertise

## Recent Topics

## Open Questions / Follow-ups
"""
FRONTMATTER = "---\nuser_id: mallory\nturn_count: 99\n---\n\n"
SECRETS = RefusedLine(5, Section.IDENTITY, Category.SECRETS)
CARDS = RefusedLine(10, Section.WORK, Category.PAYMENT_CARDS)


def with_actions(**changes: Action) -> MemoryPolicy:
    actions = dict(DEFAULT_POLICY.actions) | {Category(k): v for k, v in changes.items()}
    return MemoryPolicy(actions=MappingProxyType(actions))


CASES: dict[str, tuple[str, MemoryPolicy, list[RefusedLine]]] = {
    "the defaults refuse the password and the card, not the e-mail (redacted)": (
        BODY,
        DEFAULT_POLICY,
        [SECRETS, CARDS],
    ),
    "a frontmatter block counts in the line numbers": (
        FRONTMATTER + BODY,
        DEFAULT_POLICY,
        [
            RefusedLine(10, Section.IDENTITY, Category.SECRETS),
            RefusedLine(15, Section.WORK, Category.PAYMENT_CARDS),
        ],
    ),
    "CR LF line ends count one line each": (
        BODY.replace("\n", "\r\n"),
        DEFAULT_POLICY,
        [SECRETS, CARDS],
    ),
    "an allowed category is not refused": (BODY, with_actions(secrets=Action.ALLOW), [CARDS]),
    "a dropped e-mail category is refused too": (
        BODY,
        with_actions(email_addresses=Action.DROP),
        [SECRETS, CARDS, RefusedLine(11, Section.WORK, Category.EMAIL_ADDRESSES)],
    ),
}


@pytest.mark.parametrize(("text", "policy", "expected"), CASES.values(), ids=CASES.keys())
def test_the_refused_lines_of_a_new_profile(
    text: str, policy: MemoryPolicy, expected: list[RefusedLine]
) -> None:
    assert refused_lines(text, None, policy, "alice") == expected


def test_a_bullet_the_head_already_holds_in_its_section_is_not_judged_again() -> None:
    head = profile_of({Section.IDENTITY: [PASSWORD_BULLET]})

    assert refused_lines(BODY, head, DEFAULT_POLICY, "alice") == [CARDS]


def test_a_bullet_moved_to_another_section_is_judged_again() -> None:
    head = profile_of({Section.WORK: [PASSWORD_BULLET]})

    assert refused_lines(BODY, head, DEFAULT_POLICY, "alice") == [SECRETS, CARDS]


def test_the_problem_names_line_and_category_and_never_the_value() -> None:
    error = refusal([SECRETS, CARDS], [])

    assert isinstance(error, MemoryPolicyRefusal)
    assert error.status == 422
    assert error.problem_type().slug == "memory-policy"
    assert "line 5: looked like a password or key (secrets)" in error.detail
    assert "line 10: looked like a card number (payment_cards)" in error.detail
    assert error.errors == [
        {
            "field": "body.content",
            "message": "line 5: looked like a password or key (secrets)",
            "type": "memory_policy.secrets",
        },
        {
            "field": "body.content",
            "message": "line 10: looked like a card number (payment_cards)",
            "type": "memory_policy.payment_cards",
        },
    ]
    assert "hunter2horse" not in str(error.errors) + error.detail


def test_without_lines_the_problem_still_names_each_category_once() -> None:
    dropped = [
        PolicyAction(Category.SECRETS, "password", Action.DROP, Section.IDENTITY),
        PolicyAction(Category.SECRETS, "aws-access-key", Action.DROP, Section.WORK),
    ]

    error = refusal([], dropped)

    assert error.errors == [
        {
            "field": "body.content",
            "message": "looked like a password or key",
            "type": "memory_policy.secrets",
        }
    ]
