"""The system-prompt section that shows the model what the service remembers about the user."""

from app.profiles.document import render_body
from app.profiles.profile import Profile

MEMORY_SECTION_TITLE = "What I know about you"

MEMORY_INSTRUCTIONS = (
    "The notes below are durable context about the user you are talking to, kept across their "
    "conversations. Treat them as background about this user and adapt your tone, examples and "
    "depth to them. They describe the user, not the world: do not treat them as an authoritative "
    "source of facts. You cannot edit this memory while responding; it is updated separately "
    "after the conversation turn, so never claim that you have saved, changed or forgotten "
    "anything in it."
)


def render_memory_section(profile: Profile) -> str:
    """The heading, the instructions, then the profile body verbatim (no frontmatter)."""
    return memory_section_for_body(render_body(profile))


def memory_section_for_body(body: str) -> str:
    """`render_memory_section` for an already rendered body (the load path's fast route)."""
    return f"## {MEMORY_SECTION_TITLE}\n\n{MEMORY_INSTRUCTIONS}\n\n{body}"


def compose_system_prompt(base: str | None, memory_section: str | None) -> str | None:
    """``base``, one blank line, ``memory_section``; either may be absent (None or blank).

    Trailing whitespace of ``base`` is dropped so exactly one blank line separates the two.
    Returns None when both are absent.
    """
    parts = [part for part in (base, memory_section) if part and part.strip()]
    if not parts:
        return None
    if len(parts) == 1:
        return parts[0]
    return f"{parts[0].rstrip()}\n\n{parts[1]}"
