"""The TypeScript client (`clients/typescript`) against the real service: `python -m app serve`
with its consolidation worker and the offline engine, on a fresh database, and `npm test` run
against it (the generated types checked against openapi.yaml, `tsc --strict`, the client, the
Vercel AI SDK middleware and every block of docs/typescript.md under `node --test`). Then the
packed tarball installed into an empty project and imported, and the example orchestrator's
demo. Skipped, saying why, where there is no npm."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from app.kit.config import PROJECT_ROOT
from tests.helpers.apps import TEST_JWT_SECRET
from tests.helpers.db import scratch_database
from tests.test_serve_workers import serve_env, serving, wait_until_answering

PACKAGE = PROJECT_ROOT / "clients" / "typescript"
EXAMPLE = PROJECT_ROOT / "examples" / "typescript"
INSTALLED = PACKAGE / "node_modules" / ".installed"
NPM_TIMEOUT_SECONDS = 600


def _run(command: list[str], cwd: Path, env: dict[str, str] | None = None) -> str:
    """Run `command`; its output, or the test fails with it."""
    done = subprocess.run(
        command,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=NPM_TIMEOUT_SECONDS,
        check=False,
    )
    output = done.stdout + done.stderr
    if done.returncode != 0:
        pytest.fail(f"`{' '.join(command)}` in {cwd} exited {done.returncode}:\n{output[-8000:]}")
    return output


@pytest.fixture(scope="module")
def npm() -> str:
    """npm, with the package's pinned development packages installed (what `make test`'s stamp
    does, done here when it has not been)."""
    found = shutil.which("npm")
    if found is None:
        pytest.skip("npm not found: the TypeScript client's tests need Node.js and npm")
    lock = PACKAGE / "package-lock.json"
    if not INSTALLED.exists() or INSTALLED.stat().st_mtime < lock.stat().st_mtime:
        _run([found, "ci", "--no-audit", "--no-fund", "--loglevel=error"], PACKAGE)
        INSTALLED.touch()
    return found


@pytest.fixture(scope="module")
async def service_database(server_url: str) -> AsyncIterator[str]:
    async with scratch_database(server_url, "cms_ts") as url:
        yield url


@pytest.fixture(scope="module")
def service_url(
    npm: str, service_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """`python -m app serve` on the fresh database, its worker consolidating offline."""
    workdir = tmp_path_factory.mktemp("ts-serve")
    env = serve_env(
        DATABASE_URL=service_database,
        WORKER_ENABLED="true",
        WORKER_HEARTBEAT_FILE=str(workdir / "heartbeat"),
    )
    with serving(1, env, workdir) as (process, port, log_path):
        url = f"http://127.0.0.1:{port}"
        wait_until_answering(process, f"{url}/readyz", log_path)
        yield url


def _npm_env(**extra: str) -> dict[str, str]:
    return {**os.environ, "NO_COLOR": "1", **extra}


@pytest.mark.slow
def test_npm_test_passes_against_the_service(npm: str, service_url: str) -> None:
    output = _run(
        [npm, "test"], PACKAGE, _npm_env(CMS_URL=service_url, CMS_JWT_SECRET=TEST_JWT_SECRET)
    )
    assert "src/generated/openapi.ts matches openapi.yaml" in output
    passed = re.search(r"^ℹ pass (\d+)$", output, flags=re.M)
    assert passed is not None, output[-3000:]
    assert int(passed.group(1)) >= 20, output[-3000:]
    assert re.search(r"^ℹ fail 0$", output, flags=re.M), output[-3000:]
    assert re.search(r"^ℹ skipped 0$", output, flags=re.M), "every test ran against the service"


@pytest.mark.slow
def test_the_packed_tarball_installs_into_an_empty_project_and_imports(
    npm: str, tmp_path: Path
) -> None:
    _run([npm, "run", "--silent", "build"], PACKAGE)
    pack = [npm, "pack", "--json", "--ignore-scripts", "--pack-destination", str(tmp_path)]
    packed = json.loads(_run(pack, PACKAGE))
    files = {entry["path"] for entry in packed[0]["files"]}
    assert {"dist/index.js", "dist/index.d.ts", "dist/ai-sdk.js", "package.json"} <= files
    assert not any(path.startswith(("src/", "test/", "node_modules/")) for path in files)
    project = tmp_path / "app"
    project.mkdir()
    (project / "package.json").write_text('{"name": "app", "private": true, "type": "module"}')
    tarball = str(tmp_path / packed[0]["filename"])
    _run([npm, "install", "--no-audit", "--no-fund", tarball], project)
    installed = json.loads((project / "package.json").read_text())["dependencies"]
    assert list(installed) == ["context-memory-client"], "no runtime dependency came along"
    # the machine's own Node.js (>= 20), not the package's development one; `ai` not installed
    script = (
        "const m = await import('context-memory-client');"
        "const ai = await import('context-memory-client/ai-sdk');"
        "const c = new m.ContextMemoryClient({ baseUrl: 'http://127.0.0.1:9', token: 't' });"
        "console.log(process.versions.node, typeof c.saveTurn, new m.NotFound({status: 404,"
        " title: 't', detail: 'd', type: 'x', requestId: 'r', errors: [],"
        " retryAfterSeconds: null}) instanceof m.ProblemError, typeof ai.contextMemoryMiddleware);"
    )
    node = shutil.which("node")
    assert node is not None
    output = _run([node, "--input-type=module", "-e", script], project).split()
    assert int(output[0].split(".")[0]) >= 20
    assert output[1:] == ["function", "true", "function"]


@pytest.mark.slow
def test_the_example_orchestrator_plays_the_demo_against_the_service(
    npm: str, service_url: str, tmp_path: Path
) -> None:
    _run([npm, "run", "--silent", "build"], PACKAGE)
    _run([npm, "install", "--no-audit", "--no-fund", "--loglevel=error"], EXAMPLE)
    _run([str(PACKAGE / "node_modules" / ".bin" / "tsc"), "-p", "."], EXAMPLE)
    env = _npm_env(
        CMS_URL=service_url,
        JWT_SECRET=TEST_JWT_SECRET,  # the demo mints its token with `python -m app token`
        PYTHON=str(PROJECT_ROOT / ".venv" / "bin" / "python"),
    )
    env.pop("OPENAI_BASE_URL", None)
    env.pop("OPENAI_API_KEY", None)
    node = shutil.which("node")
    assert node is not None
    output = _run([node, "build/demo.js"], EXAMPLE, env)
    versions = re.search(r"5 turns; profile version after each: \[(.*)\]", output)
    assert versions is not None, output[-3000:]
    numbers = [int(v) for v in versions.group(1).split(", ")]
    assert numbers == sorted(numbers), numbers
    assert numbers[0] == 1, numbers
    assert numbers[-1] >= 3, numbers
    assert numbers[-1] == numbers[-2], "chit-chat leaves the profile as it was"
    assert "+ Based in Lisbon." in output
    assert "- Based in Berlin." in output
