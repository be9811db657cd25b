"""The company export format, version 1: NDJSON, one JSON object per line, each with a `type`.

Line 1 is the header (format, version, company, the snapshot's time); then the records, grouped
by type in a fixed order (a record only refers to records of earlier types); the last line is
the trailer, the count of every type, so a stream cut short is told from a complete one.

Pure: bytes and values in, values out. Which record types exist, and their fields, come from
the tables (`kinds.py`); this module knows field types, not tables.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterable, AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Final

import orjson

FORMAT: Final = "context-memory.company-export"
FORMAT_VERSION: Final = 1
MEDIA_TYPE: Final = "application/x-ndjson"
HEADER: Final = "header"
TRAILER: Final = "end"
MAX_LINE_BYTES: Final = 16 * 1024 * 1024
"""The longest line an import reads (a record's text came from requests of at most
MAX_BODY_BYTES; JSON escaping may grow it several times)."""


class StreamError(ValueError):
    """A line of an import stream that cannot be loaded: its number (from 1), the field at
    fault (or None for the whole line) and why."""

    def __init__(self, line: int, message: str, field: str | None = None) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line
        self.field = field
        self.message = message


# --- fields -------------------------------------------------------------------------------------


class FieldType(StrEnum):
    TEXT = "text"
    INTEGER = "integer"
    BOOLEAN = "boolean"
    TIMESTAMP = "timestamp"
    UUID = "uuid"
    JSON = "json"


@dataclass(frozen=True)
class FieldSpec:
    """One field of a record: its JSON form and what a stored value may be.

    `required`: the stream must carry it (a column without a default); `nullable`: it may be
    null. TEXT is a string without NUL characters of at most `max_length` characters, INTEGER
    a whole number of `integer_bits`, TIMESTAMP an RFC 3339 string with an offset, UUID the
    usual hex form, JSON any JSON value.
    """

    name: str
    type: FieldType
    nullable: bool = False
    required: bool = True
    max_length: int | None = None
    integer_bits: int = 32

    def read(self, value: object) -> object:
        """The stored value of `value`, or `ValueError` saying what it should be."""
        if value is None:
            if not self.nullable:
                raise ValueError("must not be null")
            return None
        match self.type:
            case FieldType.TEXT:
                return self._text(value)
            case FieldType.INTEGER:
                if not isinstance(value, int) or isinstance(value, bool):
                    raise ValueError("must be an integer")
                if not -(2 ** (self.integer_bits - 1)) <= value < 2 ** (self.integer_bits - 1):
                    raise ValueError(f"must fit in {self.integer_bits} bits")
                return value
            case FieldType.BOOLEAN:
                if not isinstance(value, bool):
                    raise ValueError("must be true or false")
                return value
            case FieldType.TIMESTAMP:
                return _timestamp(value)
            case FieldType.UUID:
                if not isinstance(value, str):
                    raise ValueError("must be a UUID string")
                return uuid.UUID(value)
            case FieldType.JSON:
                return value

    def _text(self, value: object) -> str:
        if not isinstance(value, str):
            raise ValueError("must be a string")
        if "\x00" in value:
            raise ValueError("must not contain NUL characters")
        if self.max_length is not None and len(value) > self.max_length:
            raise ValueError(f"must be at most {self.max_length} characters")
        return value


def _timestamp(value: object) -> datetime:
    if not isinstance(value, str):
        raise ValueError("must be an RFC 3339 timestamp string")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("must be an RFC 3339 timestamp string") from None
    if moment.utcoffset() is None:
        raise ValueError("must name its UTC offset")
    return moment


@dataclass(frozen=True)
class RecordType:
    """A kind of record: its `type` name and its fields (every one is written on export)."""

    name: str
    fields: tuple[FieldSpec, ...]

    def read(self, line: int, data: Mapping[str, object]) -> dict[str, object]:
        """The record's stored values by field name; `StreamError` naming the first bad field."""
        known = {spec.name: spec for spec in self.fields}
        for name in data:
            if name != "type" and name not in known:
                raise StreamError(line, f"{name!r} is not a field of a {self.name} record", name)
        values: dict[str, object] = {}
        for spec in self.fields:
            if spec.name not in data:
                if spec.required:
                    raise StreamError(line, f"a {self.name} record needs {spec.name!r}", spec.name)
                continue
            try:
                values[spec.name] = spec.read(data[spec.name])
            except ValueError as exc:
                raise StreamError(line, f"{spec.name} {exc}", spec.name) from None
        return values


# --- writing ------------------------------------------------------------------------------------


def header_line(company_id: str, exported_at: datetime, types: Sequence[RecordType]) -> bytes:
    return encode(
        {
            "type": HEADER,
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "company_id": company_id,
            "exported_at": exported_at,
            "record_types": [record_type.name for record_type in types],
        }
    )


def record_line(record_type: RecordType, values: Mapping[str, object]) -> bytes:
    return encode({"type": record_type.name, **values})


def trailer_line(counts: Mapping[str, int]) -> bytes:
    return encode({"type": TRAILER, "counts": dict(counts)})


def encode(record: Mapping[str, object]) -> bytes:
    """One line: compact JSON (timestamps in RFC 3339, UUIDs as strings) and a newline."""
    return orjson.dumps(record, default=_uuid_text, option=orjson.OPT_APPEND_NEWLINE)


def _uuid_text(value: object) -> str:
    """UUIDs of types orjson does not know (the driver's own subclass)."""
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not exported")


# --- reading ------------------------------------------------------------------------------------


async def numbered_lines(
    chunks: AsyncIterable[bytes], max_line_bytes: int = MAX_LINE_BYTES
) -> AsyncIterator[tuple[int, bytes]]:
    """The lines of a body arriving in chunks, numbered from 1, without their newline; at most
    one line (of at most `max_line_bytes`) is held. A last line without a newline counts."""
    pending = bytearray()
    number = 0
    async for chunk in chunks:
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            number += 1
            if len(pending) + end - start > max_line_bytes:
                raise StreamError(number, f"is longer than {max_line_bytes} bytes")
            if pending:
                pending += chunk[start:end]
                line = bytes(pending)
                pending.clear()
            else:
                line = chunk[start:end]
            yield number, line
            start = end + 1
        pending += chunk[start:]
        if len(pending) > max_line_bytes:
            raise StreamError(number + 1, f"is longer than {max_line_bytes} bytes")
    if pending:
        yield number + 1, bytes(pending)


def read_object(line: int, raw: bytes) -> dict[str, object]:
    """A line as a JSON object with a string `type`."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise StreamError(line, "is not JSON (one JSON object per line)") from None
    if not isinstance(value, dict):
        raise StreamError(line, "is not a JSON object")
    if not isinstance(value.get("type"), str):
        raise StreamError(line, "has no string `type`", "type")
    return value


@dataclass
class StreamReader:
    """The structure of a stream, checked line by line as it arrives: the header first (this
    format and version, the expected company), then records grouped by type in the order of
    `types`, then the trailer, whose counts must equal the records read, and nothing after it.
    """

    company_id: str
    types: Sequence[RecordType]
    counts: dict[str, int] = field(default_factory=dict, init=False)
    _position: int = field(default=-1, init=False)
    _header_seen: bool = field(default=False, init=False)
    _trailer_line: int | None = field(default=None, init=False)

    def accept(
        self, line: int, data: Mapping[str, object]
    ) -> tuple[RecordType, dict[str, object]] | None:
        """A record with its values, or None for the header and the trailer."""
        kind = data.get("type")
        if self._trailer_line is not None:
            raise StreamError(line, f"follows the trailer (line {self._trailer_line})")
        if not self._header_seen:
            if kind != HEADER:
                raise StreamError(line, "must be the header (`type` header)", "type")
            self._read_header(line, data)
            self._header_seen = True
            return None
        if kind == TRAILER:
            self._read_trailer(line, data)
            self._trailer_line = line
            return None
        if kind == HEADER:
            raise StreamError(line, "is a second header", "type")
        names = [record_type.name for record_type in self.types]
        if kind not in names:
            raise StreamError(line, f"type {kind!r} is not one of {names}", "type")
        position = names.index(str(kind))
        if position < self._position:
            raise StreamError(
                line,
                f"a {kind} record after {names[self._position]} records; records come grouped "
                f"in this order: {', '.join(names)}",
                "type",
            )
        self._position = position
        record_type = self.types[position]
        values = record_type.read(line, data)
        self.counts[record_type.name] = self.counts.get(record_type.name, 0) + 1
        return record_type, values

    def finish(self, last_line: int) -> None:
        """The stream ended after `last_line`: it must have had its trailer."""
        if not self._header_seen:
            raise StreamError(1, "the stream is empty; it must start with its header")
        if self._trailer_line is None:
            raise StreamError(
                last_line + 1, "the stream ends without its trailer (`type` end): cut short?"
            )

    def _read_header(self, line: int, data: Mapping[str, object]) -> None:
        expected = {"type", "format", "version", "company_id", "exported_at", "record_types"}
        for name in data:
            if name not in expected:
                raise StreamError(line, f"{name!r} is not a field of the header", name)
        if data.get("format") != FORMAT:
            raise StreamError(line, f"format must be {FORMAT!r}", "format")
        if data.get("version") != FORMAT_VERSION:
            raise StreamError(
                line, f"version {data.get('version')!r} is not {FORMAT_VERSION}", "version"
            )
        if data.get("company_id") != self.company_id:
            raise StreamError(
                line,
                f"the stream holds company {data.get('company_id')!r}, not {self.company_id!r} "
                "(the company of the path): a company moves under its own id, because its "
                "users' tokens, its folders' access entries (its Root Group) and its records "
                "name it; import it into that company",
                "company_id",
            )
        try:
            _timestamp(data.get("exported_at"))
        except ValueError as exc:
            raise StreamError(line, f"exported_at {exc}", "exported_at") from None
        types = data.get("record_types")
        if not isinstance(types, list) or not all(isinstance(name, str) for name in types):
            raise StreamError(line, "record_types must be a list of names", "record_types")

    def _read_trailer(self, line: int, data: Mapping[str, object]) -> None:
        for name in data:
            if name not in ("type", "counts"):
                raise StreamError(line, f"{name!r} is not a field of the trailer", name)
        counts = data.get("counts")
        if not isinstance(counts, dict):
            raise StreamError(line, "counts must be an object", "counts")
        names = {record_type.name for record_type in self.types}
        for name, count in counts.items():
            if name not in names:
                raise StreamError(line, f"counts names an unknown type {name!r}", "counts")
            if self.counts.get(name, 0) != count:
                raise StreamError(
                    line,
                    f"counts says {count!r} {name} records; the stream holds "
                    f"{self.counts.get(name, 0)}",
                    "counts",
                )
        missing = sorted(set(self.counts) - set(counts))
        if missing:
            raise StreamError(line, f"counts does not count {missing}", "counts")
