"""What `/context` injects from a stored profile: the "What I know about you" section, within
the space's token budget. Pure, and cached per (content, budget): parsing and rendering a
profile costs far more than the rest of the load path, and a stored version never changes.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from app.profiles.budget import truncate_to_budget
from app.profiles.document import bullet_count, parse, render_body
from app.profiles.injection import render_memory_section
from app.tokens import TokenCounter

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


@functools.lru_cache(maxsize=CACHE_SIZE)
def _whole(content: str, stored_tokens: int) -> InjectedMemory | None:
    profile = parse(content)
    if bullet_count(profile) == 0:
        return None
    return InjectedMemory(render_memory_section(profile), stored_tokens, truncated=False)


@functools.lru_cache(maxsize=CACHE_SIZE)
def _truncated(content: str, budget: int, counter: TokenCounter) -> InjectedMemory | None:
    profile = parse(content)
    if bullet_count(profile) == 0:
        return None
    cut = truncate_to_budget(profile, budget, counter.count)
    tokens = counter.count(render_body(cut))
    return InjectedMemory(render_memory_section(cut), tokens, truncated=cut.truncated)
