"""JSON to the dataclasses of `models` and back, driven by their type hints.

Decoding is lenient the way a client of an evolving API should be: unknown members are ignored,
a missing member takes the field's default, and enumerations are not checked. A field named
with a trailing underscore (`from_`) is the JSON member without it (`from`).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from functools import cache
from typing import Any, TypeVar, cast

from context_memory_client.models import Page, Unset

T = TypeVar("T")


def _json_name(name: str) -> str:
    return name[:-1] if name.endswith("_") else name


@cache
def _hints(cls: type[Any]) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _decode_value(hint: Any, value: Any) -> Any:
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (types.UnionType, typing.Union):
        options = [arg for arg in typing.get_args(hint) if arg is not type(None)]
        return _decode_value(options[0], value) if len(options) == 1 else value
    if origin is list:
        (item,) = typing.get_args(hint)
        return [_decode_value(item, v) for v in value]
    if origin is dict:
        _, item = typing.get_args(hint)
        return {k: _decode_value(item, v) for k, v in value.items()}
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return decode(hint, value)
    return value


def decode(cls: type[T], data: Any) -> T:
    """`data` (parsed JSON) as an instance of the dataclass `cls`."""
    if not isinstance(data, dict):
        raise TypeError(f"expected a JSON object for {cls.__name__}, got {type(data).__name__}")
    hints = _hints(cast(Any, cls))
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cast(Any, cls)):
        key = _json_name(f.name)
        if key in data:
            values[f.name] = _decode_value(hints[f.name], data[key])
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            values[f.name] = None
    return cls(**values)


def decode_page(item: type[T], data: Any) -> Page[T]:
    """A `{"items": [...], "next_cursor": ...}` body as a `Page` of `item`."""
    return Page([decode(item, v) for v in data["items"]], data.get("next_cursor"))


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
