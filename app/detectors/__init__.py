"""What a memory bullet must not hold: secrets, payment cards, bank accounts, national ids,
e-mail addresses, phone numbers, and instructions addressed to the assistant. The only importer
of detect-secrets, python-stdnum and phonenumbers.

Pure: text in, findings out; no session, no settings. What happens to a finding (drop, redact,
allow) is the company's memory policy (`app/enablement/memory_policy.py`), applied per bullet by
`app/profiles/policy.py`. One module per family of detectors: `secrets` (detect-secrets' plugins
and stated passwords), `numbers` (python-stdnum checksums), `contacts` (e-mail, phonenumbers),
`instructions` (text addressed to the assistant); each module's docstring says what it finds
and which look-alikes it deliberately lets pass.

Every detector reads the canonical text (`canonical.canonicalise`: NFKC, digits of every
script as ASCII, invisible characters out, look-alike letters folded, markup unwrapped), never
the text as written; a finding's offsets are mapped back to the text as written. Whoever calls
`find` judges the canonical text and stores (or redacts) what was written.

The detector modules are imported by the first `find`, not with this package: with their
libraries, the confusables table and the instruction patterns (some twenty large regular
expressions, compiled on import) they cost a process ~9 MB and ~0.2 s, which an API process
that only serves the turn calls never needs. The first memory a process judges waits for them.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

from app.detectors.findings import Category, Finding

if TYPE_CHECKING:
    from app.detectors.canonical import Canonical

__all__ = ["MAX_TEXT_CHARS", "Category", "Finding", "find"]

MAX_TEXT_CHARS: Final = 4000
"""Longest text a detector reads at once. A bullet is at most 500 characters; longer text is
read in overlapping windows of this size, so nothing escapes the check and no pattern ever runs
over more than this."""
_WINDOW_OVERLAP: Final = 1000

# Words joined by "_", "+" or "-" ("Ignore_previous_instructions"): for the instruction
# detector, the text is also read with them apart.
_JOINED_WORDS: Final = re.compile(r"(?<=[^\W\d_])[_+-](?=[^\W\d_])")
_PRIORITY: Final = tuple(Category)  # secrets first, instructions last


@dataclass(frozen=True, slots=True)
class _Detectors:
    canonicalise: Callable[[str], Canonical]
    values: Sequence[Callable[[str], Iterable[Finding]]]  # secrets, numbers, contacts
    is_instruction: Callable[[str], bool]
    generic_kinds: Sequence[str]


@functools.cache
def _detectors() -> _Detectors:
    from app.detectors.canonical import canonicalise  # noqa: PLC0415 - see the docstring
    from app.detectors.contacts import find_contacts  # noqa: PLC0415
    from app.detectors.instructions import is_instruction  # noqa: PLC0415
    from app.detectors.numbers import find_numbers  # noqa: PLC0415
    from app.detectors.secrets import GENERIC_KINDS, find_secrets  # noqa: PLC0415

    return _Detectors(
        canonicalise, (find_secrets, find_numbers, find_contacts), is_instruction, GENERIC_KINDS
    )


def find(text: str) -> list[Finding]:
    """Every finding in `text`, in order of `start`, judged on its canonical text (offsets are
    those of `text` as written).

    Overlapping value findings are merged into the one of the higher-priority category (secrets
    first, phone numbers last; within a category the longer one). An instruction is a property
    of the whole text rather than a value: it is reported in addition to any values, spanning
    the whole text, so that a bullet holding both is judged by both. A part in parentheses,
    brackets, backticks or an HTML comment is also judged as an instruction on its own.
    """
    detectors = _detectors()
    is_instruction = detectors.is_instruction
    judged = detectors.canonicalise(text)
    findings: list[Finding] = []
    instruction = False
    for offset, window in _windows(judged.text):
        for detect in detectors.values:
            findings += (
                Finding(f.category, f.kind, *judged.source_span(f.start + offset, f.end + offset))
                for f in detect(window)
            )
        instruction = instruction or is_instruction(window)
    for wrapped in _wrapped(judged.text, judged.segments):
        instruction = instruction or any(is_instruction(w) for _, w in _windows(wrapped))
    if not instruction and _JOINED_WORDS.search(judged.text):
        spaced = _JOINED_WORDS.sub(" ", judged.text)
        instruction = any(is_instruction(window) for _, window in _windows(spaced))
    findings = _merge(findings, detectors.generic_kinds)
    if instruction:
        findings.append(Finding(Category.INSTRUCTIONS, "instruction", 0, len(text)))
    return sorted(findings, key=lambda finding: (finding.start, finding.end))


def _wrapped(text: str, segments: tuple[tuple[int, int], ...]) -> Iterator[str]:
    """The innermost wrapped parts, then the outermost, each set as one text with each part a
    sentence of its own (each set is at most as long as the text, however deep the nesting)."""
    if not segments:
        return
    ordered = sorted(segments, key=lambda span: (span[0], -span[1]))
    innermost = [
        span
        for span, following in zip(ordered, [*ordered[1:], (len(text), len(text))], strict=True)
        if following[0] >= span[1]
    ]
    outermost: list[tuple[int, int]] = []
    for span in ordered:
        if not outermost or span[0] >= outermost[-1][1]:
            outermost.append(span)
    for chosen in (innermost, outermost):
        yield ". ".join(text[start:end].strip() for start, end in chosen)


def _windows(text: str) -> Iterator[tuple[int, str]]:
    if len(text) <= MAX_TEXT_CHARS:
        yield 0, text
        return
    step = MAX_TEXT_CHARS - _WINDOW_OVERLAP
    for offset in range(0, len(text) - _WINDOW_OVERLAP, step):
        yield offset, text[offset : offset + MAX_TEXT_CHARS]


def _merge(findings: list[Finding], generic_kinds: Sequence[str]) -> list[Finding]:
    """Of overlapping findings keep the one of the first category, then the longest, then a
    specific kind over a generic one (`generic_kinds`, in that order)."""
    ranked = sorted(
        set(findings),
        key=lambda f: (
            _PRIORITY.index(f.category),
            f.start - f.end,
            generic_kinds.index(f.kind) + 1 if f.kind in generic_kinds else 0,
            f.start,
            f.kind,
        ),
    )
    kept: list[Finding] = []
    for finding in ranked:
        if all(finding.end <= other.start or other.end <= finding.start for other in kept):
            kept.append(finding)
    return kept
