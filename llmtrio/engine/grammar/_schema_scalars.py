"""The plain JSON values' rules, and the numbers and strings a schema's keywords allow, as
automata (:mod:`._automaton`). Pure.

Numbers: ``minimum``, ``maximum``, their exclusive forms and ``multipleOf`` (:mod:`._numbers`).
Strings: ``format`` (:mod:`._formats`), ``pattern`` (:mod:`._regex`), ``minLength`` and
``maxLength``. A keyword that cannot be enforced goes to ``cannot`` (which raises for a strict
schema, and otherwise records it and lets the automaton be made without it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from decimal import Decimal
from typing import Any

from ._automaton import ANY_STRING, Dfa, TooComplexError
from ._formats import FORMATS, format_dfa
from ._gbnf import SPACE
from ._numbers import MAX_DIVISOR, divisor, range_dfa
from ._regex import PatternError, pattern_dfa
from ._schema_keywords import ENFORCED, SchemaError

__all__ = ["PRIMITIVES", "Cannot", "count", "number_dfa", "string_dfa"]

#: The plain JSON values' rules: name -> (body, the rules it uses).
PRIMITIVES: dict[str, tuple[str, tuple[str, ...]]] = {
    "space": (SPACE, ()),
    "boolean": ('"true" | "false"', ()),
    "null": ('"null"', ()),
    "decimal-part": ("[0-9]{1,16}", ()),
    "integral-part": ("[0] | [1-9] [0-9]{0,15}", ()),
    "number": (
        '"-"? integral-part ("." decimal-part)? ([eE] [-+]? integral-part)?',
        ("integral-part", "decimal-part"),
    ),
    "integer": ('"-"? integral-part', ("integral-part",)),
    "char": (r'[^"\\\x7F\x00-\x1F] | [\\] (["\\bfnrt] | "u" [0-9a-fA-F]{4})', ()),
    "string": ('"\\"" char* "\\""', ("char",)),
    "value": (
        "object | array | string | number | boolean | null",
        ("object", "array", "string", "number", "boolean", "null"),
    ),
    "object": (
        '"{" space ( string space ":" space value space '
        '( "," space string space ":" space value space )* )? "}"',
        ("space", "string", "value"),
    ),
    "array": (
        '"[" space ( value space ( "," space value space )* )? "]"',
        ("space", "value"),
    ),
}

#: ``cannot(where, keyword, why)``: a keyword the grammar cannot enforce at ``where``.
Cannot = Callable[[str, str, str], None]


def _number(value: object, where: str, key: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SchemaError(f"{where}: '{key}' must be a number")
    return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)


def count(schema: Mapping[str, Any], key: str, where: str) -> int | None:
    """A count keyword's value (``minLength``, ``maxItems``...), or ``None`` when absent."""
    value = schema.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaError(f"{where}: '{key}' must be a non-negative integer")
    return value


def _keys(schema: Mapping[str, Any], kind: str) -> str:
    return ", ".join(k for k in schema if ENFORCED.get(k) == kind)


def number_dfa(
    schema: Mapping[str, Any], *, integer: bool, where: str, cannot: Cannot
) -> Dfa | None:
    """The numbers the numeric keywords allow, or ``None`` when none is left to enforce
    (any number)."""
    low = high = None
    low_exclusive = high_exclusive = False
    for key, exclusive in (("minimum", False), ("exclusiveMinimum", True)):
        if key in schema:
            value = _number(schema[key], where, key)
            if low is None or value > low or (value == low and exclusive):
                low, low_exclusive = value, exclusive
    for key, exclusive in (("maximum", False), ("exclusiveMaximum", True)):
        if key in schema:
            value = _number(schema[key], where, key)
            if high is None or value < high or (value == high and exclusive):
                high, high_exclusive = value, exclusive
    multiple = None
    if "multipleOf" in schema:
        step = _number(schema["multipleOf"], where, "multipleOf")
        if step <= 0:
            raise SchemaError(f"{where}: 'multipleOf' must be above 0")
        multiple = divisor(step)
        if multiple is None:
            cannot(
                where,
                "multipleOf",
                f"'multipleOf' {schema['multipleOf']} is not enforced (a multiple of d / 10^k "
                f"with an integer d up to {MAX_DIVISOR} is)",
            )
    if low is None and high is None and multiple is None:
        return None
    try:
        dfa = range_dfa(
            low=low,
            low_exclusive=low_exclusive,
            high=high,
            high_exclusive=high_exclusive,
            multiple=multiple,
            integer=integer,
        )
    except TooComplexError:
        cannot(where, _keys(schema, "number"), "the numeric keywords make too large a grammar")
        return None
    if dfa.empty:
        cannot(where, _keys(schema, "number"), "no number meets the bounds and 'multipleOf'")
        return None
    return dfa


def string_dfa(schema: Mapping[str, Any], where: str, cannot: Cannot) -> Dfa | None:
    """The strings the string keywords allow, or ``None`` when none is given (or none is
    left to enforce)."""
    dfa: Dfa | None = None
    patterns = schema.get("pattern", [])
    patterns = patterns if isinstance(patterns, list) else [patterns]
    if not all(isinstance(p, str) for p in patterns):
        raise SchemaError(f"{where}: 'pattern' must be a string")
    low, high = count(schema, "minLength", where), count(schema, "maxLength", where)
    if low is not None and high is not None and low > high:
        cannot(where, "maxLength", "'minLength' is above 'maxLength'")
        low = high = None
    try:
        if "format" in schema:
            name = schema["format"]
            if name in FORMATS:
                dfa = format_dfa(name)
            else:
                cannot(
                    where,
                    "format",
                    f"the string format {name!r} is not supported (supported: "
                    f"{', '.join(sorted(FORMATS))})",
                )
        for pattern in patterns:
            try:
                found = pattern_dfa(pattern)
            except PatternError as exc:
                cannot(
                    where, "pattern", f"the pattern {pattern!r} uses {exc}, which is not supported"
                )
                continue
            dfa = found if dfa is None else dfa.intersect(found)
        if low is not None or high is not None:
            dfa = (dfa or ANY_STRING).bounded(low or 0, high)
    except TooComplexError:
        cannot(
            where,
            _keys(schema, "string"),
            "the string keywords (pattern, format, lengths) make too large a grammar",
        )
        return None
    if dfa is not None and dfa.empty:
        cannot(
            where, _keys(schema, "string"), "no string meets pattern, format and lengths at once"
        )
        return None
    return dfa
