"""A company setting changed under a row lock and audited: the table it is stored in
(`SettingTable`, the repository), the audit log that records its changes (`AuditLog`), and the
one way to change it (`AuditedSetting.save`). Knows no domain: each setting names its table,
key and value columns, its defaults, and how its values are stored and audited.

Every statement names the company (the distribution column on a Citus cluster) and runs in the
caller's transaction; nothing here commits.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass
from datetime import datetime
from typing import Generic, TypeVar, cast

from sqlalchemy import ColumnElement, RowMapping, Table, bindparam, func, insert, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import DeclarativeBase

from app.kit.errors import RetryableConflict, SettingChanged
from app.kit.principal import Principal

V = TypeVar("V")
JsonObject = Mapping[str, object]


@dataclass(frozen=True)
class Actor:
    """Who changed something: a user of a company. A user id names a person only together with
    its company (an operator of one company changes the settings of others)."""

    company_id: str
    user_id: str

    @classmethod
    def of(cls, principal: Principal) -> Actor:
        """The caller, as the verified token names them."""
        return cls(principal.company_id, principal.user_id)


def changed_fields(old: JsonObject, new: JsonObject) -> tuple[dict[str, object], dict[str, object]]:
    """The (old, new) values of the keys whose value differs, recursing into nested objects.

    `changed_fields({"a": 1, "b": {"c": 2, "d": 3}}, {"a": 1, "b": {"c": 2, "d": 4}})` is
    `({"b": {"d": 3}}, {"b": {"d": 4}})`; both are empty when nothing changed.
    """
    before: dict[str, object] = {}
    after: dict[str, object] = {}
    for key in old.keys() | new.keys():
        old_value, new_value = old.get(key), new.get(key)
        if isinstance(old_value, Mapping) and isinstance(new_value, Mapping):
            nested_old, nested_new = changed_fields(old_value, new_value)
            if nested_old or nested_new:
                before[key], after[key] = nested_old, nested_new
        elif old_value != new_value:
            before[key], after[key] = old_value, new_value
    return before, after


def _table(source: Table | type[DeclarativeBase]) -> Table:
    if isinstance(source, Table):
        return source
    return cast(Table, source.__table__)


# --- the audit log ------------------------------------------------------------------------------


@dataclass(frozen=True)
class AuditEntry:
    """One event to record: who did what to which target, and the changed fields' values."""

    actor: Actor
    action: str
    target_kind: str
    target_id: str
    old: JsonObject | None
    new: JsonObject | None


class AuditLog:
    """An append-only table of events, one row per event, in the log of the company changed:
    columns `company_id`, `actor_company_id`, `actor_id`, `action`, `target_kind`,
    `target_id`, `old` and `new` (JSON objects), an id and the time filled in by the table."""

    def __init__(self, table: Table | type[DeclarativeBase]) -> None:
        self.table = _table(table)

    async def record(self, session: AsyncSession, company_id: str, entry: AuditEntry) -> None:
        """Append an event; it commits or rolls back with the change it describes."""
        await session.execute(
            insert(self.table).values(
                company_id=company_id,
                actor_company_id=entry.actor.company_id,
                actor_id=entry.actor.user_id,
                action=entry.action,
                target_kind=entry.target_kind,
                target_id=entry.target_id,
                old=None if entry.old is None else dict(entry.old),
                new=None if entry.new is None else dict(entry.new),
            )
        )

    async def anonymise_actor(
        self, session: AsyncSession, actor: Actor, marker: str, *, sparing: str
    ) -> int:
        """Erasure: name `marker` instead of `actor`'s user in the events they caused, in any
        company's log, except those whose action is `sparing`; returns how many events. The
        actor's company stays: it names no person."""
        c = self.table.c
        result = await session.execute(
            update(self.table)
            .where(
                c.actor_company_id == actor.company_id,
                c.actor_id == actor.user_id,
                c.action != sparing,
            )
            .values(actor_id=marker)
            .returning(c.id)
        )
        return len(result.all())


# --- the table of a setting ---------------------------------------------------------------------


@dataclass(frozen=True)
class Stored(Generic[V]):
    """A saved setting's value, when it was saved, and by whom (None where its table names no
    editor: then only the audit log does)."""

    value: V
    updated_at: datetime
    updated_by_company_id: str | None
    updated_by: str | None


EDITOR_COLUMNS = ("updated_by_company_id", "updated_by")


class SettingTable(Generic[V]):
    """Where a setting is stored: one row per (`company_id`, *`key`), its value in `columns`
    (`to_row` gives them, `of_row` reads them back, with `updated_at` and the editor columns
    beside), `updated_at` set by the database, and its last editor as the two `editor` columns
    (company, user), or none. A company (or key) with no row is at the setting's defaults.
    """

    def __init__(  # noqa: PLR0913 - a table's description, given once per setting
        self,
        table: Table | type[DeclarativeBase],
        *,
        key: tuple[str, ...] = (),
        columns: tuple[str, ...],
        to_row: Callable[[V], Mapping[str, object]],
        of_row: Callable[[RowMapping], V],
        editor: tuple[str, str] | None = EDITOR_COLUMNS,
    ) -> None:
        self.table = _table(table)
        self.key = ("company_id", *key)
        self.editor = editor
        self.to_row = to_row
        self.of_row = of_row
        c = self.table.c
        read = (*columns, "updated_at", *(editor or ()))
        # built once: the memory policy's read runs before every write of a profile
        self._select = select(*(c[name] for name in read)).where(*self._key_bound())
        self._select_for_update = self._select.with_for_update()

    def _key_bound(self) -> tuple[ColumnElement[bool], ...]:
        return tuple(self.table.c[name] == bindparam(name) for name in self.key)

    def _key_of(self, company_id: str, key: tuple[str, ...]) -> dict[str, str]:
        if len(key) != len(self.key) - 1:
            raise TypeError(f"{self.table.name} is keyed by {self.key}, not {(company_id, *key)}")
        return dict(zip(self.key, (company_id, *key), strict=True))

    def _stored(self, row: RowMapping) -> Stored[V]:
        by_company, by = (None, None) if self.editor is None else self.editor
        return Stored(
            self.of_row(row),
            row["updated_at"],
            None if by_company is None else row[by_company],
            None if by is None else row[by],
        )

    async def select(
        self, session: AsyncSession, company_id: str, *key: str, for_update: bool = False
    ) -> Stored[V] | None:
        """The saved setting, or None when it was never saved; `for_update` row-locks it until
        the transaction ends."""
        statement = self._select_for_update if for_update else self._select
        row = (await session.execute(statement, self._key_of(company_id, key))).first()
        return None if row is None else self._stored(row._mapping)

    def _written(self, value: V, editor: Actor) -> dict[str, object]:
        values = dict(self.to_row(value))
        if self.editor is not None:
            by_company, by = self.editor
            values |= {by_company: editor.company_id, by: editor.user_id}
        return values

    async def insert(
        self, session: AsyncSession, company_id: str, key: tuple[str, ...], value: V, editor: Actor
    ) -> datetime | None:
        """Save the setting for the first time; None when a concurrent transaction saved it
        first (the insert waits for that one to end, and writes nothing)."""
        statement = (
            pg_insert(self.table)
            .values(
                **self._key_of(company_id, key),
                **self._written(value, editor),
                updated_at=func.now(),
            )
            .on_conflict_do_nothing(index_elements=[self.table.c[name] for name in self.key])
            .returning(self.table.c.updated_at)
        )
        updated_at: datetime | None = (await session.execute(statement)).scalar_one_or_none()
        return updated_at

    async def update(
        self, session: AsyncSession, company_id: str, key: tuple[str, ...], value: V, editor: Actor
    ) -> datetime:
        """Overwrite the saved setting (the caller holds its row lock)."""
        c = self.table.c
        statement = (
            update(self.table)
            .where(*(c[name] == bound for name, bound in self._key_of(company_id, key).items()))
            .values(**self._written(value, editor), updated_at=func.now())
            .returning(c.updated_at)
        )
        updated_at: datetime = (await session.execute(statement)).scalar_one()
        return updated_at

    async def anonymise_editor(self, session: AsyncSession, editor: Actor, marker: str) -> int:
        """Erasure: the rows `editor` changed last (both ids matching, in any company: operators
        change other companies' settings) keep their values but name `marker` as their editor;
        returns how many rows. Nothing to do where the table names no editor."""
        if self.editor is None:
            return 0
        by_company, by = (self.table.c[name] for name in self.editor)
        result = await session.execute(
            update(self.table)
            .where(by_company == editor.company_id, by == editor.user_id)
            .values({by: marker})
            .returning(self.table.c.company_id)
        )
        return len(result.all())


# --- the one way to change a setting ------------------------------------------------------------


@dataclass(frozen=True)
class Saved(Generic[V]):
    """What a save left in force: `stored` None for a setting never saved (at its defaults)
    that the save did not change; `changed` whether it wrote (and recorded) anything."""

    stored: Stored[V] | None
    changed: bool


@dataclass(frozen=True)
class AuditedSetting(Generic[V]):
    """A setting of `table`, recorded in `log` as `action` on a target of `target_kind` (its
    id: the last value of the table's key, the company itself when the company is the key),
    with the changed fields of `audited(value)` old -> new. A setting never saved is
    `default`; `lost_race` is the conflict a save can end in (see `save`).
    """

    table: SettingTable[V]
    log: AuditLog
    _: KW_ONLY
    action: str
    target_kind: str
    default: V
    audited: Callable[[V], JsonObject]
    lost_race: Callable[[], RetryableConflict] = SettingChanged

    async def save(
        self,
        session: AsyncSession,
        editor: Actor,
        company_id: str,
        *key: str,
        change: Callable[[V], V],
    ) -> Saved[V]:
        """Change the setting to `change(value in force)`, under its row lock: the saved value
        (the default when never saved) is read FOR UPDATE, so concurrent saves of one setting
        run one after the other and each applies `change` to what the previous one left (no
        lost update). A result whose audited fields equal those in force writes nothing and
        records nothing; else the row is written, naming `editor`, and one event records the
        changed fields old -> new. `change` may raise to refuse: nothing is written then.

        The first save of a setting inserts its row; one that loses that race to a concurrent
        first save waits for it, then reads the winner's row and starts again. Two rounds at
        most: a row that disappears again meanwhile ends in `lost_race()`.
        """
        for _ in range(2):
            stored = await self.table.select(session, company_id, *key, for_update=True)
            before = self.default if stored is None else stored.value
            after = change(before)
            old, new = changed_fields(self.audited(before), self.audited(after))
            if not new:
                return Saved(stored, changed=False)
            if stored is None:
                updated_at = await self.table.insert(session, company_id, key, after, editor)
                if updated_at is None:
                    continue
            else:
                updated_at = await self.table.update(session, company_id, key, after, editor)
            target = key[-1] if key else company_id
            entry = AuditEntry(editor, self.action, self.target_kind, target, old, new)
            await self.log.record(session, company_id, entry)
            has_editor = self.table.editor is not None
            return Saved(
                Stored(
                    after,
                    updated_at,
                    editor.company_id if has_editor else None,
                    editor.user_id if has_editor else None,
                ),
                changed=True,
            )
        raise self.lost_race()
