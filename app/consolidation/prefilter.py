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
shapes above. Whatever it does not recognise goes to the model: statements, anything with "I",
"my" or "we" beyond "how do I ...", long messages, and every language and script beyond its
small-talk lists (`small_talk`). Words are read in every script (Unicode letters, marks and
digits); a sentence is "punctuation or emoji only" when it holds no letter or digit of any
script; small talk in the listed languages stays free, any other word makes a sentence not small
talk; and the question and task shapes are English ones, read only in sentences of Latin letters.
docs/model-cost.md lists the rules and what it never filters.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final, Literal

from app.consolidation.small_talk import (
    MAX_SMALL_TALK_WORDS,
    has_letters_or_digits,
    is_small_talk,
    latin_only,
)

__all__ = [
    "MAX_LOCAL_CHARS",
    "MAX_SMALL_TALK_WORDS",
    "PrefilterDecision",
    "is_clearly_non_durable",
    "prefilter",
]

PrefilterDecision = Literal["noop", "operations", "gate"]

MAX_LOCAL_CHARS: Final = 600
"""Longer messages always go to the model: a long text is rarely small talk."""

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
_SENTENCE_END: Final = ".!?\n\u3002\uff01\uff1f\uff61\u061f\u0964\u0965"
"""`.`, `!`, `?`, a line break, and the full stops and question marks of Chinese and Japanese
(`。！？｡`), Arabic (`؟`) and Devanagari (`।॥`)."""
_SENTENCE = re.compile(f"[^{_SENTENCE_END}]+[{_SENTENCE_END}]*")


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
    if not has_letters_or_digits(sentence):
        return True  # punctuation or emoji only
    if is_small_talk(sentence):
        return True
    if not latin_only(sentence):
        return False  # the question and task shapes below are read in English only
    asked = _ASK_ME.sub(" ", sentence)
    if sentence.endswith("?") and _QUESTION_START.match(sentence):
        return not _FIRST_PERSON.search(_HOW_TO.sub(" ", asked))
    if _TASK_START.match(sentence) and not sentence.endswith("?"):
        return not _FIRST_PERSON.search(asked)
    return False
