"""docs/operations.md cannot fall behind the code: its configuration table names every setting of
`app/kit/config.py`, and its metrics table every metric the service exports, with its labels."""

from __future__ import annotations

import re

from prometheus_client.metrics import MetricWrapperBase

from app.kit.config import PROJECT_ROOT, Settings
from app.kit.observability import Metrics

DOC = PROJECT_ROOT / "docs" / "operations.md"


def section(title: str) -> str:
    """The text of one `## title` section of the doc."""
    text = DOC.read_text(encoding="utf-8")
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"docs/operations.md has no '## {title}' section"
    return match.group(1)


def table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ") and "---" not in line]


def test_the_configuration_table_names_every_setting() -> None:
    first_cells = [row.split(" | ")[0] for row in table_rows(section("Configuration"))]
    documented = {name for cell in first_cells for name in re.findall(r"`([A-Z][A-Z0-9_]+)`", cell)}
    settings = {name.upper() for name in Settings.model_fields}
    assert sorted(settings - documented) == [], "settings missing from docs/operations.md"
    assert sorted(documented - settings) == [], "docs/operations.md names unknown settings"


def exported_metrics() -> dict[str, tuple[str, ...]]:
    """Every metric of the app's registry, by its exported name, with its label names."""
    metrics = Metrics()
    found: dict[str, tuple[str, ...]] = {}
    for value in vars(metrics).values():
        if isinstance(value, MetricWrapperBase):
            (family,) = value.describe()
            name = family.name + ("_total" if family.type == "counter" else "")
            found[name] = tuple(value._labelnames)  # no public accessor for the label names
    assert len(found) >= 10
    return found


def test_the_metrics_table_names_every_metric_and_its_labels() -> None:
    rows = {
        match.group(1): row
        for row in table_rows(section("Metrics and what to alert on"))
        if (match := re.match(r"\| `([a-z_]+)`", row))
    }
    for name, labels in exported_metrics().items():
        assert name in rows, f"{name} is missing from the metrics table of docs/operations.md"
        label_cell = rows[name].split(" | ")[1]
        for label in labels:
            assert f"`{label}`" in label_cell, f"{name}: label {label} is not documented"
