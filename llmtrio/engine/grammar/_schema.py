"""JSON Schema to GBNF: the grammar of the JSON values a schema accepts. Pure.

Every keyword of :data:`ENFORCED` is enforced exactly, over the forms the grammar writes:
objects list their properties in the schema's order (required ones always, optional ones
when chosen, extra ones, where ``additionalProperties`` allows them, after the declared);
whitespace is none, a space, or a newline and a bounded indent; strings escape only what JSON
must; numbers are as :mod:`._numbers` says. So every value the grammar accepts is valid for
the schema, and every valid value written in these forms is accepted. A keyword that cannot
be enforced is a :class:`SchemaError` naming it.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from ._automaton import ANY_STRING, Dfa, TooComplexError, none_of, one_of, to_gbnf, without
from ._formats import FORMATS, format_dfa
from ._gbnf import SPACE, Rules, literal, repetition
from ._numbers import MAX_DIVISOR, divisor, range_dfa
from ._regex import PatternError, pattern_dfa
from ._schema_keywords import (
    ANNOTATIONS,
    ENFORCED,
    REFUSED,
    SchemaError,
    disjoint,
    json_text,
    merge,
    merge_all,
    types_of,
)

__all__ = ["SchemaConverter", "SchemaError", "schema_grammar"]

_PRIMITIVES = {
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
_QUOTE = literal('"')
_MAX_DEPTH = 64


def _number(value: object, where: str, key: str) -> Decimal:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SchemaError(f"{where}: '{key}' must be a number")
    return Decimal(repr(value)) if isinstance(value, float) else Decimal(value)


def _count(schema: Mapping[str, Any], key: str, where: str) -> int | None:
    value = schema.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SchemaError(f"{where}: '{key}' must be a non-negative integer")
    return value


class SchemaConverter:
    """Builds rules for schemas into one :class:`Rules`; ``root`` is the document ``$ref``
    resolves against."""

    def __init__(self, rules: Rules, root: object, where: str) -> None:
        self.rules = rules
        self.root = root
        self.where = where
        self._refs: dict[str, str] = {}
        self._seen: dict[str, str] = {}
        self._depth = 0

    # -- helpers ---------------------------------------------------------------------------

    def primitive(self, name: str) -> str:
        if not self.rules.has(name):
            body, deps = _PRIMITIVES[name]
            self.rules.define(name, body)
            for dep in deps:
                self.primitive(dep)
        return name

    def resolve(self, ref: str) -> Mapping[str, Any]:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise SchemaError(f"{self.where}: only local references ('#/...') are supported")
        node: Any = self.root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            key = urllib.parse.unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and key in node:
                node = node[key]
            elif isinstance(node, list) and key.isdigit() and int(key) < len(node):
                node = node[int(key)]
            else:
                raise SchemaError(f"{self.where}: the reference {ref!r} points nowhere")
        if node is True:
            return {}
        if not isinstance(node, dict):
            raise SchemaError(f"{self.where}: the reference {ref!r} is not a schema")
        return node

    def _check(self, schema: Mapping[str, Any], where: str) -> None:
        for key in schema:
            if key in ENFORCED or key in ANNOTATIONS:
                continue
            why = REFUSED.get(key, "structured output enforces " + ", ".join(sorted(ENFORCED)))
            raise SchemaError(f"{where}: the JSON schema keyword '{key}' is not supported ({why})")

    # -- values ----------------------------------------------------------------------------

    def document(self, where: str) -> str:
        """The root document's rule (recursive references to ``#`` use the same)."""
        if isinstance(self.root, bool):
            return self.value(self.root, "root", where)
        return self._ref("#", where)

    def value(self, schema: object, hint: str, where: str) -> str:
        """A GBNF expression (a rule name) for the JSON values ``schema`` accepts."""
        if schema is True:
            return self.primitive("value")
        if schema is False:
            raise SchemaError(f"{where}: a 'false' schema matches nothing")
        if not isinstance(schema, dict):
            raise SchemaError(f"{where} must be a JSON schema object")
        key = json_text(schema)
        known = self._seen.get(key)
        if known is not None:
            return known
        self._depth += 1
        try:
            if self._depth > _MAX_DEPTH:
                raise SchemaError(f"{where}: the schema nests too deep")
            name = self._seen[key] = self._value(schema, hint, where)
            return name
        finally:
            self._depth -= 1

    def _value(self, schema: dict[str, Any], hint: str, where: str) -> str:
        self._check(schema, where)
        constraints = {k: v for k, v in schema.items() if k not in ANNOTATIONS}
        constraints.pop("$defs", None)
        constraints.pop("definitions", None)
        if "$ref" in constraints:
            if len(constraints) == 1:
                return self._ref(constraints["$ref"], where)
            return self.value(merge([constraints], self.resolve, where), hint, where)
        if "allOf" in constraints:
            parts = merge_all(constraints, self.resolve, where)
            return self.value(merge(parts, self.resolve, where), hint, where)
        for key in ("anyOf", "oneOf"):
            if key in constraints:
                return self._union(constraints, key, hint, where)
        if not constraints:
            return self.primitive("value")
        if "const" in constraints or "enum" in constraints:
            return self._enum(constraints, hint, where)
        alternatives = [
            self._typed(kind, constraints, hint, where) for kind in types_of(constraints, where)
        ]
        if len(alternatives) == 1:
            return alternatives[0]
        return self.rules.add(hint, " | ".join(alternatives))

    def _ref(self, ref: str, where: str) -> str:
        name = self._refs.get(ref)
        if name is None:
            label = f"ref-{ref.rsplit('/', 1)[-1]}" if ref != "#" else "schema"
            name = self._refs[ref] = self.rules.name(label)
            self.rules.define(name, self.value(self.resolve(ref), name, f"{self.where}{ref[1:]}"))
        return name

    def _union(self, schema: dict[str, Any], key: str, hint: str, where: str) -> str:
        branches = schema[key]
        if not isinstance(branches, list) or not branches:
            raise SchemaError(f"{where}.{key} must be a non-empty array")
        rest = {k: v for k, v in schema.items() if k != key}
        if rest:
            branches = [merge([rest, b], self.resolve, where) for b in branches]
        if key == "oneOf" and not disjoint(branches, self.resolve):
            raise SchemaError(
                f"{where}: 'oneOf' whose branches may overlap is not enforced (a grammar "
                f"cannot exclude a value two branches match); use anyOf, or a property with "
                f"a different const in each branch"
            )
        alternatives = [
            self.value(b, f"{hint}-{i}", f"{where}.{key}[{i}]") for i, b in enumerate(branches)
        ]
        return self.rules.add(hint, " | ".join(dict.fromkeys(alternatives)))

    def _enum(self, schema: dict[str, Any], hint: str, where: str) -> str:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        if not isinstance(values, list) or not values:
            raise SchemaError(f"{where}: 'enum' must be a non-empty array")
        rest = {k: v for k, v in schema.items() if k not in ("const", "enum")}
        kept = [v for v in values if self._allows(rest, v, where)]
        if not kept:
            raise SchemaError(
                f"{where}: no value of 'enum' or 'const' meets the schema's other keywords"
            )
        texts = dict.fromkeys(literal(json_text(v)) for v in kept)
        return self.rules.add(hint, " | ".join(texts))

    def _allows(self, schema: dict[str, Any], value: object, where: str) -> bool:
        """Whether ``value`` of an enum meets the type, string and number keywords beside it
        (object and array keywords beside an enum are refused)."""
        for key in schema:
            if ENFORCED.get(key) in ("object", "array"):
                raise SchemaError(f"{where}: '{key}' beside 'enum' or 'const' is not enforced")
        kinds = types_of({"type": schema["type"]}, where) if "type" in schema else None
        if isinstance(value, bool):
            return kinds is None or "boolean" in kinds
        if isinstance(value, int | float):
            integral = isinstance(value, int) or float(value).is_integer()
            if (
                kinds is not None
                and "number" not in kinds
                and not ("integer" in kinds and integral)
            ):
                return False
            if not any(ENFORCED.get(k) == "number" for k in schema):
                return True
            return self._number_dfa(schema, integer=False, where=where).accepts(json_text(value))
        if isinstance(value, str):
            if kinds is not None and "string" not in kinds:
                return False
            strings = self._string_dfa(schema, where)
            return strings is None or strings.accepts(value)
        kind = "null" if value is None else "array" if isinstance(value, list) else "object"
        return kinds is None or kind in kinds

    def _typed(self, kind: str, schema: dict[str, Any], hint: str, where: str) -> str:
        if kind in ("null", "boolean"):
            return self.primitive(kind)
        if kind in ("integer", "number"):
            if not any(ENFORCED.get(k) == "number" for k in schema):
                return self.primitive(kind)
            dfa = self._number_dfa(schema, integer=kind == "integer", where=where)
            return to_gbnf(dfa, self.rules, f"{hint}-{kind}", json_string=False)
        if kind == "string":
            return self.string(schema, hint, where)
        if kind == "array":
            return self._array(schema, hint, where)
        return self._object(schema, hint, where)

    # -- numbers and strings ---------------------------------------------------------------

    def _number_dfa(self, schema: dict[str, Any], *, integer: bool, where: str) -> Dfa:
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
                raise SchemaError(
                    f"{where}: 'multipleOf' {schema['multipleOf']} is not enforced (a "
                    f"multiple of d / 10^k with an integer d up to {MAX_DIVISOR} is)"
                )
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
            raise SchemaError(f"{where}: the numeric keywords make too large a grammar") from None
        if dfa.empty:
            raise SchemaError(f"{where}: no number meets the bounds and 'multipleOf'")
        return dfa

    def _string_dfa(self, schema: dict[str, Any], where: str) -> Dfa | None:
        """The strings the string keywords allow, or ``None`` when none is given."""
        dfa: Dfa | None = None
        try:
            if "format" in schema:
                name = schema["format"]
                if name not in FORMATS:
                    raise SchemaError(
                        f"{where}: the string format {name!r} is not supported (supported: "
                        f"{', '.join(sorted(FORMATS))})"
                    )
                dfa = format_dfa(name)
            patterns = schema.get("pattern", [])
            for pattern in patterns if isinstance(patterns, list) else [patterns]:
                if not isinstance(pattern, str):
                    raise SchemaError(f"{where}: 'pattern' must be a string")
                try:
                    found = pattern_dfa(pattern)
                except PatternError as exc:
                    raise SchemaError(
                        f"{where}: the pattern {pattern!r} uses {exc}, which is not supported"
                    ) from None
                dfa = found if dfa is None else dfa.intersect(found)
            low, high = _count(schema, "minLength", where), _count(schema, "maxLength", where)
            if low is not None or high is not None:
                dfa = (dfa or ANY_STRING).bounded(low or 0, high)
        except TooComplexError:
            raise SchemaError(
                f"{where}: the string keywords (pattern, format, lengths) make too large a grammar"
            ) from None
        if dfa is not None and dfa.empty:
            raise SchemaError(f"{where}: no string meets pattern, format and lengths at once")
        return dfa

    def string(self, schema: dict[str, Any], hint: str, where: str) -> str:
        keys = {k for k in schema if ENFORCED.get(k) == "string"}
        if not keys:
            return self.primitive("string")
        if keys <= {"minLength", "maxLength"}:
            low, high = _count(schema, "minLength", where), _count(schema, "maxLength", where)
            if high is not None and (low or 0) > high:
                raise SchemaError(f"{where}: 'minLength' is above 'maxLength'")
            body = repetition(self.primitive("char"), low or 0, high)
            return self.rules.add(f"{hint}-string", f"{_QUOTE} {body} {_QUOTE}")
        dfa = self._string_dfa(schema, where)
        assert dfa is not None
        start = to_gbnf(dfa, self.rules, f"{hint}-string", json_string=True)
        return self.rules.add(f"{hint}-string", f"{_QUOTE} {start} {_QUOTE}")

    def raw_string(self, schema: dict[str, Any], hint: str, where: str, forbid: str) -> str:
        """A string's characters unquoted and unescaped (an XML tool-call parameter), never
        holding ``forbid``."""
        dfa = self._string_dfa(schema, where) or ANY_STRING
        if "const" in schema or "enum" in schema:
            values = [schema["const"]] if "const" in schema else schema["enum"]
            if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
                raise SchemaError(f"{where}: a raw string's 'enum' must hold strings only")
            dfa = dfa.intersect(one_of(tuple(values)))
        try:
            dfa = dfa.intersect(without(forbid))
        except TooComplexError:
            raise SchemaError(f"{where}: the string keywords make too large a grammar") from None
        if dfa.empty:
            raise SchemaError(f"{where}: no string meets the keywords without {forbid!r}")
        return to_gbnf(dfa, self.rules, f"{hint}-raw", json_string=False)

    # -- arrays and objects ----------------------------------------------------------------

    def _array(self, schema: dict[str, Any], hint: str, where: str) -> str:
        low = _count(schema, "minItems", where) or 0
        high = _count(schema, "maxItems", where)
        if high is not None and low > high:
            raise SchemaError(f"{where}: 'minItems' is above 'maxItems'")
        prefix = schema.get("prefixItems", [])
        if not isinstance(prefix, list):
            raise SchemaError(f"{where}.prefixItems must be an array")
        firsts = [
            self.value(s, f"{hint}-{i}", f"{where}.prefixItems[{i}]") for i, s in enumerate(prefix)
        ]
        items = schema.get("items", True)
        item = None if items is False else self.value(items, f"{hint}-item", f"{where}.items")
        if item is None:
            high = len(firsts) if high is None else min(high, len(firsts))
            if low > high:
                raise SchemaError(f"{where}: 'minItems' asks for more items than allowed")
        space, comma = self.primitive("space"), f'"," {self.primitive("space")}'

        def tail(at: int, first: bool) -> str:
            if high is not None and at >= high:
                return ""
            if at >= len(firsts):
                assert item is not None
                left_low = max(low - at, 0)
                left_high = None if high is None else high - at
                if first:
                    return repetition(f"{item} {space}", left_low, left_high, comma)
                return repetition(f"{comma} {item} {space}", left_low, left_high)
            sequence = f"{'' if first else comma + ' '}{firsts[at]} {space} {tail(at + 1, False)}"
            return sequence if at < low else f"( {sequence} )?"

        return self.rules.add(f"{hint}-array", f'"[" {space} {tail(0, True)} "]"')

    def _object(self, schema: dict[str, Any], hint: str, where: str) -> str:
        properties = schema.get("properties", {})
        required = schema.get("required", [])
        extra = schema.get("additionalProperties")
        if not isinstance(properties, dict):
            raise SchemaError(f"{where}.properties must be an object")
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError(f"{where}.required must be an array of names")
        properties = dict(properties)
        for name in required:
            if name not in properties:
                if extra is False:
                    raise SchemaError(
                        f"{where}: '{name}' is required but not in properties, and "
                        f"additionalProperties is false"
                    )
                properties[name] = True if extra is None else extra
        space = self.primitive("space")
        pairs = []
        for name, sub in properties.items():
            value = self.value(sub, f"{hint}-{name}", f"{where}.properties.{name}")
            key = literal(json_text(name))
            pairs.append((name in required, f'{key} {space} ":" {space} {value} {space}'))
        comma = f'"," {space}'
        if extra is None or extra is False:
            rest, first = "", ""
        else:
            key = self._other_key(list(properties), hint)
            value = self.value(extra, f"{hint}-additional", f"{where}.additionalProperties")
            pair = self.rules.add(
                f"{hint}-additional-kv", f'{key} {space} ":" {space} {value} {space}'
            )
            rest = f"( {comma} {pair} )*"
            first = f"( {pair} {rest} )?"
        # rest: the pairs from i on after one already written; first: before any.
        for i in range(len(pairs) - 1, -1, -1):
            is_required, pair = pairs[i]
            after = self.rules.add(f"{hint}-after-{i}", rest) if rest else ""
            if is_required:
                rest, first = f"{comma} {pair} {after}", f"{pair} {after}"
            else:
                alone = self.rules.add(f"{hint}-from-{i + 1}", first) if first else '""'
                rest = f"( {comma} {pair} )? {after}"
                first = f"{pair} {after} | {alone}"
        body = f'"{{" {space} ' + (f"( {first} ) " if first else "") + '"}"'
        return self.rules.add(f"{hint}-object", body)

    def _other_key(self, names: list[str], hint: str) -> str:
        """A JSON string that is none of ``names``."""
        dfa = none_of(tuple(names))
        start = to_gbnf(dfa, self.rules, f"{hint}-other-key", json_string=True)
        return self.rules.add(f"{hint}-other-key", f"{_QUOTE} {start} {_QUOTE}")


def schema_grammar(schema: object, where: str) -> str:
    """The whole grammar for ``schema`` (root rule ``root``)."""
    rules = Rules()
    rules.define("root", "")
    converter = SchemaConverter(rules, schema, where)
    rules.define("root", converter.document(where))
    return rules.text()
