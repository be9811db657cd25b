"""The text the detectors judge: what a memory bullet says with its disguise taken off.

A value can be written so that it reads the same to a person (and to a model) but no longer
matches a pattern: a card number in full-width or Arabic-Indic digits, a zero-width space inside
a keyword, a Cyrillic `а` in "pаssword", an instruction in an HTML comment or a Markdown quote.
`canonicalise` undoes that, for judging only: the detectors read the canonical text, and every
finding is mapped back to the characters of the text as written, which is what is stored (or
redacted, or refused). The canonical text is never stored.

In order:

1. Removed: format characters (zero-width space and joiners, soft hyphen, bidi controls, the
   invisible tag characters), other controls, variation selectors, the combining grapheme
   joiner, Hangul fillers, and the combining marks that overlay or enclose a letter (a
   strike-through over `I` is still an `I`). Whitespace of any kind is one space.
2. Unicode NFKC, per character with its combining marks: full-width and mathematical letters
   and digits, ligatures and compatibility forms become their plain forms (`ｐａｓｓ` is
   `pass`, `𝟒` is `4`, `：` is `:`, `＠` is `@`).
3. Every decimal digit of any script (Unicode category Nd: Arabic-Indic, Devanagari, Bengali,
   Thai, ...) is its ASCII digit.
4. Look-alike letters are folded to Latin with Unicode's confusables data (the
   `confusable-homoglyphs` package, whose wheel ships it), only where it disguises something:
   in a word that mixes Latin with letters of another script (`pаsswоrd` with Cyrillic а and
   о, `Ιgnore` with a Greek Ι), and in a word that reads as one of the `KEYWORDS` the detectors
   look for once look-alikes, accents, small capitals and digits or symbols written for letters
   are read as letters (`КЕУ`, `Ignóre`, `ɪɢɴᴏʀᴇ`, `p4ssw0rd`, `pa$$word`). A word written
   honestly in Greek, Cyrillic, Arabic, Hebrew or any other script, and a Latin word that is no
   keyword (`Python3`, `café`), is left as it is.
5. HTML tags are removed (a block tag leaves a space). A keyword spelt letter by letter or cut
   in two or three (`p a s s w o r d`, `I-g-n-o-r-e`, `pass word`) is read whole; a bracketed
   "at" or "dot", or a plain one inside an address with a dotted domain, is `@` or `.`
   (`max (at) example (dot) com`).
6. Markup is unwrapped: HTML entities (`&lt;`), Markdown backslash escapes, HTML comment
   delimiters, backticks, emphasis (`*`, `**`, `_`, `~~` at the edge of a word) and quote
   markers (`>` opening the text or standing alone) are removed. The content of parentheses,
   brackets, backticks and HTML comments is also given as `segments`, each judged on its own
   by the instruction detector (an instruction in parentheses opens its own sentence).
7. Runs of spaces are one space.

Digit groups are not joined here: the number detectors read groups separated by spaces, dots
and dashes as one number where a card, an account or an id number may be written that way
(`numbers`). Pure; bounded linear work per character.
"""

from __future__ import annotations

import io
import itertools
import re
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Final

from confusable_homoglyphs import categories, utils

KEYWORDS: Final = frozenset(
    {
        # secrets
        "password",
        "passwort",
        "passphrase",
        "passcode",
        "pass",
        "pw",
        "pwd",
        "pin",
        "kennwort",
        "token",
        "key",
        "secret",
        "api",
        "login",
        "user",
        "admin",
        "iban",
        "card",
        "ssn",
        # instructions
        "ignore",
        "ignoriere",
        "disregard",
        "forget",
        "vergiss",
        "override",
        "bypass",
        "previous",
        "prior",
        "above",
        "all",
        "instructions",
        "instruction",
        "rules",
        "system",
        "prompt",
        "assistant",
        "always",
        "never",
        "only",
        "you",
        "your",
        "must",
        "reveal",
        "recommend",
        "promote",
        "act",
        "as",
        "new",
        "note",
        "from",
        "now",
        "on",
    }
)
"""Words a whole token of another script is folded into when it looks like one of them."""

_REMOVED_CATEGORIES: Final = frozenset({"Cc", "Cf", "Cs", "Co", "Cn"})
_FILLERS: Final = frozenset("\u034f\u115f\u1160\u3164\uffa0")
_OVERLAY_CLASS: Final = 1  # canonical combining class of the overlay marks (U+0335 ...)
_SEGMENT_PAIRS: Final = {"(": ")", "[": "]", "{": "}"}
_ENTITIES: Final = (
    ("&lt;", "<"),
    ("&gt;", ">"),
    ("&amp;", "&"),
    ("&quot;", '"'),
    ("&#39;", "'"),
    ("&apos;", "'"),
    ("&nbsp;", " "),
)
_ASCII_PUNCTUATION: Final = frozenset("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
_PLAIN: Final = re.compile(r"[A-Za-z0-9 ,.;:!?'\"/+=@%#$-]*")  # nothing to take off
_MARKUP: Final = re.compile(r"[<>`*_~(\[{]|-->")
_LATIN: Final = "LATIN"
_WORD: Final = re.compile(r"[^\W_]+")
_NEUTRAL_SCRIPTS: Final = frozenset({"COMMON", "INHERITED", "Unknown"})


@dataclass(frozen=True, slots=True)
class Canonical:
    """The canonical text; for each of its characters, the span of the text as written it
    came from (`starts[i]`, `ends[i]`); and the wrapped parts (`segments`, spans of `text`)."""

    text: str
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    source_length: int
    segments: tuple[tuple[int, int], ...] = ()

    def source_span(self, start: int, end: int) -> tuple[int, int]:
        """The span of the text as written that the canonical `text[start:end]` came from."""
        if not self.text:
            return 0, self.source_length
        start = min(max(start, 0), len(self.text) - 1)
        end = min(max(end, start + 1), len(self.text))
        return self.starts[start], self.ends[end - 1]


@dataclass(slots=True)
class _Piece:
    char: str
    start: int
    end: int


def canonicalise(text: str) -> Canonical:
    """`text` with its disguise taken off (see the module docstring)."""
    plain = _PLAIN.fullmatch(text) and "  " not in text
    disguised = _split_keywords(text) or _SPELT_ADDRESS.search(text) or _leet_keyword(text)
    if plain and not disguised:
        return Canonical(text, tuple(range(len(text))), tuple(range(1, len(text) + 1)), len(text))
    pieces = list(_characters(text))
    pieces = _fold_look_alikes(pieces)
    pieces = _decode_entities(pieces)
    pieces = _unescape(pieces)
    pieces = _remove_tags(pieces)
    pieces = _join_split_words(pieces)
    pieces = _spelt_out_at(pieces)
    pieces, segments = _unwrap(pieces)
    return _collapse(pieces, segments, len(text))


# --- characters -----------------------------------------------------------------------------


def _characters(text: str) -> Iterator[_Piece]:
    """Steps 1 to 3: removed, NFKC, decimal digits; a character with the combining marks that
    follow it is normalised as one."""
    if text.isascii():
        yield from (_Piece(" " if c.isspace() else c, i, i + 1) for i, c in enumerate(text))
        return
    index = 0
    length = len(text)
    while index < length:
        end = index + 1
        while end < length and not text[end].isascii() and unicodedata.combining(text[end]):
            end += 1
        char = text[index]
        if end == index + 1 and char.isascii():
            yield _Piece(" " if char.isspace() else char, index, end)
            index = end
            continue
        kept = "".join(_kept(c) for c in text[index:end])
        normalised = unicodedata.normalize("NFKC", kept) if kept else ""
        if normalised[:1].isascii() and normalised[:1].isalnum():
            # "4̲", "I̲": marks that no precomposed form of a Latin letter or digit holds
            normalised = "".join(c for c in normalised if not unicodedata.combining(c))
        for normal in normalised:
            digit = unicodedata.decimal(normal, None)
            if normal.isspace():
                yield _Piece(" ", index, end)
            else:
                yield _Piece(normal if digit is None else str(digit), index, end)
        index = end


def _kept(char: str) -> str:
    if char.isspace():
        return " "
    if char.isascii():
        return char
    if char in _FILLERS or unicodedata.category(char) in _REMOVED_CATEGORIES:
        return ""
    if "\ufe00" <= char <= "\ufe0f" or "\U000e0100" <= char <= "\U000e01ef":
        return ""  # variation selectors
    if unicodedata.category(char) == "Me" or unicodedata.combining(char) == _OVERLAY_CLASS:
        return ""
    return char


# --- look-alikes ----------------------------------------------------------------------------


def _fold_look_alikes(pieces: list[_Piece]) -> list[_Piece]:
    """Step 4, word by word (a word: letters and digits; for digits read as letters, also `@`
    and `$`)."""
    text = "".join(piece.char for piece in pieces)
    for word in _LEET_WORD.finditer(text):
        keyword = _keyword(word[0].translate(_LEET))
        if keyword is not None:
            for piece, char in zip(pieces[word.start() : word.end()], keyword, strict=True):
                piece.char = char
    if text.isascii():
        return pieces
    for word in _WORD.finditer(text):
        folded = _fold_word(word[0])
        if folded != word[0]:
            for piece, char in zip(pieces[word.start() : word.end()], folded, strict=True):
                piece.char = char
    return pieces


def _fold_word(word: str) -> str:
    """A word of Latin and other letters folded to Latin; a word that folds to a keyword
    (look-alikes of any script, small capitals, accents dropped) spelt as the keyword; any other
    word as it is."""
    if word.isascii():
        return word
    folded = "".join(_latin(char) or _base(char) for char in word)
    keyword = _keyword(folded)
    if keyword is not None:
        return keyword
    scripts = {_script(char) for char in word if char.isalpha()} - _NEUTRAL_SCRIPTS
    if _LATIN in scripts and len(scripts) > 1:
        return "".join(_latin(char) or char for char in word)
    return word


@lru_cache(maxsize=4096)
def _base(char: str) -> str:
    """A Latin letter without its accents (`ó` is `o`), a small capital as its letter (`ɪ` is
    `i`); any other character as it is."""
    base = unicodedata.normalize("NFD", char)[0]
    if base.isascii() and base.isalpha():
        return base
    name = unicodedata.name(char, "").removeprefix("LATIN LETTER SMALL CAPITAL ")
    return name.lower() if len(name) == 1 and name.isascii() else char


def _leet_keyword(text: str) -> bool:
    return any(_keyword(word[0].translate(_LEET)) for word in _LEET_WORD.finditer(text))


# Digits and symbols written for letters: "p4ssw0rd", "pa$$word", "1gnore".
_LEET: Final = str.maketrans("4@3105$7", "aaeiosst")
_LEET_WORD: Final = re.compile(
    r"(?<![\w@$])(?=[\w@$]*[A-Za-z])(?=[\w@$]*[0-9@$])[A-Za-z0-9@$]{2,16}(?![\w@$])"
)


def _keyword(folded: str) -> str | None:
    """`folded` spelt as the keyword it reads as, in its case (`l` and `I` look alike)."""
    if not folded.isascii():
        return None
    skeleton = folded.casefold().replace("l", "i")
    match = _KEYWORD_SKELETONS.get(skeleton)
    if match is None:
        return None
    return "".join(
        new.upper() if old.isupper() else new for old, new in zip(folded, match, strict=True)
    )


_KEYWORD_SKELETONS: Final = {word.replace("l", "i"): word for word in KEYWORDS}
_KEYWORD_PREFIXES: Final = frozenset(
    skeleton[:end] for skeleton in _KEYWORD_SKELETONS for end in range(2, len(skeleton))
)


@lru_cache(maxsize=4096)
def _script(char: str) -> str:
    return str(categories.alias(char))


def _latin(char: str) -> str | None:
    """The ASCII letter `char` is confusable with, in its case (None: none, or it is ASCII)."""
    return None if char.isascii() else _LATIN_LOOKALIKES.get(char)


def _latin_lookalikes() -> dict[str, str]:
    """Every non-ASCII character of the confusables data that looks like an ASCII letter, and
    that letter. Read from the package's data file rather than through its `confusables`
    module, which would keep the whole table (~6 MB of objects) for the process's life. The
    pairs found are written into one text buffer and the dictionary is built from it after the
    table is gone: keys kept from the parsed table would pin, scattered among its ~50,000
    objects, memory pages the allocator can then never hand back (~3 MB of them)."""
    table: dict[str, Sequence[dict[str, str]]] = utils.load("confusables.json")
    found = io.StringIO()
    for char, homoglyphs in table.items():
        if char.isascii():
            continue
        letters = [h["c"] for h in homoglyphs if len(h["c"]) == 1 and h["c"].isascii()]
        letters = [letter for letter in letters if letter.isalpha()]
        if not letters:
            continue
        same_case = [letter for letter in letters if letter.isupper() == char.isupper()]
        letter = (same_case or letters)[0]
        # a capital Ι or І is read as an I, not as an l
        found.write(f"{char}\0{'I' if letter == 'l' and char.isupper() else letter}\0")
    del table  # its objects freed whole before the dictionary is built
    fields = iter(found.getvalue().split("\0")[:-1])
    return dict(zip(fields, fields, strict=False))


_LATIN_LOOKALIKES: Final = _latin_lookalikes()


# --- markup ---------------------------------------------------------------------------------


def _remove_tags(pieces: list[_Piece]) -> list[_Piece]:
    """HTML tags out (`Ig<b></b>nore`, `<b>4111</b> 1111 …`); a block tag leaves a space."""
    text = "".join(piece.char for piece in pieces)
    if "<" not in text:
        return pieces
    out: list[_Piece] = []
    position = 0
    for tag in _TAG.finditer(text):
        out += pieces[position : tag.start()]
        if tag["name"].casefold() in _BLOCK_TAGS:
            out.append(_Piece(" ", pieces[tag.start()].start, pieces[tag.end() - 1].end))
        position = tag.end()
    return out + pieces[position:]


_TAG: Final = re.compile(r"</?(?P<name>[A-Za-z][A-Za-z0-9-]{0,20})(?:\s[^<>]{0,200})?/?>")
_BLOCK_TAGS: Final = frozenset(
    {"p", "div", "br", "li", "ul", "ol", "tr", "td", "th", "table", "hr", "blockquote", "pre"}
    | {f"h{level}" for level in range(1, 7)}
)


def _join_split_words(pieces: list[_Piece]) -> list[_Piece]:
    """A keyword spelt letter by letter (`p a s s w o r d`, `I-g-n-o-r-e`) or cut in two or
    three (`pass word`, `dis-regard`) is read as the word: the separators go. Other words
    written apart stay apart."""
    dropped = _split_keywords("".join(piece.char for piece in pieces))
    if not dropped:
        return pieces
    return [piece for index, piece in enumerate(pieces) if index not in dropped]


def _split_keywords(text: str) -> set[int]:
    """Where the separators inside split keywords are."""
    words = [(m.start(), m.end()) for m in _LETTERS.finditer(text)]
    dropped: set[int] = set()
    first = 0
    while first < len(words):
        last = first
        while last + 1 < len(words) and _joined(text, words[last], words[last + 1]):
            last += 1
        if last > first:
            _join_run(text, words[first : last + 1], dropped)
        first = last + 1
    return dropped


def _joined(text: str, left: tuple[int, int], right: tuple[int, int]) -> bool:
    """Whether two words stand apart by one separator (with a space around it or not)."""
    gap = right[0] - left[1]
    return 1 <= gap <= 3 and _SEPARATOR.fullmatch(text, left[1], right[0]) is not None


def _join_run(text: str, run: list[tuple[int, int]], dropped: set[int]) -> None:
    """In a run of words apart by separators: single letters spelling a keyword, and two or
    three words making a keyword of six letters or more."""
    start = 0
    while start < len(run):
        end = start
        while end < len(run) and run[end][1] - run[end][0] == 1:
            end += 1
        if end - start >= 3 and _keyword(_letters(text, run[start:end])) is not None:
            dropped.update(_gaps(run[start:end]))
        start = max(end, start + 1)
    for size in (2, 3):
        for first in range(len(run) - size + 1):
            head = text[run[first][0] : run[first][1]].casefold().replace("l", "i")
            if head not in _KEYWORD_PREFIXES:
                continue
            parts = run[first : first + size]
            word = _letters(text, parts)
            if len(word) >= 6 and _keyword(word) is not None:
                dropped.update(_gaps(parts))


def _letters(text: str, words: list[tuple[int, int]]) -> str:
    return "".join(text[start:end] for start, end in words)


def _gaps(words: list[tuple[int, int]]) -> set[int]:
    return {i for left, right in itertools.pairwise(words) for i in range(left[1], right[0])}


_LETTERS: Final = re.compile(r"[^\W\d_]+")
_SEPARATOR: Final = re.compile(r" ?[.\-_·*/]? ?")


def _spelt_out_at(pieces: list[_Piece]) -> list[_Piece]:
    """`max [at] example (dot) com`, `anna dot keller at example dot com`: a bracketed "at" or
    "dot", and a plain one inside an address spelt out with a dotted domain, is read as `@` or
    `.`."""
    text = "".join(piece.char for piece in pieces)
    matches = [
        *_AT_OR_DOT.finditer(text),
        *(
            word
            for address in _SPELT_ADDRESS.finditer(text)
            for word in _PLAIN_AT_OR_DOT.finditer(text, address.start(), address.end())
        ),
    ]
    if not matches:
        return pieces
    out: list[_Piece] = []
    position = 0
    for match in sorted(matches, key=lambda m: m.start()):
        if match.start() < position:
            continue
        out += pieces[position : match.start()]
        char = "@" if match["word"].casefold() == "at" else "."
        out.append(_Piece(char, pieces[match.start()].start, pieces[match.end() - 1].end))
        position = match.end()
    return out + pieces[position:]


_AT_OR_DOT: Final = re.compile(r" ?[\[({<] ?(?P<word>at|dot) ?[\])}>] ?", re.IGNORECASE)
_PLAIN_AT_OR_DOT: Final = re.compile(r" (?P<word>at|dot) ", re.IGNORECASE)
_SPELT_ADDRESS: Final = re.compile(
    r"(?<![\w.])[\w.%+-]{1,64}(?: dot [\w%+-]{1,64}){0,5} at [\w-]{1,63}"
    r"(?: dot [\w-]{1,63}){1,5}(?![\w-])",
    re.IGNORECASE,
)


def _decode_entities(pieces: list[_Piece]) -> list[_Piece]:
    text = "".join(piece.char for piece in pieces)
    if "&" not in text:
        return pieces
    out: list[_Piece] = []
    index = 0
    while index < len(pieces):
        for entity, char in _ENTITIES:
            if text.startswith(entity, index):
                last = pieces[index + len(entity) - 1]
                out.append(_Piece(char, pieces[index].start, last.end))
                index += len(entity)
                break
        else:
            out.append(pieces[index])
            index += 1
    return out


def _unescape(pieces: list[_Piece]) -> list[_Piece]:
    """Markdown backslash escapes: the backslash goes, the character stays."""
    if not any(piece.char == "\\" for piece in pieces):
        return pieces
    out: list[_Piece] = []
    index = 0
    while index < len(pieces):
        piece = pieces[index]
        following = pieces[index + 1].char if index + 1 < len(pieces) else ""
        if piece.char == "\\" and following in _ASCII_PUNCTUATION:
            out.append(pieces[index + 1])
            index += 2
            continue
        out.append(piece)
        index += 1
    return out


def _unwrap(pieces: list[_Piece]) -> tuple[list[_Piece], list[tuple[int, int]]]:
    """Step 5: comment delimiters, backticks, emphasis and quote markers out (a comment
    delimiter leaves a space); the wrapped parts as segments of the result."""
    text = "".join(piece.char for piece in pieces)
    if _MARKUP.search(text) is None:
        return pieces, []
    out: list[_Piece] = []
    segments: list[tuple[int, int]] = []
    opened: list[tuple[str, int]] = []  # closing character, where its content starts in `out`
    lead = len(text) - len(text.lstrip(" >"))
    emphasis = _emphasis(text)
    index = 0
    while index < len(pieces):
        piece = pieces[index]
        char = piece.char
        if text.startswith("<!--", index) or text.startswith("-->", index):
            width = 4 if char == "<" else 3
            out.append(_Piece(" ", piece.start, pieces[index + width - 1].end))
            _toggle(opened, segments, "-->", len(out), closing=char != "<")
            index += width
            continue
        if char == "`":
            _toggle(opened, segments, "`", len(out), closing=bool(opened and opened[-1][0] == "`"))
            index += 1
            continue
        if char in _SEGMENT_PAIRS:
            opened.append((_SEGMENT_PAIRS[char], len(out) + 1))
        elif opened and char == opened[-1][0]:
            segments.append((opened.pop()[1], len(out)))
        if _is_delimiter(text, index, lead, emphasis):
            index += 1
            continue
        out.append(piece)
        index += 1
    return out, segments


def _toggle(
    opened: list[tuple[str, int]],
    segments: list[tuple[int, int]],
    closer: str,
    position: int,
    *,
    closing: bool,
) -> None:
    if closing:
        while opened:
            wanted, start = opened.pop()
            if wanted == closer:
                segments.append((start, position))
                return
        segments.append((0, position))  # a closer with no opener closes from the start
        return
    opened.append((closer, position))


def _is_delimiter(text: str, index: int, lead: int, emphasis: set[int]) -> bool:
    """Whether `text[index]` is emphasis (`emphasis`: where it is) or a quote marker (`lead`:
    the length of the quote markers and spaces opening the text)."""
    if text[index] != ">":
        return index in emphasis
    before = text[index - 1] if index else " "
    after = text[index + 1] if index + 1 < len(text) else " "
    return index < lead or (before in " >" and after in " >")


def _emphasis(text: str) -> set[int]:
    """Where the runs of `*`, `_` and `~` at the edge of a word are (a run inside a word, as in
    `snake_case`, and a single `~`, as in `~5`, are not emphasis)."""
    found: set[int] = set()
    for run in _EMPHASIS_RUN.finditer(text):
        before = text[run.start() - 1] if run.start() else " "
        after = text[run.end()] if run.end() < len(text) else " "
        if run[0] == "~" or (before.isalnum() and after.isalnum()):
            continue
        found.update(range(run.start(), run.end()))
    return found


_EMPHASIS_RUN: Final = re.compile(r"[*_~]+")


def _collapse(pieces: list[_Piece], segments: list[tuple[int, int]], length: int) -> Canonical:
    """Step 6, keeping the segments' positions; empty segments dropped."""
    kept: list[_Piece] = []
    position = [0] * (len(pieces) + 1)
    for index, piece in enumerate(pieces):
        position[index] = len(kept)
        if piece.char == " " and (not kept or kept[-1].char == " "):
            continue
        kept.append(piece)
    position[len(pieces)] = len(kept)
    while kept and kept[-1].char == " ":
        kept.pop()
    text = "".join(piece.char for piece in kept)
    spans = {
        (position[start], min(position[end], len(text)))
        for start, end in segments
        if text[position[start] : position[end]].strip()
    }
    return Canonical(
        text,
        tuple(piece.start for piece in kept),
        tuple(piece.end for piece in kept),
        length,
        tuple(sorted(spans)),
    )
