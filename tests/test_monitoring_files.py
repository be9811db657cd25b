"""The monitoring files load: the Prometheus alert rules pass `promtool check rules` and their
unit tests, the Grafana dashboard is a dashboard whose every query parses, and every query,
the dashboard's and the rules', names only metrics the service exports.

promtool comes from Debian's `prometheus` package (`.ci/install-promtool`); where it cannot be
installed, the checks that need it skip and say so."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from app.kit.config import PROJECT_ROOT
from app.kit.observability import Metrics

ALERTS = PROJECT_ROOT / "deploy" / "prometheus" / "alerts.yml"
ALERT_TESTS = PROJECT_ROOT / "deploy" / "prometheus" / "alerts.test.yml"
DASHBOARD = PROJECT_ROOT / "deploy" / "grafana" / "context-memory.json"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool is not installed (.ci/install-promtool installs it)"
)
# Grafana's variables, as a query runs them
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "6h"}
PROMQL_WORDS = frozenset(
    {
        "sum",
        "max",
        "min",
        "avg",
        "count",
        "rate",
        "increase",
        "histogram_quantile",
        "by",
        "without",
        "or",
        "and",
        "unless",
        "on",
        "ignoring",
    }
)


def exported_metric_names() -> set[str]:
    """Every series name the service's registry can expose (a counter's `_total`, a
    histogram's `_bucket`, `_count` and `_sum`)."""
    suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum"), "gauge": ("",)}
    return {
        family.name + suffix
        for family in Metrics().registry.collect()
        for suffix in suffixes[family.type]
    }


def metric_names_in(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: its identifiers, once strings, label
    matchers, ranges, grouping clauses, numbers and functions are left out."""
    bare = re.sub(r'"[^"]*"', "", expr)
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", bare)
    bare = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", bare)
    return set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", bare)) - PROMQL_WORDS


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    queries = []
    for panel in dashboard["panels"]:
        for target in panel.get("targets", ()):
            expr = target["expr"]
            for variable, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(variable, value)
            queries.append(expr)
    return queries


def alert_expressions() -> list[str]:
    rules = yaml.safe_load(ALERTS.read_text())
    return [rule["expr"] for group in rules["groups"] for rule in group["rules"]]


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run(
        [PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60, check=False
    )


@needs_promtool
def test_the_alert_rules_pass_promtool_check_rules() -> None:
    result = promtool("check", "rules", ALERTS.name, cwd=ALERTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_the_alerts_fire_on_the_series_their_unit_tests_give_them() -> None:
    result = promtool("test", "rules", ALERT_TESTS.name, cwd=ALERTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_documented_alert_is_a_rule_or_a_named_probe() -> None:
    """Each alert row of docs/operations.md's table has a rule whose expression it quotes
    (or is one of the two probes the rules file names)."""
    doc = (PROJECT_ROOT / "docs" / "operations.md").read_text()
    table = doc.split("Suggested alerts", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "`" in line]
    expressions = " ".join(alert_expressions())
    probes = ("/readyz", "worker --check")
    for row in rows:
        if any(probe in row for probe in probes):
            continue
        quoted = set().union(*map(metric_names_in, re.findall(r"`([^`]+)`", row.split("|")[2])))
        assert quoted, row
        assert all(name in expressions for name in quoted), row


def test_the_dashboard_is_a_dashboard_of_panels_with_queries() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"]
    assert dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int)
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert {"h", "w", "x", "y"} <= set(panel["gridPos"])
        if panel["type"] != "row":
            assert panel["targets"], panel["title"]
            assert panel["datasource"]["uid"] == "${datasource}"
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]


def test_every_query_names_only_metrics_the_service_exports() -> None:
    exported = exported_metric_names()
    queries = dashboard_queries(json.loads(DASHBOARD.read_text())) + alert_expressions()
    for expr in queries:
        unknown = metric_names_in(expr) - exported
        assert not unknown, (unknown, expr)


def test_a_misspelt_metric_is_caught() -> None:
    exported = exported_metric_names()
    assert metric_names_in("sum(rate(jobs_totl[5m]))") - exported == {"jobs_totl"}
    assert metric_names_in('max by (company_id) (model_budget_used_ratio{company_id="a"})') <= (
        exported
    )


@needs_promtool
def test_every_dashboard_query_parses(tmp_path: Path) -> None:
    """promtool parses each query as the expression of a recording rule."""
    queries = dashboard_queries(json.loads(DASHBOARD.read_text()))
    rules = {
        "groups": [
            {
                "name": "dashboard",
                "rules": [
                    {"record": f"dashboard:query_{n}", "expr": expr}
                    for n, expr in enumerate(queries)
                ],
            }
        ]
    }
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    result = promtool("check", "rules", path.name, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(queries)} rules found" in result.stdout
