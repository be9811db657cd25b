"""What consolidation costs in model calls: a scripted conversation through the real app and its
worker, answered by a recording OpenAI-compatible server, counted by call kind.

The conversation (`CONVERSATION`) is 30 paced turns (each consolidated before the next is saved)
then a burst of 10 saved at once (coalesced into one claim): 40 % of the turns state facts about
the user (among them a contradiction and a forget request), 60 % are chit-chat. The model server
(`OracleModel`) answers the way a well-behaved model would: it finds the scripted user texts in
each prompt and answers the gate UPDATE when one of them states a fact, the operations call with
exactly the scripted operations of those turns, and NOOP otherwise. It counts each request's
prompt (cl100k: every message's text plus 3 tokens a message and 3 for the reply, the usual
chat-format overhead), its `max_completion_tokens`, and the answer's tokens, and reports them
as the response's usage, so the service's own metrics count the same numbers.

    .venv/bin/python bench/model_cost.py                  # the report on stdout
    .venv/bin/python bench/model_cost.py --json out.json  # and the figures as JSON

Needs PostgreSQL (`DATABASE_URL`, default `postgresql://postgres@127.0.0.1:5432/postgres`, used
as the admin connection): a scratch database `cms_model_cost_<random>` is created, migrated and
dropped at the end. The final profile is printed so two runs can be compared: a change that
makes consolidation cheaper must not change it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import math
import os
import re
import socket
import sys
import uuid
from collections import Counter, defaultdict
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import asyncpg
import httpx
import uvicorn
from asgi_lifespan import LifespanManager
from prometheus_client.parser import text_string_to_metric_families
from pydantic import SecretStr
from sqlalchemy import make_url
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.consolidation.prompts import STATIC_PREFIXES
from app.consolidation.runner import BackgroundWorker
from app.enablement.decision import FLAG_CONTEXT_MEMORY
from app.kit.auth.mint import issue_token
from app.kit.config import Settings, to_asyncpg_url
from app.kit.db.migrations import run_migrations
from app.kit.principal import Principal
from app.kit.tokens import TokenCounter
from app.main import create_app

DEFAULT_ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
JWT_SECRET = "model-cost-bench-only-secret-not-the-default"  # noqa: S105 - scratch database
COMPANY, SPACE, USER = "cost-co", "space-1", "dana"
MESSAGE_OVERHEAD_TOKENS = 3
REPLY_PRIMING_TOKENS = 3

# --- the conversation -----------------------------------------------------------------------


@dataclass(frozen=True)
class Turn:
    """One exchange; `ops` is what a good model does with it (empty: nothing durable)."""

    user: str
    assistant: str
    ops: tuple[dict[str, str], ...] = ()

    @property
    def is_fact(self) -> bool:
        return bool(self.ops)

    def ops_at(self, minute: str) -> list[dict[str, str]]:
        """The scripted operations and, for a fact, the Recent Topics bullet a model adds,
        dated with the prompt's current time."""
        if not self.ops or self.ops[0]["op"] == "DELETE":
            return list(self.ops)  # a forget request adds no topic
        # lower-cased words without punctuation: never a scripted user text the oracle looks for
        topic = " ".join(re.findall(r"[\w'-]+", self.user.casefold())[:8])
        return [*self.ops, add(RECENT, f"{minute} UTC: Talked about {topic}.")]


def add(section: str, text: str) -> dict[str, str]:
    return {"op": "ADD", "section": section, "text": text}


def update(section: str, target: str, text: str) -> dict[str, str]:
    return {"op": "UPDATE", "section": section, "target": target, "text": text}


def delete(section: str, target: str) -> dict[str, str]:
    return {"op": "DELETE", "section": section, "target": target}


ID, COMM, WORK, SKILLS, RECENT, FOLLOW = (
    "Identity",
    "Communication Preferences",
    "Work Context",
    "Skills & Expertise",
    "Recent Topics",
    "Open Questions / Follow-ups",
)
_MINUTE = re.compile(r"(\d{4}-\d{2}-\d{2} \d{2}:\d{2}) UTC")
OK = "Got it, I'll keep that in mind."

PACED: tuple[Turn, ...] = (
    Turn("Hi there!", "Hello! How can I help you today?"),
    Turn(
        "I'm a credit risk analyst at Helvetia Private Bank, and I live in Zurich.",
        "Nice to meet you! Credit risk at a private bank covers a lot of ground. What are you "
        "working on at the moment?",
        (
            add(ID, "Works as a credit risk analyst."),
            add(ID, "Works at Helvetia Private Bank."),
            add(ID, "Based in Zurich."),
        ),
    ),
    Turn(
        "What is the difference between IFRS 9 stage 2 and stage 3?",
        "Stage 2 covers exposures whose credit risk increased significantly since initial "
        "recognition: lifetime expected credit losses are recognised, interest on the gross "
        "carrying amount. Stage 3 covers credit-impaired exposures: lifetime losses as well, but "
        "interest is computed on the net carrying amount (after the loss allowance).",
    ),
    Turn("Thanks, that helps!", "You're welcome!"),
    Turn(
        "Please keep answers short and use tables when you compare numbers.",
        OK,
        (
            add(COMM, "Prefers concise answers."),
            add(COMM, "Prefers tables for numeric comparisons."),
        ),
    ),
    Turn(
        "How do I compute a lifetime PD from a 12-month PD?",
        "Under a constant hazard assumption, lifetime PD = 1 - (1 - PD_12m)^T for T years. With "
        "term structures you chain the marginal PDs year by year instead.",
    ),
    Turn(
        "Can you write a Python function that discounts a list of cash flows?",
        "def present_value(flows, rate):\n    return sum(cf / (1 + rate) ** t for t, cf in "
        "enumerate(flows, start=1))",
    ),
    Turn(
        "I'm working on the ICAAP stress-testing report, due at the end of June.",
        "Understood. Stress testing for the ICAAP usually needs scenario design, the mapping to "
        "PD and LGD shifts, and the capital impact. Where would you like to start?",
        (add(WORK, "Working on the ICAAP stress-testing report, due at the end of June."),),
    ),
    Turn("Ok, great.", "Let me know if you need anything else."),
    Turn(
        "Which central bank sets Swiss interest rates?",
        "The Swiss National Bank (SNB) sets the policy rate.",
    ),
    Turn(
        "I have eight years of experience in credit risk modelling and I know Python and SAS.",
        "That is a solid background for the modelling side of the ICAAP.",
        (
            add(SKILLS, "8 years of experience in credit risk modelling."),
            add(SKILLS, "Knows Python and SAS."),
        ),
    ),
    Turn(
        "What does LGD stand for?",
        "Loss given default: the share of an exposure lost when the borrower defaults.",
    ),
    Turn("Cool, thanks!", "Anytime."),
    Turn(
        "Explain the difference between a VaR and an expected shortfall.",
        "VaR is a quantile of the loss distribution (the loss not exceeded with, say, 99 % "
        "confidence); expected shortfall is the average loss beyond that quantile, so it also "
        "sees the size of the tail.",
    ),
    Turn(
        "Actually, I moved to Geneva last month.",
        "Noted, Geneva then. Is the bank's team there as well?",
        (update(ID, "Based in Zurich.", "Based in Geneva."),),
    ),
    Turn("Good morning!", "Good morning! What's on your list today?"),
    Turn(
        "Remind me to check the scenario weights next week.",
        "I'll bring up the scenario weights when we talk next week.",
        (add(FOLLOW, "Wants a reminder to check the scenario weights next week."),),
    ),
    Turn(
        "My English is fine, but German is my mother tongue.",
        "Good to know. I'll stay in English unless you ask otherwise.",
        (add(ID, "Native language: German."),),
    ),
    Turn(
        "Most of my week now goes into the Basel IV output floor impact study.",
        "The output floor compares the internal-model RWA with 72.5 % of the standardised one, "
        "so the study mostly means running both approaches side by side.",
        (add(WORK, "Working on the Basel IV output floor impact study."),),
    ),
    Turn("Thank you so much!", "You're very welcome."),
    Turn(
        "What's a good way to visualise a migration matrix?",
        "A heat map of the rating-to-rating transition probabilities, with the diagonal "
        "highlighted, reads best.",
    ),
    Turn(
        "From now on, call me Dana.",
        "Will do, Dana.",
        (add(ID, "Name: Dana."),),
    ),
    Turn(
        "Please forget that I live in Geneva.",
        "Done, I won't keep your location.",
        (delete(ID, "Based in Geneva."),),
    ),
    Turn(
        "How does the SNB's policy rate affect mortgage pricing?",
        "Saron-based mortgages reprice with the policy rate almost at once; fixed-rate mortgages "
        "follow the swap curve, which anticipates the policy path.",
    ),
    Turn(
        "I'm now the team lead for the credit risk analytics team.",
        "Congratulations on the new role!",
        (
            update(
                ID,
                "Works as a credit risk analyst.",
                "Works as the team lead for credit risk analytics.",
            ),
        ),
    ),
    Turn("See you later!", "See you!"),
    Turn(
        "Write a SQL query that lists the ten largest exposures.",
        "SELECT counterparty, exposure FROM exposures ORDER BY exposure DESC LIMIT 10;",
    ),
    Turn(
        "Why do banks hold capital buffers?",
        "To absorb losses in a stress without breaching the minimum requirements, so lending "
        "can go on in a downturn.",
    ),
    Turn(
        "Ich spreche auch fließend Französisch, das hilft in Genf.",
        "Très bien ! That helps with clients in Romandy.",
        (add(ID, "Speaks French fluently."),),
    ),
    Turn("Great, bye!", "Bye!"),
)

BURST: tuple[Turn, ...] = (
    Turn("Hello again!", "Hi! Welcome back."),
    Turn(
        "I prefer answers in English, even when I write in German.",
        OK,
        (add(COMM, "Prefers answers in English."),),
    ),
    Turn(
        "What is a credit conversion factor?",
        "The share of an undrawn commitment expected to be drawn by the time of default.",
    ),
    Turn(
        "We are migrating our PD models from SAS to Python this year.",
        "A good moment to add proper model versioning and back-testing pipelines too.",
        (add(WORK, "Migrating the PD models from SAS to Python this year."),),
    ),
    Turn("Thanks!", "You're welcome."),
    Turn(
        "How do I read a Parquet file with pandas?",
        "pandas.read_parquet('file.parquet') reads it into a DataFrame (pyarrow installed).",
    ),
    Turn(
        "Let's revisit the LGD downturn adjustment on Monday.",
        "Sure, Monday then.",
        (add(FOLLOW, "Wants to revisit the LGD downturn adjustment on Monday."),),
    ),
    Turn(
        "Can you summarise what the output floor does in one sentence?",
        "It caps the capital benefit of internal models at 27.5 % below the standardised approach.",
    ),
    Turn(
        "My deadline for the impact study is September 30.",
        "Noted: September 30 for the impact study.",
        (add(WORK, "Deadline for the Basel IV impact study: September 30."),),
    ),
    Turn("Perfect, thanks a lot.", "Anytime!"),
)
CONVERSATION = PACED + BURST

# --- the recording model --------------------------------------------------------------------


@dataclass
class Call:
    kind: str
    model: str
    prompt_tokens: int
    max_tokens: int
    completion_tokens: int
    noop: bool
    system_tokens: int


@dataclass
class Recorder:
    calls: list[Call] = field(default_factory=list)
    systems: dict[str, set[str]] = field(default_factory=lambda: defaultdict(set))


_KIND_OF_SYSTEM: Final = {system: kind for kind, system in STATIC_PREFIXES.items()}


def call_kind(body: dict[str, Any]) -> str:
    """The consolidation call a request is: its system message is that kind's static prefix
    (`STATIC_PREFIXES`), byte for byte, or the request is not one the service sends."""
    system = str(body["messages"][0]["content"])
    if system not in _KIND_OF_SYSTEM:
        raise RuntimeError("a request whose system message is no static prefix of the service")
    return _KIND_OF_SYSTEM[system]


def turns_in(prompt: str) -> list[Turn]:
    """The scripted turns whose user text the prompt holds, in the conversation's order."""
    return [turn for turn in CONVERSATION if turn.user in prompt]


class OracleModel:
    """An OpenAI-compatible server on 127.0.0.1 that answers as the script says (module doc)."""

    def __init__(self) -> None:
        self.recorder = Recorder()
        self.counter = TokenCounter(None)
        self._port: int | None = None
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None
        app = Starlette(routes=[Route("/v1/chat/completions", self._answer, methods=["POST"])])
        self._config = uvicorn.Config(
            app, log_config=None, access_log=False, lifespan="off", ws="none"
        )

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._port}/v1"

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[OracleModel]:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self._port = sock.getsockname()[1]
        server = _QuietServer(self._config)
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started:
            if task.done():
                task.result()
            await asyncio.sleep(0.01)
        try:
            yield self
        finally:
            server.should_exit = True
            await task

    def _tokens(self, text: str) -> int:
        return self.counter.count(text)

    async def _answer(self, request: Request) -> Response:
        body = json.loads(await request.body())
        kind = call_kind(body)
        messages = body["messages"]
        prompt = "\n".join(str(m["content"]) for m in messages[1:])
        turns = turns_in(prompt)
        now = _MINUTE.search(prompt)
        ops = [op for turn in turns for op in turn.ops_at(now[1] if now else "")]
        if kind == "gate":
            text = "UPDATE" if ops else "NOOP"
        elif kind == "operations":
            text = json.dumps(
                {"decision": "UPDATE", "operations": ops} if ops else {"decision": "NOOP"}
            )
        else:
            text = "NOOP"
        prompt_tokens = REPLY_PRIMING_TOKENS + sum(
            MESSAGE_OVERHEAD_TOKENS + self._tokens(str(m["content"])) for m in messages
        )
        completion_tokens = self._tokens(text)
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or 0
        system = str(messages[0]["content"])
        self.recorder.systems[kind].add(system)
        self.recorder.calls.append(
            Call(
                kind,
                str(body["model"]),
                prompt_tokens,
                int(limit),
                completion_tokens,
                text.startswith("NOOP") or '"NOOP"' in text,
                MESSAGE_OVERHEAD_TOKENS + self._tokens(system),
            )
        )
        return JSONResponse(
            {
                "id": f"chatcmpl-cost-{len(self.recorder.calls)}",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": text, "refusal": None},
                        "finish_reason": "stop",
                        "logprobs": None,
                    }
                ],
                "usage": {
                    "prompt_tokens": prompt_tokens,
                    "completion_tokens": completion_tokens,
                    "total_tokens": prompt_tokens + completion_tokens,
                },
            }
        )


class _QuietServer(uvicorn.Server):
    """uvicorn without its own signal handlers: Ctrl-C stays with the bench."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


# --- running the conversation ---------------------------------------------------------------


@contextlib.asynccontextmanager
async def scratch_database(admin_url: str) -> AsyncIterator[str]:
    name = f"cms_model_cost_{uuid.uuid4().hex[:8]}"
    admin_dsn = to_asyncpg_url(admin_url).replace("postgresql+asyncpg://", "postgresql://")
    admin = await asyncpg.connect(admin_dsn)
    try:
        await admin.execute(f'CREATE DATABASE "{name}"')
    finally:
        await admin.close()
    url = make_url(to_asyncpg_url(admin_url)).set(database=name)
    database_url = url.render_as_string(hide_password=False)
    try:
        await asyncio.to_thread(run_migrations, database_url)
        yield database_url
    finally:
        admin = await asyncpg.connect(admin_dsn)
        try:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        finally:
            await admin.close()


@dataclass
class Phase:
    name: str
    turns: int
    calls: list[Call]


@dataclass
class RunResult:
    phases: list[Phase]
    profile: str
    metrics: dict[str, float]


async def run_conversation(database_url: str, model: OracleModel, **overrides: Any) -> RunResult:
    values: dict[str, Any] = {
        "environment": "test",
        "database_url": database_url,
        "jwt_secret": SecretStr(JWT_SECRET),
        "jwt_platform": True,  # the harness's operator switches a company's flag on
        "worker_enabled": False,
        "llm_provider": "openai",
        "openai_base_url": model.base_url,
        "log_level": "WARNING",
        "db_pool_size": 4,
    }
    settings = Settings(_env_file=None, **(values | overrides))
    app = create_app(settings)
    phases: list[Phase] = []
    async with LifespanManager(app):
        worker = BackgroundWorker(app.state.database, settings, app.state.metrics, app.state.tokens)
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://bench") as client:

            def headers(sub: str, company: str, *roles: str) -> dict[str, str]:
                token = issue_token(settings, Principal(sub, company, frozenset(roles)))
                return {"Authorization": f"Bearer {token}"}

            operator = headers("olga", "platform", "operator")
            response = await client.post(
                "/v1/companies", json={"company_id": COMPANY}, headers=operator
            )
            response.raise_for_status()
            response = await client.put(
                f"/v1/companies/{COMPANY}/feature-flags/{FLAG_CONTEXT_MEMORY}",
                json={"enabled": True},
                headers=operator,
            )
            response.raise_for_status()
            user_headers = headers(USER, COMPANY)

            async def save(turn: Turn) -> None:
                body = {
                    "space_id": SPACE,
                    "messages": [{"role": "user", "content": turn.user}],
                    "response": {"role": "assistant", "content": turn.assistant},
                }
                saved = await client.post(
                    "/v1/chats/cost-chat/turns", json=body, headers=user_headers
                )
                if saved.status_code != 202:
                    raise RuntimeError(f"turn-save answered {saved.status_code}: {saved.text}")

            async def drain() -> None:
                while await worker.worker.run_once() is not None:
                    pass

            try:
                start = len(model.recorder.calls)
                for turn in PACED:
                    await save(turn)
                    await drain()
                phases.append(Phase("paced", len(PACED), model.recorder.calls[start:]))
                start = len(model.recorder.calls)
                for turn in BURST:
                    await save(turn)
                await drain()
                phases.append(Phase("burst", len(BURST), model.recorder.calls[start:]))
            finally:
                await worker.stop()
            memory = await client.get("/v1/me/memory", headers=user_headers)
            memory.raise_for_status()
            exposition = (await client.get("/metrics")).text
    return RunResult(phases, str(memory.json()["content"]), model_metrics(exposition))


def model_metrics(exposition: str) -> dict[str, float]:
    """The model-cost samples of the service's /metrics, by name and labels."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(exposition):
        if not family.name.startswith(("model_", "consolidation_prefilter", "consolidations")):
            continue
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}"] = sample.value
    return found


# --- the report -----------------------------------------------------------------------------


def percentile(values: Sequence[float], share: float) -> float:
    """Nearest-rank percentile; 0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def summarise(result: RunResult, recorder: Recorder) -> dict[str, Any]:
    calls = [call for phase in result.phases for call in phase.calls]
    turns = sum(phase.turns for phase in result.phases)
    paced_turns = list(PACED)
    by_kind: dict[str, dict[str, Any]] = {}
    for kind in sorted({call.kind for call in calls}):
        mine = [call for call in calls if call.kind == kind]
        ratios = [c.max_tokens / max(1, c.completion_tokens) for c in mine]
        answered = [c.max_tokens / max(1, c.completion_tokens) for c in mine if not c.noop]
        by_kind[kind] = {
            "calls": len(mine),
            "models": dict(Counter(call.model for call in mine)),
            "noop": sum(call.noop for call in mine),
            "prompt_tokens_mean": round(mean([c.prompt_tokens for c in mine]), 1),
            "system_tokens": sorted({c.system_tokens for c in mine}),
            "distinct_system_prompts": len(recorder.systems[kind]),
            "max_tokens": sorted({c.max_tokens for c in mine}),
            "completion_tokens_mean": round(mean([c.completion_tokens for c in mine]), 1),
            "max_tokens_over_output_p95": round(percentile(ratios, 0.95), 1),
            "max_tokens_over_output_p95_non_noop": round(percentile(answered, 0.95), 1),
        }
    phases = {
        phase.name: {
            "turns": phase.turns,
            "calls": len(phase.calls),
            "calls_per_turn": round(len(phase.calls) / phase.turns, 3),
            "prompt_tokens_per_turn": round(
                sum(c.prompt_tokens for c in phase.calls) / phase.turns, 1
            ),
        }
        for phase in result.phases
    }
    paced = next(phase for phase in result.phases if phase.name == "paced")
    fact_turns = sum(turn.is_fact for turn in paced_turns)
    return {
        "turns": turns,
        "fact_share": round(sum(t.is_fact for t in CONVERSATION) / len(CONVERSATION), 2),
        "paced_fact_turns": fact_turns,
        "calls_per_turn": round(len(calls) / turns, 3),
        "prompt_tokens_per_turn": round(sum(c.prompt_tokens for c in calls) / turns, 1),
        "completion_tokens_per_turn": round(sum(c.completion_tokens for c in calls) / turns, 1),
        "phases": phases,
        "paced_prompt_tokens_per_turn": round(
            sum(c.prompt_tokens for c in paced.calls) / paced.turns, 1
        ),
        "by_kind": by_kind,
        "profile_sha256": hashlib.sha256(profile_body(result.profile).encode()).hexdigest()[:16],
        "metrics": result.metrics,
    }


def profile_body(content: str) -> str:
    """The profile without its frontmatter and with its times masked: what two runs of the
    conversation must agree on."""
    return _MINUTE.sub("<time>", content.split("\n---\n", 1)[-1])


def report(summary: dict[str, Any], profile: str) -> str:
    lines = [
        f"turns {summary['turns']} (facts {summary['fact_share']:.0%}); "
        f"calls/turn {summary['calls_per_turn']}; prompt tokens/turn "
        f"{summary['prompt_tokens_per_turn']}; completion tokens/turn "
        f"{summary['completion_tokens_per_turn']}",
    ]
    for name, phase in summary["phases"].items():
        lines.append(
            f"  {name}: {phase['turns']} turns, {phase['calls']} calls "
            f"({phase['calls_per_turn']}/turn), "
            f"{phase['prompt_tokens_per_turn']} prompt tokens/turn"
        )
    lines.append("")
    header = "| kind | calls | NOOP | models | prompt tokens (mean) | system tokens | max_tokens "
    header += "| output (mean) | max_tokens/output p95 (non-NOOP) |"
    lines += [header, "|---|---|---|---|---|---|---|---|---|"]
    for kind, row in summary["by_kind"].items():
        models = ", ".join(f"{m} ×{n}" for m, n in row["models"].items())
        limits = row["max_tokens"]
        shown = f"{limits[0]}–{limits[-1]}" if len(limits) > 1 else str(limits[0])
        lines.append(
            f"| {kind} | {row['calls']} | {row['noop']} | {models} | {row['prompt_tokens_mean']} "
            f"| {row['system_tokens']} | {shown} | {row['completion_tokens_mean']} "
            f"| {row['max_tokens_over_output_p95']} "
            f"({row['max_tokens_over_output_p95_non_noop']}) |"
        )
    lines += ["", "metrics:"]
    lines += [f"  {name} {value:g}" for name, value in summary["metrics"].items()]
    lines += ["", f"final profile (sha256 {summary['profile_sha256']}):", profile]
    return "\n".join(lines)


async def measure(admin_url: str) -> tuple[str, dict[str, Any]]:
    """The report and the figures (with every call and the final profile) of one run."""
    texts = [turn.user for turn in CONVERSATION]
    if any(a != b and a in b for a in texts for b in texts):
        raise SystemExit("a scripted user text occurs inside another: the oracle would misread")
    model = OracleModel()
    async with model.running(), scratch_database(admin_url) as database_url:
        result = await run_conversation(database_url, model)
    summary = summarise(result, model.recorder)
    figures = summary | {
        "profile": result.profile,
        "calls": [asdict(call) for call in model.recorder.calls],
    }
    return report(summary, result.profile), figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--admin-url", default=os.environ.get("DATABASE_URL") or DEFAULT_ADMIN_URL)
    parser.add_argument("--json", help="also write the figures (and every call) to this file")
    args = parser.parse_args(argv)
    text, figures = asyncio.run(measure(args.admin_url))
    print(text)
    if args.json:
        Path(args.json).write_text(json.dumps(figures, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
