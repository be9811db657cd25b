"""`python -m eval`: replay the corpus through the service and print the report.

python -m eval                          # the offline engine (no model, no network)
python -m eval --engine stub            # the model path, against a local recording stub
python -m eval --engine obedient --suite policy   # the memory policy against a model that obeys
python -m eval --engine obedient --suite policy --paths put,restore   # only these write paths
OPENAI_BASE_URL=... OPENAI_API_KEY=... python -m eval --engine endpoint --model NAME
python -m eval --engine stub --json var/eval.json --price-prompt 0.15 --price-completion 0.6
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from eval.corpus import DEFAULT_CORPUS, Corpus, CorpusError, load_corpus
from eval.policy_corpus import DEFAULT_ATTACKERS, DEFAULT_BENIGNS, PolicyCorpus, load_policy_corpus
from eval.policy_replay import PATHS
from eval.replay import ReplayError, project_path
from eval.report import Prices, render
from eval.run import ENGINES, RunOptions, run_eval

DEFAULT_PRICE_PROMPT = 0.15
DEFAULT_PRICE_COMPLETION = 0.60


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    # Before the app is built: the MCP SDK configures the root logger at INFO unless it is set.
    logging.basicConfig(level=logging.WARNING, format="eval: %(name)s %(levelname)s %(message)s")
    policy: PolicyCorpus | None = None
    try:
        corpus = load_corpus(args.corpus) if args.suite != "policy" else Corpus(())
        if args.suite != "quality":
            attackers = args.attacker_corpus or list(DEFAULT_ATTACKERS)
            benigns = args.benign_corpus or list(DEFAULT_BENIGNS)
            policy = load_policy_corpus(attackers, benigns)
    except (CorpusError, OSError) as error:
        print(f"eval: {error}", file=sys.stderr)
        return 2
    paths = tuple(name.strip() for name in args.paths.split(",") if name.strip())
    if not paths or set(paths) - set(PATHS):
        print(f"eval: --paths must name some of {', '.join(PATHS)}", file=sys.stderr)
        return 2
    if args.users:
        wanted = [name.strip() for name in args.users.split(",") if name.strip()]
        unknown = set(wanted) - {user.id for user in corpus.users}
        if unknown:
            print(f"eval: no such users in the corpus: {sorted(unknown)}", file=sys.stderr)
            return 2
        corpus = Corpus(tuple(user for user in corpus.users if user.id in wanted))
    prices = Prices(args.price_prompt, args.price_completion)
    policy_turns = 0 if policy is None else len(policy.attack_turns) + len(policy.benign_turns)
    print(
        f"eval: {len(corpus.users)} users, {corpus.turns} turns, {policy_turns} memory-policy "
        f"turns, engine {args.engine}",
        file=sys.stderr,
    )
    try:
        report, _ = asyncio.run(
            run_eval(
                corpus,
                RunOptions(
                    engine=args.engine,
                    model=args.model,
                    prices=prices,
                    corpus_name=project_path(args.corpus) if corpus.users else "-",
                    job_timeout=args.job_timeout,
                    policy=policy,
                    policy_names=(
                        ", ".join(
                            project_path(p) for p in args.attacker_corpus or DEFAULT_ATTACKERS
                        ),
                        ", ".join(project_path(p) for p in args.benign_corpus or DEFAULT_BENIGNS),
                    ),
                    policy_paths=paths,
                    policy_burst=args.burst,
                ),
                progress=lambda line: print(f"eval: {line}", file=sys.stderr),
            )
        )
    except ReplayError as error:
        print(f"eval: {error}", file=sys.stderr)
        return 1
    print(render(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.to_json(), indent=2, ensure_ascii=False) + "\n")
        print(f"\nJSON report: {args.json}")
    return 0


def _parser() -> argparse.ArgumentParser:
    env = os.environ
    parser = argparse.ArgumentParser(
        prog="python -m eval", description=(__doc__ or "").split("\n\n", maxsplit=1)[0]
    )
    parser.add_argument(
        "--engine",
        choices=ENGINES,
        default=env.get("EVAL_ENGINE", "offline"),
        help="offline: the rule engine; stub: a local recording model stub; obedient: a stub "
        "model that stores every sentence the user wrote; endpoint: OPENAI_BASE_URL / "
        "OPENAI_API_KEY through a recording proxy (default: offline)",
    )
    parser.add_argument(
        "--suite",
        choices=("all", "quality", "policy"),
        default="all",
        help="quality: the corpus; policy: the attacker and benign corpora by every write "
        "path; all: both (default)",
    )
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS)
    parser.add_argument(
        "--attacker-corpus",
        type=Path,
        action="append",
        help="an attacker corpus (repeat for several; default: eval/corpus-attacker.yaml and "
        "eval/corpus-disguises.yaml)",
    )
    parser.add_argument(
        "--benign-corpus",
        type=Path,
        action="append",
        help="a benign corpus (repeat for several; default: eval/corpus-benign.yaml and "
        "eval/corpus-benign-scripts.yaml)",
    )
    parser.add_argument(
        "--burst",
        action="store_true",
        help="the policy suite's chat turns of each user in one burst, not paced (faster; the "
        "worker may consolidate several turns at once)",
    )
    parser.add_argument(
        "--paths",
        default=",".join(PATHS),
        help="the write paths of the policy suite, comma-separated (default: %(default)s)",
    )
    parser.add_argument("--users", help="comma-separated corpus user ids (default: all)")
    parser.add_argument(
        "--model",
        default=env.get("LLM_MODEL", "gpt-4o-mini"),
        help="the space's consolidation model (default: LLM_MODEL or gpt-4o-mini)",
    )
    parser.add_argument(
        "--price-prompt",
        type=float,
        default=float(env.get("EVAL_PRICE_PROMPT", DEFAULT_PRICE_PROMPT)),
        help="price per million prompt tokens (EVAL_PRICE_PROMPT, default %(default)s)",
    )
    parser.add_argument(
        "--price-completion",
        type=float,
        default=float(env.get("EVAL_PRICE_COMPLETION", DEFAULT_PRICE_COMPLETION)),
        help="price per million completion tokens (EVAL_PRICE_COMPLETION, default %(default)s)",
    )
    parser.add_argument("--json", type=Path, help="also write the report as JSON to this file")
    parser.add_argument(
        "--job-timeout",
        type=float,
        default=300.0,
        help="seconds to wait for one consolidation (default %(default)s)",
    )
    return parser


if __name__ == "__main__":
    sys.exit(main())
