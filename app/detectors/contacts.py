"""E-mail addresses and phone numbers.

Phone numbers are phonenumbers' matches at `VALID` leniency (a number valid for its region, in
any grouping). Without a region the matcher reads international numbers only (`+41 44 668 18
00`; `0041 44 668 18 00` too). A national-format number (`044 668 18 00`) cannot be told from an
order number or a reference without knowing the caller's country, so it is only looked for when
the text names a phone ("phone", "mobile", "call me", "reach me", "my number", "Telefon", "Handy",
"Natel", "meine Nummer", "ruf mich an", "erreichbar unter", ...), and then as a number valid in
one of `NATIONAL_REGIONS`. "Number" alone does not name a phone: "my order number is 12345678"
and "ticket number 0446681800" are not read as national numbers.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Final

import phonenumbers

from app.detectors.findings import Category, Finding

# A strict address: an RFC 5322 dot-atom local part (no quoted strings, comments or IP
# literals), "@", one to ten DNS labels (letters, digits, inner hyphens) and a letters-only
# top-level domain. Not preceded by a local-part character and not followed by more of a domain
# name, so a match is a whole address. Every repetition is bounded and separated by a literal.
_ATOM: Final = r"[\w!#$%&'*+/=?^`{|}~-]{1,64}"
_EMAIL = re.compile(
    rf"(?<![\w.!#$%&'*+/=?^`{{|}}~-]){_ATOM}(?:\.{_ATOM}){{0,10}}"
    r"@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.){1,10}[A-Za-z]{2,63}"
    r"(?![\w-]|\.[A-Za-z0-9]|:[\w.~-]+/)",  # not a Git remote (git@host:owner/repo)
)

_PHONE_WORDS = re.compile(
    r"\b(?:phone|telephone|tel|mobile|cell|cellphone|landline|fax|whatsapp|signal|sms|text me|"
    r"call(?:ed)? (?:me|us)\b|call(?:ed)? (?:them |him |her )?(?:at|on|under)|ring me|"
    r"reach(?:able)? (?:me|us)\b|reach(?:able)? (?:them |him |her )?(?:at|on|under)|"
    r"contact me (?:at|on|under)|"
    r"(?:my|our|his|her|their) (?:(?:new|old|private|personal|work|office|home|direct|business|"
    r"contact|swiss|german|austrian|us|uk) )?number|"
    r"telefon\w*|handy\w*|natel\w*|mobil\w*|rufnummer|festnetz\w*|erreichbar|"
    r"ruf(?:e|t)? (?:mich|uns)|anrufen|erreichst du mich|"
    r"(?:meine|unsere|seine|ihre) (?:(?:neue|alte|private|geschäftliche|direkte) )?nummer|"
    r"unter der nummer)\b",
    re.IGNORECASE,
)
_INTERNATIONAL_00 = re.compile(r"(?<![\d+])00[1-9]")
NATIONAL_REGIONS: Final = ("CH", "DE", "AT", "FR", "IT", "GB", "US")
"""The regions a national-format number is read in, where the text names a phone."""


def find_contacts(text: str) -> Iterator[Finding]:
    for match in _EMAIL.finditer(text):
        yield Finding(Category.EMAIL_ADDRESSES, "email", match.start(), match.end())
    named = _PHONE_WORDS.search(text) is not None
    for region in (None, *NATIONAL_REGIONS) if named else (None,):
        yield from _numbers(text, region, international_only=False)
    if not named and _INTERNATIONAL_00.search(text):
        # "0041 44 668 18 00" is international too, dialled from a country whose prefix is 00.
        yield from _numbers(text, "CH", international_only=True)


def _numbers(text: str, region: str | None, *, international_only: bool) -> Iterator[Finding]:
    for number in phonenumbers.PhoneNumberMatcher(text, region, phonenumbers.Leniency.VALID):
        if not international_only or number.raw_string.startswith("00"):
            yield Finding(Category.PHONE_NUMBERS, "phone", number.start, number.end)
