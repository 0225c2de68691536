"""Hypothesis strategies for the structured-output tests: random JSON schemas built from the
keywords the grammar enforces (bounded, so every value ends), valid instances of them written
in the forms the grammar allows, and a decimal-exact validator."""

from __future__ import annotations

import datetime
import json
import re
import uuid
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from typing import Any

from hypothesis import assume
from hypothesis import strategies as st
from jsonschema import Draft202012Validator

__all__ = ["FORMATS", "canonical", "instances", "schemas", "validator"]

FORMATS = ["date", "time", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"]
# Patterns of the supported subset, without Unicode-sensitive shorthands (Python's \d and \w
# take Unicode digits and letters, ECMA-262's and the grammar's do not).
PATTERNS = [
    "^[a-z]{1,5}$",
    "[0-9]{3}",
    "^(ab|cd)+$",
    "x",
    "^[A-Z][a-z]{0,4}$",
    "^[0-9]{2}-[0-9]{2}$",
    "a|b",
    "^[^a-z]{2}$",
    "^(?:[a-c]|[x-z]){2,3}$",
    "q$",
    "^é",
]
NAMES = ["id", "name", "a b", 'quo"te', "é", "n2", "tags", "x"]
_TEXT = st.text(st.characters(exclude_categories=("Cs",)), max_size=6)


def validator(schema: object) -> Draft202012Validator:
    """A validator that checks formats and compares numbers exactly (as decimals)."""
    exact = json.loads(json.dumps(schema), parse_float=Decimal)
    return Draft202012Validator(exact, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _bound(draw: Any, integer: bool) -> Any:
    if integer:
        return draw(st.integers(-1000, 1000))
    return float(draw(st.decimals(-100, 100, places=2)))


@st.composite
def _integer(draw: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    low, high = sorted(draw(st.lists(st.integers(-(10**6), 10**6), min_size=2, max_size=2)))
    if draw(st.booleans()):
        schema[draw(st.sampled_from(["minimum", "exclusiveMinimum"]))] = low
    if draw(st.booleans()):
        schema[draw(st.sampled_from(["maximum", "exclusiveMaximum"]))] = max(high, low + 200)
    if draw(st.booleans()):
        schema["multipleOf"] = draw(st.sampled_from([1, 2, 3, 5, 7, 10, 25, 100]))
    return schema


@st.composite
def _number(draw: Any) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "number"}
    low = _bound(draw, False)
    if draw(st.booleans()):
        schema[draw(st.sampled_from(["minimum", "exclusiveMinimum"]))] = low
    if draw(st.booleans()):
        high = low + float(draw(st.decimals(1, 50, places=2)))
        schema[draw(st.sampled_from(["maximum", "exclusiveMaximum"]))] = round(high, 2)
    if draw(st.booleans()):
        schema["multipleOf"] = draw(st.sampled_from([0.5, 0.25, 0.1, 2, 0.05]))
    return schema


@st.composite
def _string(draw: Any) -> dict[str, Any]:
    kind = draw(st.sampled_from(["length", "pattern", "format", "enum"]))
    if kind == "format":
        return {"type": "string", "format": draw(st.sampled_from(FORMATS))}
    if kind == "enum":
        return {"type": "string", "enum": draw(st.lists(_TEXT, min_size=1, max_size=3))}
    high = draw(st.integers(1, 8))
    schema: dict[str, Any] = {"type": "string", "maxLength": high}
    if draw(st.booleans()):
        schema["minLength"] = draw(st.integers(0, high))
    if kind == "pattern":
        schema["pattern"] = draw(st.sampled_from(PATTERNS))
    return schema


def _leaf() -> st.SearchStrategy[dict[str, Any]]:
    scalars = st.one_of(
        _integer(),
        _number(),
        _string(),
        st.just({"type": "boolean"}),
        st.just({"type": "null"}),
        st.builds(lambda v: {"const": v}, st.one_of(_TEXT, st.integers(-9, 9), st.booleans())),
        st.builds(
            lambda vs: {"enum": vs},
            st.lists(st.one_of(_TEXT, st.integers(-99, 99), st.none()), min_size=1, max_size=3),
        ),
    )
    nullable = st.builds(
        lambda s: {**s, "type": [s["type"], "null"]}, st.one_of(_integer(), _string())
    )
    return st.one_of(scalars, nullable)


def _extend(children: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[dict[str, Any]]:
    @st.composite
    def obj(draw: Any) -> dict[str, Any]:
        names = draw(st.lists(st.sampled_from(NAMES), min_size=1, max_size=4, unique=True))
        properties = {n: draw(children) for n in names}
        required = [n for n in names if draw(st.booleans())]
        return {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        }

    @st.composite
    def arr(draw: Any) -> dict[str, Any]:
        low = draw(st.integers(0, 2))
        schema = {"type": "array", "items": draw(children), "minItems": low}
        schema["maxItems"] = draw(st.integers(low, 3))
        if draw(st.booleans()):
            schema["prefixItems"] = [draw(children)]
        return schema

    union = st.builds(lambda a, b: {"anyOf": [a, b]}, children, children)
    return st.one_of(obj(), arr(), union)


@st.composite
def schemas(draw: Any) -> dict[str, Any]:
    """A random bounded schema: nested objects, arrays, unions, references."""
    body = draw(st.recursive(_leaf(), _extend, max_leaves=6))
    shape = draw(st.sampled_from(["plain", "ref", "list"]))
    if shape == "ref":
        return {
            "$defs": {"Item": body},
            "type": "object",
            "properties": {"item": {"$ref": "#/$defs/Item"}},
            "required": ["item"],
            "additionalProperties": False,
        }
    if shape == "list":  # recursive: a linked list of values
        node = {
            "type": "object",
            "properties": {
                "value": body,
                "next": {"anyOf": [{"$ref": "#/$defs/Node"}, {"type": "null"}]},
            },
            "required": ["value", "next"],
            "additionalProperties": False,
        }
        return {"$defs": {"Node": node}, "$ref": "#/$defs/Node"}
    return body


# -- valid instances, in the grammar's forms ----------------------------------------------


def _resolve(root: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        node: Any = root
        for part in schema["$ref"][2:].split("/"):
            node = node[part]
        schema = node
    return schema


def _format_value(draw: Any, name: str) -> str:
    if name in ("date", "date-time", "time"):
        day = draw(st.dates(datetime.date(1, 1, 1), datetime.date(9999, 12, 31))).isoformat()
        clock = draw(st.times()).isoformat()
        zone = draw(st.sampled_from(["Z", "+05:30", "-11:00"]))
        return {"date": day, "time": clock + zone, "date-time": f"{day}T{clock}{zone}"}[name]
    if name == "duration":
        return draw(st.sampled_from(["P1Y2M3DT4H5M6S", "PT5M", "P3W", "P1D", "PT0S", "P12M"]))
    label = st.from_regex(r"\A[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?\Z")
    host = ".".join(draw(st.lists(label, min_size=2, max_size=3)))
    if name == "hostname":
        return host
    if name == "email":
        return draw(st.from_regex(r"\A[a-z0-9_+-]{1,10}(\.[a-z]{1,5})?\Z")) + "@" + host
    if name in ("ipv4", "ipv6"):
        return str(draw(st.ip_addresses(v=4 if name == "ipv4" else 6)))
    return str(uuid.UUID(int=draw(st.integers(0, 2**128 - 1))))


def _string_value(draw: Any, schema: dict[str, Any]) -> str:
    if "format" in schema:
        return _format_value(draw, schema["format"])
    low, high = schema.get("minLength", 0), schema.get("maxLength", 8)
    pattern = schema.get("pattern")
    if pattern is None:
        return draw(st.text(st.characters(exclude_categories=("Cs",)), min_size=low, max_size=high))
    text = draw(st.from_regex(pattern, alphabet=st.characters(exclude_categories=("Cs",))))
    assume(low <= len(text) <= high and not text.endswith("\n"))
    assert re.search(pattern, text)
    return text


def _number_value(draw: Any, schema: dict[str, Any], integer: bool) -> Any:
    step = Decimal(str(schema.get("multipleOf", 1 if integer else "0.01")))
    low = schema.get("minimum", schema.get("exclusiveMinimum", -1000))
    high = schema.get("maximum", schema.get("exclusiveMaximum", 1000))
    first = (Decimal(str(low)) / step).to_integral_value(rounding=ROUND_CEILING)
    last = (Decimal(str(high)) / step).to_integral_value(rounding=ROUND_FLOOR)
    assume(first <= last)
    value = draw(st.integers(int(first), int(min(last, first + 10**6)))) * step
    if "exclusiveMinimum" in schema and value == Decimal(str(low)):
        value += step
    if "exclusiveMaximum" in schema and value == Decimal(str(high)):
        value -= step
    return int(value) if integer else value


@st.composite
def instances(draw: Any, root: dict[str, Any], schema: dict[str, Any] | None = None) -> Any:
    """A value valid for ``schema`` (within ``root``), as the grammar writes it."""
    schema = _resolve(root, root if schema is None else schema)
    if "anyOf" in schema:
        return draw(instances(root, draw(st.sampled_from(schema["anyOf"]))))
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return draw(st.sampled_from(schema["enum"]))
    kind = schema["type"]
    if isinstance(kind, list):
        kind = draw(st.sampled_from(kind))
    if kind == "null":
        return None
    if kind == "boolean":
        return draw(st.booleans())
    if kind in ("integer", "number"):
        return _number_value(draw, schema, kind == "integer")
    if kind == "string":
        return _string_value(draw, schema)
    if kind == "array":
        count = draw(st.integers(schema.get("minItems", 0), schema.get("maxItems", 3)))
        prefix = schema.get("prefixItems", [])
        return [
            draw(instances(root, prefix[i] if i < len(prefix) else schema["items"]))
            for i in range(count)
        ]
    return {
        name: draw(instances(root, sub))
        for name, sub in schema["properties"].items()
        if name in schema.get("required", ()) or draw(st.booleans())
    }


def canonical(value: Any) -> str:
    """``value`` as JSON in the grammar's forms: keys in order, ``, `` and ``: ``, strings
    escaped as JSON must (DEL too), numbers in plain decimal."""
    if isinstance(value, dict):
        items = (f"{canonical(k)}: {canonical(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(canonical(v) for v in value) + "]"
    if isinstance(value, Decimal):
        return format(value.normalize() if value == value.to_integral() else value, "f")
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
