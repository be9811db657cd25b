"""`make demo` on a machine with no service running, no network and no model key: the demo
starts `python -m app serve` itself (here on the test database), plays its five turns, and the
profile grows, takes the correction, and holds still on chit-chat."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from app.kit.config import PROJECT_ROOT
from tests.helpers.apps import TEST_JWT_SECRET

DEMO_TIMEOUT_SECONDS = 180


def _unused_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.slow
def test_the_demo_starts_a_service_and_shows_the_profile_grow_over_five_turns(
    database_url: str, tmp_path: Path
) -> None:
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "PYTHONPATH": str(PROJECT_ROOT),
        "CMS_URL": f"http://127.0.0.1:{_unused_port()}",  # nothing answers there
        "DATABASE_URL": database_url,
        "JWT_SECRET": TEST_JWT_SECRET,
        "LLM_PROVIDER": "rules",
        "WORKER_HEARTBEAT_FILE": str(tmp_path / "heartbeat"),
    }  # no OPENAI_* variable: the orchestrator answers with its canned reply
    done = subprocess.run(
        [sys.executable, "-m", "examples.demo"],
        cwd=PROJECT_ROOT,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_SECONDS,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]

    assert "starting one on port" in out
    assert "Stopped the service the demo started." in out
    turns = re.split(r"^=== Turn \d/5 =+$", out, flags=re.MULTILINE)[1:]
    assert len(turns) == 5
    versions = [int(v) for v in re.findall(r"profile version (\d+)", out)]
    assert versions == [1, 2, 3, 4, 4]  # four turns said something durable, the fifth did not
    assert "+ Works as a data engineer." in turns[0]
    assert "+ Based in Berlin." in turns[1]
    assert "+ Prefers concise answers." in turns[2]
    assert "- Based in Berlin." in turns[3]
    assert "+ Based in Lisbon." in turns[3]
    assert "consolidation noop" in turns[4]
    assert "profile diff: (no change)" in turns[4]
    # the first turn's model call had no memory yet; every later one was given the section
    assert "without a memory section" in turns[0]
    assert all("with a memory section" in turn for turn in turns[1:])
    final_section = turns[4].split("injected next turn:")[1]
    assert "## What I know about you" in final_section
    assert "Based in Lisbon." in final_section
    assert "Based in Berlin." not in final_section
    assert "Prefers concise answers." in final_section
