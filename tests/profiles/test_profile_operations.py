"""Update operations: what ADD / UPDATE / DELETE do to a profile, their JSON form, and diffs."""

from datetime import UTC, datetime

import pytest

from app.profiles.document import (
    Frontmatter,
    Operation,
    OperationError,
    OpKind,
    Section,
    apply,
    diff_operations,
    parse,
    render,
)
from tests.helpers.profiles import profile_of

NOW = datetime(2026, 6, 18, 9, 5, 42, tzinfo=UTC)
EARLIER = datetime(2026, 6, 17, 12, 0, tzinfo=UTC)

ADD, UPDATE, DELETE = OpKind.ADD, OpKind.UPDATE, OpKind.DELETE
ID, WORK, RECENT = Section.IDENTITY, Section.WORK, Section.RECENT


FRONTMATTER = Frontmatter("user_1", last_updated=EARLIER, turn_count=3)


BASE = profile_of(
    {
        ID: ["Works as a credit risk analyst.", "Based in Zurich."],
        WORK: ["Preparing the IFRS 9 report."],
        RECENT: ["2026-06-17 11:40 UTC: Discussed staging rules."],
    },
    FRONTMATTER,
)

APPLY_CASES = [
    ("add appends", [Operation(ADD, WORK, text="Migrating to Python.")],
     WORK, ("Preparing the IFRS 9 report.", "Migrating to Python.")),
    ("add sanitises", [Operation(ADD, WORK, text="  ## Budget\n\tplanning \u202e")],
     WORK, ("Preparing the IFRS 9 report.", "\\## Budget planning")),
    ("add duplicate ignoring case and spaces", [Operation(ADD, ID, text="based  in ZURICH.")],
     ID, BASE.bullets(ID)),
    ("add prefixes recent topics with now", [Operation(ADD, RECENT, text="ECL scenarios")],
     RECENT, (*BASE.bullets(RECENT), "2026-06-18 09:05 UTC: ECL scenarios")),
    ("add keeps a valid prefix", [Operation(ADD, RECENT, text="2026-06-01 08:00 UTC: Old topic")],
     RECENT, (*BASE.bullets(RECENT), "2026-06-01 08:00 UTC: Old topic")),
    ("add re-prefixes an invalid date",
     [Operation(ADD, RECENT, text="2026-13-01 08:00 UTC: x")],
     RECENT, (*BASE.bullets(RECENT), "2026-06-18 09:05 UTC: 2026-13-01 08:00 UTC: x")),
    ("update in place", [Operation(UPDATE, ID, text="Based in Geneva.", target="Based in Zurich.")],
     ID, ("Works as a credit risk analyst.", "Based in Geneva.")),
    ("update finds target ignoring case and spaces",
     [Operation(UPDATE, ID, text="Based in Geneva.", target=" based in   zurich. ")],
     ID, ("Works as a credit risk analyst.", "Based in Geneva.")),
    ("update recent topic by its text alone",
     [Operation(UPDATE, RECENT, text="Staging rules, stage 2 triggers",
                target="discussed staging rules.")],
     RECENT, ("2026-06-18 09:05 UTC: Staging rules, stage 2 triggers",)),
    ("delete", [Operation(DELETE, ID, target="Works as a credit risk analyst.")],
     ID, ("Based in Zurich.",)),
    ("ops apply in order",
     [Operation(ADD, WORK, text="A"), Operation(UPDATE, WORK, text="B", target="A"),
      Operation(DELETE, WORK, target="Preparing the IFRS 9 report.")],
     WORK, ("B",)),
]  # fmt: skip


@pytest.mark.parametrize(
    ("ops", "section", "expected"),
    [case[1:] for case in APPLY_CASES],
    ids=[case[0] for case in APPLY_CASES],
)
def test_apply_changes_the_named_section(
    ops: list[Operation], section: Section, expected: tuple[str, ...]
) -> None:
    result = apply(BASE, ops, NOW)

    assert result.bullets(section) == expected
    others = [s for s, _ in BASE.sections if s is not section]
    assert all(result.bullets(s) == BASE.bullets(s) for s in others)
    assert parse(render(result)) == result


def test_a_change_stamps_the_frontmatter_and_keeps_the_owner() -> None:
    result = apply(BASE, [Operation(ADD, WORK, text="New goal.")], NOW)

    assert result.frontmatter == Frontmatter(
        "user_1", last_updated=datetime(2026, 6, 18, 9, 5, 42, tzinfo=UTC), turn_count=4
    )


@pytest.mark.parametrize(
    "ops",
    [
        [],
        [Operation(ADD, ID, text="BASED IN ZURICH.")],
        [Operation(ADD, WORK, text="\u200b \n")],
        [Operation(UPDATE, ID, text="Based in Zurich.", target="Based in Zurich.")],
        [Operation(ADD, WORK, text="x"), Operation(DELETE, WORK, target="x")],
    ],
    ids=["no ops", "duplicate add", "blank add", "identity update", "add then delete"],
)
def test_no_net_change_returns_the_same_profile_unstamped(ops: list[Operation]) -> None:
    truncated = profile_of({ID: ["Based in Zurich."]}, FRONTMATTER, truncated=True)

    assert apply(truncated, ops, NOW) is truncated


def test_a_changed_profile_is_no_longer_marked_truncated() -> None:
    truncated = profile_of({ID: ["Based in Zurich."]}, FRONTMATTER, truncated=True)

    assert not apply(truncated, [Operation(ADD, WORK, text="x")], NOW).truncated


@pytest.mark.parametrize(
    ("op", "problem"),
    [
        (Operation(UPDATE, ID, text="x", target="Lives in Bern."), "operation 1 (UPDATE"),
        (Operation(DELETE, WORK, target="Based in Zurich."), "no bullet matches"),
        (Operation(UPDATE, ID, text=" \x00 ", target="Based in Zurich."), "new text is empty"),
    ],
)
def test_operations_that_do_not_fit_raise(op: Operation, problem: str) -> None:
    with pytest.raises(OperationError, match=problem.replace("(", r"\(")):
        apply(BASE, [op], NOW)


def test_apply_requires_an_aware_now() -> None:
    with pytest.raises(ValueError, match="timezone"):
        apply(BASE, [], datetime(2026, 1, 1))


@pytest.mark.parametrize(
    ("kind", "text", "target"),
    [(ADD, None, None), (ADD, "x", "y"), (UPDATE, "x", None), (UPDATE, None, "y"),
     (DELETE, None, None), (DELETE, "x", "y")],
)  # fmt: skip
def test_operation_requires_exactly_the_fields_of_its_kind(
    kind: OpKind, text: str | None, target: str | None
) -> None:
    with pytest.raises(OperationError):
        Operation(kind, WORK, text=text, target=target)


@pytest.mark.parametrize(
    ("op", "stored"),
    [
        (Operation(ADD, WORK, text="x"),
         {"op": "ADD", "section": "Work Context", "old": None, "new": "x"}),
        (Operation(UPDATE, Section.SKILLS, text="b", target="a"),
         {"op": "UPDATE", "section": "Skills & Expertise", "old": "a", "new": "b"}),
        (Operation(DELETE, Section.FOLLOWUPS, target="a"),
         {"op": "DELETE", "section": "Open Questions / Follow-ups", "old": "a", "new": None}),
    ],
)  # fmt: skip
def test_operation_json_is_the_versions_table_form(
    op: Operation, stored: dict[str, object]
) -> None:
    assert op.to_json() == stored
    assert Operation.from_json(stored) == op


def test_operation_json_accepts_a_lowercase_op_and_missing_nulls() -> None:
    assert Operation.from_json({"op": "add", "section": "Identity", "new": "x"}) == Operation(
        ADD, ID, text="x"
    )


@pytest.mark.parametrize(
    "data",
    [
        {"op": "MERGE", "section": "Identity", "new": "x"},
        {"op": "ADD", "section": "identity", "new": "x"},
        {"op": "ADD", "section": "## Identity", "new": "x"},
        {"op": "ADD", "section": "Identity", "new": 3},
        {"op": "ADD", "section": "Identity"},
        {"op": "ADD", "section": "Identity", "new": "x", "user_id": "evil"},
        {"section": "Identity", "new": "x"},
        {"op": ["ADD"], "section": "Identity", "new": "x"},
    ],
)
def test_operation_from_json_rejects_bad_data(data: dict[str, object]) -> None:
    with pytest.raises(OperationError):
        Operation.from_json(data)


DIFF_CASES = [
    ("identical", ["a", "b"], ["a", "b"], []),
    ("append", ["a"], ["a", "b"], [Operation(ADD, WORK, text="b")]),
    ("replace in place", ["a", "b", "c"], ["a", "x", "c"],
     [Operation(UPDATE, WORK, text="x", target="b")]),
    ("delete", ["a", "b", "c"], ["a", "c"], [Operation(DELETE, WORK, target="b")]),
    ("more removed than added", ["a", "b", "c"], ["x"],
     [Operation(DELETE, WORK, target="c"), Operation(DELETE, WORK, target="b"),
      Operation(UPDATE, WORK, text="x", target="a")]),
    ("insert before survivors shifts them", ["a", "c"], ["a", "b", "c"],
     [Operation(UPDATE, WORK, text="b", target="c"), Operation(ADD, WORK, text="c")]),
    ("swap", ["b", "a"], ["a", "b"],
     [Operation(UPDATE, WORK, text="b", target="a"),
      Operation(UPDATE, WORK, text="a", target="b")]),
]  # fmt: skip


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [case[1:] for case in DIFF_CASES],
    ids=[case[0] for case in DIFF_CASES],
)
def test_diff_operations_describe_the_rewrite(
    old: list[str], new: list[str], expected: list[Operation]
) -> None:
    before, after = profile_of({WORK: old}, FRONTMATTER), profile_of({WORK: new}, FRONTMATTER)

    ops = diff_operations(before, after)

    assert ops == expected
    assert apply(before, ops, NOW).sections == after.sections


def test_diff_across_sections_moves_a_bullet() -> None:
    before = profile_of({WORK: ["Knows SQL."]}, FRONTMATTER)
    after = profile_of({Section.SKILLS: ["Knows SQL."]}, FRONTMATTER)

    assert diff_operations(before, after) == [
        Operation(DELETE, WORK, target="Knows SQL."),
        Operation(ADD, Section.SKILLS, text="Knows SQL."),
    ]
