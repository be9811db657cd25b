"""The offline consolidation engine: explicit first-person statements in the user's messages
become profile operations, deterministically, without a language model, a network or a clock.

What it recognises, and what it deliberately does not, is described in docs/offline-engine.md;
the patterns themselves live in ``rules_patterns``.
"""

import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from app.consolidation.rules_patterns import (
    ANY,
    DEADLINE,
    EMPLOYER,
    I_AM,
    LANGUAGES,
    LOCATION,
    NAME,
    NATIVE_LANGUAGE,
    ROLE,
    TIMEZONE,
    Fact,
    clean_value,
    extract_facts,
    phrase_key,
)
from app.consolidation.small_talk import is_small_talk, latin_only
from app.detectors import find
from app.enablement.memory_policy import DEFAULT_ACTIONS, Action
from app.profiles.document import Operation, OpKind, Profile, Section, apply, sanitize_bullet
from app.profiles.profile import strip_topic_prefix, topic_prefix

__all__ = ["TOPIC_MAX_CHARS", "Exchange", "RulesResult", "consolidate_with_rules"]

TOPIC_MAX_CHARS = 100
"""Longest Recent Topics text (without the date prefix)."""

_MAX_CLAUSE_CHARS = 500  # longer "clauses" are prose, not explicit statements; also bounds regexes
MAX_UNREAD_MESSAGE_CHARS = 600
"""The longest message whose unread sentences the engine keeps verbatim: a longer one is a
pasted text, not statements about the user."""


@dataclass(frozen=True)
class Exchange:
    """One turn to consolidate: the user's text, the assistant's answer, and when it happened.

    Only ``user`` is ever a source of facts; ``assistant`` is context for language-model prompts.
    """

    user: str
    assistant: str
    at: datetime

    def __post_init__(self) -> None:
        if self.at.utcoffset() is None:
            raise ValueError("Exchange.at must be timezone-aware")


@dataclass(frozen=True)
class RulesResult:
    """``operations`` apply in order to the profile given to ``consolidate_with_rules``.

    ``forget_requested`` is True when the user asked to forget something (even if nothing in the
    profile matched): the change guard then allows deleting more than its usual share.
    """

    decision: Literal["NOOP", "UPDATE"]
    operations: tuple[Operation, ...]
    forget_requested: bool


@dataclass(frozen=True)
class ForgetRequest:
    """What to delete: every bullet (``everything``); else the bullets of ``slot`` in ``section``
    (only those containing ``phrase`` when one is given); else the bullets containing ``phrase``
    in ``section``, or in every section when ``section`` is None."""

    phrase: str = ""
    section: Section | None = None
    slot: str | None = None
    everything: bool = False


def consolidate_with_rules(
    profile: Profile, exchanges: Sequence[Exchange], *, keep_unread: bool = True
) -> RulesResult:
    """Turn the user's explicit statements in ``exchanges`` into operations on ``profile``.

    Exchanges are processed in order, each against the profile as the previous ones left it, so
    the newest statement of a single-valued fact (role, employer, name, location, timezone,
    native language, spoken languages, answer length, answer language, one answer format, a
    skill's level or years of experience, the deadline) wins: it UPDATEs the slot's bullet.
    An exchange that changed a fact also adds one Recent Topics bullet dated with its own time;
    forget requests alone add none (the topic would repeat what was to be forgotten).
    With ``keep_unread`` (the engine deciding on its own, without a model), each sentence in a
    script it cannot read (``_unread_sentences``) is kept verbatim as an Identity bullet, so a
    fact in another script is not lost; such a bullet adds no Recent Topic (it would repeat
    the sentence). A model-backed consolidation passes False: the model reads those sentences.
    The decision is NOOP, with no operations, when the profile's sections would not change.
    """
    working = profile
    operations: list[Operation] = []
    forget_requested = False
    for exchange in exchanges:
        before, facts_changed = working, False
        for statement in _statements(exchange.user):
            if isinstance(statement, ForgetRequest):
                forget_requested = True
                ops = _forget_operations(working, statement)
            else:
                ops = _fact_operations(working, statement)
                facts_changed = facts_changed or bool(ops)
            if ops:
                working = apply(working, ops, exchange.at)
                operations.extend(ops)
        for sentence in _unread_sentences(exchange.user) if keep_unread else ():
            ops = _fact_operations(working, Fact(Section.IDENTITY, sentence, sentence))
            if ops:
                working = apply(working, ops, exchange.at)
                operations.extend(ops)
        topic = _topic(exchange.user) if facts_changed else None
        if topic and working.sections != before.sections:
            op = Operation(OpKind.ADD, Section.RECENT, text=topic_prefix(exchange.at) + topic)
            working = apply(working, [op], exchange.at)
            operations.append(op)
    if working.sections == profile.sections:
        return RulesResult("NOOP", (), forget_requested)
    return RulesResult("UPDATE", tuple(operations), forget_requested)


# --- reading the user's text ----------------------------------------------------------------------

_CODE = re.compile(r"```.*?(?:```|$)|`[^`\n]*`", re.DOTALL)
_QUOTE_LINE = re.compile(r"^\s*>.*$", re.MULTILINE)  # quoted text is somebody else's words
_SENTENCE_BREAK = re.compile(r"(?<=[.!?…])\s+|(?<=[。！？｡؟।॥])\s*|\s*\n\s*")
"""After `.`, `!`, `?` or `…` and white space; after the full stops and question marks of
Chinese and Japanese, Arabic and Devanagari (`。！？｡؟।॥`), which need none; at a line break."""
_QUESTION_MARKS = "?？؟;\u037e՞¿⸮"
"""Question marks of Latin, full-width, Arabic, Greek (`;` and U+037E) and Armenian writing."""
_STARTS = r"(?=(?:i|i'm|i've|i'll|i'd|my|we|we're|our|please|let's|let us|remind|forget|call me)\b)"
_CLAUSE_BREAK = re.compile(
    rf"\s*;\s*|,?\s+(?:and|but|so|also|plus|while)\s+{_STARTS}|,\s+{_STARTS}", re.IGNORECASE
)
_FILLER = re.compile(
    r"^(?:(?:(?:no|yes|yeah|ok|okay|oh|hey|hi|hello|well|thanks|thank you)[,!:.]|also|and|but|so|"
    r"then|now|actually|btw|by the way|fyi|just so you know|for context|for the record|anyway|"
    r"besides|plus|in fact|to be honest|honestly)[,:]?\s+)+",
    re.IGNORECASE,
)
_SMALL_TALK = re.compile(
    r"(?:hi|hello|hey|thanks|thank you|thx|ok|okay|cool|great|nice|perfect|sure|yes|yeah|no|"
    r"bye|cheers|good (?:morning|afternoon|evening|night))(?:\W+\w+){0,2}\W*",
    re.IGNORECASE,
)


def _sentences(text: str) -> list[str]:
    text = _QUOTE_LINE.sub(" ", _CODE.sub(" ", text.replace("’", "'").replace("‘", "'")))
    return [part.strip() for part in _SENTENCE_BREAK.split(text) if part and part.strip()]


def _clauses(sentence: str) -> Iterator[str]:
    for part in _CLAUSE_BREAK.split(sentence):
        clause = _FILLER.sub("", part.strip(' \t"“”')).rstrip(' .!?…;:,"”')
        if clause and len(clause) <= _MAX_CLAUSE_CHARS:
            yield clause


def _statements(text: str) -> Iterator[Fact | ForgetRequest]:
    """Facts and forget requests in the order the user made them.

    Questions and sentences with sensitive content never yield facts; they can still carry a
    forget request ("could you forget my employer?"), since deleting never stores anything.
    """
    for sentence in _sentences(text):
        factual = not sentence.rstrip(" \"')]”").endswith("?") and not _never_store(sentence)
        for clause in _clauses(sentence):
            forget = _parse_forget(clause)
            if forget is not None:
                yield forget
            elif factual:
                yield from extract_facts(clause)


def _unread_sentences(text: str) -> Iterator[str]:
    """The sentences of `text` the engine keeps verbatim because it cannot read them: in a
    message of at most `MAX_UNREAD_MESSAGE_CHARS`, a sentence with a letter of a script other
    than Latin that yields no fact or forget request, is not a question, not small talk
    (`small_talk`, any listed language) and not caught by the never-store filter."""
    if len(text) > MAX_UNREAD_MESSAGE_CHARS:
        return
    for sentence in _sentences(text):
        if latin_only(sentence) or len(sentence) > _MAX_CLAUSE_CHARS:
            continue
        if sentence.rstrip(" \"')]”»」』").endswith(tuple(_QUESTION_MARKS)):
            continue
        if is_small_talk(sentence) or _never_store(sentence):
            continue
        if not any(True for _ in _statements(sentence)):
            yield sentence


def _topic(text: str) -> str | None:
    """The first sentence that is safe to store, not small talk and not a forget request."""
    for sentence in _sentences(text):
        if _never_store(sentence) or _SMALL_TALK.fullmatch(sentence):
            continue
        if any(_parse_forget(clause) for clause in _clauses(sentence)):
            continue
        topic = sanitize_bullet(sentence)
        if len(topic) > TOPIC_MAX_CHARS:
            cut = topic[: TOPIC_MAX_CHARS - 1]
            space = cut.rfind(" ", TOPIC_MAX_CHARS // 2)
            topic = sanitize_bullet(cut[:space] if space > 0 else cut).rstrip(" ,;:") + "…"
        if topic and not _refused_by_default(topic):
            return topic
    return None


# --- forget requests ------------------------------------------------------------------------------

_SLOT_WORDS: dict[str, tuple[Section, str]] = {
    word: target
    for words, target in (
        ("name", (Section.IDENTITY, NAME)),
        ("job", (Section.IDENTITY, f"(?:{ROLE}|{EMPLOYER})")),
        ("role|job title|title|position|occupation|profession", (Section.IDENTITY, ROLE)),
        ("employer|company|workplace|firm", (Section.IDENTITY, EMPLOYER)),
        ("location|city|country|address|hometown", (Section.IDENTITY, LOCATION)),
        ("timezone|time zone", (Section.IDENTITY, TIMEZONE)),
        ("native language|mother tongue", (Section.IDENTITY, NATIVE_LANGUAGE)),
        ("language|languages", (Section.IDENTITY, f"(?:{NATIVE_LANGUAGE}|{LANGUAGES})")),
        ("deadline", (Section.WORK, DEADLINE)),
        ("preferences", (Section.COMMUNICATION, ANY)),
        ("skills", (Section.SKILLS, ANY)),
    )
    for word in words.split("|")
}
_POLITE = r"(?:(?:can|could|would|will) you )?(?:please )?(?:just )?"
_FORGET_ALL = re.compile(
    _POLITE + r"(?:(?:forget|delete|remove|erase) (?:everything|all) (?:you know )?about me|"
    r"(?:clear|wipe|delete|erase|reset) (?:all of )?(?:my|your) memory(?: (?:of|about) me)?|"
    r"(?:delete|remove|erase) everything from (?:your |my )?memory)",
    re.IGNORECASE,
)
_FORGET = [
    re.compile(_POLITE + pattern, re.IGNORECASE)
    for pattern in (
        r"(?:delete|remove|erase|drop) (?P<v>.+?) from (?:your |my |the )?memory",
        r"forget (?:that |about |the fact that |what i said about )?(?P<v>.+)",
    )
]
_NO_LONGER = re.compile(
    r"(?:i (?:no longer|don't|do not) (?P<verb>work at|work for|live in|use|speak|work on|"
    rf"work as(?: an?| the)?)|{I_AM} (?:no longer|not) (?P<am>an?|the|working on|based in|"
    r"living in|employed at|employed by)) (?P<v>.+?)(?P<end>(?: any ?more| any longer)?)",
    re.IGNORECASE,
)
_NO_LONGER_TARGETS: dict[str, tuple[Section, str | None]] = {
    word: target
    for words, target in (
        ("work at|work for|employed at|employed by", (Section.IDENTITY, EMPLOYER)),
        ("live in|based in|living in", (Section.IDENTITY, LOCATION)),
        ("work as|work as a|work as an|work as the|a|an|the", (Section.IDENTITY, ROLE)),
        ("speak", (Section.IDENTITY, LANGUAGES)),
        ("use", (Section.SKILLS, None)),
        ("work on|working on", (Section.WORK, None)),
    )
    for word in words.split("|")
}


def _parse_forget(clause: str) -> ForgetRequest | None:
    """The forget request a clause makes, if any: "forget (that|about|my) X", "delete X from
    memory", "I no longer work at X", "I'm not a X anymore", "forget everything about me".

    "Forget it" and other requests without an identifiable object are not forget requests.
    """
    if _FORGET_ALL.fullmatch(clause):
        return ForgetRequest(everything=True)
    for pattern in _FORGET:
        match = pattern.fullmatch(clause)
        if match:
            return _forget_object(match["v"])
    match = _NO_LONGER.fullmatch(clause)
    if match is None:
        return None
    if re.search(r"\b(?:not|don't|do not)\b", match[0], re.IGNORECASE) and not match["end"]:
        return None  # "I don't use Excel for this": nothing said to have ended
    section, slot = _NO_LONGER_TARGETS[(match["verb"] or match["am"]).lower()]
    value = phrase_key(clean_value(match["v"], max_words=10))
    return ForgetRequest(value, section, slot) if value else None


def _forget_object(raw: str) -> ForgetRequest | None:
    words = phrase_key(raw)
    if words.startswith("my ") and words.removeprefix("my ") in _SLOT_WORDS:
        section, slot = _SLOT_WORDS[words.removeprefix("my ")]
        return ForgetRequest(section=section, slot=slot)
    facts = extract_facts(raw.strip(" .!"))
    if facts:  # "forget that I work at Acme": the employer bullet naming Acme
        fact = facts[-1]
        return ForgetRequest(phrase_key(fact.value), fact.section, fact.slot)
    value = clean_value(re.sub(r"^(?:my|our|the|a|an)\s+", "", raw.strip(), flags=re.IGNORECASE))
    key = phrase_key(value)
    return ForgetRequest(key) if len(key) >= 3 else None


# --- never stored ---------------------------------------------------------------------------------

_SECRETS = re.compile(
    r"\b(?:pass(?:word|wd|phrase|code)s?|pin(?: code)?|api[ _-]?keys?|secret(?: key)?s?|tokens?|"
    r"access[ _-]keys?|private[ _-]keys?|credentials?|login details|otp)\b|\bsk-[\w-]{6,}|"
    r"\b(?:ghp|gho|github_pat|xox[abp])[_-]\w{6,}|\bAKIA[0-9A-Z]{12,}|\beyJ[\w-]{10,}\.|"
    r"\bbearer\s+\S{8,}",
    re.IGNORECASE,
)
_HEALTH = re.compile(
    r"\b(?:diagnos\w*|illness(?:es)?|ill|sick|diseases?|disorders?|medications?|medicines?|meds|"
    r"prescri\w+|pregnan\w+|diabet\w+|cancer|tumou?rs?|depress(?:ion|ed)|anxiety|adhd|autis\w+|"
    r"hiv|chemo\w*|therap(?:y|ies|ist)|surgery|symptoms?|allerg\w+|asthma|insulin|"
    r"blood pressure|mental health|migraines?|injur(?:y|ies|ed)|disabilit(?:y|ies)|disabled|"
    r"hospital\w*|psychiatr\w+|antidepressants?|rehab)\b",
    re.IGNORECASE,
)
_GOVERNMENT_IDS = re.compile(
    r"\b(?:ssn|social security|passport|national (?:id|identity|insurance)|"
    r"(?:id|identity) (?:card|number)|driver'?s? licen[cs]e|tax (?:id|number)|iban|ahv|"
    r"nhs number|credit card|card number|bank account|account number|routing number|"
    r"sort code)\b|\b\d{3}-\d{2}-\d{4}\b|\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){3,}|(?:\d[ -]?){9,}",
    re.IGNORECASE,
)
_RELATIONS = (
    r"(?:wife|husband|partner|spouse|boyfriend|girlfriend|fianc[eé]e?|boss|manager|colleague|"
    r"co-?worker|teammate|team lead|employee|client|customer|mother(?! tongue)|father|mom|mum|"
    r"dad|parent|son|daughter|kid|child|children|brother|sister|sibling|friend|neighbou?r|roommate|"
    r"flatmate|grandmother|grandfather|uncle|aunt|cousin|doctor|landlord|ex)"
)
_THIRD_PARTY = re.compile(
    rf"\bmy (?:[\w-]+ )?{_RELATIONS}s?(?:'s?\b|(?: \S+){{0,2}}? (?:is|are|was|were|has|have|"
    r"had|works?|worked|lives?|lived|likes?|liked|loves?|hates?|thinks?|said|says|gets?|got|"
    r"suffers?|earns?|makes?|wants?|needs?|does|did|doesn't|can't|won't|will|would|prefers?|"
    r"speaks?|knows?|uses?|studies|studied|moved|just|also|recently)\b| and i\b)",
    re.IGNORECASE,
)


def _never_store(sentence: str) -> bool:
    """Credentials, health data, government ids and facts about third parties are never kept."""
    return any(
        pattern.search(sentence) for pattern in (_SECRETS, _HEALTH, _GOVERNMENT_IDS, _THIRD_PARTY)
    )


def _refused_by_default(bullet: str) -> bool:
    """Whether the memory policy gate would drop `bullet` under the default policy (a secret, a
    card, an account, a national id, an instruction to the assistant). The gate still decides
    with the company's policy; the engine only avoids proposing what it would refuse."""
    return any(DEFAULT_ACTIONS[finding.category] is Action.DROP for finding in find(bullet))


# --- facts and forget requests → operations -------------------------------------------------------


def _fold(text: str) -> str:
    return " ".join(sanitize_bullet(text).casefold().split()).rstrip(".")


def _fact_operations(profile: Profile, fact: Fact) -> list[Operation]:
    """ADD a new fact; for a slot, UPDATE its bullet and DELETE any second, contradicting one."""
    text = sanitize_bullet(fact.text)
    bullets = profile.bullets(fact.section)
    if not text or _refused_by_default(text):
        return []
    slotted = [b for b in bullets if fact.slot is not None and re.match(fact.slot, _fold(b))]
    same = [b for b in bullets if _fold(b) == _fold(text)]
    if same:  # already known; any other bullet of the slot contradicts it
        return [Operation(OpKind.DELETE, fact.section, target=b) for b in slotted if b not in same]
    if not slotted:
        return [Operation(OpKind.ADD, fact.section, text=text)]
    first, *others = slotted
    update = Operation(OpKind.UPDATE, fact.section, text=text, target=first)
    return [update, *(Operation(OpKind.DELETE, fact.section, target=b) for b in others)]


_FILLER_WORDS = frozenset({"a", "an", "the", "my", "their", "our", "of", "about", "to", "and"})


def _contains(key: str, phrase: str) -> bool:
    """Whether a bullet's phrase key mentions ``phrase``: as a word sequence, or every word of
    it that is not a filler ("the IFRS report" matches "Working on the quarterly IFRS report")."""
    words = set(phrase.split()) - _FILLER_WORDS
    return bool(words) and (f" {phrase} " in f" {key} " or words <= set(key.split()))


def _forget_operations(profile: Profile, request: ForgetRequest) -> list[Operation]:
    """DELETE what the request names, and the Recent Topics bullets that mention it."""
    doomed: list[tuple[Section, str]] = []
    echoes = [request.phrase] if request.phrase else []
    for section, bullets in profile.sections:
        for bullet in bullets:
            key = phrase_key(strip_topic_prefix(bullet))
            if request.everything:
                hit = True
            elif request.section is None:
                hit = _contains(key, request.phrase)
            else:
                slot = re.match(request.slot, _fold(bullet)) if request.slot is not None else None
                hit = section is request.section and (request.slot is None or slot is not None)
                hit = hit and (not request.phrase or _contains(key, request.phrase))
                if hit and slot is not None and not request.phrase:
                    echoes.append(phrase_key(_fold(bullet)[slot.end() :]))
            if hit:
                doomed.append((section, bullet))
    for bullet in profile.bullets(Section.RECENT):
        key = phrase_key(strip_topic_prefix(bullet))
        mentioned = any(len(echo) >= 3 and _contains(key, echo) for echo in echoes)
        if mentioned and (Section.RECENT, bullet) not in doomed:
            doomed.append((Section.RECENT, bullet))
    return [Operation(OpKind.DELETE, section, target=bullet) for section, bullet in doomed]
