"""What `/context` injects from a stored profile: the "What I know about you" section, within
the space's token budget. Pure. Within budget the stored body is injected as it is, without a
parse (the version was validated when it was written); the rare over-budget path parses and
cuts, cached per (content, budget) since a stored version never changes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from app.kit.tokens import TokenCounter
from app.profiles.budget import truncate_to_budget
from app.profiles.document import (
    body_has_bullets,
    bullet_count,
    parse,
    render_body,
    stored_body,
)
from app.profiles.injection import memory_section_for_body, render_memory_section

CACHE_SIZE = 256


@dataclass(frozen=True)
class InjectedMemory:
    """The section for the system prompt, the tokens of the profile body in it, and whether
    whole bullets were dropped to fit the budget."""

    section: str
    tokens: int
    truncated: bool


def memory_to_inject(
    content: str, stored_tokens: int, budget: int, counter: TokenCounter
) -> InjectedMemory | None:
    """The section for a stored profile document (frontmatter stripped).

    Within budget (by the body tokens stored with the version, never re-counted) the body goes
    in whole; over budget it is cut with `truncate_to_budget`, marker included, and the tokens
    are those of the cut body by `counter` (pass the counter the stored tokens were counted
    with). None for a profile without a single bullet: six empty headings tell the model
    nothing. Raises `ProfileFormatError` for a document that does not parse.
    """
    if stored_tokens <= budget:
        return _whole(content, stored_tokens)
    return _truncated(content, budget, counter)


def _whole(content: str, stored_tokens: int) -> InjectedMemory | None:
    """The common path: no parse (the version was validated when written), a string slice."""
    body = stored_body(content)
    if not body_has_bullets(body):
        return None
    return InjectedMemory(memory_section_for_body(body), stored_tokens, truncated=False)


@functools.lru_cache(maxsize=CACHE_SIZE)
def _truncated(content: str, budget: int, counter: TokenCounter) -> InjectedMemory | None:
    profile = parse(content)
    if bullet_count(profile) == 0:
        return None
    cut = truncate_to_budget(profile, budget, counter.count)
    tokens = counter.count(render_body(cut))
    return InjectedMemory(render_memory_section(cut), tokens, truncated=cut.truncated)
