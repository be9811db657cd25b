"""Every Python example of docs/integration.md, run against the service served over HTTP with
context memory on: the examples a reader copies work as printed."""

from __future__ import annotations

import re

import pytest
from context_memory_client import FLAG_CONTEXT_MEMORY, CompanyIn, MemoryClient

from app.kit.config import PROJECT_ROOT
from tests.helpers.apps import COMPANY, OPERATOR, TokenFactory

DOC = PROJECT_ROOT / "docs" / "integration.md"
BLOCKS = re.findall(r"^```python\n(.*?)^```", DOC.read_text(), flags=re.S | re.M)


def test_the_page_has_its_examples() -> None:
    assert len(BLOCKS) == 3


@pytest.mark.parametrize("block", BLOCKS, ids=[f"example-{n}" for n in range(len(BLOCKS))])
def test_an_integration_example_runs_against_the_service(
    block: str, served_url: str, make_token: TokenFactory, capsys: pytest.CaptureFixture[str]
) -> None:
    with MemoryClient(served_url, make_token("olga", "platform", OPERATOR)) as operator:
        operator.create_company(CompanyIn(COMPANY))
        operator.set_feature_flag(COMPANY, FLAG_CONTEXT_MEMORY, enabled=True)
    exec(compile(block, str(DOC), "exec"), {"BASE_URL": served_url, "TOKEN": make_token()})  # noqa: S102 - our own docs
    printed = capsys.readouterr().out
    assert printed.strip()
    if "wait_for_job" in block:
        assert printed.startswith("updated")
        assert "- Works at Globex." in printed
    if "ContextMemoryRunnable" in block:
        assert "Globex, you said." in printed
        assert "'consolidation': 'queued'" in printed
    if "MemoryChatMessageHistory" in block:
        assert "['I live in Berlin.', 'Berlin it is.']" in printed
