"""JSON to the dataclasses of `models` and back, driven by their type hints.

Decoding is lenient where a client of an evolving API should be: unknown members are ignored
and enumerations are not checked, so a newer service does not break an older client. It is
strict where a value would otherwise be made up: an optional member (a field with a default)
that is missing takes its default, but a missing required one is an `UnexpectedResponse`, never
a `None` the type does not allow. A field named with a trailing underscore (`from_`) is the
JSON member without it (`from`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache
from typing import Any, TypeVar, cast

from context_memory_client.errors import UnexpectedResponse
from context_memory_client.models import Page, Unset

T = TypeVar("T")


def _json_name(name: str) -> str:
    return name[:-1] if name.endswith("_") else name


@cache
def _hints(cls: type[Any]) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _decode_value(hint: Any, value: Any, where: str) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _decode_value(options[0], value, where) if len(options) == 1 else value
    if origin is list:
        (item,) = typing.get_args(hint)
        return [_decode_value(item, v, f"{where}[{i}]") for i, v in enumerate(_array(value, where))]
    if origin is dict:
        _, item = typing.get_args(hint)
        return {k: _decode_value(item, v, f"{where}.{k}") for k, v in _object(value, where).items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return decode(hint, value, where)
    return value


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise UnexpectedResponse(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def _array(value: Any, where: str) -> list[Any]:
    if not isinstance(value, list):
        raise UnexpectedResponse(f"{where}: expected a JSON array, got {type(value).__name__}")
    return value


def decode(cls: type[T], data: Any, where: str | None = None) -> T:
    """`data` (parsed JSON) as an instance of the dataclass `cls`; `where` names it in an
    `UnexpectedResponse` (default: the class name)."""
    where = where or cls.__name__
    data = _object(data, where)
    hints = _hints(cast(Any, cls))
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cast(Any, cls)):
        key = _json_name(f.name)
        if key in data:
            values[f.name] = _decode_value(hints[f.name], data[key], f"{where}.{key}")
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise UnexpectedResponse(f"{where}: the required member {key!r} is missing")
    return cls(**values)


def decode_page(item: type[T], data: Any) -> Page[T]:
    """A `{"items": [...], "next_cursor": ...}` body as a `Page` of `item`."""
    where = f"Page[{item.__name__}]"
    data = _object(data, where)
    for key in ("items", "next_cursor"):
        if key not in data:
            raise UnexpectedResponse(f"{where}: the required member {key!r} is missing")
    items = _array(data["items"], f"{where}.items")
    return Page(
        [decode(item, v, f"{where}.items[{i}]") for i, v in enumerate(items)], data["next_cursor"]
    )


def encode(obj: Any) -> Any:
    """A request dataclass (or a value inside one) as JSON-ready data; `UNSET` members are
    left out."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {
            _json_name(f.name): encode(getattr(obj, f.name))
            for f in dataclasses.fields(obj)
            if not isinstance(getattr(obj, f.name), Unset)
        }
    if isinstance(obj, list | tuple):
        return [encode(v) for v in obj]
    if isinstance(obj, dict):
        return {k: encode(v) for k, v in obj.items()}
    return obj
