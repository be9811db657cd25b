"""docs/security.md and docs/reliability.md name, for each promise, the test that proves it:
every test they name exists, so a renamed or deleted test cannot leave a promise unproved."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ("docs/security.md", "docs/reliability.md")
REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(test_\w+)`")


def defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and node.name.startswith("test_")
    }


@pytest.mark.parametrize("doc", DOCS)
def test_every_test_a_promise_names_exists(doc: str) -> None:
    references = REFERENCE.findall((ROOT / doc).read_text(encoding="utf-8"))
    assert len(references) >= 15, f"{doc} names too few tests to be the promise table"
    missing = [
        f"{module}::{name}"
        for module, name in references
        if not (ROOT / module).is_file() or name not in defined_tests(ROOT / module)
    ]
    assert missing == []


@pytest.mark.parametrize("doc", DOCS)
def test_every_table_row_names_a_proving_test(doc: str) -> None:
    rows = [
        line
        for line in (ROOT / doc).read_text(encoding="utf-8").splitlines()
        if line.startswith("| ") and not line.startswith(("| Promise", "|---"))
    ]
    assert rows
    assert [row for row in rows if not REFERENCE.search(row)] == []
