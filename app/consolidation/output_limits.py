"""How many output tokens each consolidation call may ask for: derived from what the call can
legitimately answer, never a flat maximum. Pure: the caller passes the token counts.

The limit is the request's `max_completion_tokens`; an answer that reaches it is cut off and
fails as `model_output_truncated`. So a limit too tight loses a legitimate answer, and one far
too loose lets a runaway answer bill thousands of tokens. Each kind's rule:

- gate: one word (UPDATE is 1 token, NOOP 2) and a little slack for punctuation.
- operations: a first limit from what the exchanges can justify (about the offline engine's
  answer where it reads them, from their size where it does not), and a ceiling from what the
  profile and the exchanges could at most produce, asked for once when the first is reached.
- rewrite: the whole profile (the space's budget, or the profile when larger) plus what the
  exchanges add, plus a margin.
- condensation: the space's budget plus a margin (the model is asked for about 90 % of it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

GATE_MAX_TOKENS: Final = 4
"""UPDATE or NOOP with a period or a newline; a longer answer is cut off and read as UPDATE."""

ENVELOPE_TOKENS: Final = 16
"""`{"decision": "UPDATE", "operations": [ ... ]}` around the operations."""
OPERATION_TOKENS: Final = 26
"""One operation without its texts: `{"op": "UPDATE", "section": "Open Questions /
Follow-ups", "target": "", "text": ""}, ` (the section title of most tokens) is 26 cl100k
tokens."""
TOPIC_PREFIX_TOKENS: Final = 14
"""The `YYYY-MM-DD HH:MM UTC: ` prefix of a Recent Topics bullet."""
USER_TOKENS_PER_FACT: Final = 6
"""A fact takes a clause of the user's message: "I work at Acme as a data engineer" is 9 tokens
and two facts; an exchange the offline engine cannot read is allowed one fact per this many
tokens, rounded up."""
NEW_TEXT_FACTOR: Final = 2
"""New bullet texts restate the user's words (in the third person, with a topic line): at most
about twice the tokens the user wrote."""
READ_ANSWER_FACTOR: Final = 1.5
"""Where the offline engine reads the exchange, a model's answer is about the engine's answer
(the same facts, its own wording): half as much again is allowed."""
REWRITE_MARGIN_TOKENS: Final = 64
MARGIN_SHARE: Final = 0.1
"""Rewrite and condensation answers may exceed their size by this share of the budget (at least
`REWRITE_MARGIN_TOKENS`): headings, blank lines and a model's imprecise sense of length."""


@dataclass(frozen=True)
class OperationsLimits:
    """`first` is asked for; `ceiling` (>= first) once more when an answer is cut off at it."""

    first: int
    ceiling: int


@dataclass(frozen=True)
class OperationsInput:
    """What an operations answer's size depends on, in tokens.

    `read_answer`: the offline engine's operations (as JSON items) for the exchanges it reads a
    fact or a forget request in. `unread_users`: the user message of every other exchange that
    may hold a fact (the pre-filter's clearly non-durable ones justify no operation).
    `all_users`: every exchange's user message. `longest_bullet`, `bullets`, `profile`: the
    current profile's longest bullet, its number of bullets and its size.
    """

    read_answer: int
    unread_users: Sequence[int]
    all_users: Sequence[int]
    longest_bullet: int
    bullets: int
    profile: int


def operations_limits(size: OperationsInput) -> OperationsLimits:
    """The output limits of an operations call.

    First: `READ_ANSWER_FACTOR` times the engine's answer for the exchanges it reads; for each
    other one, one fact per `USER_TOKENS_PER_FACT` tokens of its user message (at least one),
    each an operation, a Recent Topics bullet, new texts of at most `NEW_TEXT_FACTOR` times the
    user's tokens, and one existing bullet quoted as the target of an UPDATE or DELETE.

    Ceiling: what any legitimate answer fits in: every bullet of the profile updated (quoted
    and rewritten) and every exchange allowed as if the engine read none of them.
    """
    first = ENVELOPE_TOKENS + math.ceil(READ_ANSWER_FACTOR * size.read_answer)
    first += sum(_unread_allowance(tokens, size.longest_bullet) for tokens in size.unread_users)
    ceiling = ENVELOPE_TOKENS + size.bullets * OPERATION_TOKENS + 2 * size.profile
    ceiling += sum(_unread_allowance(tokens, 0) for tokens in size.all_users)
    return OperationsLimits(first, max(first, ceiling))


def _unread_allowance(user_tokens: int, longest_bullet: int) -> int:
    facts = max(1, -(-user_tokens // USER_TOKENS_PER_FACT))
    operations = facts + 1  # and the Recent Topics bullet
    new_text = NEW_TEXT_FACTOR * user_tokens + TOPIC_PREFIX_TOKENS
    return operations * OPERATION_TOKENS + new_text + longest_bullet


def rewrite_limit(budget_tokens: int, profile_tokens: int, user_tokens: Sequence[int]) -> int:
    """The complete profile: the larger of the budget and the current profile, what the
    exchanges add, and the margin."""
    added = NEW_TEXT_FACTOR * sum(user_tokens)
    return max(budget_tokens, profile_tokens) + added + _margin(budget_tokens)


def condensation_limit(budget_tokens: int) -> int:
    """The condensed profile: at most the budget, and the margin."""
    return budget_tokens + _margin(budget_tokens)


def _margin(budget_tokens: int) -> int:
    return max(REWRITE_MARGIN_TOKENS, int(budget_tokens * MARGIN_SHARE))
