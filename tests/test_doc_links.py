"""Every relative link of README.md and docs/*.md reaches a file that exists, and every `#anchor`
a heading of that file, so moving a section between pages cannot leave a dead link behind."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from app.kit.config import PROJECT_ROOT

PAGES = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
FENCE = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)


def anchors(page: Path) -> set[str]:
    """The anchors a code host gives the page's headings: lower case, punctuation dropped,
    spaces as hyphens."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    found = set()
    for heading in re.findall(r"^#{1,6} (.+)$", text, flags=re.MULTILINE):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(PROJECT_ROOT).as_posix() for p in PAGES])
def test_relative_links_reach_a_file_and_a_heading(page: Path) -> None:
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    dead = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        missing_heading = anchor and linked.suffix == ".md" and anchor not in anchors(linked)
        if not linked.exists() or missing_heading:
            dead.append(target)
    assert dead == [], f"dead links in {page.relative_to(PROJECT_ROOT)}"
