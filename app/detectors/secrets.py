"""Secrets in a line of prose: API keys and tokens, private keys, credentials in connection
strings, passwords, tokens and keys stated as such, user/password pairs, and long random-looking
tokens.

detect-secrets' plugins are instantiated here with fixed arguments and asked only for the values
their patterns match (`analyze_string`): `analyze_line` and `scan_line` would consult the
library's global settings (which plugins and filters are on, whether to verify a key over the
network), and its keyword plugin looks for assignments in source code, not for sentences.

A password is found where a sentence states one: "My password is …", "The wifi password at home
is …", "Das Passwort für das HR-Portal lautet …", "Passwort: …", "my pw hunter2", "Login for the
admin panel: admin / …", "user admin pass …". A token or key stated as such ("My Jira API token
is …") counts when its value looks like one (letters and digits interleaved). Sentences about a
password or a key pass: "The password is stored in Vault", "Das Passwort ist abgelaufen",
"Password manager: Bitwarden", "My password manager is Bitwarden", "Login: SSO / Okta", "The key
is to stay calm", "Project key: PAY-1234", "API key rotation every 90 days".
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Final

from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.base import BasePlugin
from detect_secrets.plugins.discord import DiscordBotTokenDetector
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.high_entropy_strings import (
    Base64HighEntropyString,
    HexHighEntropyString,
)
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.mailchimp import MailchimpDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.pypi_token import PypiTokenDetector
from detect_secrets.plugins.sendgrid import SendGridDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.square_oauth import SquareOAuthDetector
from detect_secrets.plugins.stripe import StripeDetector
from detect_secrets.plugins.telegram_token import TelegramBotTokenDetector
from detect_secrets.plugins.twilio import TwilioKeyDetector

from app.detectors.findings import Category, Finding

HIGH_ENTROPY: Final = "high-entropy-string"
GENERIC_KINDS: Final = ("password", HIGH_ENTROPY, "token")
"""The kinds of the own patterns, least specific last: where findings of the same length
overlap, an issuer's key is reported before a password, a password before a high-entropy
string, and that before a token merely named as one."""

_PLUGINS: Final[tuple[tuple[BasePlugin, str], ...]] = (
    (AWSKeyDetector(), "aws-access-key"),
    (GitHubTokenDetector(), "github-token"),
    (GitLabTokenDetector(), "gitlab-token"),
    (SlackDetector(), "slack-token"),
    (StripeDetector(), "stripe-key"),
    (OpenAIDetector(), "openai-key"),
    (SendGridDetector(), "sendgrid-key"),
    (TwilioKeyDetector(), "twilio-key"),
    (MailchimpDetector(), "mailchimp-key"),
    (SquareOAuthDetector(), "square-key"),
    (PypiTokenDetector(), "pypi-token"),
    (TelegramBotTokenDetector(), "telegram-token"),
    (DiscordBotTokenDetector(), "discord-token"),
    (JwtTokenDetector(), "jwt"),
    (PrivateKeyDetector(), "private-key"),
)
# detect-secrets' default entropy limits; the plugins' own pattern only reads quoted strings,
# so the tokens are cut out here and only the entropy is measured by the plugin.
_BASE64 = Base64HighEntropyString(limit=4.5)
_HEX = HexHighEntropyString(limit=3.0)

# A token of the base64 alphabet long enough to be a key (a 24-character string cannot exceed
# the 4.5 bits limit anyway), possibly in parts joined by `.` (`SG.<22>.<43>`, `<id>.<secret>`).
# A dotted token counts when one of its parts does, or when the parts together do and mix upper
# and lower case (dotted names, domains and versions are lower case or far below the limit). A
# token with `/` (AWS secret keys have them) counts only outside a URL or a path and when it
# mixes upper and lower case.
_LONG_TOKEN = re.compile(
    r"(?<![\w+=/.-])[A-Za-z0-9+/_=-]{1,512}(?:\.[A-Za-z0-9+/_=-]{1,512}){0,8}(?![\w+=/-])"
)
_MIN_TOKEN: Final = 24
_HEX_TOKEN = re.compile(r"(?<![0-9A-Za-z])[0-9a-fA-F]{32,512}(?![0-9A-Za-z])")

# An AWS access key id written in groups ("AKIA IOSF ODNN 7EXA MPLE"); undivided, the plugin
# finds it.
_SPLIT_AWS_KEY = re.compile(
    r"(?<![A-Za-z0-9])(?:AKIA|ASIA|ABIA|ACCA)(?:[ ._-]?[A-Z0-9]){16}(?![A-Za-z0-9])"
)

# Where a plugin's match ends early (the JWT pattern leaves out the signature).
_TOKEN_TAIL = re.compile(r"[\w+/=.-]*[\w+/=-]")

# A private key from its header to its footer, or to the end of the text when cut off.
_PEM_BLOCK = re.compile(
    r"-{2,5}\s?BEGIN (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?\s?-{0,5}"
    r"(?:.*?END (?:[A-Z0-9]+ ){0,3}PRIVATE KEY(?: BLOCK)?\s?-{0,5}|.*)",
    re.DOTALL,
)

# "<scheme>://user:password@host...": the whole URL is the secret (with the user name).
_CREDENTIAL_URL = re.compile(
    r"\b[A-Za-z][A-Za-z0-9+.-]{1,30}://[^\s/@:]{1,200}:[^\s/@]{1,200}@[^\s]{1,300}"
)

_CREDENTIAL_WORD: Final = (
    r"(?:pass(?:word|wd|phrase|code)|passwort|passwörter|kennwort|kennwörter|pw|pwd|"
    r"pin(?:[ -]?(?:code|nummer))?|geheimzahl|zugangscode)"
)
# What may stand between the password (or key) word and "is": a short phrase opened by a
# preposition ("for the HR portal", "at home", "für das HR-Portal"), at most five words.
_QUALIFIER: Final = (
    r"(?:\s+(?:for|of|to|at|on|in|from|with|für|fürs|von|vom|zu[mr]?|bei|beim|im|am|auf|an|ins)"
    r"\s+(?:[\w.@&/+'-]{1,40}\s+){0,4}?[\w.@&/+'-]{1,40})?"
)
_COPULA: Final = r"(?P<sep>\s*[:=]\s*|\s+(?:is|was|are|ist|war|lautet|lauten)\s*:?\s+)"
# The value: a quoted phrase, or one token without the sentence's closing punctuation.
_VALUE: Final = (
    r"(?P<value>[\"“„‚'‘][^\"“”„‚'‘’\n]{1,100}[\"”“’'‘]"
    r"|[^\s\"'”“]{1,100}?(?=[.,;:)]*(?:\s|$)))"
)
# A password stated as such: a password word (optionally qualified), then ":"/"=" or a copula
# ("is", "ist", "lautet"), then the value.
_PASSWORD = re.compile(
    r"\b" + _CREDENTIAL_WORD + r"s?\b" + _QUALIFIER + _COPULA + _VALUE, re.IGNORECASE
)
# "my pw hunter2", "Unser WLAN-Passwort Sommer2024!": a possessive password word and the value
# right after it, which must look like a credential (see `_credential_like`).
_BARE_PASSWORD = re.compile(
    r"\b(?:my|our|the|his|her|their|mein|meine|unser|unsere|das|die|sein|ihr)\s+"
    r"(?:[\w]{1,30}[ -])?(?P<word>" + _CREDENTIAL_WORD + r")\s+" + _VALUE,
    re.IGNORECASE,
)
# A token or key stated as such: "My Jira API token is …", "API key: …", "Der Schlüssel lautet
# …", "Token …"; the value must look like a credential, so "the key is to stay calm", "Project key:
# PAY-1234" and "API key rotation" pass.
_STATED_KEY = re.compile(
    r"\b(?:api[ _-]?|access[ _-]|secret[ _-]|client[ _-]|auth[ _-]|bearer[ _-]|"
    r"personal[ _-]access[ _-]|zugangs-?)?(?:tokens?|keys?|secrets?|schlüssel)\b"
    + _QUALIFIER
    + r"(?:"
    + _COPULA
    + r"|\s+)"
    + _VALUE,
    re.IGNORECASE,
)
# A user/password pair: "Login for the admin panel: admin / Geheim123!Panel", "Zugangsdaten:
# redakteur / …", "user admin pass hunter2".
_CREDENTIAL_PAIRS: Final = (
    re.compile(
        r"\b(?:log-?ins?|sign-?ins?|credentials?|creds|accounts?|zugangsdaten|zugang|anmeldung|"
        r"anmeldedaten|login-?daten)\b[^:\n]{0,60}?:\s*[^\s/:]{1,64}\s*/\s*" + _VALUE,
        re.IGNORECASE,
    ),
    re.compile(
        r"\b(?:user(?:name)?|login|benutzer(?:name)?|nutzer(?:name)?|account)\s*[:=]?\s*"
        r"[^\s,;/:=]{1,64}\s*[,;/]?\s*(?:and\s+|und\s+)?(?:pass(?:word)?|pw|pwd|passwort|"
        r"kennwort)\s*[:=]?\s*" + _VALUE,
        re.IGNORECASE,
    ),
)
# A word after "password is" that makes the sentence about a password instead of stating one
# ("the password is stored in Vault", "Das Passwort ist abgelaufen").
_NOT_A_PASSWORD = re.compile(
    r"(?:[a-zäöü]{2,}(?:ed|en|ert|iert|lich|ig|bar|ing)|a|an|the|not|no|too|very|still|now|also|"
    r"in|on|at|for|from|with|by|set|kept|reset|required|needed|missing|wrong|weak|strong|long|"
    r"short|secret|secure|unknown|ein|eine|einen|der|die|das|nicht|kein|keine|zu|sehr|noch|"
    r"jetzt|auch|im|am|bei|mit|falsch|sicher|unsicher|nötig|notwendig|korrekt|my|your|his|her|"
    r"its|our|their|mein|meine|dein|deine|sein|seine|ihr|ihre|unser|unsere|same|different|"
    r"empty|blank|easy|simple|hard|complex|valid|invalid|unique|case-sensitive|there|here|"
    r"somewhere|what|which|that|this|it|something|nothing|only|just|gleich|leer|einfach|schwer|"
    r"gültig|ungültig|dort|hier|irgendwo|was|es|etwas|nichts|nur)[.,;:!?]?",
    re.IGNORECASE,
)
_SYMBOLS: Final = frozenset("!#$%&*+=?@^~§|\\")
_LETTER_DIGIT = re.compile(r"(?<=[^\W\d_])(?=\d)|(?<=\d)(?=[^\W\d_])")


def find_secrets(text: str) -> Iterator[Finding]:
    for match in _SPLIT_AWS_KEY.finditer(text):
        yield Finding(Category.SECRETS, "aws-access-key", match.start(), match.end())
    for plugin, kind in _PLUGINS:
        for value in set(plugin.analyze_string(text)):
            yield from _occurrences(text, value, kind)
    for match in _PEM_BLOCK.finditer(text):
        yield Finding(Category.SECRETS, "private-key", match.start(), match.end())
    for match in _CREDENTIAL_URL.finditer(text):
        yield Finding(Category.SECRETS, "connection-string", match.start(), match.end())
    for match in _PASSWORD.finditer(text):
        stated = match["sep"].strip() in (":", "=")
        value = match["value"]
        if stated or value[0] in "\"“„‚'‘" or not _NOT_A_PASSWORD.fullmatch(value):
            yield Finding(Category.SECRETS, "password", match.start("value"), match.end())
    for match in _BARE_PASSWORD.finditer(text):
        value = match["value"]
        pin = match["word"].casefold().startswith(("pin", "geheimzahl"))
        if _credential_like(value) or (pin and re.fullmatch(r"\d{4,8}", value)):
            yield Finding(Category.SECRETS, "password", match.start("value"), match.end())
    for pattern in _CREDENTIAL_PAIRS:
        for match in pattern.finditer(text):
            if _credential_like(match["value"]):
                yield Finding(Category.SECRETS, "password", match.start("value"), match.end())
    for match in _STATED_KEY.finditer(text):
        if _key_like(match["value"]):
            yield Finding(Category.SECRETS, "token", match.start("value"), match.end())
    for match in _LONG_TOKEN.finditer(text):
        if _random_looking(text, match):
            yield Finding(Category.SECRETS, HIGH_ENTROPY, match.start(), match.end())
    for match in _HEX_TOKEN.finditer(text):
        if _HEX.calculate_shannon_entropy(match[0]) > _HEX.entropy_limit:
            yield Finding(Category.SECRETS, HIGH_ENTROPY, match.start(), match.end())


def _credential_like(value: str) -> bool:
    """Whether a value said to be a password looks like one rather than like a word: letters
    with digits or symbols ("hunter2", "Geheim123!Panel"), not a word with a leading number
    ("1Password")."""
    value = value.strip("\"“”„‚'‘’")
    if len(value) < 5 or any(c.isspace() for c in value):
        return False
    letters = any(c.isalpha() for c in value)
    others = any(c.isdigit() or c in _SYMBOLS for c in value)
    return letters and others and not re.fullmatch(r"\d{1,3}[A-Za-z][a-z]+", value)


def _key_like(value: str) -> bool:
    """Whether a value said to be a token or key looks like one: at least 8 characters, no
    spaces, a letter next to a digit (or the reverse) at least three times ("ATATT3xK9fQ2mZ7p"),
    so that ids ("PAY-1234", "ACME-2026-Q3"), versions ("v2.14.3") and words pass."""
    value = value.strip("\"“”„‚'‘’")
    if len(value) < 8 or any(c.isspace() for c in value):
        return False
    return len(_LETTER_DIGIT.findall(value)) >= 3


def _random_looking(text: str, match: re.Match[str]) -> bool:
    token = match[0]
    if len(token) < _MIN_TOKEN:
        return False
    if not (any(c.isdigit() for c in token) and any(c.isalpha() for c in token)):
        return False  # identifiers and numbers are not keys, however long
    if "/" in token:
        start = match.start()
        while start > 0 and not text[start - 1].isspace():
            start -= 1
        word = text[start : match.end()]
        if "://" in word or "www." in word or word.startswith(("/", "~", ".")):
            return False  # a URL or a path
        if token.islower() or token.isupper():
            return False
    parts = token.split(".")
    if len(parts) > 1:
        if any(len(part) >= _MIN_TOKEN and _high_entropy(part) for part in parts):
            return True
        joined = "".join(parts)
        return not (joined.islower() or joined.isupper()) and _high_entropy(joined)
    return _high_entropy(token)


def _high_entropy(token: str) -> bool:
    return _BASE64.calculate_shannon_entropy(token) > _BASE64.entropy_limit


def _occurrences(text: str, value: str, kind: str) -> Iterator[Finding]:
    """Where a plugin's value occurs, each extended to the end of its token."""
    start = text.find(value) if value else -1
    while start >= 0:
        end = _TOKEN_TAIL.match(text, start + len(value))
        yield Finding(Category.SECRETS, kind, start, end.end() if end else start + len(value))
        start = text.find(value, start + len(value))
