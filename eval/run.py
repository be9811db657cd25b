"""One evaluation run: the engine's model endpoint (none, the stub, the obedient stub, or a
recording proxy to a real endpoint), the service on a scratch database, every corpus user
replayed in turn, then the memory-policy corpora by every write path, and the report built from
the final profiles, the stored versions and the recorded model calls."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal

import httpx

from app.kit.config import PROJECT_ROOT, Settings
from app.kit.llm import DEFAULT_OPENAI_BASE_URL
from eval.corpus import Corpus
from eval.obedient import obedient_answer
from eval.policy import PolicyReport
from eval.policy_corpus import PolicyCorpus
from eval.policy_replay import CONCURRENT_USERS, PATHS, PolicyRun, run_policy
from eval.recorder import ModelRecorder
from eval.replay import Service, UserRun, eval_settings, scratch_database, served, server_url
from eval.report import Prices, RunReport, UserReport, cost_of
from eval.scoring import combine, score_profile

Engine = Literal["offline", "stub", "obedient", "endpoint"]
ENGINES: tuple[Engine, ...] = ("offline", "stub", "obedient", "endpoint")
KEEP_EVERY_VERSION = 1_000_000
"""`MEMORY_MAX_VERSIONS` of a run: no version is pruned before the policy figures search them."""


@dataclass(frozen=True)
class RunOptions:
    engine: Engine
    model: str
    prices: Prices
    corpus_name: str = ""
    job_timeout: float = 300.0
    policy: PolicyCorpus | None = None
    """The attacker and benign corpora, replayed after `corpus` by every write path."""
    policy_names: tuple[str, str] = ("", "")
    policy_paths: tuple[str, ...] = PATHS
    """The write paths the policy corpora take (`policy_replay.PATHS`)."""
    policy_burst: bool = False
    """Each policy user's chat turns saved in one burst rather than paced."""


async def run_eval(
    corpus: Corpus,
    options: RunOptions,
    *,
    server: str | None = None,
    progress: Callable[[str], None] = lambda line: None,
) -> tuple[RunReport, ModelRecorder | None]:
    """Replay `corpus` with `options.engine` on PostgreSQL `server` (default: see
    `replay.server_url`); returns the report and the recorder (None offline), whose `calls` are
    every model request the service made."""
    embedded = None
    if server is None:
        admin_url, embedded = await asyncio.to_thread(server_url)
    else:
        admin_url = server
    recorder = _recorder(options.engine)
    model_settings: dict[str, Any] = {
        "llm_model": options.model,
        "llm_provider": "rules",
        "memory_max_versions": KEEP_EVERY_VERSION,
        "worker_concurrency": CONCURRENT_USERS,  # every user replayed at once consolidates
    }
    if options.engine == "obedient":
        # A model that obeys whatever it reads sees every turn: none is settled locally.
        model_settings["consolidation_prefilter"] = False
    try:
        if recorder is not None:
            await recorder.start()
            model_settings.update(
                llm_provider="openai",
                openai_base_url=recorder.base_url,
                openai_api_key=None,
                azure_openai_endpoint=None,
            )
        async with scratch_database(admin_url) as url:
            settings = eval_settings(url, **model_settings)
            runs, service_metrics, policy = await _replay_all(
                corpus, settings, recorder, options, progress
            )
    finally:
        if recorder is not None:
            await recorder.stop()
        if embedded is not None:
            await asyncio.to_thread(embedded.stop)
    quality_users = {user.id for user in corpus.users}
    calls = [] if recorder is None else [c for c in recorder.calls if c.label in quality_users]
    users = []
    for run in runs:
        own = [call for call in calls if call.label == run.user.id]
        users.append(
            UserReport(
                user=run.user.id,
                turns=len(run.user.turns),
                fact_turns=run.user.fact_turns,
                versions_written=run.versions_written,
                quality=score_profile(run.user.expect, run.profile),
                cost=cost_of(len(run.user.turns), own, options.prices),
                jobs=dict(run.jobs),
                seconds=run.seconds,
            )
        )
    total = UserReport(
        user="all",
        turns=corpus.turns,
        fact_turns=sum(u.fact_turns for u in users),
        versions_written=sum(u.versions_written for u in users),
        quality=combine(u.quality for u in users),
        cost=cost_of(corpus.turns, calls, options.prices),
        jobs=_sum_jobs(u.jobs for u in users),
        seconds=sum(u.seconds for u in users),
    )
    report = RunReport(
        engine=options.engine,
        model=options.model,
        corpus=options.corpus_name,
        commit=code_version(),
        users=users,
        total=total,
        settings=_settings_summary(settings),
        calls=list(calls),
        service_metrics=service_metrics,
        policy=policy,
    )
    return report, recorder


def _recorder(engine: Engine) -> ModelRecorder | None:
    if engine == "offline":
        return None
    if engine == "stub":
        return ModelRecorder()
    if engine == "obedient":
        return ModelRecorder(answer=obedient_answer)
    upstream = os.environ.get("OPENAI_BASE_URL") or DEFAULT_OPENAI_BASE_URL
    return ModelRecorder(upstream, os.environ.get("OPENAI_API_KEY"))


async def _replay_all(
    corpus: Corpus,
    settings: Settings,
    recorder: ModelRecorder | None,
    options: RunOptions,
    progress: Callable[[str], None],
) -> tuple[list[UserRun], dict[str, float], PolicyReport | None]:
    def label(user: str) -> None:
        if recorder is not None:
            recorder.label = user

    runs = []
    policy = None
    async with served(settings) as base, httpx.AsyncClient(base_url=base, timeout=60) as http:
        service = Service(http, settings, options.job_timeout)
        await service.enable(options.model)
        for script in corpus.users:
            label(script.id)
            run = await service.replay(script)
            progress(f"{script.id}: {len(script.turns)} turns in {run.seconds:.1f} s")
            runs.append(run)
        service_metrics = await service.model_metrics()  # the quality corpus's calls alone
        if options.policy is not None and settings.database_url is not None:
            label("memory-policy")  # users overlap there: no cost per user
            how = PolicyRun(
                options.engine,
                settings.database_url,
                options.policy_names,
                progress,
                options.policy_paths,
                options.policy_burst,
            )
            policy = await run_policy(service, options.policy, how)
    return runs, service_metrics, policy


def _sum_jobs(all_jobs: Iterable[dict[str, int]]) -> dict[str, int]:
    total: dict[str, int] = {}
    for jobs in all_jobs:
        for key, count in jobs.items():
            total[key] = total.get(key, 0) + count
    return total


def _settings_summary(settings: Settings) -> dict[str, Any]:
    """The consolidation knobs that change calls and tokens, as the service read them."""
    names = (
        "consolidation_strategy",
        "consolidation_gate",
        "llm_gate_model",
        "consolidation_prefilter",
    )
    return {name: getattr(settings, name) for name in names if hasattr(settings, name)}


def code_version() -> str:
    """The commit of the service under evaluation, `+changes` when app/ differs from it."""

    def git(*args: str) -> str:
        done = subprocess.run(  # noqa: S603 - git with fixed arguments
            ["git", "-C", str(PROJECT_ROOT), *args],  # noqa: S607
            capture_output=True,
            text=True,
            check=False,
        )
        return done.stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    return commit + ("+changes" if git("status", "--porcelain", "--", "app") else "")
