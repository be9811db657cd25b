"""The turn-save's plan, without a database: whether consolidation is skipped and why, which
model it runs with, the job's payload, and the messages each history mode stores."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from app.conversations.modes import HistoryMode
from app.enablement.decision import CompanyFlags, UserState
from app.enablement.repository import EnablementInputs, SpaceRecord, UserMemoryConfig
from app.turns.plan import plan_turn, skip_reason
from app.turns.schemas import TurnRequest

ON = CompanyFlags(context_memory=True)
OFF_SPACE = SpaceRecord(context_memory=False, saved=True)
TURN_ID = uuid.UUID("00000000-0000-4000-8000-000000000001")


def request(**overrides: Any) -> TurnRequest:
    body: dict[str, Any] = {
        "space_id": "space-1",
        "messages": [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Earlier question"},
            {"role": "assistant", "content": "Earlier answer"},
            {"role": "user", "content": "I moved to Basel."},
        ],
        "response": {"content": "Noted."},
    } | overrides
    return TurnRequest.model_validate(body)


def space(*, orchestrator: bool = True, model: str = "space-model") -> SpaceRecord:
    return SpaceRecord(user_memory=UserMemoryConfig(orchestrator, model))


@pytest.mark.parametrize(
    ("inputs", "skipped"),
    [
        (EnablementInputs(ON, SpaceRecord(), None), None),
        (EnablementInputs(ON, SpaceRecord(), UserState(True)), None),
        (EnablementInputs(CompanyFlags(), SpaceRecord(), None), "company feature flag"),
        (EnablementInputs(ON, OFF_SPACE, UserState(False)), "space"),
        (EnablementInputs(ON, SpaceRecord(), UserState(False)), "user has turned"),
    ],
)
def test_the_skip_reason_is_the_first_blocking_condition(
    inputs: EnablementInputs, skipped: str | None
) -> None:
    reason = skip_reason(inputs)
    if skipped is None:
        assert reason is None
    else:
        assert reason is not None
        assert skipped in reason


def test_each_blocking_condition_has_its_own_words() -> None:
    reasons = {
        skip_reason(EnablementInputs(CompanyFlags(), SpaceRecord(), None)),
        skip_reason(EnablementInputs(ON, OFF_SPACE, None)),
        skip_reason(EnablementInputs(ON, SpaceRecord(), UserState(False))),
    }
    assert len(reasons) == 3
    assert None not in reasons


@pytest.mark.parametrize(
    ("orchestrator", "turn_model", "expected"),
    [
        (True, "gpt-4o-mini", "gpt-4o-mini"),  # the space follows the orchestrator
        (True, None, "space-model"),  # ... unless the turn names no model
        (False, "gpt-4o-mini", "space-model"),  # the space's own model wins
        (False, None, "space-model"),
    ],
)
def test_the_consolidation_model(orchestrator: bool, turn_model: str | None, expected: str) -> None:
    plan = plan_turn(request(language_model=turn_model), space(orchestrator=orchestrator), None)
    assert plan.model == expected
    assert plan.job_payload(TURN_ID, "space-1") == {
        "turn_id": str(TURN_ID),
        "space_id": "space-1",
        "model": expected,
    }


def test_a_skipped_turn_queues_nothing_but_still_stores_its_messages() -> None:
    plan = plan_turn(request(), space(), "Context memory is off for this space.")
    assert (plan.model, plan.skipped_reason) == (None, "Context memory is off for this space.")
    assert plan.job_payload(TURN_ID, "space-1") is None
    assert [m.message.content for m in plan.messages] == ["I moved to Basel.", "Noted."]


@pytest.mark.parametrize(
    ("mode", "stored"),
    [
        (HistoryMode.AUTO, [("request", "I moved to Basel."), ("response", "Noted.")]),
        (HistoryMode.NEVER, [("request", "I moved to Basel."), ("response", "Noted.")]),
        (
            HistoryMode.RECORD_ALL,
            [
                ("placeholder", "Kept by the caller"),
                ("placeholder", "Earlier question"),
                ("placeholder", "Earlier answer"),
                ("request", "I moved to Basel."),
                ("response", "Noted."),
            ],
        ),
    ],
)
def test_the_history_mode_decides_the_stored_messages(
    mode: HistoryMode, stored: list[tuple[str, str]]
) -> None:
    placeholder = [{"role": "user", "content": "Kept by the caller"}]
    plan = plan_turn(request(history_mode=mode, placeholder_history=placeholder), space(), None)
    assert [(m.source, m.message.content) for m in plan.messages] == stored
