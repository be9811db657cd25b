"""What the eval's stub model answers, and how a recorded request is classified: pure, no I/O.

The stub reads a consolidation prompt the way a model would, from its fenced blocks (the profile,
then each exchange's user and assistant text, with the exchange's time from the line before it),
runs the offline engine on what it read, and answers in the form the call asked for: one word for
the gate, the JSON operations, the rewritten profile, or a condensed one. Its recall therefore
matches the offline engine's, while every answer goes through the pipeline's model path (the
adapter, the parsers, the change guard, size control). A prompt it cannot read is answered NOOP
and counted (`Answer.understood` False), so a changed prompt format shows in the report instead
of passing silently.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final, Literal

from app.consolidation.rules import Exchange, consolidate_with_rules
from app.kit.tokens import TokenCounter
from app.profiles.document import (
    SECTIONS,
    Profile,
    ProfileFormatError,
    Section,
    apply,
    empty_profile,
    parse_body,
    render_body,
)

CallKind = Literal["gate", "operations", "rewrite", "condense", "other"]
CALL_KINDS: Final[tuple[CallKind, ...]] = ("gate", "operations", "rewrite", "condense", "other")
STUB_USER_ID: Final = "eval-stub"
TOKENS_PER_MESSAGE: Final = 3
"""Chat formatting overhead per message (and once for the reply's priming), as OpenAI's chat
models count it on top of the role and the content."""

_FENCES = (
    re.compile(
        r"^<(?P<label>[A-Za-z]+)(?P<nonce>[0-9]+)>\n(?P<body>.*?)\n</(?P=label)(?P=nonce)>$",
        re.DOTALL | re.MULTILINE,
    ),
    # The fences of prompt versions before 2026-12-01.2, so earlier commits can be measured.
    re.compile(
        r"^<<<(?P<label>[A-Za-z][A-Za-z_]*?)_(?P<nonce>[0-9a-f]{4,})>>>\n(?P<body>.*?)\n"
        r"<<<END_(?P=label)_(?P=nonce)>>>$",
        re.DOTALL | re.MULTILINE,
    ),
)
_MINUTE = re.compile(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}) UTC")
_TARGET = re.compile(r"Target: about (\d+) tokens")


@dataclass(frozen=True)
class Answer:
    text: str
    understood: bool


def message_text(body: Mapping[str, Any]) -> tuple[str, str]:
    """The system and the user text of a chat completion request (joined per role)."""
    system: list[str] = []
    user: list[str] = []
    for message in body.get("messages") or []:
        if not isinstance(message, dict) or not isinstance(message.get("content"), str):
            continue
        (system if message.get("role") in ("system", "developer") else user).append(
            message["content"]
        )
    return "\n".join(system), "\n".join(user)


def prompt_tokens(body: Mapping[str, Any], counter: TokenCounter) -> int:
    """The request's messages in cl100k tokens, with the chat format's per-message overhead."""
    total = TOKENS_PER_MESSAGE
    for message in body.get("messages") or []:
        if isinstance(message, dict):
            total += TOKENS_PER_MESSAGE
            total += counter.count(str(message.get("role", "")))
            content = message.get("content")
            total += counter.count(content if isinstance(content, str) else json.dumps(content))
    return total


def requested_max_tokens(body: Mapping[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens"):
        value = body.get(key)
        if isinstance(value, int):
            return value
    return None


def call_kind(body: Mapping[str, Any]) -> CallKind:
    """Which consolidation call a request is, from what its prompt asks for."""
    system, user = message_text(body)
    text = f"{system}\n{user}".lower()
    response_format = body.get("response_format")
    json_mode = isinstance(response_format, dict) and response_format.get("type") == "json_object"
    if "compress" in text or "condense" in text:
        return "condense"
    if json_mode or '"operations"' in text:
        return "operations"
    if "update or noop" in text:
        return "gate"
    if "rewrit" in text:
        return "rewrite"
    return "other"


def stub_answer(kind: CallKind, body: Mapping[str, Any], counter: TokenCounter) -> Answer:
    """What a model would answer to the request, decided by the offline engine."""
    _, user = message_text(body)
    if kind == "condense":
        return condense_answer(user, counter)
    read = read_prompt(user)
    if read is None:
        return Answer('{"decision": "NOOP"}' if kind == "operations" else "NOOP", False)
    profile, exchanges = read
    result = consolidate_with_rules(profile, exchanges)
    if kind == "gate":
        return Answer(result.decision, True)
    if kind == "rewrite":
        if result.decision == "NOOP":
            return Answer("NOOP", True)
        updated = apply(profile, list(result.operations), exchanges[-1].at)
        return Answer(render_body(updated), True)
    if result.decision == "NOOP":
        return Answer(json.dumps({"decision": "NOOP"}), kind == "operations")
    operations = []
    for op in result.operations:
        item: dict[str, str] = {"op": op.kind.value, "section": op.section.value}
        if op.target is not None:
            item["target"] = op.target
        if op.text is not None:
            item["text"] = op.text
        operations.append(item)
    answer = json.dumps({"decision": "UPDATE", "operations": operations}, ensure_ascii=False)
    return Answer(answer, kind == "operations")


def read_prompt(user: str) -> tuple[Profile, list[Exchange]] | None:
    """The profile and the exchanges a consolidation prompt carries, or None when it has none
    that can be read."""
    blocks = list(_fenced(user))
    profile: Profile | None = None
    exchanges: list[Exchange] = []
    pending: tuple[str, datetime] | None = None
    previous_end = 0
    fallback = _first_minute(user) or datetime.now(UTC)
    for block in blocks:
        label, text = block["label"].upper(), block["body"]
        if label.startswith("P") and profile is None:
            profile = _profile(text)
        elif label.startswith("U"):
            at = _last_minute(user[previous_end : block.start()]) or fallback
            pending = (text, at)
        elif label.startswith("A") and pending is not None:
            exchanges.append(Exchange(user=pending[0], assistant=text, at=pending[1]))
            pending = None
        previous_end = block.end()
    if pending is not None:
        exchanges.append(Exchange(user=pending[0], assistant="", at=pending[1]))
    if profile is None or not exchanges:
        return None
    return profile, exchanges


def condense_answer(user: str, counter: TokenCounter) -> Answer:
    """The profile without its oldest Recent Topics, then its oldest other bullets, until it
    fits the target the prompt names (what a model asked to condense would drop first)."""
    block = next((b for b in _fenced(user) if b["label"].upper().startswith("P")), None)
    target = _TARGET.search(user)
    profile = None if block is None else _profile(block["body"])
    if profile is None or target is None:
        return Answer(block["body"] if block else "NOOP", False)
    limit = int(target[1])
    order = [Section.RECENT, *(s for s in SECTIONS if s is not Section.RECENT)]
    bullets = {section: list(profile.bullets(section)) for section in SECTIONS}
    current = profile
    for section in order:
        while bullets[section] and counter.count(render_body(current)) > limit:
            bullets[section].pop(0)
            current = Profile.from_sections(profile.frontmatter, bullets)
    return Answer(render_body(replace(current, truncated=False)), True)


def _fenced(text: str) -> list[re.Match[str]]:
    """The fenced blocks of a prompt, in order, in whichever fence format it uses."""
    for fence in _FENCES:
        blocks = list(fence.finditer(text))
        if blocks:
            return blocks
    return []


def _profile(body: str) -> Profile | None:
    try:
        return parse_body(body, STUB_USER_ID)
    except ProfileFormatError:
        pass
    titles = {section.value.casefold(): section for section in SECTIONS}
    bullets: dict[Section, list[str]] = {}
    section: Section | None = None
    for line in body.splitlines():
        if line.startswith("#"):
            section = titles.get(line.lstrip("#").strip().casefold())
        elif line.startswith("- ") and section is not None:
            bullets.setdefault(section, []).append(line[2:].strip())
    try:
        return Profile.from_sections(empty_profile(STUB_USER_ID).frontmatter, bullets)
    except ProfileFormatError:
        return None


def _first_minute(text: str) -> datetime | None:
    found = _MINUTE.search(text)
    return None if found is None else _minute(found[1])


def _last_minute(text: str) -> datetime | None:
    found: Sequence[str] = _MINUTE.findall(text)
    return None if not found else _minute(found[-1])


def _minute(text: str) -> datetime:
    return datetime.strptime(text, "%Y-%m-%d %H:%M").replace(tzinfo=UTC)
