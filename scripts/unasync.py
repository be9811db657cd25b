"""Write the blocking client from the async one, so the two cannot drift apart.

`client/context_memory_client/sync_client.py` is `async_client.py` with its async words
substituted (`async def` -> `def`, `await x` -> `x`, `AsyncClient` -> `Client`,
`asyncio.sleep` -> `time.sleep`, ...), then import-sorted and formatted by ruff with the
project's settings. A word of async code left after the substitutions is an error, not a
silent copy: add a rule here when the async client starts to use one.

    python scripts/unasync.py            # (re)write sync_client.py
    python scripts/unasync.py --check    # exit 1 and print the diff when it is out of date
"""

from __future__ import annotations

import argparse
import difflib
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "client" / "context_memory_client"
SOURCE = PACKAGE / "async_client.py"
TARGET = PACKAGE / "sync_client.py"

HEADER = (
    "# Generated from async_client.py by scripts/unasync.py: do not edit by hand. Change\n"
    "# async_client.py, then regenerate with `.venv/bin/python scripts/unasync.py`.\n"
)

# Applied in order, each to the whole text. Words are matched whole (`\b`), so `AsyncClient`
# does not touch `AsyncMemoryClient` and `aclose` does not touch `close`.
SUBSTITUTIONS: tuple[tuple[str, str], ...] = (
    # the prose of the docstrings that says which kind of client this is
    (r"an `async` method", "a blocking method"),
    (r"\bAn async client\b", "A blocking client"),
    # imports only the async code needs
    (r"^import asyncio\n", ""),
    # a rule of the async linter that means nothing in blocking code (its noqa would be unused)
    (r"  # noqa: ASYNC\d+[^\n]*", ""),
    # an async generator cannot `yield from`; a blocking one should
    (r"^(\s+)for (\w+) in ([^\n]+):\n\s+yield \2\n", r"\1yield from \3\n"),
    # the language
    (r"\basync def\b", "def"),
    (r"\basync with\b", "with"),
    (r"\basync for\b", "for"),
    (r"\bawait ", ""),
    (r"\b__aenter__\b", "__enter__"),
    (r"\b__aexit__\b", "__exit__"),
    (r"\b__aiter__\b", "__iter__"),
    (r"\b__anext__\b", "__next__"),
    (r"\bStopAsyncIteration\b", "StopIteration"),
    (r"\bAsyncIterator\b", "Iterator"),
    (r"\bAsyncIterable\b", "Iterable"),
    (r"\basyncio\.sleep\b", "time.sleep"),
    (r"\basynccontextmanager\b", "contextmanager"),
    # httpx and this client
    (r"\baclose\b", "close"),
    (r"\bAsyncClient\b", "Client"),
    (r"\bAsyncBaseTransport\b", "BaseTransport"),
    (r"\bAsyncMemoryClient\b", "MemoryClient"),
)

LEFTOVER = re.compile(r"\b(?:async\w*|await|aclose|Async[A-Z]\w*|__a(?:enter|exit|iter|next)__)\b")


class UnasyncError(Exception):
    """The async source uses something the substitutions do not translate."""


def unasync(source: str) -> str:
    """`source` with every substitution applied, and the generated-file header on top."""
    text = source
    for pattern, replacement in SUBSTITUTIONS:
        text = re.sub(pattern, replacement, text, flags=re.MULTILINE)
    leftovers = [
        f"line {number}: {line.strip()}"
        for number, line in enumerate(text.splitlines(), start=1)
        if LEFTOVER.search(line)
    ]
    if leftovers:
        raise UnasyncError("async code left after the substitutions:\n" + "\n".join(leftovers))
    return HEADER + text


def _ruff(*args: str, text: str) -> str:
    # --stdin-filename makes ruff read the project's settings as for the real file; the command
    # is this interpreter's own ruff, never input (S603).
    command = [sys.executable, "-m", "ruff", *args, "--stdin-filename", str(TARGET), "-"]
    done = subprocess.run(command, input=text, capture_output=True, text=True, check=False)  # noqa: S603
    if done.returncode != 0:
        raise UnasyncError(f"{' '.join(command[2:4])} failed:\n{done.stderr}")
    return done.stdout


def generate(source: str) -> str:
    """The sync client for the async client's `source`, import-sorted and formatted."""
    sorted_imports = _ruff(
        "check", "--select", "I", "--fix-only", "--exit-zero", text=unasync(source)
    )
    return _ruff("format", text=sorted_imports)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument(
        "--check",
        action="store_true",
        help="write nothing; exit 1 with a diff when the target is not what would be generated",
    )
    parser.add_argument(
        "--target",
        type=Path,
        default=TARGET,
        help="the file to write or check (default: the package's sync_client.py)",
    )
    args = parser.parse_args(argv)
    try:
        expected = generate(SOURCE.read_text(encoding="utf-8"))
    except UnasyncError as error:
        print(error, file=sys.stderr)
        return 2
    target: Path = args.target
    if not args.check:
        target.write_text(expected, encoding="utf-8")
        return 0
    actual = target.read_text(encoding="utf-8") if target.exists() else ""
    if actual == expected:
        return 0
    diff = difflib.unified_diff(
        actual.splitlines(keepends=True),
        expected.splitlines(keepends=True),
        fromfile=f"{target} (as it is)",
        tofile=f"{target} (as scripts/unasync.py generates it)",
    )
    sys.stdout.writelines(diff)
    print(
        f"\n{target.name} is not what scripts/unasync.py generates from {SOURCE.name}: "
        "change async_client.py, not the generated file, and run `.venv/bin/python "
        "scripts/unasync.py`.",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
