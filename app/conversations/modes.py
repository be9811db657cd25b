"""The four history modes (auto, always, never, record_all): placeholder detection, what to load,
how to compose the model's input and what to save. Pure: messages in, messages out.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

DetectedBy = Literal["explicit", "heuristic"]
MessageSource = Literal["request", "response", "placeholder"]


class Role(StrEnum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"


@dataclass(frozen=True)
class Message:
    role: Role
    content: str


class HistoryMode(StrEnum):
    """How stored history is loaded and what a turn saves (seed 000)."""

    AUTO = "auto"
    ALWAYS = "always"
    NEVER = "never"
    RECORD_ALL = "record_all"


@dataclass(frozen=True)
class Detection:
    """Whether the caller sent its own (placeholder) history, and how we know."""

    detected: bool
    detected_by: DetectedBy | None


@dataclass(frozen=True)
class SavedMessage:
    """A message to append to the stored history, tagged with where it came from."""

    message: Message
    source: MessageSource


@dataclass(frozen=True)
class HistoryPlan:
    """The loading decision for one model call, with a sentence for the debug trace."""

    mode: HistoryMode
    detection: Detection
    load: bool
    reason: str


def _conversation(messages: Sequence[Message]) -> list[Message]:
    """The messages without system messages, which never travel as history."""
    return [m for m in messages if m.role != Role.SYSTEM]


def detect_placeholder(
    messages: Sequence[Message], placeholder_history: Sequence[Message] | None
) -> Detection:
    """Detect placeholder history: explicit when given, else the heuristic on `messages`.

    - `placeholder_history` given with a non-system message: detected, "explicit".
    - `placeholder_history == []` (or only system messages): the caller has a placeholder slot
      and it is empty, so nothing is detected and the heuristic is not consulted.
    - `placeholder_history is None` (absent): "heuristic" when `messages` holds more than one
      message and (more than one user message or at least one assistant message). System
      messages are not counted: they are template scaffolding, not history, so a template of one
      system plus one human message is not detected.
    """
    if placeholder_history is not None:
        if _conversation(placeholder_history):
            return Detection(detected=True, detected_by="explicit")
        return Detection(detected=False, detected_by=None)
    conversation = _conversation(messages)
    users = sum(1 for m in conversation if m.role == Role.USER)
    assistants = len(conversation) - users
    if len(conversation) > 1 and (users > 1 or assistants >= 1):
        return Detection(detected=True, detected_by="heuristic")
    return Detection(detected=False, detected_by=None)


def should_load(mode: HistoryMode, detection: Detection) -> bool:
    """always loads, never doesn't; auto and record_all load unless placeholder history is seen."""
    if mode == HistoryMode.ALWAYS:
        return True
    if mode == HistoryMode.NEVER:
        return False
    return not detection.detected


def _load_phrase(mode: HistoryMode, detection: Detection, load: bool) -> str:
    if mode == HistoryMode.NEVER:
        return "never mode does not load stored history"
    if mode == HistoryMode.ALWAYS and detection.detected:
        return "always mode loads stored history anyway, which may duplicate the placeholder"
    if load:
        return f"{mode} mode loads stored history"
    return f"{mode} mode skips loading"


def plan_history(
    mode: HistoryMode,
    messages: Sequence[Message],
    placeholder_history: Sequence[Message] | None,
) -> HistoryPlan:
    """Detect placeholder history and decide whether to load stored history, saying why."""
    detection = detect_placeholder(messages, placeholder_history)
    load = should_load(mode, detection)
    if detection.detected:
        seen = f"placeholder history detected ({detection.detected_by})"
    elif placeholder_history is not None:
        seen = "placeholder history given but empty"
    else:
        seen = "no placeholder history detected"
    return HistoryPlan(mode, detection, load, f"{seen}; {_load_phrase(mode, detection, load)}")


def select_history(
    stored: Sequence[Message],
    max_messages: int,
    max_tokens: int,
    count: Callable[[str], int],
    upper: Callable[[str], int] | None = None,
) -> list[Message]:
    """The newest non-system messages within both bounds, in chronological order.

    The selection is a contiguous run ending at the newest message: it stops at the first message
    that would break a bound rather than skipping it for older ones, so no gap is ever hidden
    in the middle of the history the model sees. `count` gives a message content's token count.

    `upper`, when given, is a cheap bound of `count` from above (never less than it). When the
    bounds of the newest `max_messages` messages add up to no more than `max_tokens`, their exact
    counts do too: they are the selection, and nothing is counted. Only otherwise is `count`
    called, so the selection is always the one exact counts give.
    """
    if upper is not None:
        newest = _newest(stored, max_messages)
        if sum(upper(m.content) for m in newest) <= max_tokens:
            newest.reverse()
            return newest
    selected: list[Message] = []
    tokens = 0
    for message in reversed(stored):
        if message.role == Role.SYSTEM:
            continue
        if len(selected) >= max_messages:
            break
        tokens += count(message.content)
        if tokens > max_tokens:
            break
        selected.append(message)
    selected.reverse()
    return selected


def _newest(stored: Sequence[Message], max_messages: int) -> list[Message]:
    """The newest `max_messages` non-system messages, newest first."""
    newest: list[Message] = []
    for message in reversed(stored):
        if len(newest) >= max_messages:
            break
        if message.role != Role.SYSTEM:
            newest.append(message)
    return newest


def compose_messages(
    system_prompt: str | None,
    history: Sequence[Message],
    placeholder_history: Sequence[Message] | None,
    messages: Sequence[Message],
) -> list[Message]:
    """What the model receives: one system message, loaded history, placeholder, current messages.

    The system message is `system_prompt` when given (an empty string counts as not given), else
    the first system message of `messages`, else none. Every other system message, wherever it
    appears, is dropped.
    """
    system = system_prompt or next((m.content for m in messages if m.role == Role.SYSTEM), None)
    composed = [Message(Role.SYSTEM, system)] if system is not None else []
    composed += _conversation(history)
    composed += _conversation(placeholder_history or ())
    composed += _conversation(messages)
    return composed


def _split_last_request(messages: Sequence[Message]) -> tuple[list[Message], list[Message]]:
    """Split non-system `messages` into (earlier, last request from the last user message on).

    Without a user message nothing can be told apart, so all of it is the request.
    """
    conversation = _conversation(messages)
    last_user = max((i for i, m in enumerate(conversation) if m.role == Role.USER), default=None)
    if last_user is None:
        return [], conversation
    return conversation[:last_user], conversation[last_user:]


def messages_to_save(
    mode: HistoryMode,
    placeholder_history: Sequence[Message] | None,
    messages: Sequence[Message],
    response: Message,
) -> list[SavedMessage]:
    """The messages a turn appends to the stored history, in order.

    auto, always, never: the last request (the non-system `messages` from the last user message
    on) and the response. Earlier messages of `messages` are inline placeholder history (what the
    heuristic detects) and are not saved, so the store never duplicates what the caller keeps.

    record_all: everything non-system, duplicates on purpose: `placeholder_history`, the earlier
    messages of `messages` (both tagged "placeholder"), the last request and the response. System
    messages are never saved in any mode: they are never forwarded as history either.
    """
    if response.role != Role.ASSISTANT:
        raise ValueError(f"the response must be an assistant message, not {response.role}")
    earlier, request = _split_last_request(messages)
    saved: list[SavedMessage] = []
    if mode == HistoryMode.RECORD_ALL:
        placeholder = _conversation(placeholder_history or ()) + earlier
        saved += [SavedMessage(m, "placeholder") for m in placeholder]
    saved += [SavedMessage(m, "request") for m in request]
    saved.append(SavedMessage(response, "response"))
    return saved
