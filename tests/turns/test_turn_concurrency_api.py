"""Concurrent turn-saves over HTTP keep every chat's history whole and in order."""

from __future__ import annotations

import asyncio
from itertools import groupby

import httpx

from tests.helpers.apps import AuthFactory, client_with
from tests.helpers.turns import save_turn, stored, user

CHATS = ("chat-a", "chat-b", "chat-c", "chat-d")
TURNS = 200
CONCURRENCY = 16


async def test_concurrent_turn_saves_keep_each_turn_whole_and_contiguous(
    database_url: str, auth: AuthFactory
) -> None:
    # more turns of one user than the default rate limit lets through in a minute
    async with client_with(database_url, rate_limit_turns_user="1000/60") as client:
        await _save_concurrently_and_check(client, auth)


async def _save_concurrently_and_check(client: httpx.AsyncClient, auth: AuthFactory) -> None:
    """200 turn-saves spread over 4 chats, 16 in flight at a time.

    Turns of one chat that are in flight together have no order between themselves, so the
    invariant is about each chat's stored sequence (ordered by message id, as history is
    loaded), and it is exact:
      1. every acknowledged turn is stored exactly once: its request and its response, nothing
         else with its turn id, and no message without an acknowledged turn;
      2. each turn is contiguous and in order: its request immediately followed by its response,
         never interleaved with another turn's messages (turn-saves of one chat are serialised
         by an advisory lock, so ids follow commit order within a chat);
      3. turns sent one after another by one client keep their order (checked by the last
         sequential turn being last).
    """
    gate = asyncio.Semaphore(CONCURRENCY)

    async def one(n: int) -> tuple[str, str, str]:
        chat = CHATS[n % len(CHATS)]
        async with gate:
            response = await save_turn(client, auth, chat, [user(f"Q{n}")], f"R{n}")
        return chat, response.json()["turn_id"], f"{n}"

    acknowledged = await asyncio.gather(*(one(n) for n in range(TURNS)))
    final = {
        chat: (await save_turn(client, auth, chat, [user("last")], "end")).json()["turn_id"]
        for chat in CHATS
    }

    for chat in CHATS:
        expected = {turn: n for c, turn, n in acknowledged if c == chat}
        messages = await stored(client, auth, chat)
        ids = [m["id"] for m in messages]
        assert ids == sorted(ids)
        blocks = [(turn, list(group)) for turn, group in groupby(messages, lambda m: m["turn_id"])]
        turns = [turn for turn, _ in blocks]
        assert len(turns) == len(set(turns)), "a turn's messages are split"
        assert set(turns) == set(expected) | {final[chat]}
        assert turns[-1] == final[chat]
        for turn, block in blocks[:-1]:
            n = expected[turn]
            assert [(m["role"], m["content"], m["source"]) for m in block] == [
                ("user", f"Q{n}", "request"),
                ("assistant", f"R{n}", "response"),
            ]
