"""Properties of generated profiles: render/parse round-trips, apply(diff) reproduces a rewrite."""

from datetime import UTC, datetime

from hypothesis import given, settings
from hypothesis import strategies as st

from app.profiles.document import (
    SECTIONS,
    Frontmatter,
    Operation,
    OpKind,
    Profile,
    Section,
    apply,
    body_has_bullets,
    diff_operations,
    parse,
    parse_body,
    render,
    render_body,
    sanitize_bullet,
    stored_body,
)
from app.profiles.profile import topic_prefix

PROPERTY = settings(max_examples=200, database=None, deadline=None)
NOW = datetime(2026, 6, 18, 9, 5, tzinfo=UTC)

# Structural characters are over-represented so that the escaping rules get exercised.
raw_text = (
    st.text(alphabet=st.sampled_from("#-=*_>`~<!|+ \n\t\u202e\u200b\x00aZé0.:()")) | st.text()
)
bullet_text = raw_text.map(sanitize_bullet).filter(bool)
moments = st.datetimes(
    min_value=datetime(2000, 1, 1), max_value=datetime(2100, 1, 1), timezones=st.just(UTC)
)
topic_text = st.builds(
    lambda at, text: sanitize_bullet(topic_prefix(at) + text), moments, bullet_text
)
user_ids = st.text(min_size=1, max_size=40).filter(lambda t: t.isprintable() and " " not in t)


def fold(text: str) -> str:
    return text.casefold()


def section_bullets(section: Section) -> st.SearchStrategy[list[str]]:
    item = topic_text if section is Section.RECENT else bullet_text
    return st.lists(item, max_size=6, unique_by=fold)


@st.composite
def profiles(draw: st.DrawFn) -> Profile:
    frontmatter = Frontmatter(
        user_id=draw(user_ids),
        last_updated=draw(st.none() | moments),
        turn_count=draw(st.integers(min_value=0, max_value=10**9)),
    )
    sections = {section: draw(section_bullets(section)) for section in SECTIONS}
    return Profile.from_sections(frontmatter, sections, truncated=draw(st.booleans()))


@st.composite
def rewrites(draw: st.DrawFn) -> tuple[Profile, Profile]:
    """A profile and a rewrite of it that keeps, drops, reorders and adds bullets."""
    old = draw(profiles())
    new_sections = {}
    for section in SECTIONS:
        kept = old.bullets(section)
        fresh = topic_text if section is Section.RECENT else bullet_text
        choice = st.sampled_from(kept) | fresh if kept else fresh
        new_sections[section] = draw(st.lists(choice, max_size=7, unique_by=fold))
    return old, Profile.from_sections(old.frontmatter, new_sections)


@PROPERTY
@given(profiles())
def test_render_then_parse_is_the_identity(profile: Profile) -> None:
    text = render(profile)

    assert parse(text) == profile
    assert render(parse(text)) == text


@PROPERTY
@given(profiles(), user_ids)
def test_parse_body_reads_any_rendering_for_its_owner(profile: Profile, owner: str) -> None:
    for text in (render(profile), render_body(profile)):
        parsed = parse_body(text, user_id=owner)

        assert parsed.sections == profile.sections
        assert parsed.frontmatter == Frontmatter(user_id=owner)


@PROPERTY
@given(rewrites())
def test_applying_the_diff_reproduces_the_rewrite(pair: tuple[Profile, Profile]) -> None:
    old, new = pair

    result = apply(old, diff_operations(old, new), NOW)

    assert result.sections == new.sections
    assert result.user_id == old.user_id
    if old.sections == new.sections:
        assert result is old
    else:
        assert result.frontmatter.turn_count == old.frontmatter.turn_count + 1
        assert result.frontmatter.last_updated == NOW


@PROPERTY
@given(profiles(), st.lists(st.tuples(st.sampled_from(SECTIONS), raw_text), max_size=8))
def test_any_added_text_lands_as_a_bullet_of_a_valid_document(
    profile: Profile, additions: list[tuple[Section, str]]
) -> None:
    ops = [Operation(OpKind.ADD, section, text=text) for section, text in additions]

    result = apply(profile, ops, NOW)

    assert parse(render(result)) == result
    assert result.user_id == profile.user_id
    for section, text in additions:
        clean = fold(sanitize_bullet(text))
        present = [fold(bullet) for bullet in result.bullets(section)]
        assert not clean or any(bullet.endswith(clean) for bullet in present)


@PROPERTY
@given(profiles())
def test_the_stored_body_is_the_rendered_body_without_a_parse(profile: Profile) -> None:
    text = render(profile)

    assert stored_body(text) == render_body(profile)
    assert body_has_bullets(stored_body(text)) == any(bullets for _, bullets in profile.sections)


@PROPERTY
@given(st.text(alphabet=st.characters(min_codepoint=32, max_codepoint=126)))
def test_the_ascii_fast_path_of_sanitising_changes_nothing(text: str) -> None:
    """Printable ASCII skips the per-character pass; the result must be the slow path's."""
    from app.profiles import sanitize  # noqa: PLC0415

    assert "".join(sanitize._clean_char(char) for char in text) == text
