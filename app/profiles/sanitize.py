"""Bullet sanitisation: turns any text from a user or a model into one inert Markdown bullet.

The result is rendered as ``- {text}`` on one line and can never start a heading, a frontmatter
block, a quote, a code fence, a nested list, a thematic break or an HTML comment.
"""

import re
import unicodedata

MAX_BULLET_CHARS = 500
"""Longest bullet text (in code points, without the leading ``- ``)."""

ELLIPSIS = "…"

# Categories removed outright: control (Cc), format (Cf: bidi controls, zero-width characters,
# soft hyphen, invisible tag characters used for prompt smuggling) and lone surrogates (Cs).
_REMOVED_CATEGORIES = frozenset({"Cc", "Cf", "Cs"})

# Characters that start Markdown block structure when they open a line (or a list item):
# always escaped when first, because any continuation can make them structural.
_ALWAYS_ESCAPED = frozenset("#><|")
# Escaped when first and followed by whitespace, the end, or the same character: list markers
# (``- x``), thematic breaks and setext underlines (``---``, ``===``, ``***``, ``___``) and
# code fences (````` ``` `````, ``~~~``).
_RUN_ESCAPED = frozenset("-*+=_`~")

_SPACE_RUN = re.compile(r" {2,}")


def sanitize_bullet(text: str) -> str:
    """Return ``text`` as a single safe bullet text, or ``""`` if nothing printable remains.

    Whitespace of any kind (newlines, tabs, Unicode separators) becomes one space; control,
    format (bidi, zero-width) and surrogate characters are removed; HTML comment delimiters are
    defused anywhere (so the truncation marker cannot be forged); a leading structural character
    is backslash-escaped; the result is cut to ``MAX_BULLET_CHARS`` with a trailing ellipsis.
    The function is idempotent: sanitising a sanitised text returns it unchanged.
    """
    if text.isascii() and text.isprintable():
        flattened = text  # the common case: nothing to flatten or remove
    else:
        flattened = "".join(_clean_char(char) for char in text)
    collapsed = _SPACE_RUN.sub(" ", flattened).strip()
    if not collapsed:
        return ""
    defused = _defuse_comments(collapsed)
    escaped = _escape_leading(defused)
    return _limit(escaped)


def _clean_char(char: str) -> str:
    if char.isspace():
        return " "
    if unicodedata.category(char) in _REMOVED_CATEGORIES:
        return ""
    return char


def _defuse_comments(text: str) -> str:
    # "<!--" is replaced first; "-->" afterwards cannot re-create it, and neither replacement
    # leaves a delimiter behind, which keeps the function idempotent.
    return text.replace("<!--", "<\\!--").replace("-->", "--\\>")


def _escape_leading(text: str) -> str:
    first = text[0]
    second = text[1] if len(text) > 1 else " "
    if first in _ALWAYS_ESCAPED or (first in _RUN_ESCAPED and second in (" ", first)):
        return "\\" + text
    return text


def _limit(text: str) -> str:
    if len(text) <= MAX_BULLET_CHARS:
        return text
    # Python strings index code points, so any cut is on a character boundary.
    return text[: MAX_BULLET_CHARS - len(ELLIPSIS)].rstrip() + ELLIPSIS
