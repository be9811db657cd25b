"""The schema on a Citus cluster: every company table distributed by `company_id`, co-located,
the other tables (`alembic_version` included) reference tables, copied to every node.

`distribute` is what `python -m app distribute` runs, and `python -m app migrate` after Alembic's
upgrade: on a database without the `citus` extension (plain PostgreSQL, the embedded default) it
does nothing. It reads which tables are company tables from the models' metadata (each table with
a `company_id` column), never from a list that could drift from them, and it is idempotent: a
table Citus already distributes is left as it is, so a migration that adds a table is followed by
a run that distributes that one only.

Order: reference tables first (a company table may reference one), then the company tables
parents first (`MetaData.sorted_tables`: a foreign key between company tables includes
`company_id`, so both ends are co-located), each co-located with the first.

Then the company functions (`on_company_node`): each hot statement of the request path that
Citus would split into steps becomes, on a Citus coordinator only, a PL/pgSQL function that runs
it, distributed by its company argument and co-located with the company tables, so that Citus
sends a call whole to the node holding that company's shards.

At run time: `runs_citus` tells (once per engine) whether a statement's Citus variant is needed,
and `across_companies` surrounds the few statements that must reach every company's shard
(docs/scaling.md lists them).
"""

from __future__ import annotations

import hashlib
import re
import weakref
from collections.abc import AsyncIterator, Iterable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Final

from sqlalchemy import MetaData, Table, text
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, AsyncSession, create_async_engine

DISTRIBUTION_COLUMN: Final = "company_id"
VERSION_TABLE: Final = "alembic_version"


@dataclass(frozen=True)
class Plan:
    """Which table becomes what, in the order it is done."""

    reference: tuple[str, ...]
    distributed: tuple[str, ...]


@dataclass
class Outcome:
    """What a run did: whether the database runs Citus, and the tables it changed."""

    citus: bool
    referenced: list[str] = field(default_factory=list)
    distributed: list[str] = field(default_factory=list)
    functions: list[str] = field(default_factory=list)


def company_tables(metadata: MetaData) -> tuple[Table, ...]:
    """The tables with a `company_id` column, parents first."""
    return tuple(t for t in metadata.sorted_tables if DISTRIBUTION_COLUMN in t.columns)


def plan(metadata: MetaData) -> Plan:
    companies = company_tables(metadata)
    others = [t.name for t in metadata.sorted_tables if t not in companies]
    return Plan((*others, VERSION_TABLE), tuple(t.name for t in companies))


async def is_citus(conn: AsyncConnection) -> bool:
    """Whether the connected database has the `citus` extension."""
    found = await conn.scalar(text("SELECT true FROM pg_extension WHERE extname = 'citus'"))
    return bool(found)


async def distribute(
    url: str, metadata: MetaData, functions: Iterable[CompanyStatement] | None = None
) -> Outcome:
    """Distribute the company tables and replicate the others on the Citus coordinator at
    `url` (`postgresql+asyncpg://`), then create and distribute the company functions
    (`functions`, by default every statement registered with `on_company_node`) and drop
    those of statements that are no longer; a no-op without the extension."""
    engine = create_async_engine(url, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            outcome = await _distribute(conn, plan(metadata))
            if outcome.citus:
                wanted = _COMPANY_STATEMENTS.values() if functions is None else functions
                tables = plan(metadata).distributed
                outcome.functions = await _create_functions(conn, list(wanted), tables)
            return outcome
    finally:
        await engine.dispose()


async def _distribute(conn: AsyncConnection, todo: Plan) -> Outcome:
    if not await is_citus(conn):
        return Outcome(citus=False)
    if not await conn.scalar(text("SELECT citus_is_coordinator()")):
        raise RuntimeError("distribute runs on the Citus coordinator, not on a worker node")
    rows = await conn.execute(
        text(
            "SELECT logicalrelid::regclass::text, partmethod::text FROM pg_dist_partition"
            " WHERE logicalrelid::regclass::text = ANY(:tables)"
        ),
        {"tables": [*todo.reference, *todo.distributed]},
    )
    done = {name.strip('"'): method for name, method in rows}
    outcome = Outcome(citus=True)
    for name in todo.reference:
        if name not in done:
            await conn.execute(text("SELECT create_reference_table(:t)"), {"t": name})
            outcome.referenced.append(name)
    # the group: the first company table distributed already, else the first one
    anchor = next((name for name in todo.distributed if done.get(name) == "h"), None)
    for name in todo.distributed:
        if name in done:
            continue
        colocate = anchor or "none"
        anchor = anchor or name
        await conn.execute(
            text("SELECT create_distributed_table(:t, :column, colocate_with => :colocate)"),
            {"t": name, "column": DISTRIBUTION_COLUMN, "colocate": colocate},
        )
        outcome.distributed.append(name)
    return outcome


# --- statements Citus runs whole on the company's node ----------------------------------------

FUNCTION_PREFIX: Final = "cms_company_"
COLOCATE_WITH: Final = "turns"
_COMPANY_TYPE: Final = "varchar"  # the type of every `company_id` column
_FUNCTION_FORM: Final = "4"  # part of each function's name: changes when the form below does


@dataclass(frozen=True)
class CompanyStatement:
    """A statement pinned to one company (its `company_id` parameter) that Citus would split
    into steps, coordinator and worker trading rows between them: INSERTs inside CTEs, tables
    outer-joined to `(SELECT 1)`. On a Citus coordinator it runs inside a function of its own
    (`function`: `RETURN QUERY` of the statement, its parameters the function's arguments in
    order, its columns the function's), distributed by its `company_id` argument and
    co-located with the company tables: `call` (`SELECT * FROM function($1, ...)`, the same
    arguments), sent outside a transaction block, goes whole to the node holding the company's
    shards, and the statement runs there, each of its steps on local shards; its advisory locks
    are taken on that node.

    Inside a transaction block Citus delegates a call only with `force_delegation`, and then
    requires every query of the function to compare the distribution column with the very
    constant of the call (`equal()` of the two: type, typmod and collation), which a
    `varchar(128)` column never matches (the column's constant carries its typmod and no
    collation). So only `in_transactions` statements are distributed with `force_delegation`:
    those Citus plans nothing of on the company's node (the locks, which read no table; the
    turn writes, run there on the shards themselves); a caller in a transaction block sends the
    others' plain form. A statement without a `company_id` parameter (a lock) gets one as its
    first argument: the node it runs on."""

    label: str
    sql: str
    names: tuple[str, ...]
    in_transactions: bool = False

    @property
    def function(self) -> str:
        """The function's name: the label and a digest of the statement, so that a changed
        statement is a new function (and `distribute` drops the old one)."""
        form = f"{_FUNCTION_FORM}\x1f{self.in_transactions}\x1f{self.sql}"
        digest = hashlib.sha256(form.encode()).hexdigest()[:12]
        return f"{FUNCTION_PREFIX}{self.label}_{digest}"

    @property
    def arguments(self) -> tuple[str, ...]:
        """The call's arguments by name, in order."""
        if DISTRIBUTION_COLUMN in self.names:
            return self.names
        return (DISTRIBUTION_COLUMN, *self.names)

    @property
    def named_call(self) -> str:
        """`call` with `:name` parameters (a SQLAlchemy `text()`)."""
        return f"SELECT * FROM {self.function}({', '.join(f':{n}' for n in self.arguments)})"  # noqa: S608

    @property
    def call(self) -> tuple[str, tuple[str, ...]]:
        """The call's SQL and its arguments by name, as `app.kit.db.driver_pool.positional`
        gives them."""
        placeholders = ", ".join(f"${n}" for n in range(1, len(self.arguments) + 1))
        return f"SELECT * FROM {self.function}({placeholders})", self.arguments  # noqa: S608


_COMPANY_STATEMENTS: Final[dict[str, CompanyStatement]] = {}

HOLD_COMPANY_SHARDS_SQL: Final = (
    "SELECT lock_shard_metadata(5, ARRAY[get_shard_id_for_distribution_column("
    f"'{COLOCATE_WITH}', CAST(:company_id AS {_COMPANY_TYPE}))]) IS NULL AS held"
)
"""Sent on the coordinator before a lock function is called inside a transaction block: the
company's shard metadata locked shared there until the transaction ends. A shard move switches
a company's writes over under the same lock taken exclusively, on the coordinator first, then
on the workers (Citus's `BlockWritesToShardList`), so it waits for the holder's transaction:
an advisory key held on the old node is never missed by a taker on the new one. Taken on the
coordinator, before the function's locks on the worker, in the order the move takes them: a
holder and a move never wait for each other both ways."""


def on_company_node(
    label: str, statement: tuple[str, tuple[str, ...]], *, in_transactions: bool = False
) -> CompanyStatement:
    """Register `statement` (SQL with `$n` parameters and their names, from `positional`) as a
    company function named after `label` (unique, `[a-z_]`), which `distribute` creates on a
    Citus coordinator; the caller sends `call` there, `statement` elsewhere.
    `in_transactions`: delegated inside transaction blocks too (a statement without tables)."""
    sql, names = statement
    made = CompanyStatement(label, sql, names, in_transactions)
    known = _COMPANY_STATEMENTS.setdefault(label, made)
    if known != made:
        raise ValueError(f"two statements registered as {label!r}")
    return made


def company_statements() -> tuple[CompanyStatement, ...]:
    """Every statement registered with `on_company_node` (the modules that register them are
    imported by `app.models`, so that `distribute` sees them all)."""
    return tuple(_COMPANY_STATEMENTS.values())


_FUNCTIONS_KNOWN = text(
    "SELECT p.proname, p.oid::regprocedure::text AS signature,"
    " d.objid IS NOT NULL AS distributed"
    " FROM pg_proc p LEFT JOIN pg_dist_object d"
    "   ON d.classid = 'pg_proc'::regclass AND d.objid = p.oid"
    " WHERE p.proname LIKE :prefix"
)
_TYPE_NAMES = (
    "SELECT format_type(t, NULL) FROM unnest($1::oid[]) WITH ORDINALITY AS u(t, n) ORDER BY n"
)


async def _create_functions(
    conn: AsyncConnection, statements: list[CompanyStatement], tables: tuple[str, ...]
) -> list[str]:
    """Create and distribute the function of each of `statements` that is not yet, drop the
    company functions no statement names any more; the functions created."""
    rows = (await conn.execute(_FUNCTIONS_KNOWN, {"prefix": f"{FUNCTION_PREFIX}%"})).all()
    known = {name: distributed for name, _, distributed in rows}
    wanted = {statement.function for statement in statements}
    for name, signature, _ in rows:
        if name not in wanted:
            await conn.execute(text(f"DROP FUNCTION IF EXISTS {signature}"))
    created = []
    for statement in statements:
        if known.get(statement.function):
            continue
        await conn.execute(text(await _function_ddl(conn, statement, tables)))
        argument = statement.arguments.index(DISTRIBUTION_COLUMN) + 1
        await conn.execute(
            text(
                "SELECT create_distributed_function(:function, :argument,"
                " colocate_with => :colocate, force_delegation => :force)"
            ),
            {
                "function": await _signature(conn, statement.function),
                "argument": f"${argument}",
                "colocate": COLOCATE_WITH,
                "force": statement.in_transactions,
            },
        )
        created.append(statement.function)
    return created


async def _function_ddl(
    conn: AsyncConnection, statement: CompanyStatement, tables: tuple[str, ...]
) -> str:
    """`CREATE OR REPLACE FUNCTION` of `statement`: its parameters' and columns' types are
    the database's own (the statement described, as the driver prepares it); its body is
    `_shard_body` when the statement reads company tables (`tables`)."""
    raw = (await conn.get_raw_connection()).driver_connection
    if raw is None:
        raise RuntimeError("no driver connection under the distribution's connection")
    described = await raw.prepare(statement.sql)
    parameters = [p.oid for p in described.get_parameters()]
    columns = [(a.name, a.type.oid) for a in described.get_attributes()]
    types = [t for (t,) in await raw.fetch(_TYPE_NAMES, [*parameters, *(c for _, c in columns)])]
    parameter_types, column_types = types[: len(parameters)], types[len(parameters) :]
    if DISTRIBUTION_COLUMN not in statement.names:
        parameter_types.insert(0, _COMPANY_TYPE)
    else:  # the co-location needs the distribution column's type
        parameter_types[statement.names.index(DISTRIBUTION_COLUMN)] = _COMPANY_TYPE
    arguments = ", ".join(f"a{n} {t}" for n, t in enumerate(parameter_types, start=1))
    returns = ", ".join(f'"{name}" {t}' for (name, _), t in zip(columns, column_types, strict=True))
    used = _tables_of(statement.sql, tables)
    if used:
        identities = await raw.fetch(_IDENTITIES, list(used))
        sequences = {table: (column, sequence) for table, column, sequence in identities}
        body = _shard_body(statement, parameter_types, used, sequences)
    else:  # the first argument is the node's company, the statement's own come after it
        body = f"BEGIN\nRETURN QUERY {_shift_parameters(statement.sql)};\nEND"
    # the statement and its described types, never user input
    return (
        f"CREATE OR REPLACE FUNCTION {statement.function}({arguments})"
        f" RETURNS TABLE ({returns}) LANGUAGE plpgsql VOLATILE"
        f" AS $function$\n#variable_conflict use_column\n{body}\n$function$"
    )


_TABLE_REFERENCE = re.compile(r"\b(FROM|JOIN|INTO|UPDATE)(\s+)([a-z_][a-z0-9_]*)\b", re.IGNORECASE)
_IDENTITIES = """
SELECT t.name, a.attname::text, pg_get_serial_sequence(t.name, a.attname)
FROM unnest($1::text[]) AS t(name) JOIN pg_attribute a ON a.attrelid = to_regclass(t.name)
WHERE a.attidentity <> ''
"""


def _tables_of(sql: str, tables: tuple[str, ...]) -> tuple[str, ...]:
    """The company tables `sql` reads or writes, in the order they first appear."""
    found = (m.group(3) for m in _TABLE_REFERENCE.finditer(sql))
    return tuple(dict.fromkeys(name for name in found if name in tables))


def _shard_body(
    statement: CompanyStatement,
    types: list[str],
    used: tuple[str, ...],
    sequences: dict[str, tuple[str, str]],
) -> str:
    """The body of a company function that reads company tables: on the node holding the
    company's shards (where Citus delegates the call), the statement on those shards
    themselves, planned and run by PostgreSQL alone, as on one node. Anywhere else (a shard
    moved away, a call Citus did not delegate), the statement as it is, planned by Citus.

    The company tables are co-located, so one shard of the first table the statement names
    (the anchor) stands for all of them: Citus keeps co-located shards on one node, and its
    shard metadata lock is one lock per co-location group and shard index. Each call looks the
    anchor up (`get_shard_id_for_distribution_column`), locks its metadata shared as Citus's
    executor does for a write (a shard move blocks writes with the same lock taken
    exclusively) and checks that its placement is on this node.

    The statement on the shards is prepared once per session and anchor (`PREPARE`, remembered
    in a session setting `cms_company.<name>`, rolled back with a failed transaction, when
    `pg_prepared_statements` is asked again): only then are the other tables' shards looked up
    and their names put in its text (a shard id is never reused: a tenant isolated or a shard
    split gets new shards, so a new anchor; a moved shard keeps its id and its tables' names,
    which PostgreSQL resolves again when it re-plans). An identity column the statement leaves
    to its default is given its value from the distributed table's sequence (the node's range,
    as Citus gives it). It is executed with the arguments as literals: PostgreSQL then keeps
    its plan as it keeps the plan of a statement the driver prepares on one node (planning the
    text on every call, `/context` on the cluster measured 0.46x one node's requests per
    second; prepared, 0.77x)."""
    company = f"a{statement.arguments.index(DISTRIBUTION_COLUMN) + 1}"
    sql = statement.sql.replace("%", "%%")  # the template of format()
    for table, (column, sequence) in sequences.items():
        sql = re.sub(
            rf"(INSERT INTO {table}\s*\()([^)]*)(\)\s*SELECT\s)",
            rf"\g<1>{column}, \g<2>\g<3>nextval('{sequence}'), ",
            sql,
        )

    def shard(match: re.Match[str]) -> str:
        keyword, space, name = match.groups()
        if name not in used:
            return match.group(0)
        return f"{keyword}{space}%{used.index(name) + 1}$s"

    template = _TABLE_REFERENCE.sub(shard, sql)
    names = ", ".join(
        f"shard_name('{table}'::regclass, get_shard_id_for_distribution_column('{table}', "
        f"{company}))"
        for table in used
    )
    literals = ", ".join(f"quote_nullable(a{n})" for n in range(1, len(statement.arguments) + 1))
    slots = ", ".join("%s" for _ in statement.arguments)
    prefix = "cms_" + hashlib.sha256(statement.function.encode()).hexdigest()[:16] + "_"
    # the statement, its tables and their sequences, never user input
    return f"""DECLARE
    anchor bigint := get_shard_id_for_distribution_column('{used[0]}', {company});
    prepared text := '{prefix}' || anchor;
BEGIN
    PERFORM lock_shard_metadata(5, ARRAY[anchor]);
    IF EXISTS (SELECT FROM pg_dist_placement p
               WHERE p.shardid = anchor
                 AND p.groupid = (SELECT groupid FROM pg_dist_local_group)) THEN
        IF current_setting('cms_company.' || prepared, true) IS NULL THEN
            IF NOT EXISTS (SELECT FROM pg_prepared_statements s WHERE s.name = prepared) THEN
                EXECUTE format('PREPARE %I({", ".join(types)}) AS ', prepared)
                    || format($statement${template}$statement$, {names});
            END IF;
            PERFORM set_config('cms_company.' || prepared, 'on', false);
        END IF;
        RETURN QUERY EXECUTE format('EXECUTE %I({slots})', prepared, {literals});
    ELSE
        RETURN QUERY {statement.sql};
    END IF;
END"""  # noqa: S608


def _shift_parameters(sql: str) -> str:
    """`$n` as `$(n+1)`: the statement's parameters after the company's argument."""
    return re.sub(r"\$(\d+)", lambda m: f"${int(m.group(1)) + 1}", sql)


async def _signature(conn: AsyncConnection, function: str) -> str:
    found = await conn.scalar(
        text("SELECT oid::regprocedure::text FROM pg_proc WHERE proname = :name"),
        {"name": function},
    )
    return str(found)


# --- statements that reach every company -------------------------------------------------------

ACROSS_COMPANIES_SQL: Final = "SET LOCAL citus.multi_task_query_log_level = 'off'"
BACK_TO_ONE_COMPANY_SQL: Final = "SET LOCAL citus.multi_task_query_log_level TO DEFAULT"
_ACROSS_COMPANIES: Final = text(ACROSS_COMPANIES_SQL)
_BACK_TO_ONE_COMPANY: Final = text(BACK_TO_ONE_COMPANY_SQL)


@asynccontextmanager
async def across_companies(conn: AsyncSession | AsyncConnection) -> AsyncIterator[None]:
    """Around the statements of a transaction that must reach every company's shard
    (housekeeping, gauges, an operator's edits found by the actor): on a Citus cluster whose
    sessions turn a multi-shard statement into an error (`citus.multi_task_query_log_level =
    'error'`, as the tests run the service), that level is lowered for them and restored after
    them, both transaction-local (`SET LOCAL`). On plain PostgreSQL nothing is sent (after the
    engine's one question, `runs_citus`). Each caller says why its statements reach every
    company."""
    on_citus = await bound_to_citus(conn)
    if on_citus:
        await conn.execute(_ACROSS_COMPANIES)
    yield
    if on_citus:
        await conn.execute(_BACK_TO_ONE_COMPANY)


async def bound_to_citus(bind: AsyncSession | AsyncConnection | AsyncEngine) -> bool:
    """`runs_citus` for the engine of `bind` (a session, connection or engine)."""
    engine = _engine_of(bind)
    return engine is not None and await runs_citus(engine)


def _engine_of(bind: object) -> AsyncEngine | None:
    if isinstance(bind, AsyncSession):
        bind = bind.bind
    if isinstance(bind, AsyncConnection):
        bind = bind.engine
    return bind if isinstance(bind, AsyncEngine) else None


_CITUS_ENGINES: Final[weakref.WeakKeyDictionary[AsyncEngine, bool]] = weakref.WeakKeyDictionary()


async def runs_citus(engine: AsyncEngine) -> bool:
    """Whether the engine's database has the `citus` extension: asked once per engine (the
    first caller's round trip), then remembered; a statement with a variant for a Citus
    coordinator picks it with this."""
    known = _CITUS_ENGINES.get(engine)
    if known is None:
        async with engine.connect() as conn:
            known = await is_citus(conn)
        _CITUS_ENGINES[engine] = known
        # read by the statements whose SQL differs on Citus when they are compiled (SQLAlchemy
        # caches compiled statements per engine, so per dialect instance)
        setattr(engine.dialect, _DIALECT_MARK, known)
    return known


_DIALECT_MARK: Final = "context_memory_citus"


def compiling_for_citus(dialect: object) -> bool:
    """In a `@compiles` function: whether the statement is compiled for an engine that
    `runs_citus` found on a Citus coordinator."""
    return bool(getattr(dialect, _DIALECT_MARK, False))


def known_citus(bind: object) -> bool:
    """What `runs_citus` found for the engine of `bind` (an engine, connection or session),
    without asking: False when it was never asked for that engine."""
    engine = _engine_of(bind)
    return engine is not None and _CITUS_ENGINES.get(engine, False)
