"""The memory.md format: the seed example round-trips, render's whitespace, strict parse errors."""

from datetime import UTC, datetime, timedelta, timezone

import pytest

from app.profiles.document import (
    SECTIONS,
    TRUNCATION_MARKER,
    Frontmatter,
    Profile,
    ProfileFormatError,
    Section,
    bullet_count,
    empty_profile,
    parse,
    parse_body,
    render,
    render_body,
)

# The example from seed 002 ("Example memory.md"), byte for byte.
SEED_DOCUMENT = """\
---
user_id: user_123
schema_version: 1
last_updated: 2026-06-17T12:00:00+00:00
turn_count: 12
---

# User Memory

## Identity
- Works as a credit risk analyst at a Swiss private bank, based in Zurich (CET).
- Native German speaker; communicates with the assistant in English.

## Communication Preferences
- Prefers concise answers with concrete examples.
- Wants tables for numeric comparisons instead of prose.

## Work Context
- Preparing the quarterly IFRS 9 impairment report.
- Migrating team reporting from Excel to a Python-based pipeline.

## Skills & Expertise
_(empty)_

## Recent Topics
- 2026-06-17 11:40 UTC: Discussed expected-credit-loss staging rules.

## Open Questions / Follow-ups
- Wants to revisit the scenario-weighting approach next week.
"""

SEED_BODY = SEED_DOCUMENT[SEED_DOCUMENT.index("# User Memory") :]


def test_seed_example_parses_into_its_frontmatter_and_sections() -> None:
    profile = parse(SEED_DOCUMENT)

    assert profile.frontmatter == Frontmatter(
        user_id="user_123",
        schema_version=1,
        last_updated=datetime(2026, 6, 17, 12, 0, tzinfo=UTC),
        turn_count=12,
    )
    assert profile.bullets(Section.SKILLS) == ()
    assert profile.bullets(Section.RECENT) == (
        "2026-06-17 11:40 UTC: Discussed expected-credit-loss staging rules.",
    )
    assert profile.bullets(Section.IDENTITY)[1] == (
        "Native German speaker; communicates with the assistant in English."
    )
    assert bullet_count(profile) == 8
    assert not profile.truncated


def test_seed_example_renders_back_byte_for_byte() -> None:
    profile = parse(SEED_DOCUMENT)

    assert render(profile) == SEED_DOCUMENT
    assert render_body(profile) == SEED_BODY


def test_empty_profile_renders_placeholders_and_null_timestamp() -> None:
    text = render(empty_profile("user_9"))

    assert text.startswith("---\nuser_id: user_9\nschema_version: 1\nlast_updated: null\n")
    assert text.count("\n_(empty)_\n") == 6
    assert parse(text) == empty_profile("user_9")


def test_truncated_profile_ends_with_one_blank_line_and_the_marker() -> None:
    profile = Profile(frontmatter=parse(SEED_DOCUMENT).frontmatter, truncated=True)
    text = render(profile)

    assert text.endswith("## Open Questions / Follow-ups\n_(empty)_\n\n" + TRUNCATION_MARKER + "\n")
    assert parse(text) == profile


@pytest.mark.parametrize(
    "user_id",
    ["user_123", "123", "true", "null", "yes", "2026-06-17", "0x1F", "1_000", "a:b", "#x", "-x",
     "auth0|abc", 'quo"te', "back\\slash", "émile", "用户", "😀", "~", "'single'"],
)  # fmt: skip
def test_any_printable_user_id_round_trips_through_the_yaml_frontmatter(user_id: str) -> None:
    profile = empty_profile(user_id)

    assert parse(render(profile)).user_id == user_id
    assert render(parse(render(profile))) == render(profile)


def test_last_updated_is_kept_as_whole_utc_seconds() -> None:
    zurich = timezone(timedelta(hours=2))
    frontmatter = Frontmatter("u", last_updated=datetime(2026, 6, 17, 14, 0, 5, 999, tzinfo=zurich))

    assert frontmatter.last_updated == datetime(2026, 6, 17, 12, 0, 5, tzinfo=UTC)
    assert "last_updated: 2026-06-17T12:00:05+00:00\n" in render(Profile(frontmatter))


@pytest.mark.parametrize(
    ("kwargs", "problem"),
    [
        ({"user_id": ""}, "user_id"),
        ({"user_id": "a b"}, "user_id"),
        ({"user_id": "a\nb"}, "user_id"),
        ({"user_id": "a\u202eb"}, "user_id"),
        ({"user_id": "u", "turn_count": -1}, "turn_count"),
        ({"user_id": "u", "schema_version": 0}, "schema_version"),
        ({"user_id": "u", "last_updated": datetime(2026, 1, 1)}, "timezone"),
    ],
)
def test_frontmatter_refuses_values_it_could_not_render(
    kwargs: dict[str, object], problem: str
) -> None:
    with pytest.raises(ProfileFormatError, match=problem):
        Frontmatter(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "sections",
    [
        tuple((s, ()) for s in SECTIONS[:5]),
        tuple((s, ()) for s in reversed(SECTIONS)),
        tuple((s, ("## injected",) if s is Section.WORK else ()) for s in SECTIONS),
        tuple((s, ("",) if s is Section.WORK else ()) for s in SECTIONS),
        tuple((s, ("two\nlines",) if s is Section.WORK else ()) for s in SECTIONS),
    ],
)
def test_profile_value_only_holds_six_ordered_sections_of_sanitised_bullets(
    sections: tuple[tuple[Section, tuple[str, ...]], ...],
) -> None:
    with pytest.raises(ProfileFormatError):
        Profile(frontmatter=Frontmatter("u"), sections=sections)


def _replace(old: str, new: str) -> str:
    assert old in SEED_DOCUMENT
    return SEED_DOCUMENT.replace(old, new, 1)


PREFERENCES = "- Prefers concise answers with concrete examples.\n"

INVALID_DOCUMENTS = [
    ("no frontmatter", SEED_BODY, "line 1: expected '---'"),
    ("unclosed frontmatter", SEED_DOCUMENT.replace("turn_count: 12\n---", "turn_count: 12"),
     "line 1: frontmatter"),
    ("extra key", _replace("turn_count: 12\n", "turn_count: 12\nrole: admin\n"),
     "unexpected 'role'"),
    ("missing key", _replace("turn_count: 12\n", ""), "missing turn_count"),
    ("python tag", _replace("user_id: user_123", "user_id: !!python/object:os.system"),
     "not valid YAML"),
    ("alias", _replace("user_id: user_123", "user_id: &a [*a]"), "user_id must be a string"),
    ("numeric id", _replace("user_id: user_123", "user_id: 123"), "user_id must be a string"),
    ("duplicate key", _replace("user_id: user_123\n", "user_id: user_123\nuser_id: evil\n"),
     "canonical"),
    ("schema 2", _replace("schema_version: 1", "schema_version: 2"), "line 3: schema_version"),
    ("string count", _replace("turn_count: 12", "turn_count: '12'"), "line 5: turn_count"),
    ("date only", _replace("2026-06-17T12:00:00+00:00", "2026-06-17"), "last_updated"),
    ("naive time", _replace("2026-06-17T12:00:00+00:00", "2026-06-17T12:00:00"), "timezone"),
    ("Z suffix", _replace("2026-06-17T12:00:00+00:00", "2026-06-17T12:00:00Z"), "line 4"),
    ("no title", _replace("# User Memory\n\n", ""), "line 8: expected '# User Memory'"),
    ("second title", _replace("## Work Context\n", "## Work Context\n# User Memory\n"),
     "line 19: expected '## Skills & Expertise'"),
    ("renamed heading", _replace("## Work Context", "## Work"),
     "line 18: expected '## Work Context'"),
    ("extra heading", _replace(PREFERENCES, PREFERENCES + "## Identity\n"),
     "line 16: expected '## Work Context', found '## Identity'"),
    ("swapped sections", _replace("## Identity", "## Skills"), "line 10"),
    ("missing section", SEED_DOCUMENT[: SEED_DOCUMENT.index("\n## Open")] + "\n",
     "expected '## Open Questions / Follow-ups', found the end"),
    ("h3 inside section", _replace(PREFERENCES, PREFERENCES + "### Note\n"), "line 16"),
    ("star bullet", _replace("- Prefers", "* Prefers"), "line 15: expected a '- ' bullet"),
    ("prose line", _replace(PREFERENCES, PREFERENCES + "Some prose.\n"), "line 16"),
    ("setext underline", _replace(PREFERENCES, PREFERENCES + "=====\n"), "line 16"),
    ("fence", _replace(PREFERENCES, PREFERENCES + "```\n"), "line 16"),
    ("frontmatter in body", _replace(PREFERENCES, PREFERENCES + "---\nuser_id: evil\n---\n"),
     "line 16"),
    ("placeholder and bullet", _replace("_(empty)_", "_(empty)_\n- x"), "line 24"),
    ("empty section without placeholder", _replace("_(empty)_\n", ""), "line 22: empty section"),
    ("marker mid-document", _replace(PREFERENCES, PREFERENCES + TRUNCATION_MARKER + "\n"),
     "line 16: the truncation marker"),
    ("text after marker", SEED_DOCUMENT + "\n" + TRUNCATION_MARKER + "\n- more\n", "line 31"),
    ("unescaped heading bullet", _replace("- Prefers", "- # Prefers"), "line 15: bullet"),
    ("bidi in bullet", _replace("- Prefers", "- Pre\u202efers"), "line 15: bullet"),
    ("NUL in bullet", _replace("- Prefers", "- Pre\x00fers"), "line 15: bullet"),
    ("comment in bullet", _replace("- Prefers", "- <!-- Prefers -->"), "line 15: bullet"),
    ("empty bullet", _replace(PREFERENCES, PREFERENCES + "- \n"), "line 16: bullet"),
    ("trailing space", _replace("concrete examples.", "concrete examples. "), "line 15"),
    ("CRLF", SEED_DOCUMENT.replace("\n", "\r\n"), "line 1"),
    ("extra blank line", _replace("\n## Work", "\n\n## Work"), "line 18: not in canonical form"),
    ("no final newline", SEED_DOCUMENT.rstrip("\n"), "line 30: not in canonical form"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "where"),
    [case[1:] for case in INVALID_DOCUMENTS],
    ids=[c[0] for c in INVALID_DOCUMENTS],
)
def test_parse_rejects_anything_but_the_canonical_document(text: str, where: str) -> None:
    with pytest.raises(ProfileFormatError) as caught:
        parse(text)

    assert where in caught.value.detail
    assert isinstance(caught.value, ValueError)


@pytest.mark.parametrize(
    "text",
    [
        SEED_BODY,
        SEED_DOCUMENT,
        SEED_DOCUMENT.replace("user_id: user_123", "user_id: someone_else"),
        SEED_DOCUMENT.replace("\n", "\r\n"),
        "\ufeff\n\n" + SEED_BODY.replace("\n\n", "\n\n\n") + "\n\n",
        SEED_BODY.replace("Prefers concise answers", "Prefers concise answers   "),
        SEED_BODY + "\n" + TRUNCATION_MARKER,
    ],
    ids=["body", "document", "foreign frontmatter", "crlf", "extra blank lines", "trailing space",
         "marker"],
)  # fmt: skip
def test_parse_body_accepts_client_variants_and_ignores_their_frontmatter(text: str) -> None:
    profile = parse_body(text, user_id="owner_1")

    assert profile.frontmatter == Frontmatter(user_id="owner_1")
    assert profile.sections == parse(SEED_DOCUMENT).sections
    assert not profile.truncated


def test_parse_body_sanitises_bullets_and_drops_empty_ones() -> None:
    text = SEED_BODY.replace("_(empty)_", "- # Python\n- \u200b\n-\n- <!-- x -->")

    skills = parse_body(text, user_id="u").bullets(Section.SKILLS)

    assert skills == ("\\# Python", "\\<\\!-- x --\\>")


def test_parse_body_without_placeholders_reads_empty_sections() -> None:
    text = "# User Memory\n" + "".join(f"## {section}\n" for section in SECTIONS)

    assert parse_body(text, user_id="u") == empty_profile("u")


@pytest.mark.parametrize(
    ("text", "where"),
    [
        ("", "line 1: expected '# User Memory'"),
        ("---\nuser_id: x\n", "line 1: frontmatter"),
        ("---\na: 1\n---\n---\nuser_id: x\n---\n" + SEED_BODY, "line 4: expected '# User Memory'"),
        (SEED_BODY.replace("## Identity", "## identity"), "line 3: expected '## Identity'"),
        (SEED_BODY.replace("- Prefers", "Prefers"), "line 8: expected a '- ' bullet"),
        (SEED_BODY + "## Extra\n", "line 23: expected 'the end of the document', found '## Extra'"),
        (SEED_BODY.replace("## Work Context", TRUNCATION_MARKER + "\n## Work Context"), "line 11"),
    ],
)
def test_parse_body_is_as_strict_as_parse_about_structure(text: str, where: str) -> None:
    with pytest.raises(ProfileFormatError) as caught:
        parse_body(text, user_id="u")

    assert where in caught.value.detail
