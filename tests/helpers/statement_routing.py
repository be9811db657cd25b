"""Can a SQL statement be routed to one company's shard? Parsed with PostgreSQL's own parser
(`pglast`, libpg_query), not with patterns.

A table is *company-owned* when it has a `company_id` column; on a cluster distributed by
company each such table is split by that column. A statement can go to one shard when every
company-owned table it touches is pinned to one company:

- a table read, updated or deleted from (in the main query, a CTE, a subquery, a join, a LATERAL
  subquery) is pinned by an equality on its `company_id`, among the conditions every row
  returned satisfies (the WHERE's top-level AND terms, the ON of an inner join, the ON of an
  outer join for its nullable side), with a parameter or constant (`t.company_id = $1`, also
  in a row comparison or a one-element IN), or with the `company_id` of a table already pinned,
  in this query or an enclosing one (a join, a correlated subquery);
- a CTE or subquery pins the `company_id` it returns when everything in it is pinned and it
  read or wrote a company-owned table (a VALUES list of parameters pins nothing: its rows may
  belong to several companies);
- an INSERT pins its row by a `company_id` value that is a parameter or constant, or, for
  INSERT ... SELECT, the `company_id` of a pinned table of that SELECT.

`company_id = ANY($1)` selects several companies: not routable to one shard, and said so.
Statements touching no company-owned table (BEGIN, SET, advisory locks, catalog queries) pass.
A company-owned table in a statement shape this module does not analyse (TRUNCATE, COPY,
MERGE, ...) is reported, never passed silently.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from pglast import ast, parse_sql
from pglast.enums import A_Expr_Kind, BoolExprType, JoinType, SetOperation

COMPANY_COLUMN = "company_id"


@dataclass(frozen=True)
class Finding:
    """A company-owned table of a statement that is not pinned to one company, and why."""

    table: str
    reason: str


@dataclass
class _Source:
    """A FROM item of one query level: a table, or a CTE / subquery (`derived`)."""

    name: str
    company: bool  # a company-owned table: must be pinned
    derived: bool = False
    pins_company: bool = False  # derived: its `company_id` column is one company's
    pinned: bool = False
    any_filter: bool = False  # filtered by `company_id = ANY(...)`


@dataclass
class _Scope:
    parent: _Scope | None
    ctes: dict[str, bool] = field(default_factory=dict)  # visible CTE -> pins its company
    sources: dict[str, _Source] = field(default_factory=dict)  # by alias (or name)

    def cte(self, name: str) -> bool | None:
        scope: _Scope | None = self
        while scope is not None:
            if name in scope.ctes:
                return scope.ctes[name]
            scope = scope.parent
        return None


@dataclass(frozen=True)
class _Equality:
    """`left = right` among the conditions of a query level; `only` limits which sources it may
    pin (the nullable side of an outer join), None for all."""

    left: ast.Node | None
    right: ast.Node | None
    only: frozenset[str] | None


def unrouted(sql: str, company_tables: frozenset[str]) -> list[Finding]:
    """The company-owned tables of `sql` not pinned to one company, each reason once (empty
    when routable)."""
    findings: list[Finding] = []
    for raw in parse_sql(sql):
        analysis = _Analysis(company_tables)
        analysis.statement(raw.stmt, _Scope(None))
        findings.extend(analysis.findings)
        for node in _walk(raw.stmt):
            if (
                isinstance(node, ast.RangeVar)
                and node.relname in company_tables
                and id(node) not in analysis.judged
            ):
                findings.append(
                    Finding(node.relname, f"in a {type(raw.stmt).__name__}, not analysed")
                )
    return list(dict.fromkeys(findings))


class _Analysis:
    def __init__(self, company_tables: frozenset[str]) -> None:
        self.company_tables = company_tables
        self.findings: list[Finding] = []
        self.judged: set[int] = set()  # RangeVar nodes accounted for

    # --- statements -------------------------------------------------------------------------

    def statement(self, node: ast.Node | None, parent: _Scope) -> tuple[bool, bool]:
        """Analyse one statement; (everything pinned, touched a company-owned table)."""
        before = len(self.findings)
        touched = False
        if isinstance(node, ast.SelectStmt):
            touched = self.select(node, parent)[1]
        elif isinstance(node, ast.InsertStmt):
            touched = self.insert(node, parent)
        elif isinstance(node, ast.UpdateStmt | ast.DeleteStmt):
            touched = self.update_or_delete(node, parent)
        elif isinstance(node, ast.ExplainStmt):  # EXPLAIN ANALYZE runs the statement
            touched = self.statement(node.query, parent)[1]
        return len(self.findings) == before, touched

    def with_clause(self, clause: ast.WithClause | None, scope: _Scope) -> None:
        for cte in (clause.ctes or ()) if clause is not None else ():
            assert isinstance(cte, ast.CommonTableExpr)
            name = _text(cte.ctename)
            if clause is not None and clause.recursive:
                scope.ctes[name] = True  # its anchor pins it, or its terms are reported
            pinned, touched = self.statement(cte.ctequery, scope)
            scope.ctes[name] = pinned and touched

    def select(self, node: ast.SelectStmt, parent: _Scope) -> tuple[_Scope, bool]:
        """Analyse a SELECT; (its scope, touched a company-owned table)."""
        scope = _Scope(parent)
        self.with_clause(node.withClause, scope)
        if node.op != SetOperation.SETOP_NONE:
            left = self.statement(node.larg, scope)
            right = self.statement(node.rarg, scope)
            return scope, left[1] or right[1]
        self.lock_targets(node.lockingClause)
        equalities: list[_Equality] = []
        laterals: list[tuple[ast.RangeSubselect, _Source]] = []
        for item in node.fromClause or ():
            self.from_item(item, scope, equalities, laterals)
        equalities.extend(_equalities(node.whereClause, None))
        touched = self.settle(scope, equalities, laterals)
        self.expressions(
            (
                node.fromClause,
                node.valuesLists,
                node.targetList,
                node.whereClause,
                node.groupClause,
                node.havingClause,
                node.sortClause,
                node.limitCount,
                node.limitOffset,
            ),
            scope,
        )
        self.judge(scope)
        return scope, touched

    def update_or_delete(self, node: ast.UpdateStmt | ast.DeleteStmt, parent: _Scope) -> bool:
        scope = _Scope(parent)
        self.with_clause(node.withClause, scope)
        equalities: list[_Equality] = []
        laterals: list[tuple[ast.RangeSubselect, _Source]] = []
        self.from_item(node.relation, scope, equalities, laterals)
        extra = node.fromClause if isinstance(node, ast.UpdateStmt) else node.usingClause
        for item in extra or ():
            self.from_item(item, scope, equalities, laterals)
        equalities.extend(_equalities(node.whereClause, None))
        touched = self.settle(scope, equalities, laterals)
        targets = node.targetList if isinstance(node, ast.UpdateStmt) else None
        self.expressions((extra, targets, node.whereClause, node.returningClause), scope)
        self.judge(scope)
        return touched

    def insert(self, node: ast.InsertStmt, parent: _Scope) -> bool:
        scope = _Scope(parent)
        self.with_clause(node.withClause, scope)
        relation = node.relation
        assert relation is not None
        table = _text(relation.relname)
        self.judged.add(id(relation))
        columns = [target.name for target in node.cols or ()]
        source = node.selectStmt
        company = table in self.company_tables
        reason = self.insert_reason(source, columns, scope) if company else None
        if reason is not None:
            self.findings.append(Finding(table, reason))
        alias = _text(relation.alias.aliasname) if relation.alias else table
        scope.sources[alias] = _Source(table, company, pinned=reason is None)
        scope.sources["excluded"] = _Source(table, company=False, derived=True)
        if node.onConflictClause is not None:
            self.expressions(node.onConflictClause, scope)
        self.expressions(node.returningClause, scope)
        return company or (source is not None and self.statement_touches(source))

    def insert_reason(
        self, source: ast.Node | None, columns: list[str], parent: _Scope
    ) -> str | None:
        """Why the inserted rows are not pinned to one company, or None when they are."""
        if COMPANY_COLUMN not in columns:
            return "INSERT without an explicit company_id column"
        position = columns.index(COMPANY_COLUMN)
        if not isinstance(source, ast.SelectStmt):
            return "INSERT without VALUES or SELECT"
        if source.valuesLists:
            for row in source.valuesLists:
                self.expressions(row, parent)
            if all(_is_value(row[position]) for row in source.valuesLists):
                return None
            return "INSERT whose company_id is not a parameter"
        before = len(self.findings)
        scope = self.select(source, parent)[0]
        if len(self.findings) > before:
            return "INSERT ... SELECT from a source not pinned to one company"
        if source.op != SetOperation.SETOP_NONE or not source.targetList:
            return "INSERT ... SELECT of a set operation"
        value = source.targetList[position].val
        assert isinstance(value, ast.Node)
        if _is_value(value) or _pinned_column(value, scope):
            return None
        return "INSERT ... SELECT whose company_id is not a pinned table's"

    def statement_touches(self, node: ast.Node) -> bool:
        return any(
            isinstance(child, ast.RangeVar) and child.relname in self.company_tables
            for child in _walk(node)
        )

    # --- FROM items and pinning -------------------------------------------------------------

    def from_item(
        self,
        item: ast.Node | None,
        scope: _Scope,
        equalities: list[_Equality],
        laterals: list[tuple[ast.RangeSubselect, _Source]],
    ) -> frozenset[str]:
        """Register a FROM item's sources in `scope`; the aliases it brings."""
        if isinstance(item, ast.RangeVar):
            name = _text(item.relname)
            alias = _text(item.alias.aliasname) if item.alias else name
            self.judged.add(id(item))
            cte = scope.cte(name) if item.schemaname is None else None
            if cte is not None:
                scope.sources[alias] = _Source(name, False, derived=True, pins_company=cte)
            else:
                scope.sources[alias] = _Source(name, name in self.company_tables)
            return frozenset({alias})
        if isinstance(item, ast.RangeSubselect):
            alias = _text(item.alias.aliasname) if item.alias else "?"
            source = _Source(alias, company=False, derived=True)
            scope.sources[alias] = source
            laterals.append((item, source))
            return frozenset({alias})
        if isinstance(item, ast.JoinExpr):
            left = self.from_item(item.larg, scope, equalities, laterals)
            right = self.from_item(item.rarg, scope, equalities, laterals)
            sides: dict[JoinType | None, frozenset[str] | None] = {
                JoinType.JOIN_INNER: None,
                JoinType.JOIN_LEFT: right,
                JoinType.JOIN_RIGHT: left,
            }
            only = sides.get(item.jointype, frozenset())
            equalities.extend(_equalities(item.quals, only))
            if item.usingClause and any(n.sval == COMPANY_COLUMN for n in item.usingClause):
                equalities.extend(
                    _Equality(_column(one), _column(other), only) for one in left for other in right
                )
            return left | right
        return frozenset()

    def settle(
        self,
        scope: _Scope,
        equalities: list[_Equality],
        laterals: list[tuple[ast.RangeSubselect, _Source]],
    ) -> bool:
        """Pin what the equalities pin, subqueries in FROM included (LATERAL ones see the
        sources pinned before them); True when a company-owned table was touched."""
        touched = any(source.company for source in scope.sources.values())
        _pin(scope, equalities)
        for item, source in laterals:
            outside = scope if item.lateral else _Scope(scope.parent, ctes=scope.ctes)
            pinned, inner_touched = self.statement(item.subquery, outside)
            source.pins_company = pinned and inner_touched
            touched = touched or inner_touched
            _pin(scope, equalities)
        return touched

    def judge(self, scope: _Scope) -> None:
        for source in scope.sources.values():
            if source.company and not source.pinned:
                reason = (
                    "filtered by company_id = ANY(...): several companies, several shards"
                    if source.any_filter
                    else "no company_id equality with a parameter or a pinned table"
                )
                self.findings.append(Finding(source.name, reason))

    def lock_targets(self, clauses: Sequence[ast.Node] | None) -> None:
        """`FOR UPDATE OF t` names a source of the query, not another table."""
        for clause in clauses or ():
            assert isinstance(clause, ast.LockingClause)
            for rel in clause.lockedRels or ():
                self.judged.add(id(rel))

    def expressions(self, node: object, scope: _Scope) -> None:
        """Analyse the subqueries inside expressions (correlated ones see `scope`), once `scope`
        is settled; subqueries in FROM are `settle`'s."""
        for child in _walk(node, stop_at_subqueries=True):
            if isinstance(child, ast.SubLink):
                self.statement(child.subselect, scope)


def _pin(scope: _Scope, equalities: list[_Equality]) -> None:
    """Pin sources until nothing changes: an equality of a source's company_id with a value or
    with a pinned company_id pins it."""
    changed = True
    while changed:
        changed = False
        for equality in equalities:
            for this, other in ((equality.left, equality.right), (equality.right, equality.left)):
                source = _company_column_of(this, scope)
                if source is None or source.pinned:
                    continue
                if equality.only is not None and not _among(source, scope, equality.only):
                    continue
                if other is _ANY:
                    source.any_filter = True
                elif _is_value(other) or _pinned_column(other, scope):
                    source.pinned = changed = True


def _among(source: _Source, scope: _Scope, aliases: frozenset[str]) -> bool:
    return any(scope.sources.get(alias) is source for alias in aliases)


def _equalities(condition: ast.Node | None, only: frozenset[str] | None) -> list[_Equality]:
    """The equalities among the top-level AND terms of a condition (row comparisons split,
    one-element IN lists included); `company_id = ANY(...)` is kept as a marker."""
    found: list[_Equality] = []
    for term in _conjuncts(condition):
        if not isinstance(term, ast.A_Expr) or _operator(term) != "=":
            continue
        if term.kind == A_Expr_Kind.AEXPR_OP:
            left, right = term.lexpr, term.rexpr
            if isinstance(left, ast.RowExpr) and isinstance(right, ast.RowExpr):
                pairs = zip(left.args or (), right.args or (), strict=False)
                found.extend(_Equality(a, b, only) for a, b in pairs)
            elif not isinstance(right, tuple):
                found.append(_Equality(left, right, only))
        elif (
            term.kind == A_Expr_Kind.AEXPR_IN
            and isinstance(term.rexpr, tuple)
            and len(term.rexpr) == 1
        ):
            found.append(_Equality(term.lexpr, term.rexpr[0], only))
        elif term.kind == A_Expr_Kind.AEXPR_OP_ANY:
            found.append(_Equality(term.lexpr, _ANY, only))
    return found


_ANY = ast.A_Const(isnull=True)  # stands for `ANY(...)`: pins nothing, marks the source


def _conjuncts(condition: ast.Node | None) -> Iterator[ast.Node]:
    if condition is None:
        return
    if isinstance(condition, ast.BoolExpr) and condition.boolop == BoolExprType.AND_EXPR:
        for arg in condition.args or ():
            yield from _conjuncts(arg)
    else:
        yield condition


def _operator(expr: ast.A_Expr) -> str | None:
    name = expr.name or ()
    return name[-1].sval if name and isinstance(name[-1], ast.String) else None


def _is_value(node: ast.Node | None) -> bool:
    """A parameter or a non-null constant (through casts): one company."""
    while isinstance(node, ast.TypeCast):
        node = node.arg
    return isinstance(node, ast.ParamRef) or (isinstance(node, ast.A_Const) and not node.isnull)


def _text(value: str | None) -> str:
    """A name of the parse tree (never missing where this module reads one)."""
    return value or ""


def _column(alias: str) -> ast.ColumnRef:
    return ast.ColumnRef(fields=(ast.String(sval=alias), ast.String(sval=COMPANY_COLUMN)))


def _resolve(ref: ast.Node | None, scope: _Scope) -> _Source | None:
    """The source a `company_id` column reference belongs to, looked up outwards."""
    while isinstance(ref, ast.TypeCast):
        ref = ref.arg
    if not isinstance(ref, ast.ColumnRef):
        return None
    names = [_text(part.sval) for part in ref.fields or () if isinstance(part, ast.String)]
    if not names or names[-1] != COMPANY_COLUMN:
        return None
    current: _Scope | None = scope
    while current is not None:
        if len(names) >= 2:
            found = current.sources.get(names[-2])
            if found is not None:
                return found
        else:
            candidates = [s for s in current.sources.values() if s.company or s.derived]
            if len(candidates) > 1:
                candidates = [s for s in candidates if s.company]
            if len(candidates) == 1:
                return candidates[0]
            if candidates:
                return None
        current = current.parent
    return None


def _company_column_of(ref: ast.Node | None, scope: _Scope) -> _Source | None:
    source = _resolve(ref, scope)
    return source if source is not None and source.company else None


def _pinned_column(ref: ast.Node | None, scope: _Scope) -> bool:
    """A `company_id` of a pinned table, or of a CTE / subquery that pins its company."""
    source = _resolve(ref, scope)
    if source is None:
        return False
    return source.pinned if source.company else source.pins_company


def _walk(node: object, *, stop_at_subqueries: bool = False) -> Iterator[ast.Node]:
    """Every AST node under `node` (itself included); with `stop_at_subqueries`, not the
    insides of subqueries (SubLink, RangeSubselect)."""
    if isinstance(node, tuple | list):
        for item in node:
            yield from _walk(item, stop_at_subqueries=stop_at_subqueries)
        return
    if not isinstance(node, ast.Node):
        return
    yield node
    if stop_at_subqueries and isinstance(node, ast.SubLink | ast.RangeSubselect):
        return
    for name in getattr(type(node), "__slots__", ()):
        yield from _walk(getattr(node, name, None), stop_at_subqueries=stop_at_subqueries)
