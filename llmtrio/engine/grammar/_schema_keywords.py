"""Which JSON Schema keywords structured output enforces, and the two that need reasoning
over whole schemas: ``allOf`` (merged into one schema) and ``oneOf`` (enforced only where its
branches cannot overlap). Pure.

A keyword that cannot be enforced is refused or relaxed, as the schema is strict or not
(:class:`UnenforcedError`, :class:`Relaxation`); a schema that is not one (an unknown type, a
reference that points nowhere) is a :class:`SchemaError` (relaxed too where not strict).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

__all__ = [
    "ANNOTATIONS",
    "ENFORCED",
    "REFUSED",
    "Relaxation",
    "SchemaError",
    "UnenforcedError",
    "disjoint",
    "json_text",
    "merge",
    "types_of",
]


class SchemaError(ValueError):
    """A schema the grammar cannot enforce (the message says why): not a JSON schema, or
    (an :class:`UnenforcedError`) a keyword of a strict schema the grammar cannot enforce.
    ``keyword``: the keyword at fault, where one is."""

    def __init__(self, message: str, *, keyword: str = "schema") -> None:
        super().__init__(message)
        self.keyword = keyword


class UnenforcedError(SchemaError):
    """A valid keyword the grammar cannot enforce, in a strict schema (relaxed instead where
    the schema is not strict: :class:`Relaxation`)."""


@attrs.frozen
class Relaxation:
    """A keyword the grammar did not enforce in a schema that is not strict: the sub-schema
    at ``where`` became what the grammar can enforce (``why`` says what was dropped)."""

    where: str
    keyword: str
    why: str

    def __str__(self) -> str:
        return f"'{self.keyword}' is not enforced at {self.where}: {self.why}"


#: Keywords turned into grammar, by what they constrain.
ENFORCED: dict[str, str] = {
    "type": "any",
    "enum": "any",
    "const": "any",
    "anyOf": "any",
    "oneOf": "any",
    "allOf": "any",
    "$ref": "any",
    "$defs": "any",
    "definitions": "any",
    "properties": "object",
    "required": "object",
    "additionalProperties": "object",
    "items": "array",
    "additionalItems": "array",
    "prefixItems": "array",
    "minItems": "array",
    "maxItems": "array",
    "pattern": "string",
    "format": "string",
    "minLength": "string",
    "maxLength": "string",
    "minimum": "number",
    "maximum": "number",
    "exclusiveMinimum": "number",
    "exclusiveMaximum": "number",
    "multipleOf": "number",
}
#: Keywords that constrain nothing (annotations): accepted, ignored.
ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "example",
        "$schema",
        "$id",
        "$anchor",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "strict",
        "nullable",
        "discriminator",
        "contentEncoding",
        "contentMediaType",
    }
)
#: The keywords of JSON Schema (2020-12 and draft 7) the grammar does not enforce, and why.
REFUSED = {
    "not": "a grammar cannot exclude what another schema matches",
    "uniqueItems": "a grammar cannot compare array items with each other",
    "if": "conditional schemas are not enforced",
    "then": "conditional schemas are not enforced",
    "else": "conditional schemas are not enforced",
    "contains": "a grammar cannot count the items that match a schema",
    "minContains": "a grammar cannot count the items that match a schema",
    "maxContains": "a grammar cannot count the items that match a schema",
    "patternProperties": "property names by pattern are not enforced",
    "propertyNames": "property names by schema are not enforced",
    "dependentRequired": "dependencies between properties are not enforced",
    "dependentSchemas": "dependencies between properties are not enforced",
    "dependencies": "dependencies between properties are not enforced",
    "minProperties": "property counts are not enforced",
    "maxProperties": "property counts are not enforced",
    "unevaluatedProperties": "unevaluated properties are not enforced",
    "unevaluatedItems": "unevaluated items are not enforced",
    "$dynamicRef": "dynamic references are not enforced",
    "$recursiveRef": "dynamic references are not enforced",
}
_TYPES = ("null", "boolean", "object", "array", "number", "string", "integer")


def json_text(value: object) -> str:
    """``value`` as the grammar writes it (JSON, non-ASCII raw, DEL escaped)."""
    return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")


def types_of(schema: Mapping[str, Any], where: str) -> list[str]:
    """The JSON types ``schema`` is generated as: its ``type``, or those its keywords
    constrain (an object's keywords make an object), or every type."""
    declared = schema.get("type")
    if declared is not None:
        kinds = declared if isinstance(declared, list) else [declared]
        for kind in kinds:
            if kind not in _TYPES:
                raise SchemaError(f"{where}: unknown type {kind!r}", keyword="type")
        if "number" in kinds and "integer" in kinds:
            kinds = [k for k in kinds if k != "integer"]
        return list(dict.fromkeys(kinds))
    implied = {ENFORCED[k] for k in schema if ENFORCED.get(k) not in (None, "any")}
    order = ("object", "array", "string", "number")
    return [k for k in order if k in implied] or list(_TYPES[:-1])


_BOUNDS = frozenset(
    {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}
    | {"minItems", "maxItems", "minLength", "maxLength"}
)


def _stricter(key: str, a: Any, b: Any) -> Any:
    if key in ("minimum", "exclusiveMinimum", "minItems", "minLength"):
        return max(a, b)
    return min(a, b)


def merge(
    parts: Sequence[Mapping[str, Any]], resolve: Callable[[str], Mapping[str, Any]], where: str
) -> dict[str, Any]:
    """One schema that holds exactly when all of ``parts`` do (``allOf``, or ``$ref`` with
    sibling keywords), or :class:`SchemaError` naming what cannot be merged."""
    flat: list[Mapping[str, Any]] = []
    for part in parts:
        for _ in range(32):
            if "$ref" not in part:
                break
            rest = {k: v for k, v in part.items() if k != "$ref"}
            if rest:
                flat.append(rest)
            part = resolve(part["$ref"])
        if "allOf" in part:
            flat += merge_all(part, resolve, where)
        else:
            flat.append(part)
    out: dict[str, Any] = {}
    for part in flat:
        for key, value in part.items():
            if key in ANNOTATIONS or key in ("$defs", "definitions"):
                out.setdefault(key, value)
            elif key not in out:
                out[key] = value
            elif key == "type":
                a, b = types_of({"type": out[key]}, where), types_of({"type": value}, where)
                both = [t for t in a if t in b or (t == "integer" and "number" in b)]
                both += [t for t in b if t == "integer" and "number" in a and t not in both]
                if not both:
                    raise UnenforcedError(
                        f"{where}: allOf asks for types {a} and {b} at once", keyword="allOf"
                    )
                out[key] = both
            elif key == "required":
                out[key] = list(dict.fromkeys([*out[key], *value]))
            elif key == "properties":
                merged = dict(out[key])
                for name, sub in value.items():
                    merged[name] = {"allOf": [merged[name], sub]} if name in merged else sub
                out[key] = merged
            elif key in ("items", "additionalProperties"):
                out[key] = {"allOf": [out[key], value]}
            elif key in ("enum", "const"):
                a = out[key] if key == "enum" else [out[key]]
                b = value if key == "enum" else [value]
                keep = [v for v in a if json_text(v) in {json_text(w) for w in b}]
                out[key] = keep if key == "enum" else (keep[0] if keep else None)
                if not keep:
                    raise UnenforcedError(
                        f"{where}: allOf leaves no value of its enum or const", keyword="allOf"
                    )
            elif key in _BOUNDS:
                out[key] = _stricter(key, out[key], value)
            elif key == "pattern":
                out[key] = [*_as_list(out[key]), *_as_list(value)]
            elif json_text(out[key]) != json_text(value):
                raise UnenforcedError(
                    f"{where}: allOf combines two different '{key}'", keyword="allOf"
                )
    _close_properties(flat, out)
    return out


def merge_all(
    schema: Mapping[str, Any], resolve: Callable[[str], Mapping[str, Any]], where: str
) -> list[Mapping[str, Any]]:
    parts = schema["allOf"]
    if not isinstance(parts, list) or not parts:
        raise SchemaError(f"{where}.allOf must be a non-empty array")
    rest = {k: v for k, v in schema.items() if k != "allOf"}
    return [rest, *parts] if rest else list(parts)


def _as_list(value: Any) -> list[Any]:
    return list(value) if isinstance(value, list) else [value]


def _close_properties(parts: Sequence[Mapping[str, Any]], out: dict[str, Any]) -> None:
    """A part's ``additionalProperties`` also judges the properties other parts declare."""
    properties = out.get("properties", {})
    for part in parts:
        extra = part.get("additionalProperties")
        if extra is None or extra is True:
            continue
        own = part.get("properties", {})
        for name in list(properties):
            if name in own:
                continue
            if extra is False:
                if name in out.get("required", ()):
                    raise UnenforcedError(
                        f"allOf requires '{name}', which another part's "
                        f"additionalProperties forbids",
                        keyword="allOf",
                    )
                del properties[name]
            else:
                properties[name] = {"allOf": [properties[name], extra]}


def _json_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object" if isinstance(value, dict) else "null"


def _signature(
    schema: Mapping[str, Any], resolve: Callable[[str], Mapping[str, Any]]
) -> tuple[frozenset[str], dict[str, frozenset[str]]]:
    """The types a schema allows and, for an object, its required properties' fixed values."""
    for _ in range(32):
        if "$ref" not in schema:
            break
        schema = resolve(schema["$ref"])
    values = None
    if "const" in schema:
        values = [schema["const"]]
    elif "enum" in schema:
        values = list(schema["enum"])
    if values is not None:
        kinds = frozenset(_json_type(v) for v in values)
    else:
        kinds = frozenset("number" if t == "integer" else t for t in types_of(schema, ""))
    fixed: dict[str, frozenset[str]] = {}
    properties = schema.get("properties", {})
    for name in schema.get("required", ()):
        sub = properties.get(name) if isinstance(properties, dict) else None
        if isinstance(sub, dict) and ("const" in sub or "enum" in sub):
            allowed = [sub["const"]] if "const" in sub else sub["enum"]
            fixed[name] = frozenset(json_text(v) for v in allowed)
    return kinds, fixed


def disjoint(
    branches: Sequence[Mapping[str, Any]], resolve: Callable[[str], Mapping[str, Any]]
) -> bool:
    """Whether no value can match two of ``branches`` (so ``oneOf`` is ``anyOf``): they
    allow different types, or objects that differ in a required property's fixed values (a
    discriminated union)."""
    signatures = [_signature(b, resolve) for b in branches]
    for i, (kinds_a, fixed_a) in enumerate(signatures):
        for kinds_b, fixed_b in signatures[i + 1 :]:
            common = kinds_a & kinds_b
            if not common:
                continue
            if common == {"object"} and any(
                name in fixed_b and not fixed_a[name] & fixed_b[name] for name in fixed_a
            ):
                continue
            return False
    return True
