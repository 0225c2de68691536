"""GBNF grammars for structured output: any JSON object, a JSON schema, a forced tool call.

The JSON-schema conversion is llama-cpp-python's port of llama.cpp's
``json_schema_to_grammar``. It silently drops what it cannot express, so a schema is first
checked here: a keyword the grammar would not enforce is an :class:`InvalidRequestError`
naming it, never a reply that breaks the schema.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from llama_cpp import llama_grammar

from ._errors import InvalidRequestError
from ._tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from ._types import Tool

__all__ = ["JSON_OBJECT_GRAMMAR", "json_schema_grammar", "tool_call_grammar"]

#: Any JSON object (OpenAI's ``response_format: {"type": "json_object"}``).
JSON_OBJECT_GRAMMAR: str = llama_grammar.JSON_GBNF

# Keywords the converter turns into grammar rules.
_ENFORCED = frozenset(
    {
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "prefixItems",
        "minItems",
        "maxItems",
        "enum",
        "const",
        "anyOf",
        "oneOf",
        "allOf",
        "$ref",
        "$defs",
        "definitions",
        "pattern",
        "format",
        "minLength",
        "maxLength",
    }
)
# Keywords that constrain nothing (annotations), accepted and ignored.
_ANNOTATIONS = frozenset(
    {
        "title",
        "description",
        "default",
        "examples",
        "example",
        "$schema",
        "$id",
        "$comment",
        "deprecated",
        "readOnly",
        "writeOnly",
        "strict",
        "nullable",
        "discriminator",
    }
)
_TYPES = frozenset({"object", "array", "string", "number", "integer", "boolean", "null"})
_FORMATS = frozenset({"date", "time", "date-time", "uuid", "uuid1", "uuid2", "uuid3", "uuid4"})
_FORMATS |= {"uuid5"}
# The converter's string character allows raw control characters, which JSON forbids.
_LOOSE_CHAR = r'char ::= [^"\\] | "\\"'
_JSON_CHAR = r'char ::= [^"\\\x7F\x00-\x1F] | "\\"'


def _check(schema: object, where: str) -> None:
    if isinstance(schema, bool):
        if schema:
            return
        raise InvalidRequestError(f"{where}: a 'false' schema matches nothing", param=where)
    if not isinstance(schema, dict):
        raise InvalidRequestError(f"{where} must be a JSON schema object", param=where)
    for key, value in schema.items():
        if key in _ANNOTATIONS:
            continue
        if key not in _ENFORCED:
            raise InvalidRequestError(
                f"{where}: the JSON schema keyword '{key}' is not supported (structured output "
                f"enforces {', '.join(sorted(_ENFORCED))})",
                param=where,
            )
        if key == "type":
            kinds = value if isinstance(value, list) else [value]
            bad = [k for k in kinds if k not in _TYPES]
            if bad:
                raise InvalidRequestError(f"{where}: unknown type {bad[0]!r}", param=where)
        elif key == "format" and value not in _FORMATS:
            raise InvalidRequestError(
                f"{where}: the string format {value!r} is not supported (supported: "
                f"{', '.join(sorted(_FORMATS))})",
                param=where,
            )
        elif key == "pattern" and not (
            isinstance(value, str) and value.startswith("^") and value.endswith("$")
        ):
            raise InvalidRequestError(
                f"{where}: a pattern must be anchored with ^ and $", param=where
            )
        elif key == "$ref" and not (isinstance(value, str) and value.startswith("#/")):
            raise InvalidRequestError(
                f"{where}: only local references ('#/...') are supported", param=where
            )
        elif key in ("properties", "$defs", "definitions"):
            if not isinstance(value, dict):
                raise InvalidRequestError(f"{where}.{key} must be an object", param=where)
            for name, sub in value.items():
                _check(sub, f"{where}.{key}.{name}")
        elif key in ("items", "additionalProperties") and not isinstance(value, bool):
            if isinstance(value, list):
                for i, sub in enumerate(value):
                    _check(sub, f"{where}.{key}[{i}]")
            else:
                _check(value, f"{where}.{key}")
        elif key in ("anyOf", "oneOf", "allOf", "prefixItems"):
            if not isinstance(value, list) or not value:
                raise InvalidRequestError(f"{where}.{key} must be a non-empty array", param=where)
            for i, sub in enumerate(value):
                _check(sub, f"{where}.{key}[{i}]")


def _convert(schemas: Sequence[tuple[str, Any]]) -> tuple[Any, list[str]]:
    make: Any = llama_grammar.SchemaConverter
    converter = make(prop_order={}, allow_fetch=False, dotall=False, raw_pattern=False)
    names = []
    for name, schema in schemas:
        try:
            resolved = converter.resolve_refs(json.loads(json.dumps(schema)), name or "schema")
            names.append(converter.visit(resolved, name))
        except (AssertionError, ValueError, KeyError, TypeError, RecursionError) as exc:
            raise InvalidRequestError(
                f"the JSON schema cannot be turned into a grammar: {exc}", param="json_schema"
            ) from None
    return converter, names


def _format(converter: Any) -> str:
    return str(converter.format_grammar()).replace(_LOOSE_CHAR, _JSON_CHAR)


def json_schema_grammar(schema: object, *, where: str = "json_schema.schema") -> str:
    """A grammar for the JSON values ``schema`` accepts.

    Error handling: :class:`InvalidRequestError` naming the keyword, format or reference the
    grammar could not enforce.
    """
    _check(schema, where)
    converter, _ = _convert([("", schema)])
    return _format(converter)


def _literal(text: str) -> str:
    return json.dumps(text)


def tool_call_grammar(tools: Sequence[Tool]) -> str:
    """A grammar for exactly one call of one of ``tools``, in the Hermes format
    (``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``), the arguments
    following the tool's parameter schema.

    Error handling: :class:`InvalidRequestError` for a schema the grammar cannot enforce.
    """
    for tool in tools:
        _check(tool.parameters, f"tools.{tool.name}.parameters")
    converter, names = _convert(
        [(f"tool-{i}-arguments", tool.parameters) for i, tool in enumerate(tools)]
    )
    calls = []
    for tool, arguments in zip(tools, names, strict=True):
        head = '{"name": ' + json.dumps(tool.name) + ', "arguments": '
        calls.append(f"{_literal(head)} {arguments} {_literal('}')}")
    open_tag, close_tag = _literal(TOOL_CALL_OPEN + "\n"), _literal("\n" + TOOL_CALL_CLOSE)
    converter._rules["root"] = f"{open_tag} ( {' | '.join(calls)} ) {close_tag}"
    return _format(converter)
