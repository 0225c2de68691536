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

A text tool (:attr:`Tool.text`) is written with one parameter, ``input``: JSON
``{"name": "apply_patch", "arguments": {"input": "...the text, escaped..."}}``, XML
``<function=apply_patch>\\n<parameter=input>\\n...the text, raw...\\n</parameter>\\n</function>``,
the text following its Lark or regex grammar (:mod:`..grammar`) in either form: escaped as
JSON strings are in the one, raw in the other (where no regular-expression terminal of the
grammar may hold ``</parameter>``: a literal of the grammar could still close the parameter
early).

What the grammar cannot enforce: a strict tool's schema is refused by name (an
:class:`InvalidRequestError`); any other tool's keyword is relaxed for its sub-schema, a
schema the grammar cannot read at all lets that tool take any JSON object, and a text
grammar that cannot be translated leaves the text free. Each relaxation is logged once, as
the grammar is compiled (compiled grammars are cached).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from .._errors import InvalidRequestError
from .._types import TEXT_INPUT, TextFormat, Tool
from ..grammar import (
    CannotTranslateError,
    Relaxation,
    Rules,
    SchemaConverter,
    SchemaError,
    json_text,
    lark_rules,
    literal,
    regex_rules,
    warn_relaxed,
)

__all__ = [
    "FUNCTION_CLOSE",
    "PARAMETER_CLOSE",
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "ToolsGrammar",
    "raw_parameter",
    "tool_call_grammar",
    "tool_calls_grammar",
    "xml_properties",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
FUNCTION_CLOSE = "</function>"
PARAMETER_CLOSE = "</parameter>"


@attrs.frozen
class ToolsGrammar:
    """A tool-call grammar (GBNF, root rule ``root``) and what it relaxed."""

    text: str
    relaxed: tuple[Relaxation, ...] = ()


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


def _json_head(tool: Tool) -> str:
    return literal('{"name": ' + json.dumps(tool.name, ensure_ascii=False) + ', "arguments": ')


def _json_call(converter: SchemaConverter, tool: Tool) -> str:
    arguments = converter.document(f"tools.{tool.name}.parameters")
    space = converter.primitive("space")
    return f'{_json_head(tool)} {arguments} {space} "}}"'


def _any_arguments(converter: SchemaConverter, tool: Tool) -> str:
    """Any JSON object as the arguments (a schema the grammar cannot read)."""
    space = converter.primitive("space")
    return f'{_json_head(tool)} {converter.primitive("object")} {space} "}}"'


def _xml_call(converter: SchemaConverter, tool: Tool) -> str:
    properties = xml_properties(tool.parameters)
    assert properties is not None
    where = f"tools.{tool.name}.parameters"
    schema = _resolver(tool.parameters)(tool.parameters)
    required = schema.get("required", [])
    missing = [name for name in required if name not in properties]
    if missing and schema.get("additionalProperties") is False:
        converter.cannot(where, "required", f"'{missing[0]}' is required but not in properties")
    properties = {**properties, **dict.fromkeys(missing, True)}
    parts = []
    for name, schema in properties.items():
        hint = f"{tool.name}-{name}"
        if raw_parameter(tool.parameters, name):
            value = converter.raw_string(
                dict(_resolver(tool.parameters)(schema)),
                hint,
                f"{where}.properties.{name}",
                PARAMETER_CLOSE,
            )
        else:
            value = converter.value(schema, hint, f"{where}.properties.{name}")
        tag = literal(f"<parameter={name}>\n")
        part = f"{tag} {value} {literal(chr(10) + PARAMETER_CLOSE + chr(10))}"
        parts.append(part if name in required else f"( {part} )?")
    head = literal(f"<function={tool.name}>\n")
    return f"{head} {' '.join(parts)} {literal(FUNCTION_CLOSE)}"


def _text(
    converter: SchemaConverter, tool: Tool, text: TextFormat, xml: bool
) -> tuple[str, list[Relaxation]]:
    """The rule of a text tool's input, and the relaxation when its grammar could not be
    translated (any text then)."""
    rules, hint = converter.rules, f"{tool.name}-input"
    forbid = PARAMETER_CLOSE if xml else None
    if text.syntax is not None:
        mark = rules.checkpoint()
        translate = lark_rules if text.syntax == "lark" else regex_rules
        try:
            return translate(text.definition, rules, hint, json_string=not xml, forbid=forbid), []
        except CannotTranslateError as exc:
            where = f"tools.{tool.name}.format"
            if tool.strict:
                raise InvalidRequestError(
                    f"{where}: cannot translate the {text.syntax} grammar: {exc}", param="tools"
                ) from None
            rules.rollback(mark)
            why = f"cannot translate the {text.syntax} grammar ({exc}); the input is free text"
            relaxed = [Relaxation(where, text.syntax, why)]
    else:
        relaxed = []
    if xml:
        return converter.raw_string({}, hint, f"tools.{tool.name}", PARAMETER_CLOSE), relaxed
    return rules.add(hint, f"( {converter.primitive('char')} )*"), relaxed


def _text_call(
    converter: SchemaConverter, tool: Tool, text: TextFormat, xml: bool
) -> tuple[str, list[Relaxation]]:
    body, relaxed = _text(converter, tool, text, xml)
    if xml:
        head = literal(f"<function={tool.name}>\n<parameter={TEXT_INPUT}>\n")
        tail = literal(f"\n{PARAMETER_CLOSE}\n{FUNCTION_CLOSE}")
    else:
        head = literal(
            '{"name": '
            + json.dumps(tool.name, ensure_ascii=False)
            + ', "arguments": {'
            + json.dumps(TEXT_INPUT)
            + ': "'
        )
        tail = literal('"}}')
    return f"{head} {body} {tail}", relaxed


def _call(rules: Rules, tool: Tool, xml: bool) -> tuple[str, list[Relaxation]]:
    """One tool's call and what it relaxed.

    Error handling: :class:`SchemaError` for a strict tool's schema the grammar cannot
    enforce.
    """
    where = f"tools.{tool.name}.parameters"
    mark = rules.checkpoint()
    converter = SchemaConverter(rules, tool.parameters, where, strict=tool.strict)
    if tool.text is not None:
        return _text_call(converter, tool, tool.text, xml)
    try:
        if xml and xml_properties(tool.parameters) is not None:
            return _xml_call(converter, tool), converter.relaxed
        return _json_call(converter, tool), converter.relaxed
    except SchemaError as exc:
        if tool.strict:
            raise
        rules.rollback(mark)  # nothing half-written stays
        loose = SchemaConverter(rules, {}, where, strict=False)
        why = f"{exc}; any JSON object is taken as its arguments"
        return _any_arguments(loose, tool), [Relaxation(where, "parameters", why)]


def _key(tools: Sequence[Tool]) -> str:
    return json_text(
        [
            [t.name, t.parameters, t.strict, None if t.text is None else attrs.astuple(t.text)]
            for t in tools
        ]
    )


@functools.lru_cache(maxsize=64)
def _grammar(key: str, xml: bool, parallel: bool) -> ToolsGrammar:
    tools = []
    for name, parameters, strict, text in json.loads(key):
        format_ = None if text is None else TextFormat(*text)
        tools.append(Tool(name, "", parameters, strict=strict, text=format_))
    rules = Rules()
    rules.define("root", "")
    calls, relaxed = [], []
    for tool in tools:
        body, relaxations = _call(rules, tool, xml)
        calls.append(rules.add(f"call-{tool.name}", body))
        relaxed += relaxations
    open_tag, close_tag = literal(TOOL_CALL_OPEN + "\n"), literal("\n" + TOOL_CALL_CLOSE)
    call = rules.add("call", f"{open_tag} ( {' | '.join(calls)} ) {close_tag}")
    rules.define("root", f'{call} ( "\\n" {call} )*' if parallel else call)
    for tool in tools:  # once: when compiled, not when found in this cache
        mine = tuple(r for r in relaxed if r.where.startswith(f"tools.{tool.name}."))
        warn_relaxed(mine, f"tool {tool.name!r}")
    return ToolsGrammar(rules.text(), tuple(relaxed))


def tool_calls_grammar(
    tools: Sequence[Tool], *, xml: bool = False, parallel: bool = False
) -> ToolsGrammar:
    """A grammar for a call of one of ``tools`` (several, a newline apart, when
    ``parallel``), in the XML form when ``xml``, else JSON; the arguments follow each
    tool's parameter schema (a text tool's input its text format), relaxed where they
    cannot be enforced (see the module's notes).

    Error handling: :class:`SchemaError` for a strict tool's schema the grammar cannot
    enforce; :class:`InvalidRequestError` for a strict text tool whose grammar cannot be
    translated.
    """
    return _grammar(_key(tools), xml, parallel)


def tool_call_grammar(tools: Sequence[Tool], *, xml: bool = False, parallel: bool = False) -> str:
    """A grammar for a call of one of ``tools``, in the XML form (``<function=...>``) when
    ``xml``, else Hermes JSON; several calls, a newline apart, when ``parallel``. A keyword
    the grammar cannot enforce is relaxed for a tool that is not strict (a warning is
    logged), refused for a strict one.

    Error handling: :class:`InvalidRequestError` naming what a strict tool's schema asks
    that the grammar cannot enforce.
    """
    try:
        return tool_calls_grammar(tools, xml=xml, parallel=parallel).text
    except SchemaError as exc:
        raise InvalidRequestError(str(exc), param="tools") from None
