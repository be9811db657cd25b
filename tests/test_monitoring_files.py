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
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from app.kit.config import PROJECT_ROOT
from app.kit.observability import Metrics, QueueGauges, build_labels

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
        "time",
        "absent",
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


# --- the queue gauges over several workers -------------------------------------------------------

QUEUE = QueueGauges(
    depth={"queued": 7, "retrying": 2, "running": 3, "dead": 1}, oldest_age_seconds=42.0
)
"""One database's queue, as every worker reads it."""
QUEUE_PANELS = {
    "Jobs waiting": [(f'{{status="{s}"}}', float(n)) for s, n in QUEUE["depth"].items()],
    "Oldest claimable job": [("{}", QUEUE["oldest_age_seconds"])],
}
"""The figures each dashboard panel over the queue gauges must show: the database's own."""


def scraped_series(metrics: Metrics, instance: str, job: str) -> list[dict[str, str]]:
    """The `/metrics` of one process as Prometheus stores it: every sample with the target's
    `instance` and `job` labels, as promtool input series (the value constant for 10 minutes)."""
    text = generate_latest(metrics.registry).decode()
    series = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = {**sample.labels, "instance": instance, "job": job}
            selector = ",".join(f'{name}="{value}"' for name, value in sorted(labels.items()))
            series.append(
                {"series": f"{sample.name}{{{selector}}}", "values": f"{sample.value!r}x10"}
            )
    return series


def two_workers_and_an_api() -> list[dict[str, str]]:
    """What Prometheus holds under docker-compose.yml: two worker replicas that each report the
    same database's queue (through the worker's own reporting call), and an API process."""
    scrapes = []
    for n in (1, 2):
        worker = Metrics(environ={})
        worker.observe_worker_report(QUEUE)
        scrapes += scraped_series(worker, f"worker-{n}:9100", "context-memory-worker")
    scrapes += scraped_series(Metrics(environ={}), "api-1:8000", "context-memory-api")
    return scrapes


def queue_panel_queries() -> dict[str, str]:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = {}
    for panel in dashboard["panels"]:
        for expr in dashboard_queries({"panels": [panel]}):
            if metric_names_in(expr) & {"queue_depth", "queue_oldest_age_seconds"}:
                queries[panel["title"]] = expr
    return queries


def expr_tests(queries: dict[str, str]) -> list[dict[str, Any]]:
    return [
        {
            "expr": expr,
            "eval_time": "5m",
            "exp_samples": [
                {"labels": labels, "value": value} for labels, value in QUEUE_PANELS[title]
            ],
        }
        for title, expr in queries.items()
    ]


def promtool_expr_test(
    tmp_path: Path, tests: list[dict[str, Any]]
) -> subprocess.CompletedProcess[str]:
    document = {
        "rule_files": [],
        "evaluation_interval": "1m",
        "tests": [
            {"interval": "1m", "input_series": two_workers_and_an_api(), "promql_expr_test": tests}
        ],
    }
    (tmp_path / "queue.test.yml").write_text(yaml.safe_dump(document, sort_keys=False))
    return promtool("test", "rules", "queue.test.yml", cwd=tmp_path)


def test_every_queue_panel_has_its_expected_figures() -> None:
    assert set(queue_panel_queries()) == set(QUEUE_PANELS)


@needs_promtool
def test_the_queue_panels_show_the_database_figures_with_two_workers_scraped(
    tmp_path: Path,
) -> None:
    """Each worker exports the whole database's queue: the dashboard shows it once, not once per
    worker (promtool evaluates each panel's query over the three scrapes)."""
    result = promtool_expr_test(tmp_path, expr_tests(queue_panel_queries()))
    assert result.returncode == 0, result.stdout + result.stderr


@needs_promtool
def test_summing_the_queue_gauges_over_the_workers_counts_each_job_twice(tmp_path: Path) -> None:
    """The same scrapes catch a panel that sums: `sum` shows the database's figures doubled."""
    summed = expr_tests({"Jobs waiting": "sum by (status) (queue_depth)"})
    result = promtool_expr_test(tmp_path, summed)
    assert result.returncode == 1, result.stdout + result.stderr
    got = re.search(r"got: (.*)", result.stdout + result.stderr)
    assert got is not None, result.stdout + result.stderr
    shown = {s: float(v) for s, v in re.findall(r'\{status="(\w+)"\} (\S+?),?(?: |$)', got[1])}
    assert shown == {status: 2.0 * depth for status, depth in QUEUE["depth"].items()}


def test_build_info_names_the_version_and_the_commit() -> None:
    families = {
        family.name: family
        for family in Metrics(environ={"BUILD_COMMIT": "0a1b2c3"}).registry.collect()
    }
    (sample,) = families["build_info"].samples
    assert sample.labels == {"version": build_labels({})[0], "commit": "0a1b2c3"}
    assert sample.value == 1
    assert build_labels({})[0] != "unknown"  # the installed package's version
    assert build_labels({"BUILD_COMMIT": " "})[1] == "unknown"


def sample_values(metrics: Metrics, name: str) -> list[float]:
    return [
        sample.value
        for family in metrics.registry.collect()
        for sample in family.samples
        if sample.name == name
    ]


def test_a_worker_report_sets_the_heartbeat_even_without_queue_figures() -> None:
    metrics = Metrics(environ={})
    heartbeat = "worker_last_heartbeat_timestamp_seconds"
    assert sample_values(metrics, heartbeat) == [0.0]  # a process that runs no worker
    before = time.time()
    metrics.observe_worker_report(None)  # the database did not answer
    (beat,) = sample_values(metrics, heartbeat)
    assert before <= beat <= time.time()
    assert sample_values(metrics, "queue_depth") == []
