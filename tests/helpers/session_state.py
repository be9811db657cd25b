"""What a SQL statement leaves on the database session that runs it, read with PostgreSQL's own
parser (pglast): the rule under `DriverPool`, whose connections skip asyncpg's session reset
(`pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`) between requests.

The rule as `DriverPool` states it, strictly: no SET or RESET of any kind (not even LOCAL), no
cursor, no LISTEN, no session-level advisory lock, no prepared statement by SQL (asyncpg's own,
prepared over the protocol, are the statement cache), no temporary relation, no DISCARD or LOAD.
"""

from __future__ import annotations

from collections.abc import Iterator

from pglast import ast, parse_sql

from app.kit.citus import ACROSS_COMPANIES_SQL, BACK_TO_ONE_COMPANY_SQL

# statements that set, use or drop session state, by what they touch
_STATEMENTS: dict[type[ast.Node], str] = {
    ast.VariableSetStmt: "a setting (SET/RESET)",
    ast.ListenStmt: "a LISTEN",
    ast.UnlistenStmt: "an UNLISTEN",
    ast.DeclareCursorStmt: "a cursor (DECLARE)",
    ast.ClosePortalStmt: "a cursor (CLOSE)",
    ast.FetchStmt: "a cursor (FETCH/MOVE)",
    ast.PrepareStmt: "a prepared statement (PREPARE)",
    ast.ExecuteStmt: "a prepared statement (EXECUTE)",
    ast.DeallocateStmt: "a prepared statement (DEALLOCATE)",
    ast.DiscardStmt: "the session's state (DISCARD)",
    ast.LoadStmt: "a library loaded into the session (LOAD)",
}

# functions whose effect outlives the transaction: session-level advisory locks (the
# `_xact_` ones end with the transaction) and settings
_FUNCTIONS = {
    "pg_advisory_lock": "a session-level advisory lock",
    "pg_advisory_lock_shared": "a session-level advisory lock",
    "pg_try_advisory_lock": "a session-level advisory lock",
    "pg_try_advisory_lock_shared": "a session-level advisory lock",
    "set_config": "a setting (set_config)",
}

_TEMPORARY = "t"  # RangeVar.relpersistence of CREATE TEMP ..., SELECT ... INTO TEMP

RESTORED_BY_THE_DRIVER = frozenset(
    {
        "SELECT current_setting('jit') AS cur, set_config('jit', 'off', false) AS new",
        "SELECT set_config('jit', $1, false)",
    }
)
"""asyncpg's own statements (whitespace normalised) that change a setting and set it back: its
type introspection turns JIT off for its catalog query, then restores the value it read
(`Connection._introspect_types`, on the first use of a type it does not know)."""


TRANSACTION_LOCAL_ON_CITUS = frozenset({ACROSS_COMPANIES_SQL, BACK_TO_ONE_COMPANY_SQL})
"""The service's own, sent only on a Citus coordinator: `across_companies` (app/kit/citus.py) and
the cluster claim lower `citus.multi_task_query_log_level` for the statements that reach every
company, inside their transaction, and set it back after them; a `SET LOCAL` ends with the
transaction in any case, so no connection is handed back changed."""


def session_state(sql: str) -> list[str]:
    """What `sql` leaves on (or asks of) its session, one entry per finding; empty when the
    statement is safe on a connection that is never reset. Raises pglast's `ParseError` for
    text PostgreSQL would not parse."""
    found: list[str] = []
    for node in _nodes(parse_sql(sql)):
        described = _STATEMENTS.get(type(node))
        if described is not None:
            found.append(_with_name(described, node))
        elif isinstance(node, ast.FuncCall):
            name = (node.funcname or ())[-1]
            function = name.sval if isinstance(name, ast.String) else None
            if function in _FUNCTIONS:
                found.append(f"{_FUNCTIONS[function]}: {function}()")
        elif isinstance(node, ast.RangeVar) and node.relpersistence == _TEMPORARY:
            found.append(f"a temporary relation: {node.relname}")
    return found


def _with_name(described: str, node: ast.Node) -> str:
    name = getattr(node, "name", None)
    return f"{described}: {name}" if isinstance(name, str) else described


def _nodes(value: object) -> Iterator[ast.Node]:
    """Every node of a parse tree, depth first."""
    if isinstance(value, tuple):
        for item in value:
            yield from _nodes(item)
    elif isinstance(value, ast.Node):
        yield value
        for member in value:
            yield from _nodes(getattr(value, member))
