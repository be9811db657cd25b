"""Table tests for the effective-enablement decision and the space admin's switch.

Also parses `docs/enablement.md` and checks every row against the code, so the doc cannot drift.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

from app.enablement.decision import (
    FLAG_ALLOW_WITH_WEB_SEARCH,
    FLAG_CONTEXT_MEMORY,
    KNOWN_FLAGS,
    WEB_SEARCH_TOOLTIP,
    CompanyFlags,
    Decision,
    Level,
    SpaceState,
    SwitchState,
    UserState,
    context_memory_switch,
    effective_enablement,
)

ALL_KEYS = ("company_flag", "space_setting", "web_search", "user_setting")
DOC = Path(__file__).resolve().parents[2] / "docs" / "enablement.md"


def blocking_keys(decision: Decision) -> set[str]:
    return {c.key for c in decision.blocking}


def assert_all_conditions_reported(decision: Decision) -> None:
    assert tuple(c.key for c in decision.conditions) == ALL_KEYS
    assert [c.level for c in decision.conditions] == [
        Level.OPERATOR,
        Level.SPACE_ADMIN,
        Level.SPACE_ADMIN_OR_OPERATOR,
        Level.END_USER,
    ]
    assert all(c.reason.endswith(".") for c in decision.conditions)


# --- all 16 combinations, web-search allowance off -------------------------------------------


def expected_blocking(company: bool, space_cm: bool, web_search: bool, user_cm: bool) -> set[str]:
    return {
        key
        for key, holds in zip(ALL_KEYS, (company, space_cm, not web_search, user_cm), strict=True)
        if not holds
    }


@pytest.mark.parametrize(
    ("company", "space_cm", "web_search", "user_cm"),
    list(itertools.product([True, False], repeat=4)),
)
def test_every_combination_with_allowance_off(
    company: bool, space_cm: bool, web_search: bool, user_cm: bool
) -> None:
    decision = effective_enablement(
        CompanyFlags(context_memory=company),
        SpaceState(context_memory=space_cm, web_search=web_search),
        UserState(context_memory=user_cm),
    )

    assert_all_conditions_reported(decision)
    assert blocking_keys(decision) == expected_blocking(company, space_cm, web_search, user_cm)
    assert decision.enabled is (company and space_cm and not web_search and user_cm)


def test_exactly_one_of_the_sixteen_combinations_is_active() -> None:
    active = [
        combo
        for combo in itertools.product([True, False], repeat=4)
        if effective_enablement(
            CompanyFlags(context_memory=combo[0]),
            SpaceState(context_memory=combo[1], web_search=combo[2]),
            UserState(context_memory=combo[3]),
        ).enabled
    ]
    assert active == [(True, True, False, True)]


# --- allowance on, and settings never saved ---------------------------------------------------

ON = CompanyFlags(context_memory=True)
ON_ALLOW = CompanyFlags(context_memory=True, allow_with_web_search=True)
OFF_ALLOW = CompanyFlags(context_memory=False, allow_with_web_search=True)
MEMORY_ON = SpaceState(context_memory=True, web_search=False)
MEMORY_OFF_WEB_ON = SpaceState(context_memory=False, web_search=True)
BOTH_ON = SpaceState(context_memory=True, web_search=True)
KEY_ABSENT = SpaceState(context_memory=None, web_search=False)
KEY_ABSENT_WEB_ON = SpaceState(context_memory=None, web_search=True)
USER_ON = UserState(context_memory=True)
USER_OFF = UserState(context_memory=False)
USER_KEY_ABSENT = UserState(context_memory=None)

# id -> (flags, space, user, blocking condition keys); active exactly when nothing blocks.
MORE_CASES: dict[str, tuple[CompanyFlags, SpaceState | None, UserState | None, set[str]]] = {
    "allowance lets memory and web search run together": (ON_ALLOW, BOTH_ON, USER_ON, set()),
    "allowance with web search off changes nothing": (ON_ALLOW, MEMORY_ON, USER_ON, set()),
    "allowance does not override the space switch": (
        ON_ALLOW,
        MEMORY_OFF_WEB_ON,
        USER_ON,
        {"space_setting"},
    ),
    "allowance does not override the user opt-out": (ON_ALLOW, BOTH_ON, USER_OFF, {"user_setting"}),
    "allowance without the company flag": (OFF_ALLOW, BOTH_ON, USER_ON, {"company_flag"}),
    "space and user never saved": (ON, None, None, set()),
    "space never saved": (ON, None, USER_ON, set()),
    "user never saved": (ON, MEMORY_ON, None, set()),
    "keys absent mean enabled": (ON, KEY_ABSENT, USER_KEY_ABSENT, set()),
    "space key absent but web search on": (ON, KEY_ABSENT_WEB_ON, None, {"web_search"}),
    "space never saved, user opted out": (ON, None, USER_OFF, {"user_setting"}),
    "company flag defaults to off": (CompanyFlags(), None, None, {"company_flag"}),
}


@pytest.mark.parametrize(
    ("flags", "space", "user", "blocking"), MORE_CASES.values(), ids=MORE_CASES.keys()
)
def test_allowance_and_never_saved(
    flags: CompanyFlags,
    space: SpaceState | None,
    user: UserState | None,
    blocking: set[str],
) -> None:
    decision = effective_enablement(flags, space, user)

    assert_all_conditions_reported(decision)
    assert blocking_keys(decision) == blocking
    assert decision.enabled is (not blocking)


# --- reasons ---------------------------------------------------------------------------------


def test_reason_names_the_first_blocker_and_who_can_lift_it() -> None:
    decision = effective_enablement(
        CompanyFlags(), SpaceState(False, web_search=True), UserState(False)
    )

    assert decision.reason() == (
        "The company feature flag FEATURE_FLAG_ENABLE_CONTEXT_MEMORY_UN_22033 is off; "
        "an operator can turn it on."
    )
    reasons = {c.key: c.reason for c in decision.blocking}
    assert "a space admin can enable it" in reasons["space_setting"]
    assert FLAG_ALLOW_WITH_WEB_SEARCH in reasons["web_search"]
    assert "only the user can turn it back on" in reasons["user_setting"]


def test_reason_when_active() -> None:
    decision = effective_enablement(ON, None, None)

    assert decision.blocking == ()
    assert decision.reason() == "Context memory is enabled: all four conditions hold."


def test_never_saved_reasons_say_the_default_applies() -> None:
    reasons = {c.key: c.reason for c in effective_enablement(ON, None, None).conditions}

    assert "never saved" in reasons["space_setting"]
    assert "by default" in reasons["user_setting"]


# --- flags from storage ----------------------------------------------------------------------


def test_flags_from_mapping() -> None:
    assert KNOWN_FLAGS == (FLAG_CONTEXT_MEMORY, FLAG_ALLOW_WITH_WEB_SEARCH)
    assert CompanyFlags.from_mapping({}) == CompanyFlags(False, False)
    assert CompanyFlags.from_mapping({FLAG_CONTEXT_MEMORY: True}) == CompanyFlags(True, False)
    assert CompanyFlags.from_mapping(
        {FLAG_CONTEXT_MEMORY: False, FLAG_ALLOW_WITH_WEB_SEARCH: True}
    ) == CompanyFlags(False, True)


def test_a_misspelt_flag_is_refused_not_ignored() -> None:
    with pytest.raises(ValueError, match="FEATURE_FLAG_ENABLE_CONTEXT_MEMORY"):
        CompanyFlags.from_mapping({"FEATURE_FLAG_ENABLE_CONTEXT_MEMORY": True})


# --- the space admin's switch ----------------------------------------------------------------

HIDDEN = SwitchState(visible=False, editable=False, tooltip=None)
EDITABLE = SwitchState(visible=True, editable=True, tooltip=None)
LOCKED = SwitchState(visible=True, editable=False, tooltip=WEB_SEARCH_TOOLTIP)

# id -> (flags, space, how the switch is shown)
SWITCH_CASES: dict[str, tuple[CompanyFlags, SpaceState | None, SwitchState]] = {
    "no company flag": (CompanyFlags(), MEMORY_ON, HIDDEN),
    "no company flag, allowance on": (OFF_ALLOW, BOTH_ON, HIDDEN),
    "no company flag, space never saved": (CompanyFlags(), None, HIDDEN),
    "web search off": (ON, MEMORY_ON, EDITABLE),
    "switched off is still editable": (ON, SpaceState(context_memory=False), EDITABLE),
    "space never saved": (ON, None, EDITABLE),
    "web search blocks": (ON, BOTH_ON, LOCKED),
    "web search blocks, switched off": (ON, MEMORY_OFF_WEB_ON, LOCKED),
    "web search blocks, key absent": (ON, KEY_ABSENT_WEB_ON, LOCKED),
    "allowance lifts the lock": (ON_ALLOW, BOTH_ON, EDITABLE),
}


@pytest.mark.parametrize(
    ("flags", "space", "switch"), SWITCH_CASES.values(), ids=SWITCH_CASES.keys()
)
def test_context_memory_switch(
    flags: CompanyFlags, space: SpaceState | None, switch: SwitchState
) -> None:
    assert context_memory_switch(flags, space) == switch


def test_tooltip_text_is_the_seed_sentence() -> None:
    assert WEB_SEARCH_TOOLTIP == (
        "Context memory is unavailable while web search is enabled, "
        "to keep user data out of external search queries."
    )


# --- docs/enablement.md cannot drift ---------------------------------------------------------

DECISION_HEADER = (
    "# | company flag | allow with web search | space context memory | web search "
    "| user context memory | active | blocked by"
)
SWITCH_HEADER = "company flag | allow with web search | web search | switch"


def doc_tables() -> dict[str, list[list[str]]]:
    """Every markdown table of the doc, keyed by its header row (cells joined by ' | ')."""
    tables: dict[str, list[list[str]]] = {}
    rows: list[list[str]] | None = None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if not line.startswith("|"):
            rows = None
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if rows is None:
            rows = tables.setdefault(" | ".join(cells), [])
        elif not all(re.fullmatch(r"-+", cell) for cell in cells):
            rows.append(cells)
    return tables


def on_off(cell: str) -> bool:
    assert cell in {"on", "off"}, cell
    return cell == "on"


def setting(cell: str) -> bool | None:
    return None if cell == "never saved" else on_off(cell)


def decision_rows() -> list[list[str]]:
    return doc_tables()[DECISION_HEADER]


@pytest.mark.parametrize("row", decision_rows(), ids=lambda row: f"doc row {row[0]}")
def test_doc_decision_row_matches_the_code(row: list[str]) -> None:
    _, company, allow, space_cm, web_search, user_cm, active, blocked_by = row
    flags = CompanyFlags(context_memory=on_off(company), allow_with_web_search=on_off(allow))
    if space_cm == web_search == "never saved":
        space = None
    else:
        space = SpaceState(context_memory=setting(space_cm), web_search=on_off(web_search))
    user = UserState(context_memory=setting(user_cm))

    decision = effective_enablement(flags, space, user)

    assert active in {"**yes**", "no"}
    assert decision.enabled is (active == "**yes**")
    documented = [] if blocked_by == "—" else [k.strip(" `") for k in blocked_by.split(",")]
    assert documented == [c.key for c in decision.blocking]


def test_doc_lists_all_sixteen_combinations_with_allowance_off() -> None:
    rows = decision_rows()
    numbers = [int(row[0]) for row in rows]
    assert numbers == list(range(1, len(rows) + 1))
    first_sixteen = rows[:16]
    assert [r[2] for r in first_sixteen] == ["off"] * 16
    combos = {(on_off(r[1]), on_off(r[3]), on_off(r[4]), on_off(r[5])) for r in first_sixteen}
    assert combos == set(itertools.product([True, False], repeat=4))


@pytest.mark.parametrize("row", doc_tables()[SWITCH_HEADER], ids=" | ".join)
def test_doc_switch_row_matches_the_code(row: list[str]) -> None:
    company, allow, web_search, shown = row
    flags = CompanyFlags(context_memory=on_off(company), allow_with_web_search=on_off(allow))

    switch = context_memory_switch(flags, SpaceState(web_search=on_off(web_search)))

    expected = {
        "hidden": HIDDEN,
        "editable": EDITABLE,
        "shown disabled, with the tooltip below": LOCKED,
    }
    assert switch == expected[shown]


def test_doc_quotes_the_tooltip_verbatim() -> None:
    text = " ".join(DOC.read_text(encoding="utf-8").split())
    assert f"Tooltip: *{WEB_SEARCH_TOOLTIP}*" in text
