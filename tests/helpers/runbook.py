"""The Citus runbook of docs/scaling.md, run as written.

Each fenced block of the section "Beyond one PostgreSQL" (up to "What the tests prove") names
itself in its info string (```` ```sql runbook=move-shard ````). The tests run those blocks, not
copies of them: SQL through `psql` with the block's variables given by `-v` (`:'company'`,
`:target_port`), shell blocks through `bash`, and the node settings read from their block into
every node of the test cluster (`tests/helpers/citus.py`). `tests/citus/test_runbook.py` fails
on a block without a name, and on a name no test runs: the doc cannot drift from what is run.
"""

from __future__ import annotations

import asyncio
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from app.kit.config import PROJECT_ROOT
from tests.helpers.replicated_pg import PG_BIN, Server

DOC: Final = PROJECT_ROOT / "docs" / "scaling.md"
SECTION_START: Final = "## Beyond one PostgreSQL"
SECTION_END: Final = "### What the tests prove"
_FENCE = re.compile(r"^```(?P<info>[^\n`]*)\n(?P<body>.*?)^```$", re.MULTILINE | re.DOTALL)
_NAME = re.compile(r"\brunbook=(?P<name>[a-z0-9-]+)")
PSQL_TIMEOUT_SECONDS: Final = 120.0


@dataclass(frozen=True)
class Block:
    """One fenced block of the runbook: its language, its name (None when it has none) and
    its text."""

    language: str
    name: str | None
    text: str


def runbook_text(doc: Path = DOC) -> str:
    """The runbook's part of `doc`: from `SECTION_START` up to `SECTION_END`."""
    text = doc.read_text(encoding="utf-8")
    start = text.index(SECTION_START)
    return text[start : text.index(SECTION_END, start)]


def blocks(doc: Path = DOC) -> list[Block]:
    found = []
    for match in _FENCE.finditer(runbook_text(doc)):
        info = match["info"].strip()
        named = _NAME.search(info)
        language = info.split()[0] if info else ""
        found.append(Block(language, named["name"] if named else None, match["body"]))
    return found


def block(name: str) -> str:
    """The text of the block named `name`; a KeyError names the missing block."""
    for found in blocks():
        if found.name == name:
            return found.text
    raise KeyError(f"docs/scaling.md has no runbook block {name!r}")


def settings(name: str) -> dict[str, str]:
    """The `key = value` lines of a settings block (postgresql.conf syntax, `#` comments), the
    values as postgresql.conf holds them (quotes removed)."""
    values = {}
    for line in block(name).splitlines():
        setting = line.split("#", 1)[0].strip()
        if setting:
            key, value = (part.strip() for part in setting.split("=", 1))
            values[key] = value.strip("'")
    return values


async def psql(node: Server, database: str, name: str, **variables: object) -> str:
    """Run the SQL block `name` on `node`'s `database` as `postgres` with psql, each keyword a
    psql variable; its output (unaligned, tuples only). Fails with psql's error."""
    defined = [arg for key, value in variables.items() for arg in ("-v", f"{key}={value}")]
    process = await asyncio.create_subprocess_exec(
        str(PG_BIN / "psql"),
        *("-X", "-q", "-A", "-t", "-v", "ON_ERROR_STOP=1", *defined),
        *("-h", "127.0.0.1", "-p", str(node.port), "-U", "postgres", "-d", database),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    try:
        async with asyncio.timeout(PSQL_TIMEOUT_SECONDS):
            out, err = await process.communicate(block(name).encode())
    finally:
        if process.returncode is None:  # timed out or cancelled: psql is not left behind
            process.kill()
            await process.wait()
    if process.returncode != 0:
        raise AssertionError(f"runbook block {name!r} failed:\n{err.decode(errors='replace')}")
    return out.decode()


async def shell(name: str, env: dict[str, str]) -> str:
    """Run the shell block `name` with bash (`-euo pipefail`) in the checkout, the process's
    environment with `env` on top; its output. Fails with the output."""
    process = await asyncio.create_subprocess_exec(
        "bash",
        *("-euo", "pipefail", "-c", block(name)),
        cwd=PROJECT_ROOT,
        env={**os.environ, **env},
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    try:
        async with asyncio.timeout(PSQL_TIMEOUT_SECONDS):
            out, _ = await process.communicate()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    text = out.decode(errors="replace")
    if process.returncode != 0:
        raise AssertionError(f"runbook block {name!r} exited {process.returncode}:\n{text}")
    return text
