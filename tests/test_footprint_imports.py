"""What each process imports: the packages only some paths need stay out of the others.

The openai SDK (~30 MB with its transport) is imported when a model client is built, the MCP
SDK when `/mcp` serves its first request, alembic when migrations run, httpx when there are
issuers' keys to fetch, the detectors' libraries when a first memory is judged: an API process
whose worker is off, and its app as `create_app` builds it, load none of them, and the worker
loads neither the MCP SDK nor alembic, nor the web framework and the token library (it serves
no HTTP and verifies no token). Each check runs in a fresh interpreter, since this one has
imported everything already. What they save is measured by bench/footprint.py
(docs/benchmarks.md), not asserted here.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAZY = (
    "openai",
    "aiohttp",
    "mcp",
    "mcp_types",
    "alembic",
    "httpx",
    "detect_secrets",
    "phonenumbers",
    "stdnum",
    "app.consolidation.runner",
    "opentelemetry.sdk",
)


SECRET = "footprint-test-secret-not-the-development-one"  # a test's own


def loaded_after(code: str) -> set[str]:
    """Which of `LAZY`, `fastapi` and `jwt` a new interpreter has imported after running
    `code`."""
    probe = textwrap.dedent(code) + textwrap.dedent(
        f"""
        import json, sys
        names = {(*LAZY, "fastapi", "jwt")!r}
        print(json.dumps([name for name in names if name in sys.modules]))
        """
    )
    env = {"PATH": "/usr/bin:/bin", "ENVIRONMENT": "test", "JWT_SECRET": SECRET}
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def test_the_api_app_imports_none_of_them() -> None:
    loaded = loaded_after(
        """
        from app.kit.config import Settings
        from app.main import create_app

        settings = Settings(_env_file=None, environment="test", worker_enabled=False)
        create_app(settings).openapi()
        """
    )
    assert loaded == {"fastapi", "jwt"}


def test_the_cli_imports_nothing_heavy_before_its_command_runs() -> None:
    assert loaded_after("import app.cli") == set()


def test_a_model_client_imports_the_openai_sdk() -> None:
    """The other side of the first test: the SDK does arrive when a client is built."""
    loaded = loaded_after(
        """
        from app.kit.llm import OpenAIChatModel

        OpenAIChatModel(api_key="k", base_url="http://127.0.0.1:9/v1", timeout_seconds=1)
        """
    )
    assert {"openai", "aiohttp"} <= loaded


@pytest.mark.parametrize("engine", ["rules", "openai"])
def test_the_worker_command_imports_no_web_framework_mcp_or_alembic(
    engine: str, database_url: str, tmp_path: Path
) -> None:
    """`python -m app worker` up to its first claim: the worker's own process (no API app),
    the model client built when one is configured."""
    heartbeat = tmp_path / "heartbeat"
    loaded = loaded_after(
        f"""
        import asyncio
        import time
        from pathlib import Path

        from app.cli import _run_worker
        from app.kit.config import Settings

        settings = Settings(
            _env_file=None,
            environment="test",
            database_url={database_url!r},
            worker_enabled=True,
            llm_provider={engine!r},
            openai_base_url="http://127.0.0.1:9/v1",
            worker_heartbeat_file={str(heartbeat)!r},
        )

        async def until_it_claims() -> None:
            task = asyncio.create_task(_run_worker(settings))
            deadline = time.monotonic() + 60
            while not Path({str(heartbeat)!r}).exists():  # touched before each claim
                assert not task.done() and time.monotonic() < deadline, "no worker loop"
                await asyncio.sleep(0.05)
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

        asyncio.run(until_it_claims())
        """
    )
    assert not loaded & {"mcp", "mcp_types", "alembic", "fastapi", "jwt"}
    assert ("openai" in loaded) == (engine == "openai")
