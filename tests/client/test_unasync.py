"""The blocking client is generated from the async one by scripts/unasync.py; its `--check`
fails, with the diff, as soon as sync_client.py is not what the script would write."""

from __future__ import annotations

import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from app.kit.config import PROJECT_ROOT

SCRIPT = PROJECT_ROOT / "scripts" / "unasync.py"
SYNC_CLIENT = PROJECT_ROOT / "client" / "context_memory_client" / "sync_client.py"


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--check", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )


def test_the_sync_client_is_what_unasync_generates_from_the_async_client() -> None:
    done = check()
    assert done.returncode == 0, (
        "sync_client.py drifted from async_client.py; run `.venv/bin/python scripts/unasync.py`"
        f"\n{done.stdout}{done.stderr}"
    )


def test_the_check_fails_with_a_diff_when_the_sync_client_is_edited_by_hand(
    tmp_path: Path,
) -> None:
    edited = SYNC_CLIENT.read_text("utf-8").replace("time.sleep(delay)", "time.sleep(2 * delay)")
    assert "time.sleep(2 * delay)" in edited
    target = tmp_path / "sync_client.py"
    target.write_text(edited, "utf-8")
    done = check("--target", str(target))
    assert done.returncode == 1
    assert "-            time.sleep(2 * delay)" in done.stdout
    assert "+            time.sleep(delay)" in done.stdout
    assert "change async_client.py, not the generated file" in done.stderr


def test_the_generated_client_says_it_is_generated_and_how_to_regenerate_it() -> None:
    head = SYNC_CLIENT.read_text("utf-8").splitlines()[:2]
    assert head[0].startswith("# Generated from async_client.py by scripts/unasync.py")
    assert "scripts/unasync.py" in head[1]


def script() -> dict[str, Any]:
    return runpy.run_path(str(SCRIPT))  # its globals; `main` is not run


def test_each_async_word_becomes_its_blocking_counterpart() -> None:
    source = (
        "import asyncio\n"
        "async def poll(client: httpx.AsyncClient) -> AsyncIterator[int]:\n"
        "    async with client:\n"
        "        await asyncio.sleep(1)\n"
        "        for item in await client.get('/'):\n"
        "            yield item\n"
        "        await client.aclose()\n"
    )
    generated = script()["unasync"](source).split("\n", 2)[2]
    assert generated == (
        "def poll(client: httpx.Client) -> Iterator[int]:\n"
        "    with client:\n"
        "        time.sleep(1)\n"
        "        yield from client.get('/')\n"
        "        client.close()\n"
    )


@pytest.mark.parametrize(
    "source",
    ["from asyncio import TaskGroup\n", "async_result = None\n", "x: AsyncGenerator[int, None]\n"],
)
def test_async_code_the_rules_do_not_translate_is_refused(source: str) -> None:
    namespace = script()
    with pytest.raises(namespace["UnasyncError"], match="async code left"):
        namespace["unasync"](source)
