"""docs/api.md works as written: every `bash` block runs, in order, as a real shell against the
app served on a real port over a fresh database (what a fresh `make run` sees), and every
request answers the status its `# → NNN` comment states. Every operation of `openapi.yaml`
must have an example there, so a new route without documentation fails here.

The blocks run with `TOKEN` set to a token the app itself mints for alice of acme (operator and
space admin, like the one `make run` prints) in place of the doc's `TOKEN=...` line, and with
`localhost:8000` / `127.0.0.1:8000` rewritten to the test server. Shell variables a block sets
(`JOB`, `ETAG`, ...) carry over to the next blocks. `curl` is wrapped so that each call also
reports its status on stderr, leaving its output, which the doc may pipe, untouched.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from app.kit.auth.mint import issue_token
from app.kit.config import PROJECT_ROOT
from app.kit.errors import OTHER_PROBLEMS, PROBLEM_BASE, Conflict, DomainError, ProblemType
from app.kit.principal import Principal
from app.main import create_app
from tests.helpers.apps import make_settings
from tests.helpers.db import scratch_database
from tests.helpers.serving import served

DOC = PROJECT_ROOT / "docs" / "api.md"
OPENAPI = PROJECT_ROOT / "openapi.yaml"
HTTP_METHODS = ("get", "put", "post", "patch", "delete")

BLOCK = re.compile(r"^```bash\n(.*?)^```", re.MULTILINE | re.DOTALL)
EXPECTED_STATUS = re.compile(r"# → (\d{3})\b")
ASSIGNED = re.compile(r"^([A-Z][A-Z0-9_]*)=", re.MULTILINE)
DOC_HOSTS = re.compile(r"(?:http://)?(?:localhost|127\.0\.0\.1):8000")
STATUS_LINE = re.compile(r"^CURL_HTTP_STATUS=(\d{3})$", re.MULTILINE)
# every curl also writes its status to stderr (written last, so it wins over the doc's own -w)
CURL_WRAPPER = (
    "curl() { command curl \"$@\" --write-out '%{stderr}\\nCURL_HTTP_STATUS=%{http_code}\\n'; }\n"
)
BLOCK_TIMEOUT_SECONDS = 60


def doc_blocks() -> list[str]:
    return BLOCK.findall(DOC.read_text(encoding="utf-8"))


def requests_of(block: str) -> list[str]:
    """Each curl command of a block, from the line that calls curl to the line that ends with its
    `# → NNN` (an argument may span lines); a curl with no status before the next is an error."""
    requests: list[str] = []
    current: list[str] | None = None
    for line in block.splitlines():
        if re.search(r"(^|[\s(])curl\s", line):
            assert current is None, f"no `# → NNN` after this request: {' '.join(current)}"
            current = []
        if current is not None:
            current.append(line)
            if EXPECTED_STATUS.search(line):
                requests.append("\n".join(current))
                current = None
    assert current is None, f"no `# → NNN` after this request: {' '.join(current)}"
    return requests


def documented_operations() -> set[tuple[str, str]]:
    """(METHOD, URL path) of every curl in the doc; shell variables stay as written."""
    found: set[tuple[str, str]] = set()
    for block in doc_blocks():
        for request in requests_of(block):
            url = re.search(r"(?:localhost|127\.0\.0\.1):8000(/[^\s\"'?]*)", request)
            assert url, f"a curl without a localhost:8000 URL in docs/api.md: {request}"
            method = re.search(r"-X\s+([A-Z]+)", request)
            found.add((method.group(1) if method else "GET", url.group(1)))
    return found


def openapi_operations() -> list[tuple[str, str]]:
    spec = yaml.safe_load(OPENAPI.read_text(encoding="utf-8"))
    return [
        (method.upper(), path)
        for path, item in spec["paths"].items()
        for method in item
        if method in HTTP_METHODS
    ]


def template_pattern(path: str) -> re.Pattern[str]:
    parts = re.split(r"\{[^}]+\}", path)
    return re.compile("[^/]+".join(re.escape(part) for part in parts))


def test_every_openapi_operation_has_an_example() -> None:
    documented = documented_operations()
    missing = [
        f"{method} {path}"
        for method, path in openapi_operations()
        if not any(
            method == doc_method and template_pattern(path).fullmatch(doc_path)
            for doc_method, doc_path in documented
        )
    ]
    assert len(documented) >= 30
    assert missing == [], "operations of openapi.yaml without a curl example in docs/api.md"


def test_every_request_states_its_status() -> None:
    requests = [request for block in doc_blocks() for request in requests_of(block)]
    assert len(requests) >= 40


def shell_script(block: str, base_url: str, state: Path, variables: list[str]) -> str:
    """The block as it runs: stop at the first failing command (pipes included), curl wrapped,
    the variables of the blocks before it loaded from `state` and its own saved there after.
    The doc's `TOKEN=...` placeholder is dropped: the environment carries the token."""
    body = "\n".join(line for line in block.splitlines() if not line.startswith("TOKEN="))
    body = DOC_HOSTS.sub(base_url, body)
    names = " ".join(variables)
    return (
        f"set -eo pipefail\n{CURL_WRAPPER}source {state}\n{body}\n"
        f"declare -p {names} > {state}.next 2>/dev/null || true\n"
        f"mv {state}.next {state}\n"
    )


@dataclass
class BlockRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def statuses(self) -> list[str]:
        return STATUS_LINE.findall(self.stderr)


async def run_block(script: str, env: dict[str, str], cwd: Path) -> BlockRun:
    process = await asyncio.create_subprocess_exec(
        "bash",
        "-c",
        script,
        cwd=cwd,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdout, stderr = await asyncio.wait_for(process.communicate(), BLOCK_TIMEOUT_SECONDS)
    assert process.returncode is not None
    return BlockRun(process.returncode, stdout.decode(), stderr.decode())


@pytest.fixture
async def fresh_database_url(server_url: str) -> AsyncIterator[str]:
    """A database of its own, migrated to head: the doc runs top to bottom on empty tables."""
    async with scratch_database(server_url, "cms_apidoc") as url:
        yield url


async def test_every_example_answers_its_stated_status(
    fresh_database_url: str, tmp_path: Path
) -> None:
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    blocks = doc_blocks()
    assert any(re.match(r"TOKEN=\.\.\.", line) for b in blocks for line in b.splitlines())
    # what `make run` runs: the in-process worker and, with no model configured, the offline engine
    settings = make_settings(
        fresh_database_url,
        worker_enabled=True,
        llm_provider="rules",
        worker_heartbeat_file=tmp_path / "worker.heartbeat",
    )
    token = issue_token(
        settings, Principal("alice", "acme", frozenset({"operator", "space_admin"}))
    )
    state = tmp_path / "shell-state.sh"
    state.write_text("")
    variables: list[str] = []
    async with served(create_app(settings)) as base_url:
        env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "TOKEN": token}
        for number, block in enumerate(blocks, start=1):
            variables += [name for name in ASSIGNED.findall(block) if name not in variables]
            script = shell_script(block, base_url, state, variables)
            run = await run_block(script, env, PROJECT_ROOT)
            expected = [EXPECTED_STATUS.findall(request)[-1] for request in requests_of(block)]
            report = (
                f"docs/api.md, bash block {number}:\n{block}\n"
                f"expected statuses {expected}, got {run.statuses} (exit {run.returncode})\n"
                f"--- stdout\n{run.stdout}\n--- stderr\n{run.stderr}"
            )
            assert run.statuses == expected, report
            assert run.returncode == 0, report


PROBLEMS_HEADING = "\n## Problem types\n"
PROBLEM_ROW = re.compile(r"^\| `([^`]+)` \| (\d{3}) \| ([^|]+?) \|(.*)$", re.MULTILINE)


def domain_errors(cls: type[DomainError] = DomainError) -> list[type[DomainError]]:
    """`cls` and its subclasses, theirs too (`app.main` has imported every module of `app`
    that defines one)."""
    return [cls, *(sub for child in cls.__subclasses__() for sub in domain_errors(child))]


def named_errors() -> list[type[DomainError]]:
    """The errors the service raises: each `DomainError` that no class extends. The generic
    classes of app/kit/errors.py are the bases of the named ones and carry their problem types;
    the few raised as they are (`Unauthorized`, `RequestTimeout`, ...) have no subclass."""
    return [cls for cls in domain_errors() if not cls.__subclasses__()]


def service_problem_types() -> set[ProblemType]:
    """Every problem type the service renders: each named error's, and the framework's own."""
    return {cls.problem_type() for cls in named_errors()} | set(OTHER_PROBLEMS)


def documented_problem_rows() -> dict[tuple[str, int, str], str]:
    """(type URI, status, title) -> the rest of the row, from the table of docs/api.md."""
    text = DOC.read_text(encoding="utf-8")
    assert PROBLEMS_HEADING in text, "docs/api.md has no `## Problem types` section"
    section = text.split(PROBLEMS_HEADING, 1)[1].split("\n## ", 1)[0]
    return {
        (uri, int(status), title.strip()): rest
        for uri, status, title, rest in PROBLEM_ROW.findall(section)
    }


def test_the_problem_table_lists_every_problem_type_and_no_other() -> None:
    documented = documented_problem_rows()
    served = {(PROBLEM_BASE + p.slug, p.status, p.title) for p in service_problem_types()}
    assert len(served) >= 15
    assert len(named_errors()) >= 40
    assert sorted(served - documented.keys()) == [], "problem types missing from docs/api.md"
    assert sorted(documented.keys() - served) == [], "rows of docs/api.md no named error raises"


def test_the_problem_table_says_what_every_409_says_of_retrying() -> None:
    documented = documented_problem_rows()
    conflicts = [p for p in service_problem_types() if p.status == Conflict.status]
    assert len(conflicts) >= 3
    for problem in conflicts:
        row = documented[(PROBLEM_BASE + problem.slug, problem.status, problem.title)]
        assert f"`retryable: {str(problem.retryable).lower()}`" in row, problem.slug
