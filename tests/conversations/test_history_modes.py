"""Table tests for the four history modes: seed 000's scenario matrix, its record_all example,
the multi-chain RAG pattern, placeholder detection, the single system message and load bounds."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from app.conversations.modes import (
    Detection,
    HistoryMode,
    Message,
    Role,
    SavedMessage,
    compose_messages,
    detect_placeholder,
    messages_to_save,
    plan_history,
    select_history,
    should_load,
)

AUTO, ALWAYS, NEVER, RECORD_ALL = (
    HistoryMode.AUTO,
    HistoryMode.ALWAYS,
    HistoryMode.NEVER,
    HistoryMode.RECORD_ALL,
)
MODES = (AUTO, ALWAYS, NEVER, RECORD_ALL)


def system(text: str) -> Message:
    return Message(Role.SYSTEM, text)


def user(text: str) -> Message:
    return Message(Role.USER, text)


def assistant(text: str) -> Message:
    return Message(Role.ASSISTANT, text)


def words(text: str) -> int:
    return len(text.split())


SYSTEM = system("Answer concisely.")
H1, A1 = user("Hi, I am planning a trip to France."), assistant("Nice! How can I help?")
M1, M2 = user("I prefer trains."), assistant("Noted: trains it is.")
Q = user("What is the capital?")


def model_input(
    mode: HistoryMode,
    stored: Sequence[Message],
    placeholder: Sequence[Message] | None,
    messages: Sequence[Message],
) -> list[Message]:
    """What the model receives for one call, as the turn service composes it."""
    plan = plan_history(mode, messages, placeholder)
    history = (
        select_history(stored, max_messages=50, max_tokens=10_000, count=words) if plan.load else []
    )
    return compose_messages(None, history, placeholder, messages)


def run_turn(
    mode: HistoryMode,
    store: list[Message],
    placeholder: Sequence[Message] | None,
    messages: Sequence[Message],
    response: Message,
) -> list[Message]:
    """One call against a store kept as a list: compose the input, then save. Returns the input."""
    received = model_input(mode, store, placeholder, messages)
    store.extend(saved.message for saved in messages_to_save(mode, placeholder, messages, response))
    return received


# --- seed 000: the scenario matrix, each of its 16 cells -------------------------------------

# scenario -> (caller sends placeholder history, memory has history, cell per mode in MODES order)
MATRIX = {
    "S1": (False, False, ("Current", "Current", "Current", "Current")),
    "S2": (False, True, ("Memory+Current", "Memory+Current", "Current", "Memory+Current")),
    "S3": (True, False, ("Placeholder", "Placeholder", "Placeholder", "Placeholder")),
    "S4": (True, True, ("Placeholder", "Memory+Placeholder", "Placeholder", "Placeholder")),
}
CELLS = [
    pytest.param(placeholder, memory, mode, cell, id=f"{scenario}-{mode}")
    for scenario, (placeholder, memory, cells) in MATRIX.items()
    for mode, cell in zip(MODES, cells, strict=True)
]
# The seed's cell names as message lists. "Placeholder" includes the current question: the
# placeholder history is always followed by the human message of the template.
RECEIVED = {
    "Current": [SYSTEM, Q],
    "Memory+Current": [SYSTEM, M1, M2, Q],
    "Placeholder": [SYSTEM, H1, A1, Q],
    "Memory+Placeholder": [SYSTEM, M1, M2, H1, A1, Q],
}


@pytest.mark.parametrize(
    "style",
    [
        "explicit",  # placeholder_history field: [H1, A1] or [] for "no placeholder"
        "inline",  # field absent: H1, A1 inside `messages`, found by the heuristic
    ],
)
@pytest.mark.parametrize(("has_placeholder", "has_memory", "mode", "cell"), CELLS)
def test_scenario_matrix(
    has_placeholder: bool, has_memory: bool, mode: HistoryMode, cell: str, style: str
) -> None:
    # A stale system message in the store shows stored system messages are never forwarded.
    stored = [system("Old instructions."), M1, M2] if has_memory else []
    if style == "explicit":
        placeholder: list[Message] | None = [H1, A1] if has_placeholder else []
        messages = [SYSTEM, Q]
    else:
        placeholder = None
        messages = [SYSTEM, H1, A1, Q] if has_placeholder else [SYSTEM, Q]

    assert model_input(mode, stored, placeholder, messages) == RECEIVED[cell]


# --- seed 000: the record_all example ---------------------------------------------------------

Q1, R1 = user("Which city should I start in?"), assistant("Start in Paris.")
Q2, R2 = user("How long should I stay?"), assistant("Three days.")


@pytest.mark.parametrize("style", ["explicit", "inline"])
def test_record_all_two_turns_reproduce_the_seed(style: str) -> None:
    """The app keeps its own chat_history ([H1, A1] before turn 1, plus Q1, R1 after it) and
    passes it as placeholder history every turn. record_all never loads (placeholder detected)
    and saves everything, so the store grows with duplicates exactly as the seed shows."""
    store: list[Message] = []

    def turn(chat_history: list[Message], question: Message, response: Message) -> list[Message]:
        if style == "explicit":
            return run_turn(RECORD_ALL, store, chat_history, [SYSTEM, question], response)
        return run_turn(RECORD_ALL, store, None, [SYSTEM, *chat_history, question], response)

    received_1 = turn([H1, A1], Q1, R1)
    assert store == [H1, A1, Q1, R1]

    received_2 = turn([H1, A1, Q1, R1], Q2, R2)
    assert store == [H1, A1, Q1, R1, H1, A1, Q1, R1, Q2, R2]

    # The growth is in the store only: the model never sees the duplicates.
    assert received_1 == [SYSTEM, H1, A1, Q1]
    assert received_2 == [SYSTEM, H1, A1, Q1, R1, Q2]


def test_auto_with_the_same_turns_saves_only_new_exchanges() -> None:
    store: list[Message] = []

    run_turn(AUTO, store, [H1, A1], [SYSTEM, Q1], R1)
    run_turn(AUTO, store, [H1, A1, Q1, R1], [SYSTEM, Q2], R2)

    assert store == [Q1, R1, Q2, R2]


# --- seed 000: the multi-chain RAG pattern ----------------------------------------------------

REPHRASE = system("Rephrase to standalone question.")
ANSWER = system("Answer concisely.")
# What the contextualize chain answers: the standalone rephrasing of Q1 and Q2.
C1 = assistant("Which French city should I start my trip in?")
C2 = assistant("How long should I stay in Paris?")


def rag_turn(
    mode: HistoryMode,
    store: list[Message],
    chat_history: list[Message],
    *,
    question: Message,
    standalone: Message,
    answer: Message,
) -> tuple[list[Message], list[Message]]:
    """One RAG turn: contextualize, then answer, both with the app's chat_history as placeholder.

    Returns what the contextualize chain and the answer chain received.
    """
    contextualize_in = run_turn(mode, store, chat_history, [REPHRASE, question], standalone)
    standalone_question = user(standalone.content)
    answer_in = run_turn(mode, store, chat_history, [ANSWER, standalone_question], answer)
    chat_history += [question, answer]
    return contextualize_in, answer_in


def test_multi_chain_rag_in_auto_mode() -> None:
    """Two chains share one memory; the app passes its chat_history (which already holds an
    earlier exchange H1, A1) as placeholder history to both.

    "The answer chain never sees the contextualize chain's exchange" means: placeholder history
    is detected on every call, so auto never loads the store, and the answer chain receives only
    its own system prompt, the app's chat_history and its (standalone) question; never the
    rephrase prompt's question and output as history. Each chain still saves its last request
    and response, so the store holds both chains' exchanges and no copy of the placeholder.
    """
    store: list[Message] = []
    chat_history = [H1, A1]

    ctx_1, answer_1 = rag_turn(AUTO, store, chat_history, question=Q1, standalone=C1, answer=R1)
    assert ctx_1 == [REPHRASE, H1, A1, Q1]
    assert answer_1 == [ANSWER, H1, A1, user(C1.content)]

    ctx_2, answer_2 = rag_turn(AUTO, store, chat_history, question=Q2, standalone=C2, answer=R2)
    assert ctx_2 == [REPHRASE, H1, A1, Q1, R1, Q2]
    assert answer_2 == [ANSWER, H1, A1, Q1, R1, user(C2.content)]

    assert store == [Q1, C1, user(C1.content), R1, Q2, C2, user(C2.content), R2]


def test_multi_chain_rag_in_always_mode_pollutes_the_answer_chain() -> None:
    """The contrast the seed warns about: always loads the store into every call, so the answer
    chain sees the contextualize chain's exchange ahead of the app's chat_history."""
    store: list[Message] = []

    _, answer_1 = rag_turn(ALWAYS, store, [H1, A1], question=Q1, standalone=C1, answer=R1)

    assert answer_1 == [ANSWER, Q1, C1, H1, A1, user(C1.content)]


def test_multi_chain_rag_with_an_empty_chat_history_loads_the_store() -> None:
    """The limit of auto: an empty placeholder ([]) is not detected, so on the first turn of a
    brand-new chat auto loads the store, and the answer chain does see the contextualize chain's
    exchange (as the seed's heuristic would, since an empty placeholder renders nothing)."""
    store: list[Message] = []

    _, answer_1 = rag_turn(AUTO, store, [], question=Q1, standalone=C1, answer=R1)

    assert answer_1 == [ANSWER, Q1, C1, user(C1.content)]


# --- placeholder detection --------------------------------------------------------------------

EXPLICIT = Detection(detected=True, detected_by="explicit")
HEURISTIC = Detection(detected=True, detected_by="heuristic")
NONE = Detection(detected=False, detected_by=None)
U1, U2, AS = user("first"), user("second"), assistant("reply")

DETECTION_CASES: dict[str, tuple[list[Message], list[Message] | None, Detection]] = {
    "one user message": ([U1], None, NONE),
    "system and user (a plain template)": ([SYSTEM, U1], None, NONE),
    "user, assistant, user": ([U1, AS, U2], None, HEURISTIC),
    "user, user": ([U1, U2], None, HEURISTIC),
    "assistant, user": ([AS, U1], None, HEURISTIC),
    "system messages are not counted: system, assistant": ([SYSTEM, AS], None, NONE),
    "system messages are not counted: two systems and a user": ([SYSTEM, SYSTEM, U1], None, NONE),
    "no messages": ([], None, NONE),
    "explicit placeholder": ([SYSTEM, U2], [U1, AS], EXPLICIT),
    "explicit wins over a plain template": ([U2], [U1], EXPLICIT),
    "empty placeholder: not detected, no heuristic": ([U1, AS, U2], [], NONE),
    "placeholder of only system messages counts as empty": ([U1], [SYSTEM], NONE),
}


@pytest.mark.parametrize(
    ("messages", "placeholder", "detection"), DETECTION_CASES.values(), ids=DETECTION_CASES.keys()
)
def test_detect_placeholder(
    messages: list[Message], placeholder: list[Message] | None, detection: Detection
) -> None:
    assert detect_placeholder(messages, placeholder) == detection


@pytest.mark.parametrize(
    ("mode", "detection", "load"),
    [
        (AUTO, NONE, True),
        (AUTO, EXPLICIT, False),
        (AUTO, HEURISTIC, False),
        (ALWAYS, NONE, True),
        (ALWAYS, EXPLICIT, True),
        (NEVER, NONE, False),
        (NEVER, HEURISTIC, False),
        (RECORD_ALL, NONE, True),
        (RECORD_ALL, EXPLICIT, False),
        (RECORD_ALL, HEURISTIC, False),
    ],
)
def test_should_load(mode: HistoryMode, detection: Detection, load: bool) -> None:
    assert should_load(mode, detection) is load


@pytest.mark.parametrize(
    ("mode", "messages", "placeholder", "reason"),
    [
        (AUTO, [U2], [U1, AS], "placeholder history detected (explicit); auto mode skips loading"),
        (
            RECORD_ALL,
            [U1, AS, U2],
            None,
            "placeholder history detected (heuristic); record_all mode skips loading",
        ),
        (
            AUTO,
            [SYSTEM, U1],
            None,
            "no placeholder history detected; auto mode loads stored history",
        ),
        (AUTO, [U1], [], "placeholder history given but empty; auto mode loads stored history"),
        (
            ALWAYS,
            [U2],
            [U1],
            "placeholder history detected (explicit); always mode loads stored history anyway, "
            "which may duplicate the placeholder",
        ),
        (
            NEVER,
            [U1],
            None,
            "no placeholder history detected; never mode does not load stored history",
        ),
    ],
)
def test_plan_history_explains_itself(
    mode: HistoryMode, messages: list[Message], placeholder: list[Message] | None, reason: str
) -> None:
    plan = plan_history(mode, messages, placeholder)

    assert plan.reason == reason
    assert plan.mode is mode
    assert plan.load is should_load(mode, plan.detection)


# --- exactly one system message, first -------------------------------------------------------


def test_system_prompt_wins_and_every_other_system_message_is_dropped() -> None:
    composed = compose_messages(
        "You are helpful. What I know about you: likes trains.",
        history=[system("stored"), M1, M2],
        placeholder_history=[system("placeholder"), H1, A1],
        messages=[system("template"), Q],
    )

    assert composed == [
        system("You are helpful. What I know about you: likes trains."),
        M1,
        M2,
        H1,
        A1,
        Q,
    ]


@pytest.mark.parametrize("system_prompt", [None, ""])
def test_without_system_prompt_the_first_system_message_of_the_request_is_used(
    system_prompt: str | None,
) -> None:
    composed = compose_messages(
        system_prompt,
        history=[system("stored")],
        placeholder_history=[system("placeholder")],
        messages=[system("first"), Q, system("second")],
    )

    assert composed == [system("first"), Q]


def test_system_messages_of_history_are_never_promoted() -> None:
    composed = compose_messages(
        None,
        history=[system("stored"), M1],
        placeholder_history=[system("placeholder")],
        messages=[Q],
    )

    assert composed == [M1, Q]


# --- bounded loading ---------------------------------------------------------------------------

STORED = [
    user("one"),  # 1 word
    assistant("two two"),  # 2 words
    system("ignored system message"),
    user("three three three"),  # 3 words
    assistant("four four four four"),  # 4 words
]


@pytest.mark.parametrize(
    ("max_messages", "max_tokens", "kept"),
    [
        pytest.param(
            50, 10_000, ["one", "two", "three", "four"], id="everything fits, system dropped"
        ),
        pytest.param(2, 10_000, ["three", "four"], id="newest two messages"),
        pytest.param(3, 10_000, ["two", "three", "four"], id="system message does not use a slot"),
        pytest.param(50, 7, ["three", "four"], id="token budget keeps the newest"),
        pytest.param(50, 9, ["two", "three", "four"], id="token budget exactly met"),
        pytest.param(2, 9, ["three", "four"], id="message bound tighter"),
        pytest.param(3, 5, ["four"], id="token bound tighter"),
        pytest.param(50, 3, [], id="newest message too big: nothing, no gap skipping"),
        pytest.param(0, 10_000, [], id="no messages allowed"),
    ],
)
def test_select_history_keeps_newest_within_both_bounds(
    max_messages: int, max_tokens: int, kept: list[str]
) -> None:
    selected = select_history(STORED, max_messages, max_tokens, count=words)
    bounded = select_history(STORED, max_messages, max_tokens, count=words, upper=len)

    assert [m.content.split()[0] for m in selected] == kept
    assert bounded == selected


_STORED_MESSAGES = st.lists(
    st.builds(
        Message,
        st.sampled_from(list(Role)),
        st.text(alphabet="ab é漢", max_size=12),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(
    stored=_STORED_MESSAGES,
    max_messages=st.integers(0, 14),
    max_tokens=st.integers(0, 60),
    slack=st.integers(0, 3),
)
def test_an_upper_bound_never_changes_the_selection(
    stored: list[Message], max_messages: int, max_tokens: int, slack: int
) -> None:
    """Whatever the bound (exact, or looser by `slack` per message, or the UTF-8 length), the
    selection is the one exact counts give; the bound only saves counting."""
    exact = select_history(stored, max_messages, max_tokens, count=words)
    for upper in (words, lambda text: words(text) + slack, lambda text: len(text.encode())):
        assert select_history(stored, max_messages, max_tokens, words, upper) == exact


def test_when_the_bounds_fit_nothing_is_counted() -> None:
    counted: list[str] = []

    def count(text: str) -> int:
        counted.append(text)
        return words(text)

    assert len(select_history(STORED, 50, 10_000, count, upper=len)) == 4
    assert counted == []
    assert len(select_history(STORED, 50, 7, count, upper=len)) == 2  # "four…" is 19 bytes > 7
    assert counted == ["four four four four", "three three three", "two two"]


# --- what a turn saves --------------------------------------------------------------------------

RESPONSE = assistant("Paris.")


@pytest.mark.parametrize("mode", [AUTO, ALWAYS, NEVER])
def test_last_request_and_response_are_saved(mode: HistoryMode) -> None:
    saved = messages_to_save(mode, None, [SYSTEM, H1, A1, Q], RESPONSE)

    assert saved == [SavedMessage(Q, "request"), SavedMessage(RESPONSE, "response")]


def test_last_request_runs_from_the_last_user_message_on() -> None:
    follow_up = assistant("(a tool result the caller appended)")

    saved = messages_to_save(AUTO, [H1, A1], [SYSTEM, Q, follow_up], RESPONSE)

    assert [s.message for s in saved] == [Q, follow_up, RESPONSE]


def test_record_all_saves_everything_but_system_messages() -> None:
    saved = messages_to_save(
        RECORD_ALL, [system("kept out"), H1, A1], [SYSTEM, M1, M2, Q], RESPONSE
    )

    assert saved == [
        SavedMessage(H1, "placeholder"),
        SavedMessage(A1, "placeholder"),
        SavedMessage(M1, "placeholder"),
        SavedMessage(M2, "placeholder"),
        SavedMessage(Q, "request"),
        SavedMessage(RESPONSE, "response"),
    ]


def test_without_a_user_message_the_whole_request_is_saved() -> None:
    saved = messages_to_save(AUTO, None, [SYSTEM, A1], RESPONSE)

    assert [s.message for s in saved] == [A1, RESPONSE]


def test_the_response_must_come_from_the_assistant() -> None:
    with pytest.raises(ValueError, match="assistant"):
        messages_to_save(AUTO, None, [Q], user("not a response"))
