"""The offline engine's fact patterns: one clause of a user's message → the facts it states.

Every pattern is anchored at the start of a clause and written in the first person, so only what
the user explicitly says about themself is recognised. Values keep the user's spelling; first-person
words inside them become third-person ("my thesis" → "their thesis").
"""

import re
from collections.abc import Callable
from dataclasses import dataclass

from app.profiles.document import Section

__all__ = [
    "ANY",
    "DEADLINE",
    "EMPLOYER",
    "I_AM",
    "LANGUAGES",
    "LOCATION",
    "NAME",
    "NATIVE_LANGUAGE",
    "ROLE",
    "TIMEZONE",
    "Fact",
    "clean_value",
    "extract_facts",
    "phrase_key",
]


@dataclass(frozen=True)
class Fact:
    """A candidate bullet. ``slot`` (a regex matched at the start of the casefolded bullet) marks
    a single-valued kind: its section holds at most one matching bullet, and a new fact of the
    kind replaces it. ``value`` is what a forget request for the fact has to name."""

    section: Section
    text: str
    value: str
    slot: str | None = None


# --- slots and value helpers ----------------------------------------------------------------------

NAME, ROLE, EMPLOYER = r"name:", r"works as\b", r"works (?:at|for)\b"
LOCATION, TIMEZONE = r"based in\b", r"timezone:"
NATIVE_LANGUAGE, LANGUAGES = r"native language:", r"speaks\b"
ANSWER_LENGTH, ANSWER_LANGUAGE = r"prefers (?:concise|detailed) answers\b", r"prefers answers in\b"
DEADLINE, ANY = r"deadline:", ""
_LEVELS = (
    "beginner|novice|new|intermediate|advanced|expert|proficient|experienced|fluent|skilled|"
    "competent|comfortable|familiar|good|very good|strong"
)

_VAGUE = re.compile(
    r"(?:it|this|that|these|those|something|anything|nothing|everything|stuff|things|them|one|"
    r"what|how|why|who|whom|where|when|if|whether|you|right|about|exactly|him|her|so|too|of|"
    r"i|we|they|he|she|your|yours|some|someone|somebody|people|nobody|all)",
    re.IGNORECASE,
)
_TRAILING_TIME = re.compile(
    r"\s+(?:now|currently|these days|anymore|any more|any longer|again|as well|too|since\b.*|"
    r"for the (?:past|last)\b.*|"
    r"for (?:\d+|a|an|one|two|three|many|several) (?:years?|months?)\b.*)$",
    re.IGNORECASE,
)
_STRIP = " \"'“”‘’()[],;:.!…"
_PRONOUNS: tuple[tuple[str, str], ...] = (
    (r"\bI'm\b", "they're"), (r"\bI am\b", "they are"), (r"\bI've\b", "they've"),
    (r"\bI'll\b", "they'll"), (r"\bI\b", "they"), (r"\b[Mm]yself\b", "themselves"),
    (r"\bmy\b", "their"), (r"\bMy\b", "Their"), (r"\bmine\b", "theirs"), (r"\bour\b", "their"),
    (r"\bOur\b", "Their"), (r"\bme\b", "them"), (r"\bus\b", "them"), (r"\bwe\b", "they"),
)  # fmt: skip


def to_third_person(text: str) -> str:
    """First-person words of the user's text, rewritten to the third person."""
    for pattern, replacement in _PRONOUNS:
        text = re.sub(pattern, replacement, text)
    return text


def phrase_key(text: str) -> str:
    """Casefolded words separated by single spaces: the form forget requests match on."""
    return " ".join(re.findall(r"\w+", text.casefold()))


def clean_value(
    raw: str | None, *, cut: str = "", max_words: int = 15, capital: bool = False
) -> str:
    """The cleaned, third-person value of a capture, or "" when it is vague or implausible."""
    value = (raw or "").strip()
    if cut:
        value = re.split(cut, value, maxsplit=1, flags=re.IGNORECASE)[0]
    value = _TRAILING_TIME.sub("", value.strip(_STRIP)).strip(_STRIP)
    words = value.split()
    if not words or len(words) > max_words or _VAGUE.fullmatch(words[0]):
        return ""
    if capital and not value[0].isupper():
        return ""
    return to_third_person(" ".join(words))


def _plural(word: str) -> str:
    """A regex for ``word`` in its singular or plural form."""
    if word.endswith("ies"):
        return re.escape(word[:-3]) + "(?:y|ies)"
    if word.endswith("y") and not word.endswith(("ay", "ey", "oy", "uy")):
        return re.escape(word[:-1]) + "(?:y|ies)"
    return re.escape(word.removesuffix("s")) + "s?"


# --- fact patterns, tried in order; the first that yields a fact wins -----------------------------

Builder = Callable[[re.Match[str]], list[Fact]]
_RULES: list[tuple[re.Pattern[str], Builder]] = []
I_AM = r"i(?:'m| am)(?: (?:currently|now|still|also|actually|really))?"
_ROLE_CUT = r"\s+(?:at|for|with|in|based|from|who|and|since|where|working)\s+|,"
_EMPLOYER_CUT = r"\s+(?:as|in|since|where|and|which|who)\s+|,"
_PLACE_CUT = r"\s+(?:and|since|with|where|because|but|for)\s+|,"
_NOT_A_ROLE = re.compile(
    r"(?:bit|little|lot|fan|big|huge|bad|good|great|quick|fast|slow|total|complete|real|person|"
    r"morning|night|human|man|woman|guy|girl|boy|mess|idiot|fool|genius|one|only|best|worst|"
    r"first|last|same|to)",
    re.IGNORECASE,
)
_NOT_AN_EMPLOYER = re.compile(
    r"(?:home|nights?|weekends?|the moment|the weekend|myself|free|fun|remotely|part-time)\b",
    re.IGNORECASE,
)
_FORMAT = (
    r"(?:(?:concrete|practical|real-world|numbered|bulleted|code|short|more) )?"
    r"(?:tables?|bullet points?|bullets|lists?|examples?|samples?|diagrams?|emojis?|"
    r"headings?|headers?|markdown|jargon|abbreviations?|analogies|analogy|formulas?|"
    r"citations?|sources|summaries|summary)"
)
_DEICTIC = re.compile(r"\b(?:this|that|these|those|it|above|below|here)\b", re.IGNORECASE)
_LATER = re.compile(
    r"\b(?:later|tomorrow|next|another time|some ?time|at some point|soon|after|"
    r"on (?:mon|tues|wednes|thurs|fri|satur|sun)day|"
    r"in (?:a|an|one|two|three|\d+) (?:days?|weeks?|months?))\b",
    re.IGNORECASE,
)
_NUMBER = r"\d+|one|two|three|four|five|six|seven|eight|nine|ten|fifteen|twenty|a few|several"


def _rule(*patterns: str) -> Callable[[Builder], Builder]:
    def register(builder: Builder) -> Builder:
        _RULES.extend((re.compile(p, re.IGNORECASE), builder) for p in patterns)
        return builder

    return register


def _fact(section: Section, template: str, value: str, slot: str | None = None) -> list[Fact]:
    if not value:
        return []
    text = template.format(value)
    return [Fact(section, text[0].upper() + text[1:], value, slot)]


@_rule(r"(?:my name is|my name's|i'm called|i am called|(?:please |you can )?call me) (?P<v>.+)")
def _name(m: re.Match[str]) -> list[Fact]:
    value = clean_value(m["v"], cut=r",|\s+(?:and|but|because)\s+", max_words=4, capital=True)
    return _fact(Section.IDENTITY, "Name: {}.", value, NAME)


@_rule(
    r"my (?:native language|mother tongue|first language) is (?P<v>.+)",
    rf"{I_AM} a native (?P<v>\S+(?: \S+)?) speaker(?: .*)?",
)
def _native_language(m: re.Match[str]) -> list[Fact]:
    value = clean_value(m["v"], cut=_PLACE_CUT, max_words=3, capital=True)
    return _fact(Section.IDENTITY, "Native language: {}.", value, NATIVE_LANGUAGE)


@_rule(r"i speak (?:(?:fluent|native|some|basic) )?(?P<v>.+)")
def _speaks(m: re.Match[str]) -> list[Fact]:
    # Capitalised only: "I speak German" is a language, "I speak to clients daily" is not.
    value = clean_value(
        m["v"], cut=r",?\s+(?:but|with|at|because|to)\s+", max_words=6, capital=True
    )
    return _fact(Section.IDENTITY, "Speaks {}.", value, LANGUAGES)


@_rule(r"my time ?zone is (?P<v>.+)", rf"{I_AM} in (?:the )?(?P<v>.+?) time ?zone")
def _timezone(m: re.Match[str]) -> list[Fact]:
    value = clean_value(m["v"], cut=_PLACE_CUT, max_words=5)
    return _fact(Section.IDENTITY, "Timezone: {}.", value, TIMEZONE)


@_rule(
    r"i (?:currently |now |still )?live in (?P<v>.+)",
    rf"{I_AM} (?:based|located|living) in (?P<v>.+)",
    r"i (?:just |recently |have )?moved to (?P<v>.+)",
    rf"{I_AM} (?P<from>from) (?P<v>.+)",
    r"i come (?P<from>from) (?P<v>.+)",
)
def _location(m: re.Match[str]) -> list[Fact]:
    # "from" may name a team ("I'm from the risk team"): only a capitalised place counts there.
    value = clean_value(m["v"], cut=_PLACE_CUT, max_words=6, capital="from" in m.groupdict())
    return _fact(Section.IDENTITY, "Based in {}.", value, LOCATION)


@_rule(
    rf"{I_AM} (?:an? |the )?(?P<lvl>{_LEVELS})(?: user)? (?P<prep>in|at|with|to) (?P<v>.+)",
    rf"{I_AM} (?:fairly|quite|very|relatively|pretty) (?P<lvl>{_LEVELS}) "
    r"(?P<prep>in|at|with|to) (?P<v>.+)",
)
def _skill_level(m: re.Match[str]) -> list[Fact]:
    value = clean_value(m["v"], max_words=8)
    # One level per subject: "beginner in Python" and later "proficient in Python" never coexist.
    slot = rf"(?:{_LEVELS}) (?:in|at|with|to) {re.escape(value.casefold())}(?:\W|$)"
    return _fact(Section.SKILLS, f"{m['lvl'].capitalize()} {m['prep'].lower()} {{}}.", value, slot)


@_rule(
    r"i work as (?P<art>an?|the) (?P<role>.+?)(?: (?:at|for|with) (?P<emp>.+))?",
    r"i (?:currently )?work (?:at|for) (?P<emp>.+?)(?: as (?P<art>an?|the) (?P<role>.+))?",
    rf"{I_AM} (?:employed|working) (?:at|by|for) (?P<emp>.+?)"
    r"(?: as (?P<art>an?|the) (?P<role>.+))?",
    rf"{I_AM} (?P<art>an?|the) (?P<role>.+?)(?: (?:at|for|with) (?P<emp>.+))?",
    r"my (?:role|job title|job|position|title) is (?:(?P<art>an?|the) )?(?P<role>.+?)"
    r"(?: (?:at|for|with) (?P<emp>.+))?",
)
def _role_and_employer(m: re.Match[str]) -> list[Fact]:
    facts: list[Fact] = []
    role = clean_value(m["role"], cut=_ROLE_CUT, max_words=6)
    if role and not _NOT_A_ROLE.fullmatch(role.split()[0]):
        article = f"{m['art'].lower()} " if m["art"] else ""
        facts += _fact(Section.IDENTITY, f"Works as {article}{{}}.", role, ROLE)
    employer = clean_value(m["emp"], cut=_EMPLOYER_CUT, max_words=8)
    if employer and not _NOT_AN_EMPLOYER.match(employer):
        facts += _fact(Section.IDENTITY, "Works at {}.", employer, EMPLOYER)
    return facts


_DETAILED = frozenset({"detailed", "long", "longer", "in-depth", "thorough", "comprehensive"})


@_rule(
    r"(?:i (?:like|want|prefer|need|appreciate|'d like|would like)|(?:please )?give me) "
    r"(?:(?:more|very|really|rather|fairly) )?(?P<len>short|shorter|concise|brief|succinct|"
    r"detailed|long|longer|in-depth|thorough|comprehensive) "
    r"(?:answers|responses|replies|explanations)(?P<rest> .+)?",
    r"(?:please )?(?:keep|make) (?:it|them|answers|responses|your answers|your responses) "
    r"(?:(?:more|very|really) )?(?P<len>short|shorter|concise|brief|detailed|longer|thorough)",
    r"(?:please )?(?:always )?be (?:more |very )?(?P<len>concise|brief|succinct|detailed|thorough)",
)
def _answer_length(m: re.Match[str]) -> list[Fact]:
    kind = "detailed" if m["len"].lower() in _DETAILED else "concise"
    rest = clean_value(m.groupdict().get("rest"), max_words=12)
    text = f"Prefers {kind} answers{' ' + rest if rest else ''}."
    return [Fact(Section.COMMUNICATION, text, kind, ANSWER_LENGTH)]


@_rule(
    r"(?:please )?(?:always )?(?:answer|respond|reply|write|talk)(?: to me)? (?:always )?in "
    r"(?P<v>[^\s,]+(?: (?-i:[A-Z])\w+)?)(?:\W.*)?",
    r"i(?:'d| would)? (?:prefer|want|like) (?:answers|responses|replies|"
    r"you to (?:answer|respond|reply|write)) in (?P<v>[^\s,]+(?: (?-i:[A-Z])\w+)?)(?:\W.*)?",
)
def _answer_language(m: re.Match[str]) -> list[Fact]:
    if not m["v"][0].isupper() or re.fullmatch(_FORMAT, m["v"], re.IGNORECASE):
        return []  # "answer in detail", "answer in bullet points": not a language
    value = clean_value(m["v"], max_words=2)
    return _fact(Section.COMMUNICATION, "Prefers answers in {}.", value, ANSWER_LANGUAGE)


def _format_fact(obj: str, rest: str | None, *, negative: bool) -> list[Fact]:
    if rest and _DEICTIC.search(rest):
        return []  # "use a table for this": a request about the current answer, not a preference
    tail = clean_value(rest, max_words=10)
    kind = obj.lower()
    # One slot per format kind, whatever adjective came with it: "tables" vs "no tables".
    slot = rf"prefers (?:no )?(?:[\w-]+ )?{_plural(kind.split()[-1])}\b"
    text = f"Prefers {'no ' if negative else ''}{kind}{' ' + tail if tail else ''}."
    return [Fact(Section.COMMUNICATION, text, kind, slot)]


@_rule(
    rf"(?:please )?(?:don't|do not|never|stop|avoid)(?: using| use)? (?:any )?(?P<obj>{_FORMAT})"
    r"(?P<rest> .+)?",
    rf"no (?:more )?(?P<obj>{_FORMAT})(?:,? please)?",
    rf"i (?:don't|do not) (?:like|want) (?P<obj>{_FORMAT})(?P<rest> .+)?",
)
def _format_negative(m: re.Match[str]) -> list[Fact]:
    return _format_fact(m["obj"], m.groupdict().get("rest"), negative=True)


@_rule(
    rf"(?:please )?(?:always )?use (?P<obj>{_FORMAT})(?P<rest> .+)?",
    r"(?:please )?(?:always )?(?:answer|respond|reply|write)(?: to me)? (?:in|with|using) "
    rf"(?P<obj>{_FORMAT})(?P<rest> .+)?",
    rf"i (?:like|want|prefer|love|need|appreciate) (?P<obj>{_FORMAT})(?P<rest> .+)?",
)
def _format_positive(m: re.Match[str]) -> list[Fact]:
    return _format_fact(m["obj"], m["rest"], negative=False)


@_rule(r"i (?:prefer|'d prefer|would prefer) (?P<v>.+)")
def _general_preference(m: re.Match[str]) -> list[Fact]:
    return _fact(Section.COMMUNICATION, "Prefers {}.", clean_value(m["v"], max_words=15))


@_rule(
    rf"{I_AM} (?P<verb>working on|preparing|building|leading|migrating|planning) (?P<v>.+)",
    r"we(?:'re| are)(?: (?:currently|now|also))? "
    r"(?P<verb>migrating|working on|preparing|building|moving|switching) (?P<v>.+)",
    r"(?:i|we) (?:currently )?(?P<verb>work) on (?P<v>.+)",
    r"(?:my|our) (?:current |main )?(?P<verb>project) is (?P<v>.+)",
)
def _work(m: re.Match[str]) -> list[Fact]:
    verb = m["verb"].lower()
    prefix = "Working on" if verb in {"work", "project", "working on"} else verb.capitalize()
    return _fact(Section.WORK, prefix + " {}.", clean_value(m["v"], max_words=20))


@_rule(r"(?:my|our) (?:project |current |next )?deadline is (?P<v>.+)")
def _deadline(m: re.Match[str]) -> list[Fact]:
    return _fact(Section.WORK, "Deadline: {}.", clean_value(m["v"], max_words=10), DEADLINE)


@_rule(
    rf"{I_AM} (?P<kind>responsible) for (?P<v>.+)",
    r"my (?:main |current )?(?P<kind>focus) is (?:on )?(?P<v>.+)",
)
def _responsibility(m: re.Match[str]) -> list[Fact]:
    template = "Responsible for {}." if m["kind"].lower() == "responsible" else "Focused on {}."
    return _fact(Section.WORK, template, clean_value(m["v"], max_words=15))


@_rule(
    rf"i(?:'ve| have) (?:got )?(?P<n>{_NUMBER})\+? years? of "
    r"(?:experience (?:in|with) |professional )?(?P<v>.+?)(?: experience)?",
    r"i(?:'ve| have) been (?:using|doing|working with|programming in|coding in) (?P<v>.+?) "
    rf"for (?P<n>{_NUMBER}) years?",
)
def _years(m: re.Match[str]) -> list[Fact]:
    value = clean_value(m["v"], max_words=8)
    slot = rf"\S+(?: \S+)? years? of experience in {re.escape(value.casefold())}(?:\W|$)"
    return _fact(Section.SKILLS, f"{m['n']} years of experience in {{}}.", value, slot)


@_rule(r"i (?P<verb>know|use|code in|program in) (?P<v>.+)")
def _tools(m: re.Match[str]) -> list[Fact]:
    verb = {"know": "Knows", "use": "Uses"}.get(m["verb"].lower(), "Codes in")
    return _fact(Section.SKILLS, verb + " {}.", clean_value(m["v"], max_words=12))


_LATER_ONLY = frozenset({"continue", "continue with", "look at", "discuss", "go over", "review"})


@_rule(
    r"let(?:'s| us) (?P<verb>revisit|come back to|return to|get back to|continue with|continue|"
    r"look at|discuss|go over|review) (?P<v>.+)",
)
def _lets_revisit(m: re.Match[str]) -> list[Fact]:
    verb, value = m["verb"].lower(), m["v"]
    if verb in _LATER_ONLY and not _LATER.search(value):
        return []  # "let's look at the code": about now, not a hand-off
    value = re.sub(r"^(?:this|that|it)\b", "the topic of this conversation", value, flags=re.I)
    return _fact(Section.FOLLOWUPS, f"Wants to {verb} {{}}.", clean_value(value, max_words=20))


@_rule(r"let(?:'s| us) pick (?:this|it|that) up (?:again )?(?P<v>.+)")
def _pick_up(m: re.Match[str]) -> list[Fact]:
    when = clean_value(m["v"], max_words=8) if _LATER.search(m["v"]) else ""
    return _fact(Section.FOLLOWUPS, "Wants to pick up this conversation {}.", when)


@_rule(r"(?:please )?remind me (?P<prep>about|of|to) (?P<v>.+)")
def _remind(m: re.Match[str]) -> list[Fact]:
    prep = "to" if m["prep"].lower() == "to" else "about"
    return _fact(
        Section.FOLLOWUPS, f"Wants a reminder {prep} {{}}.", clean_value(m["v"], max_words=20)
    )


@_rule(
    r"i(?:'ll| will) (?P<verb>come back to|get back to|return to|revisit|follow up on) (?P<v>.+)",
    r"i (?:need|have|want) to (?P<verb>follow up on|come back to|revisit) (?P<v>.+)",
)
def _will_return(m: re.Match[str]) -> list[Fact]:
    value = clean_value(m["v"], max_words=20)
    return _fact(Section.FOLLOWUPS, f"Wants to {m['verb'].lower()} {{}}.", value)


def extract_facts(clause: str) -> list[Fact]:
    """The facts of the first pattern that yields any for one clause (none if no pattern does)."""
    for pattern, builder in _RULES:
        match = pattern.fullmatch(clause)
        facts = builder(match) if match else []
        if facts:
            return facts
    return []
