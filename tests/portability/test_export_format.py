"""The NDJSON format's rules, without a database: lines split however the body arrives, the
stream's structure checked line by line, each field read as its column stores it, and every
company table either exported or left out on purpose."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
import pytest

from app.models import metadata
from app.portability.format import (
    FieldSpec,
    FieldType,
    RecordType,
    StreamError,
    StreamReader,
    header_line,
    numbered_lines,
    record_line,
    trailer_line,
)
from app.portability.kinds import KINDS, NOT_EXPORTED, RECORD_TYPES, SPACE

HEADER = orjson.loads(header_line("acme", datetime(2026, 12, 1, tzinfo=UTC), RECORD_TYPES))
FLAG = {
    "type": "feature_flag",
    "flag": "FEATURE_FLAG_ENABLE_CONTEXT_MEMORY_UN_22033",
    "enabled": True,
    "updated_at": "2026-11-30T08:00:00+00:00",
    "updated_by_company_id": "platform",
    "updated_by": "olga",
}
SPACE_RECORD = {
    "type": "space",
    "space_id": "space-1",
    "updated_by_company_id": "acme",
    "updated_by": "sam",
}


async def _chunks(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        yield part


async def _lines(*parts: bytes, limit: int = 1024) -> list[tuple[int, bytes]]:
    return [line async for line in numbered_lines(_chunks(*parts), limit)]


@pytest.mark.parametrize(
    ("parts", "expected"),
    [
        ((b'{"a":1}\n{"b":2}\n',), [(1, b'{"a":1}'), (2, b'{"b":2}')]),
        ((b'{"a"', b":1}\n{", b'"b":2}'), [(1, b'{"a":1}'), (2, b'{"b":2}')]),
        ((b"x\n", b"", b"\ny\n"), [(1, b"x"), (2, b""), (3, b"y")]),
        ((b"",), []),
    ],
    ids=["whole lines", "lines split across chunks, the last without newline", "blank", "empty"],
)
async def test_lines_are_numbered_however_the_body_is_cut(
    parts: tuple[bytes, ...], expected: list[tuple[int, bytes]]
) -> None:
    assert await _lines(*parts) == expected


async def test_a_line_longer_than_the_limit_is_refused_by_its_number() -> None:
    with pytest.raises(StreamError) as refused:
        await _lines(b"short\n", b"x" * 600, b"x" * 600, b"\n", limit=1000)
    assert refused.value.line == 2


def _read(*records: dict[str, Any], company: str = "acme") -> StreamReader:
    reader = StreamReader(company, RECORD_TYPES)
    for number, record in enumerate(records, start=1):
        reader.accept(number, record)
    reader.finish(len(records))
    return reader


def test_a_well_formed_stream_counts_its_records() -> None:
    end = {"type": "end", "counts": {"feature_flag": 1, "space": 1}}
    assert _read(HEADER, FLAG, SPACE_RECORD, end).counts == {"feature_flag": 1, "space": 1}


CASES: list[tuple[str, Sequence[dict[str, Any]], int, str | None]] = [
    ("no header", [FLAG], 1, "type"),
    ("another format", [{**HEADER, "format": "csv"}], 1, "format"),
    ("a newer version", [{**HEADER, "version": 2}], 1, "version"),
    ("another company", [{**HEADER, "company_id": "globex"}], 1, "company_id"),
    ("an unknown header field", [{**HEADER, "owner": "x"}], 1, "owner"),
    ("a second header", [HEADER, HEADER], 2, "type"),
    ("an unknown type", [HEADER, {**FLAG, "type": "job"}], 2, "type"),
    ("types out of order", [HEADER, SPACE_RECORD, FLAG], 3, "type"),
    ("an unknown field", [HEADER, {**FLAG, "company_id": "globex"}], 2, "company_id"),
    ("a missing field", [HEADER, {k: v for k, v in FLAG.items() if k != "enabled"}], 2, "enabled"),
    ("a string for a boolean", [HEADER, {**FLAG, "enabled": "yes"}], 2, "enabled"),
    (
        "a number out of its column",
        [HEADER, {**SPACE_RECORD, "max_tokens": 2**31}],
        2,
        "max_tokens",
    ),
    (
        "a time without offset",
        [HEADER, {**FLAG, "updated_at": "2026-11-30T08:00:00"}],
        2,
        "updated_at",
    ),
    ("text over its column", [HEADER, {**FLAG, "flag": "F" * 129}], 2, "flag"),
    ("a NUL character", [HEADER, {**FLAG, "updated_by": "o\x00"}], 2, "updated_by"),
    ("null where not nullable", [HEADER, {**FLAG, "updated_by": None}], 2, "updated_by"),
    (
        "a count that differs",
        [HEADER, FLAG, {"type": "end", "counts": {"feature_flag": 2}}],
        3,
        "counts",
    ),
    ("a type not counted", [HEADER, FLAG, {"type": "end", "counts": {}}], 3, "counts"),
    ("a line after the trailer", [HEADER, {"type": "end", "counts": {}}, FLAG], 3, None),
    ("no trailer", [HEADER, FLAG], 3, None),
]


@pytest.mark.parametrize(
    ("records", "line", "field"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_a_stream_that_breaks_a_rule_is_refused_at_its_line(
    records: Sequence[dict[str, Any]], line: int, field: str | None
) -> None:
    with pytest.raises(StreamError) as refused:
        _read(*records)
    assert (refused.value.line, refused.value.field) == (line, field)


def test_an_empty_stream_is_refused() -> None:
    with pytest.raises(StreamError) as refused:
        StreamReader("acme", RECORD_TYPES).finish(0)
    assert refused.value.line == 1


def test_a_record_reads_back_as_the_values_it_was_written_from() -> None:
    values = {
        "space_id": "space-1",
        "context_memory": None,
        "web_search": True,
        "use_orchestrator_language_model": False,
        "language_model": "gpt-4o",
        "max_tokens": 3000,
        "updated_at": datetime(2026, 11, 30, 8, 5, 1, 123456, tzinfo=UTC),
        "updated_by_company_id": "acme",
        "updated_by": "sam",
    }
    line = orjson.loads(record_line(SPACE.type, values))
    assert SPACE.type.read(1, line) == values
    assert orjson.loads(trailer_line({"space": 1})) == {"type": "end", "counts": {"space": 1}}


def test_uuids_and_json_fields_read_as_stored() -> None:
    kind = RecordType(
        "thing",
        (
            FieldSpec("id", FieldType.UUID),
            FieldSpec("doc", FieldType.JSON, nullable=True),
            FieldSpec("n", FieldType.INTEGER, required=False),
        ),
    )
    ident = uuid.uuid4()
    assert kind.read(1, {"id": str(ident), "doc": {"a": [1]}}) == {"id": ident, "doc": {"a": [1]}}
    for bad in ({"id": "nope", "doc": None}, {"id": str(ident), "doc": None, "n": True}):
        with pytest.raises(StreamError):
            kind.read(1, bad)


def test_every_company_table_is_exported_or_left_out_on_purpose() -> None:
    company_tables = {table.name for table in metadata.sorted_tables if "company_id" in table.c}
    exported = {kind.table.name for kind in KINDS}
    assert company_tables == exported | NOT_EXPORTED
    assert not exported & NOT_EXPORTED


def test_records_refer_only_to_kinds_before_them() -> None:
    """A foreign key of an exported table points at a table exported earlier in the stream."""
    position = {kind.table.name: index for index, kind in enumerate(KINDS)}
    for index, kind in enumerate(KINDS):
        for key in kind.table.foreign_keys:
            target = key.column.table.name
            assert position[target] <= index, (kind.name, target)
