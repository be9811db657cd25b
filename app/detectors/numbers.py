"""Numbers that identify a card, a bank account or a person, found by a tolerant candidate
pattern and confirmed by python-stdnum's checksum validation.

A candidate is never part of a longer number (no digit, and no decimal or thousands separator
followed by a digit, on either side), so amounts, versions and dates are not read as ids; a
separator after a letter is not a number's ("Card no.4111111111111111" is a card number).

A card number is looked for in every run of digit groups joined by spaces, dots, dashes,
underscores, slashes or middle dots (one of them, or one with a space on either side), as every
stretch of whole groups that holds 13 to 19 digits: "4111 1111.1111-1111" is one number, and so
is "Order 7 4111 1111 1111 1111"'s card. A stretch counts when its inner groups have at least
three digits each (cards are written in fours, or 4-6-5), or at least two where every separator
is one space ("4232 33 21 1325 0723"), or when all its groups have one or two digits joined by
one kind of separator (a number spelt out digit by digit); dates, times and lists of years
("30.04.2024-01.05.2024", "2019, 2020") are none of these.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Iterator
from typing import Final

from stdnum import iban, luhn
from stdnum.ch import ssn as ch_ssn
from stdnum.de import idnr as de_idnr
from stdnum.fr import nir as fr_nir
from stdnum.us import ssn as us_ssn

from app.detectors.findings import Category, Finding

_BEFORE: Final = r"(?<!\d)(?<!\d[.,/-])(?<![\s/][.,/-])(?<!^[.,/-])"
_AFTER: Final = r"(?![\d/-]|[.,]\d)"

# A run of digit groups, and the separators a card number's groups are written with.
_DIGIT_RUN = re.compile(_BEFORE + r"\d+(?:(?: ?[._/·-] ?| )\d+)*")
_GROUP = re.compile(r"\d+")
_CARD_LENGTHS: Final = range(13, 20)
# The card schemes' issuer prefixes and lengths: Luhn alone passes one digit run in ten, these
# leave about one 16-digit run in forty and one 13- or 15-digit run in a few hundred.
_CARD_SCHEMES: Final = (
    (re.compile(r"4"), frozenset({13, 16, 19})),  # Visa
    (re.compile(r"5[1-5]|222[1-9]|22[3-9]\d|2[3-6]|27[01]|2720"), frozenset({16})),  # Mastercard
    (re.compile(r"3[47]"), frozenset({15})),  # American Express
    (re.compile(r"6011|64[4-9]|65|62"), frozenset({16, 17, 18, 19})),  # Discover, UnionPay
    (re.compile(r"35(?:2[89]|[3-8])"), frozenset({16, 17, 18, 19})),  # JCB
    (re.compile(r"3(?:0[0-5]|[689])"), frozenset(range(14, 20))),  # Diners Club
)
# The separators written between the groups of an IBAN or an id number: a space, a dot, a dash.
_SEP: Final = r"[ .-]?"
_IBAN = re.compile(
    r"(?<![A-Za-z0-9])[A-Za-z]{2}\d{2}(?:"
    + _SEP
    + r"[A-Za-z0-9]{4}){2,7}(?:"
    + _SEP
    + r"[A-Za-z0-9]{1,4})?(?![A-Za-z0-9]|[.-][A-Za-z0-9])"
)
# An IBAN written loosely: its characters spaced out one by one ("A T 2 1 7 4 …"), grouped
# unevenly, or glued to its label ("IBANGB98NWBK…"); confirmed by its checksum.
_LOOSE_IBAN = re.compile(
    r"(?:(?<![A-Za-z0-9])|(?<=IBAN)|(?<=iban)|(?<=Iban))[A-Z][ .-]?[A-Z](?:[ .-]?\d){2}"
    r"(?:[ .-]?[A-Za-z0-9]){11,30}"
)
_AHV = re.compile(_BEFORE + r"756([ .-]?)\d{4}\1\d{4}\1\d{2}" + _AFTER)
_DE_IDNR = re.compile(_BEFORE + r"[1-9]\d(?:([ .-]?)\d{3}){3}" + _AFTER)
_US_SSN = re.compile(_BEFORE + r"\d{3}([ .-])\d{2}\1\d{4}" + _AFTER)
_NINE_DIGITS = re.compile(_BEFORE + r"\d{9}" + _AFTER)
_SSN_CONTEXT = re.compile(r"\b(?:ssn|social security)\b", re.IGNORECASE)
_NINO = re.compile(r"(?<![A-Za-z0-9])[A-Z]{2} ?\d{2} ?\d{2} ?\d{2} ?[A-D](?![A-Za-z0-9])")
_NINO_UNUSED_PREFIXES = frozenset({"BG", "GB", "KN", "NK", "NT", "TN", "ZZ"})
_FR_NIR = re.compile(
    _BEFORE
    + r"[12] ?\d{2} ?(?:0[1-9]|1[0-2]|[2-9]\d) ?(?:\d{2}|2[ABab]) ?\d{3} ?\d{3} ?\d{2}"
    + _AFTER
)


def find_numbers(text: str) -> Iterator[Finding]:
    ssn_named = _SSN_CONTEXT.search(text) is not None
    for run in _DIGIT_RUN.finditer(text):
        if _AFTER_NUMBER.match(text, run.end()) is None:
            continue  # part of a longer number ("1.5" after a run of groups)
        for start, end in _card_stretches(run):
            yield Finding(Category.PAYMENT_CARDS, "card-number", start, end)
        yield from _grouped_id(run, ssn_named=ssn_named)
    for match in _IBAN.finditer(text):
        length = _valid_prefix(match[0])
        if length:
            yield Finding(Category.BANK_ACCOUNTS, "iban", match.start(), match.start() + length)
    for match in _LOOSE_IBAN.finditer(text):
        span = _loose_iban(match)
        if span is not None:
            yield Finding(Category.BANK_ACCOUNTS, "iban", *span)
    checks: tuple[tuple[re.Pattern[str], Callable[[str], bool], str], ...] = (
        (_AHV, lambda number: ch_ssn.is_valid(_digits(number)), "ch-ahv"),
        (_DE_IDNR, de_idnr.is_valid, "de-tax-id"),
        (_US_SSN, lambda number: us_ssn.is_valid(_digits(number)), "us-ssn"),
        (_NINO, _is_nino, "uk-nino"),
        (_FR_NIR, fr_nir.is_valid, "fr-nir"),
    )
    for pattern, is_valid, kind in checks:
        for match in pattern.finditer(text):
            if is_valid(match[0]):
                yield Finding(Category.NATIONAL_IDS, kind, match.start(), match.end())
    if _SSN_CONTEXT.search(text):  # an undivided SSN is nine digits: only where one is named
        for match in _NINE_DIGITS.finditer(text):
            if us_ssn.is_valid(match[0]):
                yield Finding(Category.NATIONAL_IDS, "us-ssn", match.start(), match.end())


def _grouped_id(run: re.Match[str], *, ssn_named: bool) -> Iterator[Finding]:
    """An id number in a run of digit groups however it is grouped ("2-92-03-75-112-033-13",
    "47-358-1192", "5 2 4 3 9 8 8 0 6"), by its checksum: a French NIR (15 digits), a Swiss
    AHV number (13 digits from 756), and, where the text names an SSN, a US SSN (9 digits)."""
    if len(_GROUP.findall(run[0])) < 2:
        return  # one group: the patterns above read it
    digits = _digits(run[0])
    checks = (
        (15, fr_nir.is_valid, "fr-nir"),
        (13, lambda number: number.startswith("756") and ch_ssn.is_valid(number), "ch-ahv"),
        (9, lambda number: ssn_named and us_ssn.is_valid(number), "us-ssn"),
    )
    for length, is_valid, kind in checks:
        if len(digits) == length and is_valid(digits):
            yield Finding(Category.NATIONAL_IDS, kind, run.start(), run.end())


def _loose_iban(match: re.Match[str]) -> tuple[int, int] | None:
    """The span of the longest valid IBAN that a loosely written candidate starts with."""
    positions = [match.start() + i for i, c in enumerate(match[0]) if c.isalnum()]
    compact = "".join(c for c in match[0] if c.isalnum())
    for end in range(len(compact), 14, -1):
        if iban.is_valid(compact[:end]):
            return positions[0], positions[end - 1] + 1
    return None


def _is_card(digits: str) -> bool:
    schemes = (lengths for prefix, lengths in _CARD_SCHEMES if prefix.match(digits))
    return any(len(digits) in lengths for lengths in schemes) and luhn.is_valid(digits)


_AFTER_NUMBER = re.compile(_AFTER)


def _card_stretches(run: re.Match[str]) -> Iterator[tuple[int, int]]:
    """The spans of the stretches of whole groups of `run` that are card numbers (see the
    module docstring), none inside another."""
    groups = [
        (group.start() + run.start(), group.end() + run.start(), group[0])
        for group in _GROUP.finditer(run[0])
    ]
    found: list[tuple[int, int]] = []
    for first in range(len(groups)):
        digits = ""
        for last in range(first, len(groups)):
            digits += groups[last][2]
            if len(digits) > _CARD_LENGTHS[-1]:
                break
            end = groups[last][1]
            if found and end <= found[-1][1]:
                continue  # inside the card found before
            if (
                len(digits) in _CARD_LENGTHS
                and _is_card(digits)
                and _card_grouping(run.string, groups[first : last + 1])
            ):
                found.append((groups[first][0], end))
    return iter(found)


def _card_grouping(text: str, groups: list[tuple[int, int, str]]) -> bool:
    if len(groups) <= 2:
        return True
    inner = [len(group) for _, _, group in groups[1:-1]]
    if min(inner) >= 3:
        return True
    separators = {text[end:start] for (_, end, _), (start, _, _) in itertools.pairwise(groups)}
    if separators == {" "} and min(inner) >= 2:
        return True  # "4232 33 21 1325 0723"
    return len(separators) == 1 and all(len(group) <= 2 for _, _, group in groups)


def _digits(number: str) -> str:
    return re.sub(r"\D", "", number)


def _valid_prefix(candidate: str) -> int:
    """The length of the longest valid IBAN among the candidate and its prefixes that end at a
    group (0 if none): the pattern may have run on into a following code or word."""
    ends = [
        len(candidate),
        *(i for i in range(len(candidate) - 1, 14, -1) if candidate[i] in " .-"),
    ]
    return next((end for end in ends if iban.is_valid(candidate[:end])), 0)


def _is_nino(candidate: str) -> bool:
    """A UK National Insurance number by HMRC's allocation rules; it has no check digit, and
    python-stdnum has no module for it."""
    compact = candidate.replace(" ", "")
    return (
        compact[0] not in "DFIQUV"
        and compact[1] not in "DFIQUVO"
        and compact[:2] not in _NINO_UNUSED_PREFIXES
    )
