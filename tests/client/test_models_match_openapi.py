"""The client's hand-written models say what `openapi.yaml` says. Starting from every call of
`calls.py` (its route, its request model, its response model), each model is compared with the
schema it stands for: the same members, the same types, the same required members, the same
enumerations and the same defaults, and every object schema the client reads has a model.

`openapi.yaml` is itself held to the app by tests/test_deployment_files.py, so a change of a
server schema fails here until the model follows. A comparison rather than generated models:
the models are the client's public API (the positional order of request models, the shared
`Literal` aliases, `VersionOut(VersionSummaryOut)`, `UNSET` for PATCH members, the names of
clashing schemas), which a generator would have to be told member by member; here each of
those stays a plain choice in models.py, and a failure names the member that moved.
"""

from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
import yaml
from context_memory_client import calls, models
from context_memory_client.calls import Call
from context_memory_client.models import Page, Unset

from app.kit.config import PROJECT_ROOT

OPENAPI: dict[str, Any] = yaml.safe_load((PROJECT_ROOT / "openapi.yaml").read_text("utf-8"))
SCHEMAS: dict[str, dict[str, Any]] = OPENAPI["components"]["schemas"]
REF = "#/components/schemas/"
JSON = "application/json"
SCALARS: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool}


def _name(schema: dict[str, Any]) -> str | None:
    ref = schema.get("$ref")
    return ref.removeprefix(REF) if isinstance(ref, str) else None


def _resolved(schema: dict[str, Any]) -> dict[str, Any]:
    name = _name(schema)
    return SCHEMAS[name] if name else schema


def _json_name(name: str) -> str:
    return name[:-1] if name.endswith("_") else name


def _without_none(hint: Any) -> tuple[bool, Any]:
    """(whether `hint` admits None, `hint` without None and without `Unset`)."""
    if typing.get_origin(hint) not in (types.UnionType, typing.Union):
        return False, hint
    args = typing.get_args(hint)
    rest = [a for a in args if a is not type(None) and a is not Unset]
    inner = rest[0] if len(rest) == 1 else typing.Union[tuple(rest)]  # noqa: UP007
    return type(None) in args, inner


def _without_null(schema: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """(whether `schema` admits null, `schema` without the null alternative)."""
    options = schema.get("anyOf")
    if not options or {"type": "null"} not in options:
        return False, schema
    rest = [o for o in options if o != {"type": "null"}]
    outer = {k: v for k, v in schema.items() if k != "anyOf"}
    return True, {**outer, **rest[0]} if len(rest) == 1 else {**outer, "anyOf": rest}


def _enum(schema: dict[str, Any]) -> set[Any] | None:
    schema = _resolved(schema)
    if "const" in schema:
        return {schema["const"]}
    return set(schema["enum"]) if "enum" in schema else None


@dataclass
class Comparison:
    """The pairs (model, schema name) met so far, those still to compare, and every mismatch."""

    pairs: dict[type[Any], str] = field(default_factory=dict)
    todo: list[tuple[type[Any], str]] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def pair(self, cls: type[Any], schema_name: str, where: str) -> None:
        known = self.pairs.get(cls)
        if known is None:
            self.pairs[cls] = schema_name
            self.todo.append((cls, schema_name))
        elif known != schema_name:
            self.problems.append(f"{where}: {cls.__name__} stands for {known} and {schema_name}")

    def types(self, hint: Any, schema: dict[str, Any], where: str) -> None:
        """`hint` (a model field's type) against `schema` (its member's schema)."""
        hint_none, hint = _without_none(hint)
        schema_null, schema = _without_null(schema)
        if hint_none != schema_null:
            self.problems.append(
                f"{where}: null is {'' if schema_null else 'not '}allowed by the schema, "
                f"{'' if hint_none else 'not '}by the model"
            )
        enum, origin, args = _enum(schema), typing.get_origin(hint), typing.get_args(hint)
        target = _resolved(schema)
        if "anyOf" in schema:
            self.alternatives(hint, schema["anyOf"], where)
        elif target == {} and hint in (object, Any):
            pass  # any JSON value
        elif enum is not None or origin is typing.Literal:
            if origin is not typing.Literal or enum != set(args):
                self.problems.append(f"{where}: the schema's values {enum}, the model's {hint}")
        elif _name(schema) and "properties" in target:
            if not (isinstance(hint, type) and dataclasses.is_dataclass(hint)):
                self.problems.append(f"{where}: object {_name(schema)} has no model ({hint})")
            else:
                self.pair(hint, _name(schema) or "", where)
        elif target.get("type") == "array":
            if origin is not list:
                self.problems.append(f"{where}: an array in the schema, {hint} in the model")
            else:
                self.types(args[0], target["items"], f"{where}[]")
        elif target.get("type") == "object" or target == {}:
            values = target.get("additionalProperties", {})
            if origin is not dict or args[0] is not str:
                self.problems.append(f"{where}: a JSON object in the schema, {hint} in the model")
            elif values in ({}, True) and args[1] in (object, Any):
                pass
            else:
                self.types(args[1], values if isinstance(values, dict) else {}, f"{where}{{}}")
        elif target.get("type") in SCALARS:
            if hint is not SCALARS[target["type"]]:
                self.problems.append(
                    f"{where}: {target['type']} in the schema, {hint} in the model"
                )
        else:
            self.problems.append(f"{where}: a schema this test cannot read: {schema}")

    def alternatives(self, hint: Any, options: list[dict[str, Any]], where: str) -> None:
        """A union of the model (`LimitBody | Unlimited`) against the schema's `anyOf`, one
        alternative after the other, in order."""
        if typing.get_origin(hint) not in (types.UnionType, typing.Union):
            self.problems.append(f"{where}: a choice of {len(options)} in the schema, {hint}")
            return
        args = typing.get_args(hint)
        if len(args) != len(options):
            self.problems.append(f"{where}: {len(options)} alternatives in the schema, {hint}")
            return
        for n, (arg, option) in enumerate(zip(args, options, strict=True)):
            self.types(arg, option, f"{where}|{n}")

    def model(self, cls: type[Any], schema_name: str) -> None:
        """Every member of the model against the object schema it stands for."""
        schema = SCHEMAS[schema_name]
        where = f"{cls.__name__} ({schema_name})"
        named = schema_name == cls.__name__ or schema_name.endswith("__" + cls.__name__)
        if not named and f"(schema `{schema_name}`)" not in (cls.__doc__ or ""):
            self.problems.append(f"{where}: named after neither the schema nor its docstring")
        properties: dict[str, Any] = schema.get("properties", {})
        required = set(schema.get("required", []))
        hints = typing.get_type_hints(cls)
        fields = {_json_name(f.name): f for f in dataclasses.fields(cls)}
        for missing in sorted(properties.keys() - fields.keys()):
            self.problems.append(f"{where}: no field for the schema's member {missing!r}")
        for extra in sorted(fields.keys() - properties.keys()):
            self.problems.append(f"{where}: field {extra!r} is not a member of the schema")
        for name in sorted(fields.keys() & properties.keys()):
            f, member = fields[name], properties[name]
            has_default = not (
                f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
            )
            if has_default == (name in required):
                self.problems.append(
                    f"{where}.{name}: {'required' if name in required else 'optional'} in the "
                    f"schema, {'optional' if has_default else 'required'} in the model"
                )
            default = f.default
            plain_default = default is not dataclasses.MISSING and not isinstance(default, Unset)
            if plain_default and "default" in member and default != member["default"]:
                self.problems.append(
                    f"{where}.{name}: default {member['default']!r} in the schema, "
                    f"{default!r} in the model"
                )
            self.types(hints[f.name], member, f"{where}.{name}")

    def body(self, hint: Any, schema: dict[str, Any], where: str) -> None:
        """A request or response body: a model, a `Page` of one, or nothing."""
        if typing.get_origin(hint) is Page:
            page = _resolved(schema)
            if set(page.get("properties", {})) != {"items", "next_cursor"}:
                self.problems.append(f"{where}: {_name(schema)} is not a page of items")
                return
            self.types(list[typing.get_args(hint)[0]], page["properties"]["items"], where)  # type: ignore[misc]
            self.types(str | None, page["properties"]["next_cursor"], f"{where}.next_cursor")
            return
        self.types(hint, schema, where)

    def run(self) -> None:
        while self.todo:
            self.model(*self.todo.pop())


def _call_functions() -> Iterator[tuple[str, Callable[..., Call[Any]]]]:
    for name, function in inspect.getmembers(calls, inspect.isfunction):
        if function.__module__ == calls.__name__ and not name.startswith("_"):
            returns = typing.get_type_hints(function).get("return")
            if typing.get_origin(returns) is Call:
                yield name, function


CALLS = dict(_call_functions())


def _operation(call: Call[Any]) -> dict[str, Any]:
    """The operation of `openapi.yaml` that `call` is a request of (its path a template's)."""
    matches = [
        path
        for path in OPENAPI["paths"]
        if re.fullmatch(re.sub(r"\\\{[^/]+?\\\}", "[^/]+", re.escape(path)), call.path)
        and call.method.lower() in OPENAPI["paths"][path]
    ]
    assert matches, f"{call.method} {call.path} is not an operation of openapi.yaml"
    path = min(matches, key=lambda p: p.count("{"))  # a literal segment wins over a parameter
    operation: dict[str, Any] = OPENAPI["paths"][path][call.method.lower()]
    return operation


def _sample(function: Callable[..., Call[Any]]) -> Call[Any]:
    """The call with a placeholder for every argument it requires."""
    required: dict[str, Any] = {
        name: "placeholder"
        for name, parameter in inspect.signature(function).parameters.items()
        if parameter.default is inspect.Parameter.empty
    }
    return function(**required)


def _compare_call(name: str, comparison: Comparison) -> None:
    function = CALLS[name]
    hints = typing.get_type_hints(function)
    call = _sample(function)
    operation = _operation(call)
    where = f"{name} ({call.method} {call.path})"
    # the answer: every 2xx with a JSON body is the model the call reads
    _, answer = _without_none(typing.get_args(hints["return"])[0])
    successes = {s: r for s, r in operation["responses"].items() if str(s).startswith("2")}
    bodies = [
        r["content"][JSON]["schema"] for r in successes.values() if JSON in r.get("content", {})
    ]
    if answer is type(None):
        assert bodies == [], f"{where}: the client reads nothing, the service answers {bodies}"
    elif answer is bytes:
        kinds = {kind for r in successes.values() for kind in r.get("content", {})}
        assert kinds, f"{where}: the client reads bytes, the service answers no body"
        assert JSON not in kinds, f"{where}: the client reads bytes, the service answers JSON"
    else:
        assert bodies, f"{where}: the client reads {answer}, the service answers no JSON body"
        for schema in bodies:
            comparison.body(answer, schema, f"{where} answer")
    # the request body: a model argument, or the members the call writes itself
    body_schema = operation.get("requestBody", {}).get("content", {}).get(JSON, {}).get("schema")
    models_sent = [
        hint
        for arg, hint in hints.items()
        if arg != "return" and isinstance(hint, type) and dataclasses.is_dataclass(hint)
    ]
    if models_sent:
        assert body_schema, f"{where}: sends {models_sent} to an operation without a JSON body"
        comparison.body(models_sent[0], body_schema, f"{where} request")
    elif isinstance(call.json, dict):
        assert body_schema, f"{where}: sends a body to an operation without a JSON body"
        target = _resolved(body_schema)
        sent, allowed = set(call.json), set(target.get("properties", {}))
        assert sent <= allowed, f"{where}: sends {sorted(sent - allowed)}, not in the schema"
        missing = set(target.get("required", [])) - sent
        assert not missing, f"{where}: does not send the required {sorted(missing)}"
    else:
        assert call.json is None
        assert not body_schema or not operation["requestBody"].get("required"), (
            f"{where}: sends no body to an operation that requires one"
        )


def compare_all() -> Comparison:
    comparison = Comparison()
    for name in CALLS:
        _compare_call(name, comparison)
    comparison.run()
    return comparison


def test_every_call_of_the_client_is_an_operation_of_the_api() -> None:
    assert len(CALLS) >= 30
    for function in CALLS.values():
        _operation(_sample(function))


def test_every_model_has_the_members_types_required_members_and_values_of_its_schema() -> None:
    comparison = compare_all()
    drift = "\n".join(comparison.problems)
    assert not drift, f"the client's models drifted from openapi.yaml:\n{drift}"


def test_every_model_stands_for_a_schema_the_client_sends_or_reads() -> None:
    comparison = compare_all()
    dataclasses_of_models = {
        cls
        for cls in vars(models).values()
        if isinstance(cls, type)
        and dataclasses.is_dataclass(cls)
        and cls.__module__ == models.__name__
        and cls is not Page
    }
    unmatched = sorted(cls.__name__ for cls in dataclasses_of_models - comparison.pairs.keys())
    assert not unmatched, f"models that no call sends or reads: {unmatched}"
    assert len(comparison.pairs) >= 40


@pytest.mark.parametrize(
    ("hint", "schema", "problem"),
    [
        (str, {"type": "integer"}, "integer in the schema"),
        (str | None, {"type": "string"}, "null is not allowed by the schema"),
        (str, {"anyOf": [{"type": "string"}, {"type": "null"}]}, "null is allowed by the schema"),
        (str, {"type": "string", "enum": ["a"]}, "the schema's values"),
        (typing.Literal["a", "b"], {"$ref": REF + "Role"}, "the schema's values"),
        (list[str], {"type": "array", "items": {"type": "integer"}}, "integer in the schema"),
        (dict[str, object], {"$ref": REF + "SwitchOut"}, "has no model"),
    ],
)
def test_the_comparison_names_each_kind_of_drift(hint: Any, schema: Any, problem: str) -> None:
    comparison = Comparison()
    comparison.types(hint, schema, "Model.member")
    assert len(comparison.problems) == 1
    assert problem in comparison.problems[0]
