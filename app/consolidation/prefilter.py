"""The pre-filter: which model calls a consolidation needs, decided locally before any of them.
Pure: it reads the user's messages and the offline engine's reading of them, nothing else.

- `noop`: every user message is clearly non-durable (a greeting, thanks, a short
  acknowledgement, a question about the world, a task such as "explain ..." or "write ...", with
  no first-person statement and no word about memory, preferences or answers). No model call:
  the consolidation is a NOOP.
- `operations`: the offline engine already reads a fact or a forget request in them, so the gate
  would answer UPDATE: the operations (or rewrite) call is made without it.
- `gate`: anything else: the gate decides, then the operations call when it says UPDATE.

It errs towards asking the model: a message is `noop` only when every sentence has one of the
shapes above. Whatever it does not recognise (other languages, statements, anything with "I",
"my" or "we" beyond "how do I ...", long messages) goes to the model. docs/model-cost.md lists
the rules and what it never filters.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final, Literal

PrefilterDecision = Literal["noop", "operations", "gate"]

MAX_LOCAL_CHARS: Final = 600
"""Longer messages always go to the model: a long text is rarely small talk."""
MAX_SMALL_TALK_WORDS: Final = 10

_SMALL_TALK_WORDS: Final = frozenset(
    (
        "hi",
        "hello",
        "hey",
        "hiya",
        "howdy",
        "thanks",
        "thank",
        "thx",
        "ty",
        "cheers",
        "you",
        "so",
        "much",
        "very",
        "really",
        "a",
        "lot",
        "again",
        "ok",
        "okay",
        "cool",
        "great",
        "nice",
        "perfect",
        "awesome",
        "excellent",
        "wonderful",
        "brilliant",
        "fantastic",
        "amazing",
        "good",
        "morning",
        "afternoon",
        "evening",
        "night",
        "day",
        "bye",
        "goodbye",
        "see",
        "later",
        "soon",
        "that",
        "this",
        "it",
        "helps",
        "helped",
        "helpful",
        "was",
        "is",
        "that's",
        "it's",
        "makes",
        "sense",
        "got",
        "understood",
        "alright",
        "fine",
        "lol",
        "haha",
        "hehe",
        "wow",
        "all",
        "there",
        "everyone",
        "have",
        "take",
        "care",
        "one",
        "job",
        "well",
        "done",
        "clear",
        "useful",
        "interesting",
        "ha",
        "right",
        "fair",
        "enough",
        "for",
        "now",
        "today",
        "tomorrow",
        "been",
        "you've",
        "you're",
        "pity",
        "but",
    )
)
"""Words of greetings, thanks, farewells and acknowledgements. Deliberately without "yes", "no",
"sure" and "please": they may confirm or refuse something the assistant proposed to remember."""

_FIRST_PERSON = re.compile(
    r"\b(?:i|i'm|im|i've|i'd|i'll|me|my|mine|myself|we|we're|we've|we'd|we'll|us|our|ours|"
    r"ourselves|let's|lets)\b",
    re.IGNORECASE,
)
_HOW_TO = re.compile(
    r"\b(?:how|what|where|which)\s+(?:do|can|could|should|would|must)\s+(?:i|we)\b",
    re.IGNORECASE,
)
""""How do I ...?" asks about the world; the words after it are still checked."""
_ASK_ME = re.compile(r"\b(?:help|show|tell|give|teach|walk)\s+me\b", re.IGNORECASE)
""""Can you help me ...", "Tell me about ...": the user asks for something, says nothing about
themself; the words after it are still checked."""
_MEMORY_WORDS = re.compile(
    r"\b(?:remember\w*|forget\w*|forgot\w*|remind\w*|memor\w*|note|notes|keep in mind|always|"
    r"never|from now on|going forward|in future|in the future|next time|anymore|any more|"
    r"prefer\w*|call me|address me|answer\w*|repl(?:y|ies)|respond\w*|response\w*|speak\w*|"
    r"talk\w*|language\w*|tone|style|format\w*|formal|informal|concise|brief|short|shorter|long|"
    r"longer|detailed|verbose|tables?|bullets?|bullet points?|emojis?|jargon|examples?)\b",
    re.IGNORECASE,
)
"""Words that can carry a standing preference or a memory request even without "I" or "my":
"Always answer in German", "Use tables", "Could you forget the report?"."""
_QUESTION_START = re.compile(
    r"(?:what|what's|whats|how|how's|why|when|where|which|who|whose|whom|any|is|are|was|were|do|does|"
    r"did|can|could|would|will|should|shall|may|might|has|have|had|isn't|aren't|doesn't|don't|"
    r"didn't|can't|won't)\b",
    re.IGNORECASE,
)
_TASK_START = re.compile(
    r"(?:explain|describe|define|summari[sz]e|translate|compare|calculate|compute|convert|list|"
    r"show|write|draft|generate|create|fix|debug|refactor|review|check|find|suggest|recommend|"
    r"tell me|help me|walk me through)\b",
    re.IGNORECASE,
)
_SENTENCE = re.compile(r"[^.!?\n]+[.!?]*")
_WORD = re.compile(r"[a-z']+")


def prefilter(
    user_messages: Sequence[str], engine_reads_facts: bool, forget_requested: bool
) -> PrefilterDecision:
    """The calls a consolidation of these user messages needs (module docstring).

    `engine_reads_facts` and `forget_requested` are the offline engine's reading of the same
    messages: whether its operations would change the profile, and whether the user asked to
    forget something.
    """
    if engine_reads_facts or forget_requested:
        return "operations"
    if all(is_clearly_non_durable(text) for text in user_messages):
        return "noop"
    return "gate"


def is_clearly_non_durable(text: str) -> bool:
    """True only when every sentence is small talk, a question about the world or a task, and
    the message says nothing in the first person (beyond "how do I") and no memory word."""
    text = text.replace("\u2019", "'").replace("\u2018", "'").strip()
    if not text:
        return True  # nothing the user said: the assistant's words are never facts
    if len(text) > MAX_LOCAL_CHARS or _MEMORY_WORDS.search(text):
        return False
    sentences = [s.strip() for s in _SENTENCE.findall(text) if s.strip(" \t\"'()")]
    return bool(sentences) and all(_non_durable_sentence(s) for s in sentences)


def _non_durable_sentence(sentence: str) -> bool:
    words = _WORD.findall(sentence.casefold())
    if not words:
        return True  # punctuation or emoji only
    if len(words) <= MAX_SMALL_TALK_WORDS and all(w in _SMALL_TALK_WORDS for w in words):
        return True
    asked = _ASK_ME.sub(" ", sentence)
    if sentence.endswith("?") and _QUESTION_START.match(sentence):
        return not _FIRST_PERSON.search(_HOW_TO.sub(" ", asked))
    if _TASK_START.match(sentence) and not sentence.endswith("?"):
        return not _FIRST_PERSON.search(asked)
    return False
