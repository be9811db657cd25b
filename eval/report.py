"""The eval's figures and their presentation: per user and for the whole run, quality (recall,
precision, contradictions, forget requests, never-stored) and cost (model calls, tokens and
money per turn, and how far the requested `max_tokens` is above what answers use).

Definitions (docs/eval.md repeats them):
- per turn means divided by the turns replayed (every corpus turn, chit-chat included);
- versions per fact turn: profile versions written ÷ turns marked `fact`;
- max_tokens ÷ completion: per answered call, the requested `max_tokens` divided by the
  completion tokens it used (at least 1); p50/p95 by nearest rank over the calls;
- cost: prompt tokens × prompt price + completion tokens × completion price, prices per million.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from eval.model_stub import CALL_KINDS
from eval.policy import PolicyReport
from eval.policy_corpus import PLAIN
from eval.recorder import ModelCall
from eval.scoring import Quality

UNREAD = 10
"""Benign facts an engine did not store for its own reasons listed in the text report."""


@dataclass(frozen=True)
class Prices:
    prompt_per_million: float
    completion_per_million: float


@dataclass(frozen=True)
class Cost:
    """The model spend of a number of turns."""

    turns: int
    calls: int
    calls_by_kind: dict[str, int]
    prompt_tokens: int
    completion_tokens: int
    ratio_p50: float | None
    ratio_p95: float | None
    unread_prompts: int  # stub calls whose prompt it could not read (answered NOOP)
    failed_calls: int  # answered with an HTTP error
    prices: Prices

    @property
    def calls_per_turn(self) -> float:
        return self.calls / self.turns if self.turns else 0.0

    @property
    def prompt_per_turn(self) -> float:
        return self.prompt_tokens / self.turns if self.turns else 0.0

    @property
    def completion_per_turn(self) -> float:
        return self.completion_tokens / self.turns if self.turns else 0.0

    @property
    def cost_per_turn(self) -> float:
        return (
            self.prompt_per_turn * self.prices.prompt_per_million
            + self.completion_per_turn * self.prices.completion_per_million
        ) / 1_000_000

    def kind_per_turn(self, kind: str) -> float:
        return self.calls_by_kind.get(kind, 0) / self.turns if self.turns else 0.0


def cost_of(turns: int, calls: Sequence[ModelCall], prices: Prices) -> Cost:
    ratios = _ratios(calls)
    return Cost(
        turns=turns,
        calls=len(calls),
        calls_by_kind={kind: sum(c.kind == kind for c in calls) for kind in CALL_KINDS},
        prompt_tokens=sum(c.prompt_tokens for c in calls),
        completion_tokens=sum(c.completion_tokens for c in calls),
        ratio_p50=percentile(ratios, 50),
        ratio_p95=percentile(ratios, 95),
        unread_prompts=sum(not c.understood for c in calls),
        failed_calls=sum(c.status != 200 for c in calls),
        prices=prices,
    )


def ratios_by_kind(calls: Sequence[ModelCall]) -> dict[str, tuple[float | None, float | None]]:
    """The max_tokens ÷ completion ratio's p50 and p95 for each call kind that was made."""
    found: dict[str, tuple[float | None, float | None]] = {}
    for kind in CALL_KINDS:
        ratios = _ratios([call for call in calls if call.kind == kind])
        if ratios:
            found[kind] = (percentile(ratios, 50), percentile(ratios, 95))
    return found


def _ratios(calls: Sequence[ModelCall]) -> list[float]:
    return [
        call.max_tokens / max(1, call.completion_tokens)
        for call in calls
        if call.max_tokens is not None and call.status == 200
    ]


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest rank: the smallest value with at least p % of the values at or below it."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


@dataclass(frozen=True)
class UserReport:
    user: str
    turns: int
    fact_turns: int
    versions_written: int
    quality: Quality
    cost: Cost
    jobs: dict[str, int]
    seconds: float

    @property
    def versions_per_fact_turn(self) -> float:
        return self.versions_written / self.fact_turns if self.fact_turns else 0.0


@dataclass(frozen=True)
class RunReport:
    engine: str
    model: str
    corpus: str
    commit: str
    users: list[UserReport]
    total: UserReport
    settings: dict[str, Any] = field(default_factory=dict)
    calls: list[ModelCall] = field(default_factory=list)
    service_metrics: dict[str, float] = field(default_factory=dict)
    """The service's own `model_*` counters from `/metrics` at the end of the run."""
    policy: PolicyReport | None = None
    """The memory-policy figures, when the attacker and benign corpora were replayed too."""

    def to_json(self) -> dict[str, Any]:
        def user(report: UserReport) -> dict[str, Any]:
            quality, cost = report.quality, report.cost
            return {
                "user": report.user,
                "turns": report.turns,
                "fact_turns": report.fact_turns,
                "recall": quality.recall,
                "precision": quality.precision,
                "quality": asdict(quality),
                "versions_written": report.versions_written,
                "versions_per_fact_turn": report.versions_per_fact_turn,
                "calls_per_turn": cost.calls_per_turn,
                "calls_per_turn_by_kind": {k: cost.kind_per_turn(k) for k in CALL_KINDS},
                "prompt_tokens_per_turn": cost.prompt_per_turn,
                "completion_tokens_per_turn": cost.completion_per_turn,
                "cost_per_turn": cost.cost_per_turn,
                "cost_per_1000_turns": cost.cost_per_turn * 1000,
                "cost": asdict(cost),
                "jobs": report.jobs,
                "seconds": round(report.seconds, 2),
            }

        return {
            "engine": self.engine,
            "model": self.model,
            "corpus": self.corpus,
            "commit": self.commit,
            "settings": self.settings,
            "users": [user(u) for u in self.users],
            "total": user(self.total),
            "service_metrics": self.service_metrics,
            "policy": None if self.policy is None else self.policy.to_json(),
            "calls": [asdict(call) for call in self.calls],
        }


# --- text -----------------------------------------------------------------------------------------


def render(report: RunReport) -> str:
    """The report as plain text tables: quality, then cost, then what was missed or kept."""
    prices = report.total.cost.prices
    lines = [
        f"engine {report.engine} · model {report.model} · corpus {report.corpus} · "
        f"code {report.commit}",
        f"prices per million tokens: prompt {prices.prompt_per_million:g}, "
        f"completion {prices.completion_per_million:g}",
    ]
    lines += [f"settings: {_settings(report.settings)}"] if report.settings else []
    if report.users:
        lines += _quality_and_cost(report)
    if report.policy is not None:
        lines += _policy(report.policy)
    return "\n".join(lines)


def _quality_and_cost(report: RunReport) -> list[str]:
    lines: list[str] = []
    rows = [*report.users, report.total]
    lines += ["", "Quality"]
    lines += _table(
        ["user", "turns", "fact", "recall", "precision", "contradict.", "forgotten",
         "never-stored", "versions/fact", "jobs"],
        [
            [
                r.user,
                str(r.turns),
                str(r.fact_turns),
                _ratio(r.quality.facts_found, r.quality.facts_expected),
                "n/a" if r.quality.precision is None
                else _ratio(r.quality.bullets_matching, r.quality.bullets),
                f"{r.quality.contradictions_resolved}/{r.quality.contradictions}",
                f"{r.quality.forgotten_honoured}/{r.quality.forgotten}",
                f"{r.quality.never_stored_kept_out}/{r.quality.never_stored}",
                f"{r.versions_per_fact_turn:.2f}",
                _jobs(r.jobs),
            ]
            for r in rows
        ],
    )  # fmt: skip
    lines += ["", "Cost (per turn unless stated)"]
    lines += _table(
        ["user", "calls", "gate", "ops", "rewrite", "condense", "other", "prompt tok",
         "compl. tok", "max_tok/compl p50", "p95", "cost", "per 1k turns"],
        [
            [
                r.user,
                f"{r.cost.calls_per_turn:.2f}",
                *(f"{r.cost.kind_per_turn(kind):.2f}" for kind in
                  ("gate", "operations", "rewrite", "condense", "other")),
                f"{r.cost.prompt_per_turn:.0f}",
                f"{r.cost.completion_per_turn:.1f}",
                _number(r.cost.ratio_p50),
                _number(r.cost.ratio_p95),
                f"{r.cost.cost_per_turn:.6f}",
                f"{r.cost.cost_per_turn * 1000:.4f}",
            ]
            for r in rows
        ],
    )  # fmt: skip
    total = report.total.cost
    by_kind = ratios_by_kind(report.calls)
    if by_kind:
        lines.append(
            "by call kind, model and max_tokens ÷ completion p50/p95: "
            + ", ".join(
                f"{kind} ({_models(report.calls, kind)}) {_number(p50)}/{_number(p95)}"
                for kind, (p50, p95) in by_kind.items()
            )
        )
    if report.service_metrics:
        lines.append(
            "the service's /metrics: "
            + ", ".join(
                f"{name} {value:g}" for name, value in sorted(report.service_metrics.items())
            )
        )
    if report.engine == "offline":
        lines += ["", "(the offline engine makes no model calls)"]
    if total.unread_prompts or total.failed_calls:
        lines += [
            "",
            f"warning: {total.unread_prompts} prompt(s) the stub could not read (answered "
            f"NOOP), {total.failed_calls} call(s) answered with an HTTP error",
        ]
    lines += ["", "Details"]
    for user in report.users:
        quality = user.quality
        lines.append(f"- {user.user}: missing {', '.join(quality.missing) or 'nothing'}")
        lines += [f"    unmatched bullet: {bullet}" for bullet in quality.unexpected]
        lines += [f"    {violation}" for violation in quality.violations]
    return lines


def _policy(report: PolicyReport) -> list[str]:
    """Per write path: attacker values stored, edits refused, benign facts kept; then each
    value stored and each fact lost, with what the detectors and refusals said."""
    lines = [
        "",
        f"Memory policy (attacker corpus {report.attacker_corpus}, benign corpus "
        f"{report.benign_corpus})",
        f"attacker values in any of {report.texts_searched} stored texts (versions, policy "
        f"records, exports) of their users: {report.leaked_values}/{report.values} (must be 0)",
    ]
    lines += _table(
        ["path", "attack turns", "values stored", "edits refused", "benign kept",
         "lost to policy", "kept by policy"],
        [
            [
                p.path,
                str(p.attacks),
                f"{p.leaked_values}/{p.values}",
                "n/a" if p.refused is None else f"{p.refused}/{p.refusals_expected}",
                _ratio(p.kept, p.facts),
                str(len(p.lost_to_policy)),
                f"{p.policy_kept_share:.2f}",
            ]
            for p in report.paths
        ],
    )  # fmt: skip
    lines += [f"{p.path}: jobs {_jobs(p.jobs)}" for p in report.paths if p.jobs]
    lines += _classes(report)
    if report.records:
        lines.append(f"the policy's records: {_jobs(report.records)}")
    lines += ["", "Attacker values stored (false negatives)"]
    places: dict[tuple[str, tuple[str, ...]], dict[str, list[str]]] = {}
    for leak in report.leaks:
        if leak.missed:
            continue
        where = places.setdefault((leak.value, leak.categories), {}).setdefault(leak.user_id, [])
        where.append(f"v{leak.version} {leak.source}")
    lines += [
        f"- {value} [{', '.join(categories)}] in "
        + "; ".join(f"{user} ({', '.join(found)})" for user, found in users.items())
        for (value, categories), users in places.items()
    ] or ["- none"]
    lines += ["", "Benign facts lost to the policy (false positives)"]
    lines += [
        f"- {p.path}: {fact.user_id}: {fact.text!r}: "
        + "; ".join(
            [f"detectors: {', '.join(fact.flagged)}"] * bool(fact.flagged)
            + [f"refused as: {', '.join(fact.refused_as)}"] * bool(fact.refused_as)
        )
        for p in report.paths
        for fact in p.lost_to_policy
    ] or ["- none"]
    unread = [(p.path, f) for p in report.paths for f in p.lost if f not in p.lost_to_policy]
    if unread:
        lines += ["", f"Benign facts not stored that the detectors flag nothing in ({len(unread)}:"]
        lines += ["the engine's own reading, not the policy)"]
        lines += [f"- {path}: {fact.user_id}: {fact.text!r}" for path, fact in unread[:UNREAD]]
        if len(unread) > UNREAD:
            lines.append(f"- and {len(unread) - UNREAD} more (all of them in the JSON report)")
    notes = [f"- {p.path}: {note}" for p in report.paths for note in p.notes]
    if notes:
        lines += ["", "Edits not answered as the default policy says", *notes]
    return lines


def _classes(report: PolicyReport) -> list[str]:
    """Values stored per class of disguise and path; the known misses apart."""
    if not report.classes or all(c.disguise == PLAIN for c in report.classes):
        return []
    paths = [p.path for p in report.paths]
    lines = ["", "Values stored per class of disguise (must be 0; known misses apart)"]
    for missed in (False, True):
        rows = [
            [c.disguise, str(c.values), *(str(c.leaked.get(path, 0)) for path in paths)]
            for c in report.classes
            if c.missed == missed
        ]
        if not rows:
            continue
        if missed:
            stored = len({leak.value for leak in report.leaks if leak.missed})
            lines += [
                "",
                f"Known misses (not counted): {stored}/{report.missed_values} values stored",
            ]
        lines += _table(["class", "values", *paths], rows)
    return lines


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(width) for cell, width in zip(cells[1:], widths[1:], strict=True))
        return "  ".join([first, *rest]).rstrip()

    return [line(header), line(["-" * w for w in widths]), *(line(row) for row in rows)]


def _ratio(part: int, whole: int) -> str:
    return f"{part / whole:.2f} ({part}/{whole})" if whole else "n/a"


def _number(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def _models(calls: Sequence[ModelCall], kind: str) -> str:
    return ", ".join(sorted({call.model for call in calls if call.kind == kind}))


def _jobs(jobs: dict[str, int]) -> str:
    return " ".join(f"{key}={count}" for key, count in sorted(jobs.items()))


def _settings(settings: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value}" for key, value in settings.items())
