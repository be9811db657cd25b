"""Concurrent editors of one profile: with If-Match (compare-and-set) every edit survives exactly
once on a straight line of versions; a control run that defeats the CAS shows that the checker
used here does catch lost updates."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import replace
from itertools import pairwise

import httpx
from fastapi import FastAPI

from app.profiles import repository
from app.profiles.document import Profile, Section, parse, render_body
from app.profiles.errors import VersionConflict
from app.profiles.versions import (
    ExpectedHead,
    VersionRow,
    VersionSource,
    stamp,
)
from tests.helpers.apps import AuthFactory
from tests.helpers.db import sessions
from tests.helpers.memory import ME, create
from tests.helpers.profiles import memory_md

WRITERS = 8
SEED = "seed bullet"
MAX_ATTEMPTS = 50


def with_bullet(profile: Profile, bullet: str) -> Profile:
    sections = tuple(
        (section, (*bullets, bullet) if section is Section.WORK else bullets)
        for section, bullets in profile.sections
    )
    return replace(profile, sections=sections)


def lost_update_problems(history: Sequence[VersionRow], edits: Sequence[str]) -> list[str]:
    """What is wrong with a history that should hold the seed and then each edit once.

    Versions must be exactly 1..len(edits)+1, each one adding one bullet to its predecessor
    (no fork: nothing a version held is missing from the next), and the head must hold every
    edit exactly once.
    """
    problems: list[str] = []
    numbers = [row.version for row in history]
    if numbers != list(range(1, len(edits) + 2)):
        problems.append(f"versions are {numbers}, not 1..{len(edits) + 1}")
    for older, newer in pairwise(history):
        before = set(parse(older.content).bullets(Section.WORK))
        after = set(parse(newer.content).bullets(Section.WORK))
        if not before <= after or len(after - before) != 1:
            problems.append(f"version {newer.version} does not extend version {older.version}")
    head = parse(history[-1].content).bullets(Section.WORK) if history else ()
    for edit in (SEED, *edits):
        if head.count(edit) != 1:
            problems.append(f"{edit!r} is in the head {head.count(edit)} times")
    return problems


async def stored_history(app: FastAPI) -> list[VersionRow]:
    async with sessions(app)() as session, session.begin():
        return await repository.read_all_versions(session, "acme", "alice")


async def test_concurrent_editors_with_if_match_lose_nothing(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    headers = auth("alice")
    assert (await create(client, headers, memory_md({Section.WORK: [SEED]}))).status_code == 201
    retries = 0
    first_reads = asyncio.Barrier(WRITERS)

    async def editor(n: int) -> None:
        nonlocal retries
        for attempt in range(MAX_ATTEMPTS):
            read = await client.get(ME, headers=headers)
            assert read.status_code == 200
            edited = with_bullet(parse(read.json()["content"]), f"edit {n}")
            if attempt == 0:  # every editor holds the seed's head: all but one write collides
                await first_reads.wait()
            response = await client.put(
                ME,
                json={"content": render_body(edited)},
                headers={**headers, "If-Match": read.headers["etag"]},
            )
            if response.status_code == 200:
                return
            assert response.status_code == 412, response.text
            retries += 1
        raise AssertionError(f"editor {n} gave up")

    await asyncio.gather(*(editor(n) for n in range(WRITERS)))

    history = await stored_history(app)
    assert lost_update_problems(history, [f"edit {n}" for n in range(WRITERS)]) == []
    assert [row.reason for row in history] == ["user_edit"] * (WRITERS + 1)
    assert retries > 0, "the editors never collided; the test proved nothing"


async def test_control_without_compare_and_set_the_checker_sees_lost_updates(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    """The same editors, but each writes its stale edit against whatever the head is by then:
    the compare-and-set is defeated, as if no If-Match were checked."""
    created = await create(client, auth("alice"), memory_md({Section.WORK: [SEED]}))
    assert created.status_code == 201
    maker = sessions(app)
    all_read = asyncio.Barrier(WRITERS)

    async def blind_editor(n: int) -> None:
        async with maker() as session, session.begin():
            head = await repository.read_head(session, "acme", "alice")
        assert head is not None
        edited = with_bullet(parse(head.content), f"edit {n}")
        await all_read.wait()  # everyone has read the same head
        for _ in range(MAX_ATTEMPTS):
            try:
                async with maker() as session, session.begin():
                    current = await repository.select_head_version(session, "acme", "alice")
                    assert current is not None
                    # the CAS token refreshed, the content stale
                    await repository.write_version(
                        session,
                        ExpectedHead("acme", "alice", current),
                        stamp(edited, user_id="alice", now=head.created_at, turn_count=0),
                        source=VersionSource("user_edit"),
                        tokens=1,
                    )
                return
            except VersionConflict:
                continue
        raise AssertionError(f"blind editor {n} gave up")

    await asyncio.gather(*(blind_editor(n) for n in range(WRITERS)))

    problems = lost_update_problems(
        await stored_history(app), [f"edit {n}" for n in range(WRITERS)]
    )
    assert any("is in the head 0 times" in problem for problem in problems), problems
    assert any("does not extend" in problem for problem in problems), problems


async def test_concurrent_first_creates_make_exactly_one_version(
    client: httpx.AsyncClient, auth: AuthFactory, app: FastAPI
) -> None:
    async def creator(n: int) -> int:
        content = memory_md({Section.WORK: [f"creator {n}"]})
        return (await create(client, auth("alice"), content)).status_code

    statuses = await asyncio.gather(*(creator(n) for n in range(WRITERS)))

    assert sorted(statuses) == [201] + [412] * (WRITERS - 1)
    assert [row.version for row in await stored_history(app)] == [1]
