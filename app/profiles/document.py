"""The memory.md format: render a Profile to text and parse text back, strictly.

This module is also the one import point for the profile API (value types, sanitising,
operations); see ``__all__``.
"""

import json
import re
from datetime import datetime
from itertools import zip_longest

import yaml

from app.profiles.operations import (
    Operation,
    OperationError,
    OpKind,
    apply,
    diff_operations,
)
from app.profiles.profile import (
    SCHEMA_VERSION,
    SECTIONS,
    Frontmatter,
    Profile,
    ProfileFormatError,
    Section,
    bullet_count,
    empty_profile,
    preview,
)
from app.profiles.sanitize import MAX_BULLET_CHARS, is_legacy_bullet, sanitize_bullet

__all__ = [
    "EMPTY_PLACEHOLDER",
    "MAX_BULLET_CHARS",
    "SCHEMA_VERSION",
    "SECTIONS",
    "TITLE_LINE",
    "TRUNCATION_MARKER",
    "Frontmatter",
    "OpKind",
    "Operation",
    "OperationError",
    "Profile",
    "ProfileFormatError",
    "Section",
    "apply",
    "body_has_bullets",
    "bullet_count",
    "diff_operations",
    "empty_profile",
    "parse",
    "parse_body",
    "render",
    "render_body",
    "sanitize_bullet",
    "stored_body",
]

TITLE_LINE = "# User Memory"
EMPTY_PLACEHOLDER = "_(empty)_"
TRUNCATION_MARKER = "<!-- truncated to fit memory budget -->"
FRONTMATTER_DELIMITER = "---"
FRONTMATTER_KEYS = ("user_id", "schema_version", "last_updated", "turn_count")
_MAX_FRONTMATTER_LINES = 20
_PLAIN_YAML_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.@+-]*")


# --- render -------------------------------------------------------------------------------------
#
# Whitespace rules (the canonical form, byte-for-byte the seed's example):
#   * lines end with "\n" only; the document ends with exactly one "\n";
#   * the frontmatter is "---", the four keys in fixed order, "---", then one blank line;
#   * "# User Memory", one blank line, then the six sections separated by one blank line each;
#   * a section is its "## " heading followed directly by "- " bullet lines or "_(empty)_";
#   * a truncated profile ends with one blank line and the truncation marker line.


def render(profile: Profile) -> str:
    """The complete memory.md document in canonical form."""
    return _render_frontmatter(profile.frontmatter) + "\n" + render_body(profile)


def stored_body(text: str) -> str:
    """The body of a document this service rendered (`render`), without parsing it: everything
    after the frontmatter. For the load path, which must not pay for a full parse of a version
    that was validated when it was written. Equal to `render_body(parse(text))`, except for a
    document stored before markup was neutralised, whose bullets come as stored."""
    end = text.find("\n" + FRONTMATTER_DELIMITER + "\n", len(FRONTMATTER_DELIMITER))
    if not text.startswith(FRONTMATTER_DELIMITER + "\n") or end < 0:
        raise ProfileFormatError("line 1: a stored profile starts with its frontmatter")
    return text[end + len(FRONTMATTER_DELIMITER) + 2 :].lstrip("\n")


def body_has_bullets(body: str) -> bool:
    """Whether a rendered body holds at least one bullet (bullets are the only `- ` lines)."""
    return body.startswith("- ") or "\n- " in body


def render_body(profile: Profile) -> str:
    """Everything after the frontmatter, starting at ``# User Memory``."""
    blocks = [TITLE_LINE]
    for section, bullets in profile.sections:
        lines = [_heading(section), *(f"- {bullet}" for bullet in bullets)]
        blocks.append("\n".join(lines if bullets else [*lines, EMPTY_PLACEHOLDER]))
    if profile.truncated:
        blocks.append(TRUNCATION_MARKER)
    return "\n\n".join(blocks) + "\n"


def _render_frontmatter(frontmatter: Frontmatter) -> str:
    updated = frontmatter.last_updated
    lines = [
        FRONTMATTER_DELIMITER,
        f"user_id: {_yaml_string(frontmatter.user_id)}",
        f"schema_version: {frontmatter.schema_version}",
        f"last_updated: {'null' if updated is None else updated.isoformat()}",
        f"turn_count: {frontmatter.turn_count}",
        FRONTMATTER_DELIMITER,
    ]
    return "\n".join(lines) + "\n"


def _yaml_string(value: str) -> str:
    # Plain when YAML reads it back as the same string ("123", "true", "2026-01-01" do not);
    # otherwise a JSON string, which is a valid YAML double-quoted scalar.
    if _PLAIN_YAML_ID.fullmatch(value) and yaml.safe_load(value) == value:
        return value
    return json.dumps(value, ensure_ascii=False)


# --- parse --------------------------------------------------------------------------------------


def parse(text: str) -> Profile:
    """Parse a stored memory.md document; anything but the canonical form is an error.

    Raises ``ProfileFormatError`` naming the first offending line. Guarantees
    ``render(parse(text)) == text``, with one exception: a document stored before bullets had
    their markup neutralised (``is_legacy_bullet``) is read with each such bullet in its current
    sanitised form, so the next write stores it that way.
    """
    lines = text.split("\n")
    frontmatter, body_start = _read_frontmatter(lines)
    reader = _BodyReader(lines, lenient=False)
    profile = reader.read(body_start, frontmatter)
    for index, bullet in reader.upgraded.items():
        lines[index] = f"- {bullet}"
    _require_canonical("\n".join(lines) if reader.upgraded else text, render(profile))
    return profile


def parse_body(text: str, user_id: str) -> Profile:
    """Parse a document sent by a client or a model into a profile owned by ``user_id``.

    A frontmatter block is optional and ignored (never read as YAML): the result carries default
    frontmatter for ``user_id`` and the caller sets the real one. The structure is as strict as
    in ``parse``; tolerated are CRLF line ends, blank lines, trailing spaces, a leading BOM and an
    empty section without ``_(empty)_``. Bullets are passed through ``sanitize_bullet`` (those
    that sanitise to nothing are dropped), and a truncation marker on the last line is accepted
    but not kept: truncation is decided by the service.
    """
    normalised = text.removeprefix("\ufeff").replace("\r\n", "\n").replace("\r", "\n")
    lines = [line.rstrip() for line in normalised.split("\n")]
    start = _skip_frontmatter(lines)
    profile = _BodyReader(lines, lenient=True).read(start, Frontmatter(user_id=user_id))
    return Profile(frontmatter=profile.frontmatter, sections=profile.sections)


def _error(index: int, message: str) -> ProfileFormatError:
    return ProfileFormatError(f"line {index + 1}: {message}")


def _read_frontmatter(lines: list[str]) -> tuple[Frontmatter, int]:
    if lines[0] != FRONTMATTER_DELIMITER:
        raise _error(0, f"expected {FRONTMATTER_DELIMITER!r} opening the frontmatter")
    end = _closing_delimiter(lines, 0, limit=_MAX_FRONTMATTER_LINES)
    try:
        data = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError as exc:
        mark = exc.problem_mark if isinstance(exc, yaml.MarkedYAMLError) else None
        raise _error(1 + (mark.line if mark else 0), "frontmatter is not valid YAML") from exc
    if not isinstance(data, dict):
        raise _error(1, "frontmatter must be a YAML mapping")
    missing = [key for key in FRONTMATTER_KEYS if key not in data]
    unexpected = sorted(repr(key) for key in data if key not in FRONTMATTER_KEYS)
    if missing or unexpected:
        problems = ([f"missing {', '.join(missing)}"] if missing else []) + (
            [f"unexpected {', '.join(unexpected)}"] if unexpected else []
        )
        raise _error(1, f"frontmatter keys: {'; '.join(problems)}")
    return _frontmatter_from_yaml(data, lines[1:end]), end + 1


def _frontmatter_from_yaml(data: dict[object, object], block: list[str]) -> Frontmatter:
    def fail(key: str, message: str) -> ProfileFormatError:
        lines = (i for i, line in enumerate(block, start=1) if line.startswith(f"{key}:"))
        return _error(next(lines, 1), f"{key} {message}")

    user_id, version = data["user_id"], data["schema_version"]
    updated, turns = data["last_updated"], data["turn_count"]
    if not isinstance(user_id, str):
        raise fail("user_id", "must be a string")
    if not _is_int(version) or version != SCHEMA_VERSION:
        raise fail("schema_version", f"{preview(str(version))} is not supported")
    if updated is not None and not isinstance(updated, datetime):
        raise fail("last_updated", "must be a timestamp or null")
    if not isinstance(turns, int) or isinstance(turns, bool):
        raise fail("turn_count", "must be an integer")
    try:
        return Frontmatter(user_id=user_id, last_updated=updated, turn_count=turns)
    except ProfileFormatError as exc:
        raise _error(1, f"frontmatter: {exc.detail}") from exc


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _skip_frontmatter(lines: list[str]) -> int:
    first = next((i for i, line in enumerate(lines) if line), len(lines))
    if first < len(lines) and lines[first] == FRONTMATTER_DELIMITER:
        return _closing_delimiter(lines, first, limit=len(lines)) + 1
    return 0


def _closing_delimiter(lines: list[str], opening: int, *, limit: int) -> int:
    for index in range(opening + 1, min(len(lines), opening + 2 + limit)):
        if lines[index] == FRONTMATTER_DELIMITER:
            return index
    raise _error(opening, f"frontmatter opened here is not closed by {FRONTMATTER_DELIMITER!r}")


def _require_canonical(text: str, rendered: str) -> None:
    if text == rendered:
        return
    pairs = zip_longest(rendered.split("\n"), text.split("\n"))
    for index, (expected, found) in enumerate(pairs):
        if expected != found:
            want = "the end of the document" if expected is None else repr(expected)
            got = "the end of the document" if found is None else preview(found)
            raise _error(index, f"not in canonical form: expected {want}, found {got}")


class _BodyReader:
    """Reads ``# User Memory`` and the six sections from a list of lines."""

    def __init__(self, lines: list[str], *, lenient: bool) -> None:
        self.lines = lines
        self.lenient = lenient
        self.upgraded: dict[int, str] = {}  # line index -> the sanitised form of a legacy bullet

    def read(self, start: int, frontmatter: Frontmatter) -> Profile:
        index = self._skip_blank(start)
        if index >= len(self.lines) or self.lines[index] != TITLE_LINE:
            raise self._unexpected(index, repr(TITLE_LINE))
        index += 1
        sections: dict[Section, list[str]] = {}
        truncated = False
        for section in SECTIONS:
            index = self._skip_blank(index)
            if index >= len(self.lines) or self.lines[index] != _heading(section):
                raise self._unexpected(index, repr(_heading(section)))
            index, sections[section], truncated = self._read_section(index, section)
        return Profile.from_sections(frontmatter, sections, truncated=truncated)

    def _read_section(self, heading: int, section: Section) -> tuple[int, list[str], bool]:
        """Read up to the next heading; return its index, the bullets and the truncation flag."""
        following = SECTIONS.index(section) + 1
        next_heading = _heading(SECTIONS[following]) if following < len(SECTIONS) else None
        bullets: list[str] = []
        placeholder = False
        index = heading + 1
        while index < len(self.lines):
            line = self.lines[index]
            if line.startswith("#"):
                if line != next_heading:
                    raise self._unexpected(index, repr(next_heading or "the end of the document"))
                break
            if line == TRUNCATION_MARKER:
                if next_heading is not None or self._skip_blank(index + 1) < len(self.lines):
                    raise _error(index, "the truncation marker may only be the last line")
                return len(self.lines), bullets, True
            if line == EMPTY_PLACEHOLDER or line.startswith("- ") or line == "-":
                if placeholder or (bullets and line == EMPTY_PLACEHOLDER):
                    raise _error(
                        index, f"{EMPTY_PLACEHOLDER!r} must be the only line of its section"
                    )
                placeholder = line == EMPTY_PLACEHOLDER
                if not placeholder:
                    bullets.extend(self._bullet(index, line[2:]))
            elif line.strip():
                raise _error(
                    index,
                    f"expected a '- ' bullet or {EMPTY_PLACEHOLDER!r} in {section.value!r}, "
                    f"found {preview(line)}",
                )
            index += 1
        if not bullets and not placeholder and not self.lenient:
            raise _error(
                heading, f"empty section {section.value!r} must hold {EMPTY_PLACEHOLDER!r}"
            )
        return index, bullets, False

    def _bullet(self, index: int, text: str) -> list[str]:
        clean = sanitize_bullet(text)
        if self.lenient:
            return [clean] if clean else []
        if text and clean != text and is_legacy_bullet(text):
            self.upgraded[index] = clean
            return [clean]
        if not text or clean != text:
            raise _error(index, f"bullet is empty or not in sanitised form: {preview(text)}")
        return [text]

    def _skip_blank(self, index: int) -> int:
        while index < len(self.lines) and not self.lines[index].strip():
            index += 1
        return index

    def _unexpected(self, index: int, expected: str) -> ProfileFormatError:
        if index >= len(self.lines):
            return _error(
                len(self.lines) - 1, f"expected {expected}, found the end of the document"
            )
        return _error(index, f"expected {expected}, found {preview(self.lines[index])}")


def _heading(section: Section) -> str:
    return f"## {section.value}"
