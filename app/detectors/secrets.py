"""Secrets in a line of prose: API keys and tokens, private keys, credentials in connection
strings, passwords stated as such, and long random-looking tokens.

detect-secrets' plugins are instantiated here with fixed arguments and asked only for the values
their patterns match (`analyze_string`): `analyze_line` and `scan_line` would consult the
library's global settings (which plugins and filters are on, whether to verify a key over the
network), and its keyword plugin looks for assignments in source code, not for sentences.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Final

from detect_secrets.plugins.aws import AWSKeyDetector
from detect_secrets.plugins.base import BasePlugin
from detect_secrets.plugins.github_token import GitHubTokenDetector
from detect_secrets.plugins.gitlab_token import GitLabTokenDetector
from detect_secrets.plugins.high_entropy_strings import (
    Base64HighEntropyString,
    HexHighEntropyString,
)
from detect_secrets.plugins.jwt import JwtTokenDetector
from detect_secrets.plugins.openai import OpenAIDetector
from detect_secrets.plugins.private_key import PrivateKeyDetector
from detect_secrets.plugins.slack import SlackDetector
from detect_secrets.plugins.stripe import StripeDetector

from app.detectors.findings import Category, Finding

HIGH_ENTROPY: Final = "high-entropy-string"

_PLUGINS: Final[tuple[tuple[BasePlugin, str], ...]] = (
    (AWSKeyDetector(), "aws-access-key"),
    (GitHubTokenDetector(), "github-token"),
    (GitLabTokenDetector(), "gitlab-token"),
    (SlackDetector(), "slack-token"),
    (StripeDetector(), "stripe-key"),
    (OpenAIDetector(), "openai-key"),
    (JwtTokenDetector(), "jwt"),
    (PrivateKeyDetector(), "private-key"),
)
# detect-secrets' default entropy limits; the plugins' own pattern only reads quoted strings,
# so the tokens are cut out here and only the entropy is measured by the plugin.
_BASE64 = Base64HighEntropyString(limit=4.5)
_HEX = HexHighEntropyString(limit=3.0)

# A token of the base64 alphabet long enough to be a key (a 24-character string cannot exceed
# the 4.5 bits limit anyway). `.` splits tokens, so dotted names and domains are measured by
# their parts. A token with `/` (AWS secret keys have them) counts only outside a URL or a path
# and when it mixes upper and lower case.
_LONG_TOKEN = re.compile(r"(?<![\w+=/.-])[A-Za-z0-9+/_=-]{24,512}(?![\w+=/-]|\.\w)")
_HEX_TOKEN = re.compile(r"(?<![0-9A-Za-z])[0-9a-fA-F]{32,512}(?![0-9A-Za-z])")

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

# A password stated as such: a password word (optionally "for <thing>"), then ":"/"=" or a
# copula ("is", "ist", "lautet"), then the value, one token.
_PASSWORD = re.compile(
    r"\b(?:pass(?:word|wd|phrase|code)|passwort|kennwort|pw|pwd|pin(?:[ -]?code)?)s?\b"
    r"(?:\s+(?:for|of|to|für|von|zu[mr]?)\s+(?:the\s+|my\s+|their\s+|den\s+|das\s+|die\s+)?"
    r"[\w.@-]{1,60})?"
    r"(?P<sep>\s*[:=]\s*|\s+(?:is|was|are|ist|war|lautet|lauten)\s*:?\s+)"
    r"(?P<value>[\"'“„‚]?[^\s\"'”“]{1,100}[\"'”“‘]?)",
    re.IGNORECASE,
)
# A word after "password is" that makes the sentence about a password instead of stating one
# ("the password is stored in Vault", "Das Passwort ist abgelaufen").
_NOT_A_PASSWORD = re.compile(
    r"(?:[a-zäöü]{2,}(?:ed|en|ert|iert|lich|ig|bar|ing)|a|an|the|not|no|too|very|still|now|also|"
    r"in|on|at|for|from|with|by|set|kept|reset|required|needed|missing|wrong|weak|strong|long|"
    r"short|secret|secure|unknown|ein|eine|einen|der|die|das|nicht|kein|keine|zu|sehr|noch|"
    r"jetzt|auch|im|am|bei|mit|falsch|sicher|unsicher|nötig|notwendig|korrekt)[.,;:!?]?",
    re.IGNORECASE,
)


def find_secrets(text: str) -> Iterator[Finding]:
    for plugin, kind in _PLUGINS:
        for value in set(plugin.analyze_string(text)):
            yield from _occurrences(text, value, kind)
    for match in _PEM_BLOCK.finditer(text):
        yield Finding(Category.SECRETS, "private-key", match.start(), match.end())
    for match in _CREDENTIAL_URL.finditer(text):
        yield Finding(Category.SECRETS, "connection-string", match.start(), match.end())
    for match in _PASSWORD.finditer(text):
        stated = match["sep"].strip() in (":", "=")
        if stated or not _NOT_A_PASSWORD.fullmatch(match["value"]):
            yield Finding(Category.SECRETS, "password", match.start("value"), match.end())
    for match in _LONG_TOKEN.finditer(text):
        if _random_looking(text, match):
            yield Finding(Category.SECRETS, HIGH_ENTROPY, match.start(), match.end())
    for match in _HEX_TOKEN.finditer(text):
        if _HEX.calculate_shannon_entropy(match[0]) > _HEX.entropy_limit:
            yield Finding(Category.SECRETS, HIGH_ENTROPY, match.start(), match.end())


def _random_looking(text: str, match: re.Match[str]) -> bool:
    token = match[0]
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
    return _BASE64.calculate_shannon_entropy(token) > _BASE64.entropy_limit


def _occurrences(text: str, value: str, kind: str) -> Iterator[Finding]:
    """Where a plugin's value occurs, each extended to the end of its token."""
    start = text.find(value) if value else -1
    while start >= 0:
        end = _TOKEN_TAIL.match(text, start + len(value))
        yield Finding(Category.SECRETS, kind, start, end.end() if end else start + len(value))
        start = text.find(value, start + len(value))
