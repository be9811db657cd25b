"""The blocking client against the service served over real HTTP, and every Python example of
docs/client.md run against it."""

from __future__ import annotations

import re
import threading
from pathlib import Path

import pytest
from context_memory_client import (
    MemoryClient,
    MessageIn,
    NotFound,
    ResponseIn,
    RetryPolicy,
    TransportError,
    TurnRequest,
)

from app.kit.config import PROJECT_ROOT
from app.profiles.profile import Section
from tests.client.conftest import enable_memory_over_http
from tests.helpers.apps import COMPANY, SPACE, TokenFactory
from tests.helpers.profiles import memory_md

DOC = PROJECT_ROOT / "docs" / "client.md"


def python_blocks(doc: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", doc.read_text(), flags=re.S | re.M)


def test_the_sync_client_saves_a_turn_reads_it_back_and_maps_errors(
    served_url: str, make_token: TokenFactory
) -> None:
    enable_memory_over_http(served_url, make_token)
    with MemoryClient(served_url, make_token("alice", COMPANY), timeout=10.0) as memory:
        assert memory.get_me().user_id == "alice"
        with pytest.raises(NotFound) as missing:
            memory.get_memory()
        assert missing.value.request_id
        for n in range(3):
            request = TurnRequest(SPACE, [MessageIn("user", f"q{n}")], ResponseIn(f"a{n}"))
            saved = memory.save_turn("chat-s", request)
            assert saved.consolidation.job_id is not None
            assert memory.wait_for_job(saved.consolidation.job_id).status == "succeeded"
        contents = [m.content for m in memory.iter_messages("chat-s", page_size=2)]
        assert sorted(contents) == ["a0", "a1", "a2", "q0", "q1", "q2"]
        first = memory.create_memory(memory_md({Section.IDENTITY: ["An analyst"]}))
        memory.replace_memory(memory_md({Section.IDENTITY: ["A bank analyst"]}), if_match=1)
        assert first.version == 1
        assert [v.version for v in memory.iter_versions(page_size=1)] == [2, 1]
        assert memory.ready().status == "ready"


def test_a_service_that_does_not_answer_is_a_transport_error_after_the_retries() -> None:
    retry = RetryPolicy(max_attempts=2, backoff_base=0.01)
    with (
        MemoryClient("http://127.0.0.1:9", "token", timeout=1.0, retry=retry) as memory,
        pytest.raises(TransportError),
    ):
        memory.get_me()


def test_every_python_example_of_the_client_doc_runs_against_the_service(
    served_url: str, make_token: TokenFactory
) -> None:
    blocks = python_blocks(DOC)
    assert len(blocks) >= 5
    enable_memory_over_http(served_url, make_token)
    failures: list[BaseException] = []

    def run_all() -> None:  # a thread of its own: the examples call asyncio.run
        try:
            for block in blocks:
                exec(compile(block, str(DOC), "exec"), {"BASE_URL": served_url, "TOKEN": token})  # noqa: S102
        except BaseException as error:
            failures.append(error)

    token = make_token("alice", COMPANY)
    runner = threading.Thread(target=run_all)
    runner.start()
    runner.join(timeout=120)
    assert not runner.is_alive()
    if failures:
        raise failures[0]
