"""Version rules (pure) and the versioned writes underneath the API: the compare-and-set, its
unique-constraint backstop, retention, clearing, and the worker's `load_profile` /
`save_consolidation`."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncSession

from app.folders import service as folders
from app.kit.errors import NotFound, PreconditionFailed, PreconditionRequired
from app.kit.principal import Principal
from app.profiles import repository, service
from app.profiles.document import (
    Frontmatter,
    Operation,
    OpKind,
    Profile,
    Section,
    empty_profile,
    parse,
)
from app.profiles.errors import MemoryFileMissing, VersionConflict
from app.profiles.versions import (
    EntityTags,
    ExpectedHead,
    VersionPolicy,
    VersionSource,
    check_write_preconditions,
    count_tokens,
    parse_entity_tags,
    stamp,
    unified_diff,
)
from tests.helpers.profiles import STORED_COUNTER

NOW = datetime(2026, 6, 17, 12, 0, tzinfo=UTC)
ALICE = Principal(user_id="alice", company_id="acme", roles=frozenset())


def work(*bullets: str, user_id: str = "alice") -> Profile:
    return Profile.from_sections(Frontmatter(user_id=user_id), {Section.WORK: bullets})


# --- pure rules ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("header", "version", "strong", "weak"),
    [
        ('"3"', 3, True, True),
        ('W/"3"', 3, False, True),
        ('"1", "3"', 3, True, True),
        ("*", 3, True, True),
        ("3", 3, False, False),
        ('"4"', 3, False, False),
        ("", 3, False, False),
    ],
)
def test_entity_tags_compare_strongly_or_weakly(
    header: str, version: int, strong: bool, weak: bool
) -> None:
    tags = parse_entity_tags(header)
    assert tags is not None
    assert tags.matches(version, weak=False) is strong
    assert tags.matches(version, weak=True) is weak


STAR = parse_entity_tags("*")
TAG_2 = parse_entity_tags('"2"')
TAG_1 = parse_entity_tags('"1"')


@pytest.mark.parametrize(
    ("current", "if_match", "if_none_match", "may_create", "error"),
    [
        (None, None, STAR, True, None),  # create
        (None, None, None, True, PreconditionRequired),  # blind create
        (None, None, TAG_1, True, PreconditionRequired),  # not a create condition
        (None, TAG_2, None, True, PreconditionFailed),  # If-Match against nothing
        (None, None, STAR, False, PreconditionRequired),  # restore cannot create
        (2, TAG_2, None, True, None),  # replace
        (2, TAG_1, None, True, PreconditionFailed),  # stale
        (2, None, None, True, PreconditionRequired),  # blind replace
        (2, None, STAR, True, PreconditionFailed),  # create over an existing profile
        (2, None, TAG_1, True, PreconditionRequired),  # If-None-Match passes, still blind
        (2, TAG_2, STAR, True, PreconditionFailed),  # contradictory
    ],
)
def test_write_preconditions(
    current: int | None,
    if_match: EntityTags | None,
    if_none_match: EntityTags | None,
    may_create: bool,
    error: type[Exception] | None,
) -> None:
    if error is None:
        check_write_preconditions(current, if_match, if_none_match, may_create=may_create)
    else:
        with pytest.raises(error):
            check_write_preconditions(current, if_match, if_none_match, may_create=may_create)


def test_version_conflict_is_a_412() -> None:
    conflict = VersionConflict(3, 5)
    assert isinstance(conflict, PreconditionFailed)
    assert conflict.status == 412
    assert (conflict.expected, conflict.current) == (3, 5)


def test_stamp_replaces_any_frontmatter_and_keeps_the_sections() -> None:
    forged = Profile(
        frontmatter=Frontmatter(user_id="mallory", turn_count=99), sections=work("a").sections
    )
    stamped = stamp(forged, user_id="alice", now=NOW, turn_count=4)
    assert stamped.frontmatter == Frontmatter(user_id="alice", last_updated=NOW, turn_count=4)
    assert stamped.sections == forged.sections


def test_unified_diff_names_the_versions() -> None:
    diff = unified_diff("a\nb\n", "a\nc\n", old_version=1, new_version=2)
    assert diff == "--- memory.md@1\n+++ memory.md@2\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n"


# --- storage ------------------------------------------------------------------------------------


@pytest.fixture
async def session(app: FastAPI) -> AsyncIterator[AsyncSession]:
    async with app.state.database.sessionmaker() as db_session:
        yield db_session


async def provision(db: AsyncSession, principal: Principal = ALICE) -> None:
    async with db.begin():
        folder_id, _ = await folders.ensure_user_folder(db, principal)
        await service.ensure_memory_file(db, principal.company_id, principal.user_id, folder_id)


async def write(db: AsyncSession, expected: int, profile: Profile) -> int:
    async with db.begin():
        row = await repository.write_version(
            db,
            ExpectedHead("acme", "alice", expected),
            stamp(profile, user_id="alice", now=NOW, turn_count=0),
            source=VersionSource("user_edit"),
            tokens=5,
        )
    return row.version


async def version_numbers(db: AsyncSession) -> list[int]:
    async with db.begin():
        rows = await repository.read_all_versions(db, "acme", "alice")
    return [row.version for row in rows]


async def test_write_version_advances_the_head_by_compare_and_set(session: AsyncSession) -> None:
    await provision(session)
    assert await write(session, 0, work("a")) == 1
    assert await write(session, 1, work("b")) == 2

    with pytest.raises(VersionConflict) as stale:
        await write(session, 1, work("lost"))

    assert (stale.value.expected, stale.value.current) == (1, 2)
    assert await version_numbers(session) == [1, 2]
    async with session.begin():
        head = await repository.read_head(session, "acme", "alice")
    assert head is not None
    assert parse(head.content).bullets(Section.WORK) == ("b",)


async def test_the_primary_key_backs_the_compare_and_set(
    session: AsyncSession, app: FastAPI
) -> None:
    await provision(session)
    await write(session, 0, work("a"))
    # A version row ahead of the head (as a corrupted or foreign writer might leave it): the CAS
    # passes, the insert hits the primary key, and that is a conflict too, not an overwrite.
    async with session.begin():
        await session.execute(
            text(
                "INSERT INTO memory_versions (company_id, user_id, version, content, sha256,"
                " tokens, reason) VALUES ('acme', 'alice', 2, 'x', :sha, 1, 'user_edit')"
            ),
            {"sha": "0" * 64},
        )

    with pytest.raises(VersionConflict):
        await write(session, 1, work("b"))

    async with session.begin():
        state = await repository.select_head_state(session, "acme", "alice")
    assert state is not None
    assert state.head_version == 1  # the failed transaction rolled the CAS back


async def test_writing_without_a_memory_file_is_refused(session: AsyncSession) -> None:
    with pytest.raises(MemoryFileMissing):
        await write(session, 0, work("a"))


async def test_the_owner_must_be_in_the_frontmatter(session: AsyncSession) -> None:
    await provision(session)
    with pytest.raises(ValueError, match="owner"):
        async with session.begin():
            await repository.write_version(
                session,
                ExpectedHead("acme", "alice", 0),
                work("a", user_id="mallory"),
                source=VersionSource("user_edit"),
                tokens=1,
            )


async def test_pruning_keeps_the_newest_and_never_the_head(session: AsyncSession) -> None:
    await provision(session)
    for n in range(5):
        await write(session, n, work(f"fact {n}"))

    async with session.begin():
        assert await repository.prune_versions(session, "acme", "alice", 2) == 3
        assert await repository.prune_versions(session, "acme", "alice", 2) == 0
    assert await version_numbers(session) == [4, 5]
    async with session.begin():
        assert await repository.prune_versions(session, "acme", "alice", 1) == 1
    assert await version_numbers(session) == [5]
    with pytest.raises(ValueError, match="head"):
        await repository.prune_versions(session, "acme", "alice", 0)


async def test_clearing_advances_the_head_past_the_deleted_versions(
    session: AsyncSession,
) -> None:
    await provision(session)
    await write(session, 0, work("a"))
    await write(session, 1, work("b"))

    async with session.begin():
        assert await repository.delete_profile(session, "acme", "alice", 2) == 2
    async with session.begin():
        state = await repository.select_head_state(session, "acme", "alice")
    assert state is not None
    assert (state.head_version, state.row) == (3, None)
    with pytest.raises(VersionConflict):
        await write(session, 2, work("stale"))
    assert await write(session, 3, work("new")) == 4


# --- the worker's calls -------------------------------------------------------------------------


async def test_load_profile_without_a_folder_is_not_found(session: AsyncSession) -> None:
    with pytest.raises(NotFound):
        async with session.begin():
            await service.load_profile(session, "acme", "alice")


async def test_load_profile_before_the_first_version_is_empty_at_zero(
    session: AsyncSession,
) -> None:
    async with session.begin():
        await folders.ensure_user_folder(session, ALICE)
    async with session.begin():
        assert await service.load_profile(session, "acme", "alice") == (
            empty_profile("alice"),
            0,
        )


async def save(
    db: AsyncSession, expected: int, profile: Profile, reason: str = "consolidation"
) -> int | None:
    async with db.begin():
        row = await service.save_consolidation(
            db,
            ExpectedHead("acme", "alice", expected),
            profile,
            VersionSource(
                reason=reason,  # type: ignore[arg-type]
                operations=(Operation(OpKind.ADD, Section.WORK, text="x"),),
                source_turn_ids=("t-1",),
                model="gpt-test",
                tokens_in=10,
                tokens_out=3,
                job_id=uuid.UUID(int=7),
            ),
            VersionPolicy(STORED_COUNTER, keep=50, clock=lambda: NOW),
        )
    return None if row is None else row.version


async def test_save_consolidation_writes_what_the_worker_read(session: AsyncSession) -> None:
    async with session.begin():
        await folders.ensure_user_folder(session, ALICE)  # what turn-save does; no memory.md yet

    assert await save(session, 0, work("a", user_id="mallory")) == 1
    assert await save(session, 1, work("a", "b")) == 2

    async with session.begin():
        profile, version = await service.load_profile(session, "acme", "alice")
        head = await repository.read_head(session, "acme", "alice")
    assert head is not None
    assert profile.frontmatter.user_id == "alice"  # never what the model wrote
    assert head.source_turn_ids == ["t-1"]
    assert (head.model, head.tokens_in, head.tokens_out) == ("gpt-test", 10, 3)
    assert head.job_id == uuid.UUID(int=7)
    assert head.operations == [{"op": "ADD", "section": "Work Context", "old": None, "new": "x"}]
    assert head.tokens == count_tokens(profile, STORED_COUNTER)
    assert version == head.version


async def test_turn_count_counts_consolidations_only(session: AsyncSession) -> None:
    async with session.begin():
        await folders.ensure_user_folder(session, ALICE)
    await save(session, 0, work("a"))
    await save(session, 1, work("a", "b"))
    await save(session, 2, work("b"), reason="condensation")

    async with session.begin():
        profile, version = await service.load_profile(session, "acme", "alice")
    assert version == 3
    assert profile.frontmatter.turn_count == 2
    assert profile.frontmatter.last_updated == NOW


async def test_an_unchanged_profile_writes_nothing(session: AsyncSession) -> None:
    async with session.begin():
        await folders.ensure_user_folder(session, ALICE)
    assert await save(session, 0, empty_profile("alice")) is None
    assert await save(session, 0, work("a")) == 1
    assert await save(session, 1, work("a")) is None
    assert await version_numbers(session) == [1]


async def test_a_stale_consolidation_conflicts(session: AsyncSession) -> None:
    async with session.begin():
        await folders.ensure_user_folder(session, ALICE)
    await save(session, 0, work("a"))
    with pytest.raises(VersionConflict):
        await save(session, 0, work("b"))


async def test_a_consolidation_after_the_folder_was_deleted_writes_nothing(
    session: AsyncSession,
) -> None:
    async with session.begin():
        await folders.ensure_user_folder(session, ALICE)
    await save(session, 0, work("a"))
    async with session.begin():
        await folders.delete_user_folder(session, "acme", "alice")  # what an opt-out does

    with pytest.raises(NotFound):
        await save(session, 1, work("a", "b"))
    async with session.begin():
        folder = await folders.load_folder_node(session, "acme", "user-memory/alice")
    assert folder is None  # not resurrected
