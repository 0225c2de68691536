"""JSON Schema to GBNF: the grammar of the JSON values a schema accepts. Pure.

Every keyword of :data:`ENFORCED` is enforced exactly, over the forms the grammar writes:
objects list their properties in the schema's order (required ones always, optional ones
when chosen, extra ones, where ``additionalProperties`` allows them, after the declared);
whitespace is none, a space, or a newline and a bounded indent; strings escape only what JSON
must; numbers are as :mod:`._numbers` says. So every value the grammar accepts is valid for
the schema, and every valid value written in these forms is accepted.

A keyword that cannot be enforced (:data:`REFUSED`, an unknown one, a string format or
pattern outside what is supported, an overlapping ``oneOf``...) is an
:class:`UnenforcedError` naming it in a strict schema. In one that is not strict it is
relaxed: the sub-schema that holds it becomes what the grammar can enforce without it (any
string for an unknown format, an object whose keys are free for ``propertyNames``, ``anyOf``
for an overlapping ``oneOf``), and a :class:`Relaxation` records where and why. A sub-schema
that is not one (an unknown type, a reference that points nowhere) is a :class:`SchemaError`
in a strict schema, and any JSON value (relaxed) in one that is not.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Mapping
from typing import Any

from ._automaton import ANY_STRING, TooComplexError, none_of, one_of, to_gbnf, without
from ._gbnf import Rules, literal, repetition
from ._schema_keywords import (
    ANNOTATIONS,
    ENFORCED,
    REFUSED,
    Relaxation,
    SchemaError,
    UnenforcedError,
    disjoint,
    json_text,
    merge,
    merge_all,
    types_of,
)
from ._schema_scalars import PRIMITIVES, count, number_dfa, string_dfa

__all__ = ["SchemaConverter", "SchemaError", "schema_grammar"]

_QUOTE = literal('"')
_MAX_DEPTH = 64


class SchemaConverter:
    """Builds rules for schemas into one :class:`Rules`; ``root`` is the document ``$ref``
    resolves against. ``strict``: a keyword the grammar cannot enforce is an
    :class:`UnenforcedError`; else it is relaxed and recorded in :attr:`relaxed`.

    Error handling: :class:`SchemaError` from any method (a half-built rule may then be left
    in ``rules``: build into rules that are dropped on failure, :meth:`Rules.checkpoint`).
    """

    def __init__(self, rules: Rules, root: object, where: str, *, strict: bool = True) -> None:
        self.rules = rules
        self.root = root
        self.where = where
        self.strict = strict
        #: What was relaxed (never anything when ``strict``).
        self.relaxed: list[Relaxation] = []
        self._refs: dict[str, str] = {}
        self._seen: dict[str, str] = {}
        self._cached: list[tuple[dict[str, str], str]] = []  # what entered those, in order
        self._depth = 0

    def _remember(self, table: dict[str, str], key: str, name: str) -> str:
        table[key] = name
        self._cached.append((table, key))
        return name

    def _mark(self) -> tuple[int, int, int]:
        return self.rules.checkpoint(), len(self._cached), len(self.relaxed)

    def _undo(self, mark: tuple[int, int, int]) -> None:
        """Forget what was built since ``mark``: its rules, the caches naming them, and what
        it relaxed."""
        rules, cached, relaxed = mark
        self.rules.rollback(rules)
        while len(self._cached) > cached:
            table, key = self._cached.pop()
            del table[key]
        del self.relaxed[relaxed:]

    def cannot(self, where: str, keyword: str, why: str) -> None:
        """``keyword`` at ``where`` cannot be enforced: refused when strict, else recorded
        (the caller goes on without it).

        Error handling: :class:`UnenforcedError` when strict.
        """
        if self.strict:
            raise UnenforcedError(f"{where}: {why}", keyword=keyword)
        self.relaxed.append(Relaxation(where, keyword, why))

    def _relax(self, exc: UnenforcedError, where: str) -> None:
        if self.strict:
            raise exc
        why = str(exc)
        self.relaxed.append(Relaxation(where, exc.keyword, why.removeprefix(f"{where}: ")))

    # -- helpers ---------------------------------------------------------------------------

    def primitive(self, name: str) -> str:
        if not self.rules.has(name):
            body, deps = PRIMITIVES[name]
            self.rules.define(name, body)
            for dep in deps:
                self.primitive(dep)
        return name

    def resolve(self, ref: str) -> Mapping[str, Any]:
        if not isinstance(ref, str):
            raise SchemaError(f"{self.where}: '$ref' must be a string")
        if not ref.startswith("#"):
            raise UnenforcedError(
                f"{self.where}: only local references ('#/...') are supported", keyword="$ref"
            )
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

    def _enforceable(self, schema: dict[str, Any], where: str) -> dict[str, Any]:
        """``schema`` without the keywords the grammar does not enforce (each relaxed)."""
        dropped = []
        for key in schema:
            if key in ENFORCED or key in ANNOTATIONS:
                continue
            why = REFUSED.get(key, "structured output enforces " + ", ".join(sorted(ENFORCED)))
            self.cannot(where, key, f"the JSON schema keyword '{key}' is not supported ({why})")
            dropped.append(key)
        return {k: v for k, v in schema.items() if k not in dropped} if dropped else schema

    def _merged(
        self, parts: list[Mapping[str, Any]], fallback: dict[str, Any], where: str
    ) -> dict[str, Any]:
        """``parts`` merged into one schema (:func:`merge`), or ``fallback`` where they
        cannot be (relaxed)."""
        try:
            return merge(parts, self.resolve, where)
        except UnenforcedError as exc:
            self._relax(exc, where)
            return fallback

    # -- values ----------------------------------------------------------------------------

    def document(self, where: str) -> str:
        """The root document's rule (recursive references to ``#`` use the same)."""
        if isinstance(self.root, bool):
            return self.value(self.root, "root", where)
        return self._ref("#", where)

    def value(self, schema: object, hint: str, where: str) -> str:
        """A GBNF expression (a rule name) for the JSON values ``schema`` accepts (when not
        strict, any JSON value for a sub-schema that is not a schema)."""
        if self.strict:
            return self._checked(schema, hint, where)
        mark = self._mark()
        try:
            return self._checked(schema, hint, where)
        except SchemaError as exc:
            self._undo(mark)
            why = f"{str(exc).removeprefix(f'{where}: ')}; any JSON value is taken there"
            self.relaxed.append(Relaxation(where, exc.keyword, why))
            return self.primitive("value")

    def _checked(self, schema: object, hint: str, where: str) -> str:
        if schema is True:
            return self.primitive("value")
        if schema is False:
            if self.strict:
                raise SchemaError(f"{where}: a 'false' schema matches nothing")
            self.cannot(where, "false", "a 'false' schema matches nothing")
            return self.primitive("value")
        if not isinstance(schema, dict):
            raise SchemaError(f"{where} must be a JSON schema object")
        key = json_text(schema)
        known = self._seen.get(key)
        if known is not None:
            return known
        self._depth += 1
        try:
            if self._depth > _MAX_DEPTH:
                if self.strict:
                    raise SchemaError(f"{where}: the schema nests too deep")
                self.cannot(where, "$ref", f"the schema nests over {_MAX_DEPTH} deep")
                return self.primitive("value")
            return self._remember(self._seen, key, self._value(schema, hint, where))
        finally:
            self._depth -= 1

    def _value(self, schema: dict[str, Any], hint: str, where: str) -> str:
        schema = self._enforceable(schema, where)
        constraints = {k: v for k, v in schema.items() if k not in ANNOTATIONS}
        constraints.pop("$defs", None)
        constraints.pop("definitions", None)
        if "$ref" in constraints:
            if len(constraints) == 1:
                return self._ref(constraints["$ref"], where)
            alone = {"$ref": constraints["$ref"]}
            return self.value(self._merged([constraints], alone, where), hint, where)
        if "allOf" in constraints:
            parts = merge_all(constraints, self.resolve, where)
            rest = {k: v for k, v in constraints.items() if k != "allOf"}
            return self.value(self._merged(parts, rest, where), hint, where)
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
            try:
                target = self.resolve(ref)
            except UnenforcedError as exc:
                self._relax(exc, where)
                return self.primitive("value")
            label = f"ref-{ref.rsplit('/', 1)[-1]}" if ref != "#" else "schema"
            name = self._remember(self._refs, ref, self.rules.name(label))
            self.rules.define(name, self.value(target, name, f"{self.where}{ref[1:]}"))
        return name

    def _union(self, schema: dict[str, Any], key: str, hint: str, where: str) -> str:
        branches = schema[key]
        if not isinstance(branches, list) or not branches:
            raise SchemaError(f"{where}.{key} must be a non-empty array")
        rest = {k: v for k, v in schema.items() if k != key}
        branches = [b for b in branches if b is not False]  # matches nothing: never written
        if not branches:
            return self.value(False, hint, where)
        if rest:
            branches = [
                b if b is True else self._merged([rest, b], b, f"{where}.{key}[{i}]")
                for i, b in enumerate(branches)
            ]
            branches = [rest if b is True else b for b in branches]
        if key == "oneOf" and not disjoint(branches, self.resolve):
            self.cannot(
                where,
                "oneOf",
                "'oneOf' whose branches may overlap is not enforced (a grammar cannot exclude "
                "a value two branches match); use anyOf, or a property with a different const "
                "in each branch",
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
        for key in list(rest):
            if ENFORCED.get(key) in ("object", "array"):
                self.cannot(where, key, f"'{key}' beside 'enum' or 'const' is not enforced")
                del rest[key]
        kept = [v for v in values if self._allows(rest, v, where)]
        if not kept:
            self.cannot(
                where, "enum", "no value of 'enum' or 'const' meets the schema's other keywords"
            )
            kept = values
        texts = dict.fromkeys(literal(json_text(v)) for v in kept)
        return self.rules.add(hint, " | ".join(texts))

    def _allows(self, schema: dict[str, Any], value: object, where: str) -> bool:
        """Whether ``value`` of an enum meets the type, string and number keywords beside it
        (object and array keywords beside an enum are not enforced)."""
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
            numbers = number_dfa(schema, integer=False, where=where, cannot=self.cannot)
            return numbers is None or numbers.accepts(json_text(value))
        if isinstance(value, str):
            if kinds is not None and "string" not in kinds:
                return False
            strings = string_dfa(schema, where, self.cannot)
            return strings is None or strings.accepts(value)
        kind = "null" if value is None else "array" if isinstance(value, list) else "object"
        return kinds is None or kind in kinds

    def _typed(self, kind: str, schema: dict[str, Any], hint: str, where: str) -> str:
        if kind in ("null", "boolean"):
            return self.primitive(kind)
        if kind in ("integer", "number"):
            dfa = number_dfa(schema, integer=kind == "integer", where=where, cannot=self.cannot)
            if dfa is None:
                return self.primitive(kind)
            return to_gbnf(dfa, self.rules, f"{hint}-{kind}", json_string=False)
        if kind == "string":
            return self.string(schema, hint, where)
        if kind == "array":
            return self._array(schema, hint, where)
        return self._object(schema, hint, where)

    # -- numbers and strings ---------------------------------------------------------------

    def string(self, schema: dict[str, Any], hint: str, where: str) -> str:
        keys = {k for k in schema if ENFORCED.get(k) == "string"}
        if not keys:
            return self.primitive("string")
        if keys <= {"minLength", "maxLength"}:
            low, high = count(schema, "minLength", where), count(schema, "maxLength", where)
            if high is not None and (low or 0) > high:
                self.cannot(where, "maxLength", "'minLength' is above 'maxLength'")
                return self.primitive("string")
            body = repetition(self.primitive("char"), low or 0, high)
            return self.rules.add(f"{hint}-string", f"{_QUOTE} {body} {_QUOTE}")
        dfa = string_dfa(schema, where, self.cannot)
        if dfa is None:
            return self.primitive("string")
        start = to_gbnf(dfa, self.rules, f"{hint}-string", json_string=True)
        return self.rules.add(f"{hint}-string", f"{_QUOTE} {start} {_QUOTE}")

    def raw_string(self, schema: dict[str, Any], hint: str, where: str, forbid: str) -> str:
        """A string's characters unquoted and unescaped (an XML tool-call parameter), never
        holding ``forbid``."""
        dfa = string_dfa(schema, where, self.cannot) or ANY_STRING
        if "const" in schema or "enum" in schema:
            values = [schema["const"]] if "const" in schema else schema["enum"]
            if not isinstance(values, list):
                raise SchemaError(f"{where}: 'enum' must be a non-empty array")
            strings = tuple(v for v in values if isinstance(v, str))
            if strings:
                dfa = dfa.intersect(one_of(strings))
            else:
                self.cannot(where, "enum", "no value of 'enum' or 'const' is a string")
        try:
            found = dfa.intersect(without(forbid))
        except TooComplexError:
            self.cannot(where, "pattern", "the string keywords make too large a grammar")
            found = without(forbid)
        if found.empty:
            self.cannot(where, "pattern", f"no string meets the keywords without {forbid!r}")
            found = without(forbid)
        return to_gbnf(found, self.rules, f"{hint}-raw", json_string=False)

    # -- arrays and objects ----------------------------------------------------------------

    def _array(self, schema: dict[str, Any], hint: str, where: str) -> str:
        low = count(schema, "minItems", where) or 0
        high = count(schema, "maxItems", where)
        if high is not None and low > high:
            self.cannot(where, "maxItems", "'minItems' is above 'maxItems'")
            high = None
        prefix = schema.get("prefixItems", [])
        items = schema.get("items", True)
        if isinstance(items, list) and "prefixItems" not in schema:  # draft 7's tuple form
            prefix, items = items, schema.get("additionalItems", True)
        if not isinstance(prefix, list):
            raise SchemaError(f"{where}.prefixItems must be an array", keyword="prefixItems")
        firsts = [
            self.value(s, f"{hint}-{i}", f"{where}.prefixItems[{i}]") for i, s in enumerate(prefix)
        ]
        item = None if items is False else self.value(items, f"{hint}-item", f"{where}.items")
        if item is None:
            high = len(firsts) if high is None else min(high, len(firsts))
            if low > high:
                self.cannot(where, "minItems", "'minItems' asks for more items than allowed")
                low = high
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
                    self.cannot(
                        where,
                        "required",
                        f"'{name}' is required but not in properties, and "
                        f"additionalProperties is false",
                    )
                properties[name] = True if extra in (None, False) else extra
        space = self.primitive("space")
        pairs = []
        for name, sub in properties.items():
            if sub is False and name not in required:
                continue  # may not be written: never is
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


def schema_grammar(
    schema: object, where: str, *, strict: bool = True
) -> tuple[str, tuple[Relaxation, ...]]:
    """The whole grammar for ``schema`` (root rule ``root``), and what was relaxed (nothing
    when ``strict``).

    Error handling: :class:`SchemaError` (:class:`UnenforcedError` when ``strict``).
    """
    rules = Rules()
    rules.define("root", "")
    converter = SchemaConverter(rules, schema, where, strict=strict)
    rules.define("root", converter.document(where))
    return rules.text(), tuple(converter.relaxed)
