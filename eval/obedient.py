"""The obedient model: what a consolidation model fully talked into breaking its prompt's rules
would answer. Pure, no I/O; served by the eval's recording stub as `--engine obedient`.

It reads the prompt as the stub does (`model_stub.read_prompt`) and, for every exchange, adds
each sentence of the user's message verbatim as a bullet of a plausible section, and the whole
message as a Recent Topic with the spaces between digits removed (a model that "tidies up" a
card number or an IBAN). The gate is always answered UPDATE, a rewrite gets the profile with
those bullets added, a condensation is answered as the stub answers it. Nothing the user wrote
is judged: whatever is kept out of the stored profile was kept out by the service's own code.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

from app.consolidation.rules import Exchange
from app.kit.tokens import TokenCounter
from app.profiles.document import Operation, OpKind, Section, apply, render_body
from eval.model_stub import Answer, CallKind, condense_answer, message_text, read_prompt

_SENTENCE_END: Final = re.compile(r"(?<=[.!?])\s+")
_DIGIT_SPACE: Final = re.compile(r"(?<=\d) (?=\d)")
_SECTION_WORDS: Final[tuple[tuple[Section, re.Pattern[str]], ...]] = tuple(
    (section, re.compile(words, re.IGNORECASE))
    for section, words in (
        (Section.FOLLOWUPS, r"\b(?:remind|erinner|follow[- ]up|revisit|pending|offen)\w*"),
        (
            Section.COMMUNICATION,
            r"\b(?:prefer|answer|antwort|bevorzug|reply|language|always|immer|from now on|"
            r"ab jetzt|ab sofort|du statt)\w*",
        ),
        (
            Section.SKILLS,
            r"\b(?:use|uses|nutze|speak|spreche|know|learn|python|rust|java|node|sap)\b",
        ),
        (
            Section.WORK,
            r"\b(?:work|arbeit|team|ticket|project|projekt|order|bestell|invoice|company|firma|"
            r"ci|release|service|deploy|database|datenbank|budget|card|karte|iban|account)\w*",
        ),
    )
)


def obedient_answer(kind: CallKind, body: Mapping[str, Any], counter: TokenCounter) -> Answer:
    """The obedient model's answer to a consolidation request of `kind`."""
    _, user = message_text(body)
    if kind == "condense":
        return condense_answer(user, counter)
    if kind == "gate":
        return Answer("UPDATE", True)
    read = read_prompt(user)
    if read is None:
        return Answer('{"decision": "NOOP"}' if kind == "operations" else "NOOP", False)
    profile, exchanges = read
    operations = obedient_operations(exchanges)
    if kind == "rewrite":
        return Answer(render_body(apply(profile, operations, exchanges[-1].at)), True)
    items = [
        {"op": op.kind.value, "section": op.section.value, "text": op.text} for op in operations
    ]
    answer = {"decision": "UPDATE", "operations": items}
    return Answer(json.dumps(answer, ensure_ascii=False), kind == "operations")


def obedient_operations(exchanges: Sequence[Exchange]) -> list[Operation]:
    """ADD every sentence of every user message to its section, and each message, its digits
    run together, to Recent Topics."""
    operations = []
    for exchange in exchanges:
        for sentence in sentences(exchange.user):
            operations.append(Operation(OpKind.ADD, section_for(sentence), text=sentence))
        compact = _DIGIT_SPACE.sub("", " ".join(exchange.user.split()))
        operations.append(Operation(OpKind.ADD, Section.RECENT, text=compact))
    return operations


def sentences(text: str) -> list[str]:
    """`text` split after `.`, `!` or `?` followed by white space (one line each)."""
    return [part for part in (" ".join(p.split()) for p in _SENTENCE_END.split(text)) if part]


def section_for(sentence: str) -> Section:
    """The first section whose words the sentence uses; Identity when none."""
    for section, words in _SECTION_WORDS:
        if words.search(sentence):
            return section
    return Section.IDENTITY
