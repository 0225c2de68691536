"""Grammars for tool calls in the two formats models write, and what they share with the
parser. Pure.

Both formats sit inside ``<tool_call>`` and ``</tool_call>``, a newline after the opening tag
and before the closing one:

- JSON (Hermes, Qwen 2.5 and 3): ``{"name": "get_weather", "arguments": {...}}``, the
  arguments following the tool's parameter schema;
- XML (Qwen3-Coder, Qwen3.5): ``<function=get_weather>``, then each parameter as
  ``<parameter=city>\\nParis\\n</parameter>\\n`` in the schema's order, then ``</function>``.
  A parameter whose schema allows only strings is written raw (never holding
  ``</parameter>``); any other is JSON (:func:`raw_parameter` decides, for the grammar and the
  parser alike). A tool whose parameters are not an object with properties is called in the
  JSON form (the parser reads both).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .._errors import InvalidRequestError
from .._types import Tool
from ..grammar import Rules, SchemaConverter, SchemaError, json_text, literal

__all__ = [
    "FUNCTION_CLOSE",
    "PARAMETER_CLOSE",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "raw_parameter",
    "tool_call_grammar",
    "tool_calls_grammar",
    "xml_properties",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
FUNCTION_CLOSE = "</function>"
PARAMETER_CLOSE = "</parameter>"


def _resolver(root: object) -> Callable[[object], Mapping[str, Any]]:
    def resolve(schema: object) -> Mapping[str, Any]:
        for _ in range(32):
            if not isinstance(schema, dict) or "$ref" not in schema:
                break
            ref = schema["$ref"]
            node: Any = root
            for part in ref[1:].split("/")[1:] if isinstance(ref, str) and ref != "#" else []:
                node = (
                    node.get(part.replace("~1", "/").replace("~0", "~"), {})
                    if isinstance(node, dict)
                    else {}
                )
            schema = node
        return schema if isinstance(schema, dict) else {}

    return resolve


def xml_properties(parameters: Mapping[str, Any]) -> dict[str, Any] | None:
    """The parameters an XML call writes, by name with their schemas, or ``None`` when the
    schema is not an object with properties (the call is then written in JSON)."""
    schema = _resolver(parameters)(parameters)
    properties = schema.get("properties")
    if schema.get("type", "object") != "object" or not isinstance(properties, dict):
        return None
    if any(k in schema for k in ("anyOf", "oneOf", "allOf")):
        return None
    return properties


def raw_parameter(parameters: Mapping[str, Any], name: str) -> bool:
    """Whether parameter ``name`` of an XML call is written raw (its schema allows only
    strings) rather than as JSON."""
    properties = xml_properties(parameters) or {}
    schema = _resolver(parameters)(properties.get(name, {}))
    kind = schema.get("type")
    if kind is not None:
        return bool(kind == "string" or kind == ["string"])
    values = [schema["const"]] if "const" in schema else schema.get("enum")
    return isinstance(values, list) and bool(values) and all(isinstance(v, str) for v in values)


def _json_call(converter: SchemaConverter, tool: Tool, loose: bool) -> str:
    head = literal('{"name": ' + json.dumps(tool.name, ensure_ascii=False) + ', "arguments": ')
    try:
        arguments = converter.document(f"tools.{tool.name}.parameters")
    except SchemaError:
        if not loose:
            raise
        arguments = converter.primitive("object")
    space = converter.primitive("space")
    return f'{head} {arguments} {space} "}}"'


def _xml_call(converter: SchemaConverter, tool: Tool, loose: bool) -> str:
    properties = xml_properties(tool.parameters)
    assert properties is not None
    where = f"tools.{tool.name}.parameters"
    schema = _resolver(tool.parameters)(tool.parameters)
    required = schema.get("required", [])
    missing = [name for name in required if name not in properties]
    if missing and schema.get("additionalProperties") is False:
        raise SchemaError(f"{where}: '{missing[0]}' is required but not in properties")
    properties = {**properties, **dict.fromkeys(missing, True)}
    parts = []
    for name, schema in properties.items():
        hint = f"{tool.name}-{name}"
        try:
            if raw_parameter(tool.parameters, name):
                value = converter.raw_string(
                    dict(_resolver(tool.parameters)(schema)), hint, where, PARAMETER_CLOSE
                )
            else:
                value = converter.value(schema, hint, f"{where}.properties.{name}")
        except SchemaError:
            if not loose:
                raise
            value = converter.raw_string({}, f"{hint}-any", where, PARAMETER_CLOSE)
        tag = literal(f"<parameter={name}>\n")
        part = f"{tag} {value} {literal(chr(10) + PARAMETER_CLOSE + chr(10))}"
        parts.append(part if name in required else f"( {part} )?")
    head = literal(f"<function={tool.name}>\n")
    return f"{head} {' '.join(parts)} {literal(FUNCTION_CLOSE)}"


@functools.lru_cache(maxsize=64)
def _grammar(key: str, xml: bool, parallel: bool, loose: bool) -> str:
    tools = [Tool(name, "", parameters) for name, parameters in json.loads(key)]
    rules = Rules()
    rules.define("root", "")
    calls = []
    for tool in tools:
        converter = SchemaConverter(rules, tool.parameters, f"tools.{tool.name}.parameters")
        if xml and xml_properties(tool.parameters) is not None:
            body = _xml_call(converter, tool, loose)
        else:
            body = _json_call(converter, tool, loose)
        calls.append(rules.add(f"call-{tool.name}", body))
    open_tag, close_tag = literal(TOOL_CALL_OPEN + "\n"), literal("\n" + TOOL_CALL_CLOSE)
    call = rules.add("call", f"{open_tag} ( {' | '.join(calls)} ) {close_tag}")
    rules.define("root", f'{call} ( "\\n" {call} )*' if parallel else call)
    return rules.text()


def tool_calls_grammar(
    tools: Sequence[Tool], *, xml: bool = False, parallel: bool = False, loose: bool = False
) -> str:
    """A grammar for a call of one of ``tools`` (several, a newline apart, when
    ``parallel``), in the XML form when ``xml``, else JSON; the arguments follow each
    tool's parameter schema. ``loose``: a schema that cannot be enforced lets that tool's
    arguments be any JSON object (XML: any parameters) instead of failing.

    Error handling: :class:`SchemaError` for a schema the grammar cannot enforce.
    """
    key = json_text([[tool.name, tool.parameters] for tool in tools])
    return _grammar(key, xml, parallel, loose)


def tool_call_grammar(
    tools: Sequence[Tool], *, xml: bool = False, parallel: bool = False, loose: bool = False
) -> str:
    """A grammar for a call of one of ``tools``, in the XML form (``<function=...>``) when
    ``xml``, else Hermes JSON; several calls, a newline apart, when ``parallel``. ``loose``:
    a tool whose schema cannot be enforced takes any arguments instead of failing.

    Error handling: :class:`InvalidRequestError` for a schema the grammar cannot enforce.
    """
    try:
        return tool_calls_grammar(tools, xml=xml, parallel=parallel, loose=loose)
    except SchemaError as exc:
        raise InvalidRequestError(str(exc), param="tools") from None
