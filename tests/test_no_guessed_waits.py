"""No test sleeps a guessed time while it waits for another party (CONTRIBUTING.md): every sleep
in `tests/` is read from the syntax tree and must stand in a function of `ALLOWED`, which says
why that sleep is the behaviour under test or the pace of a poll that fails at its deadline.

A wait for something another party does (a worker, a server, a session blocked on a lock) polls
its condition with `tests/helpers/polling.py`, or waits on an event or a barrier; it does not
sleep and hope. A new sleep that is neither fails here until it is replaced, or named below.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from typing import TypeGuard

import pytest

from app.kit.config import PROJECT_ROOT

TESTS = PROJECT_ROOT / "tests"
SLEEPING_MODULES = frozenset({"time", "asyncio", "anyio", "trio"})

ALLOWED: dict[tuple[str, str], str] = {
    # the pace of a poll that fails at its deadline
    ("tests/helpers/polling.py", "wait_until"): "the interval of the deadline-bounded poll",
    ("tests/helpers/polling.py", "wait_until_sync"): "the interval of the deadline-bounded poll",
    ("tests/helpers/replicated_pg.py", "_make_synchronous"): "polls until sync, fails at deadline",
    ("tests/helpers/identity_provider.py", "IdentityProvider._wait_for_issuer"): (
        "polls the process's first line, fails at its deadline"
    ),
    ("tests/helpers/identity_provider.py", "IdentityProvider._wait_for_discovery"): (
        "polls discovery, fails at its deadline"
    ),
    ("tests/helpers/auto_failover.py", "Formation.wait_for_states"): (
        "polls the monitor's states, fails at its deadline"
    ),
    ("tests/test_failover_manager.py", "_fail_over"): (
        "polls for a writable primary, timing it, fails at its deadline"
    ),
    # the behaviour under test
    ("tests/helpers/identity_provider.py", "IdentityProvider.rotate"): (
        "the pause between a key rotation's steps"
    ),
    ("tests/helpers/failover.py", "TurnLoad._save"): (
        "a client's pause before it retries, honouring Retry-After"
    ),
    ("tests/helpers/failover.py", "ReadinessProbe._poll"): "the pace of the /readyz probe",
    (
        "tests/test_database_faults_under_load.py",
        "test_turn_saves_while_the_services_connections_are_terminated_lose_and_duplicate_nothing",
    ): "the pace of the connection cuts",
    (
        "tests/test_database_faults_under_load.py",
        "test_turn_saves_through_repeated_restarts_and_cuts_lose_and_duplicate_nothing",
    ): "how long an outage lasts, and the pace of the cuts",
    (
        "tests/jobs/test_fair_claims.py",
        "test_fair_order_never_runs_one_users_jobs_concurrently.slot",
    ): "a claimer's idle poll, and a claim held a moment",
    ("tests/erasure/test_erasure_racing_turn_saves.py", "race_turn_saves_with_an_erasure.save"): (
        "spreads the writes over the erasure's statements"
    ),
    ("tests/erasure/test_erasure_racing_turn_saves.py", "race_turn_saves_with_an_erasure.erase"): (
        "sends the erasure while the first writes run"
    ),
    (
        "tests/test_request_limits.py",
        "test_a_body_that_arrives_in_time_is_served.slow_but_in_time",
    ): "a slow body that still arrives in time",
    ("tests/test_pgbouncer.py", "ConnectionCounts.sample_until"): "the pace of the sampler",
    ("tests/rate_limits/test_flood.py", "context_p50"): "the gap between latency samples",
    (
        "tests/consolidation/test_worker_runs.py",
        "test_twenty_turns_in_four_chats_on_two_slots_keep_every_fact_and_a_linear_history",
    ): "turns arrive while the worker runs",
    ("tests/test_serve_slow_clients.py", "normal_client"): "a normal client's pace",
    ("tests/citus/test_claim_on_cluster.py", "Runs.handler.run"): "the job's work",
}


@dataclass(frozen=True)
class Sleep:
    line: int
    function: str  # the enclosing functions and classes, dotted; "" at module level


def _sleep_names(tree: ast.Module) -> tuple[set[str], set[str]]:
    """The local names of the sleeping modules, and of their sleep functions (any `sleep`
    too: a name that says it sleeps is read as one)."""
    modules: set[str] = set()
    functions = {"sleep"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules |= {a.asname or a.name for a in node.names if a.name in SLEEPING_MODULES}
        elif isinstance(node, ast.ImportFrom) and node.module in SLEEPING_MODULES:
            functions |= {a.asname or a.name for a in node.names if a.name == "sleep"}
    return modules, functions


def _is_sleep(node: ast.AST, modules: set[str], functions: set[str]) -> TypeGuard[ast.expr]:
    if isinstance(node, ast.Name):
        return node.id in functions
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "sleep"
        and isinstance(node.value, ast.Name)
        and node.value.id in modules
    )


def sleeps_in(source: str) -> list[Sleep]:
    """Where `source` calls (or hands on) `time.sleep`, `asyncio.sleep`, `anyio.sleep` or
    `trio.sleep`, under any name it imports them by, in the order of its lines."""
    tree = ast.parse(source)
    modules, functions = _sleep_names(tree)
    found: list[Sleep] = []

    def visit(node: ast.AST, scope: tuple[str, ...]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                visit(child, (*scope, child.name))
                continue
            if _is_sleep(child, modules, functions):
                found.append(Sleep(child.lineno, ".".join(scope)))
            visit(child, scope)

    visit(tree, ())
    return sorted(found, key=lambda use: use.line)


def _sleeps_in_tests() -> dict[tuple[str, str], list[int]]:
    found: dict[tuple[str, str], list[int]] = {}
    for path in sorted(TESTS.rglob("*.py")):
        name = path.relative_to(PROJECT_ROOT).as_posix()
        for use in sleeps_in(path.read_text("utf-8")):
            found.setdefault((name, use.function), []).append(use.line)
    return found


def test_every_sleep_in_the_tests_is_behaviour_or_the_pace_of_a_bounded_poll() -> None:
    found = _sleeps_in_tests()
    unexplained = [
        f"{path}:{line} in {function or 'the module'}"
        for (path, function), lines in found.items()
        if (path, function) not in ALLOWED
        for line in lines
    ]
    assert not unexplained, (
        "a sleep where a test may be waiting for another party: wait on its condition "
        "(tests/helpers/polling.py), an event or a barrier instead, or, if the sleep is the "
        "behaviour under test, name its function in ALLOWED with why:\n" + "\n".join(unexplained)
    )
    stale = sorted(set(ALLOWED) - set(found))
    assert not stale, f"ALLOWED names functions that no longer sleep: {stale}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import time\ndef f():\n    time.sleep(1)\n", [Sleep(3, "f")]),
        ("import asyncio\nasync def f():\n    await asyncio.sleep(0)\n", [Sleep(3, "f")]),
        ("import anyio, trio\nasync def f():\n    await anyio.sleep(1)\n", [Sleep(3, "f")]),
        (
            "import trio as t\nclass C:\n    async def m(self):\n        await t.sleep(1)\n",
            [Sleep(4, "C.m")],
        ),
        ("from time import sleep\nsleep(1)\n", [Sleep(2, "")]),
        (
            "from asyncio import sleep as nap\nasync def f():\n    async def g():\n"
            "        await nap(1)\n",
            [Sleep(4, "f.g")],
        ),
        ("import time\nx = map(time.sleep, [1])\n", [Sleep(2, "")]),  # handed on, not called
        ("def f(sleep):\n    sleep(1)\n", [Sleep(2, "f")]),  # any `sleep` is suspect
        # not a sleep: another module's, or words in a string
        ("import os\nos.sleep(1)\n", []),
        ("text = 'time.sleep(1)'\n", []),
        ("import asyncio\nasync def f(e):\n    await asyncio.wait_for(e.wait(), 5)\n", []),
    ],
)
def test_the_scan_finds_every_spelling_of_a_sleep(source: str, expected: list[Sleep]) -> None:
    assert sleeps_in(source) == expected
