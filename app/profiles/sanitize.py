"""Bullet sanitisation: turns any text from a user or a model into one inert Markdown bullet.

The result is rendered as ``- {text}`` on one line and can never start a heading, a frontmatter
block, a quote, a code fence, a nested list, a thematic break or an HTML comment, and carries no
live markup: no HTML tag, and no inline link or image, reaches a Markdown renderer.
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

# "<" that can open HTML: a tag, a closing tag, a declaration or comment, a processing
# instruction, or an autolink (CommonMark: "<" followed by a letter, "/", "!" or "?").
_TAG_OPENER = re.compile(r"<(?=[A-Za-z/!?])")
# A link reference definition ("[label]: destination"), which CommonMark reads at the start of a
# list item's paragraph and applies to the whole document.
_LINK_DEFINITION = re.compile(r"\[[^\]]{1,999}\]:")


def sanitize_bullet(text: str) -> str:
    """Return ``text`` as a single safe bullet text, or ``""`` if nothing printable remains.

    Whitespace of any kind (newlines, tabs, Unicode separators) becomes one space; control,
    format (bidi, zero-width) and surrogate characters are removed; HTML comment delimiters are
    defused anywhere (so the truncation marker cannot be forged); markup is neutralised (see
    `neutralise_markup`); a leading structural character is backslash-escaped; the result is cut
    to ``MAX_BULLET_CHARS`` with a trailing ellipsis. The function is idempotent: sanitising a
    sanitised text returns it unchanged.
    """
    return _sanitize(text, neutralise=True)


def is_legacy_bullet(text: str) -> bool:
    """Whether `text` is a bullet as this module wrote it before markup was neutralised (every
    rule above but `neutralise_markup`): such a stored bullet is read as its sanitised form."""
    return _sanitize(text, neutralise=False) == text


def neutralise_markup(text: str) -> str:
    """`text` with no live markup for a Markdown renderer, still readable as text.

    A ``<`` that could open HTML (followed by a letter, ``/``, ``!`` or ``?``) becomes ``&lt;``,
    which every renderer shows as ``<`` and none reads as a tag: ``Works as a <svg onload=…>
    engineer`` shows its text and runs nothing, while ``Prefers List<T> generics`` reads as
    ``List<T>`` again once rendered, and ``x < y`` or ``<3`` are left as they are. ``](`` (an
    inline link or image, ``[x](javascript:…)``, ``![](https://tracker/…)``) becomes ``]\\(``,
    shown as the same characters but no link (a bullet opening with a link reference definition
    has its ``[`` escaped like the other leading structure). Idempotent.
    """
    return _TAG_OPENER.sub("&lt;", text).replace("](", "]\\(")


def _sanitize(text: str, *, neutralise: bool) -> str:
    if text.isascii() and text.isprintable():
        flattened = text  # the common case: nothing to flatten or remove
    else:
        flattened = "".join(_clean_char(char) for char in text)
    collapsed = _SPACE_RUN.sub(" ", flattened).strip()
    if not collapsed:
        return ""
    defused = _defuse_comments(collapsed)
    if neutralise:
        defused = neutralise_markup(defused)
    escaped = _escape_leading(defused, link_definitions=neutralise)
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


def _escape_leading(text: str, *, link_definitions: bool) -> str:
    first = text[0]
    second = text[1] if len(text) > 1 else " "
    if first in _ALWAYS_ESCAPED or (first in _RUN_ESCAPED and second in (" ", first)):
        return "\\" + text
    if link_definitions and _LINK_DEFINITION.match(text):
        return "\\" + text  # "[ref]: javascript:…" would serve a "[x][ref]" anywhere
    return text


def _limit(text: str) -> str:
    if len(text) <= MAX_BULLET_CHARS:
        return text
    # Python strings index code points, so any cut is on a character boundary.
    return text[: MAX_BULLET_CHARS - len(ELLIPSIS)].rstrip() + ELLIPSIS
