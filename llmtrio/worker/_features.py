"""The chat request fields with more shape than a type and bounds: structured output
(``response_format``) and tools (``tools``, ``tool_choice``, ``parallel_tool_calls``, and the
tool calls and results in the history). Pure, like the rest of the request parsing.

Each function reads its fields from the parsed JSON body and raises :class:`OpenAIError`
(400, naming the field, in the one shape of ``llmtrio._fields``) for anything it cannot
honour.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from .._fields import invalid_type, invalid_value, missing, show
from ..engine import (
    JSON_OBJECT_GRAMMAR,
    ChatMessage,
    Tool,
    ToolCall,
    new_tool_call_id,
)

__all__ = [
    "ToolChoice",
    "parse_assistant_tool_calls",
    "parse_response_format",
    "parse_tools",
    "tool_message",
]

_TOOL_CHOICES = ("none", "auto", "required")


def parse_response_format(value: object) -> dict[str, Any]:
    """``response_format``: ``text`` (nothing), ``json_object`` (any JSON object) or
    ``json_schema`` (``{"name", "schema", "strict"}``), as :class:`GenerateRequest` keyword
    arguments (``grammar`` or ``json_schema``).

    Whatever ``strict`` says, the schema is enforced; the engine compiles it (off the event
    loop, once per schema) and refuses a keyword the grammar cannot enforce with a 400
    naming it."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid_type("response_format", "an object", value)
    kind = value.get("type")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"grammar": JSON_OBJECT_GRAMMAR}
    if kind != "json_schema":
        raise invalid_value(
            "response_format.type",
            f"{show(kind)}. Supported values are: 'text', 'json_object' and 'json_schema'.",
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise missing("response_format.json_schema")
    if not isinstance(spec.get("name"), str):
        raise missing("response_format.json_schema.name")
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid_type("response_format.json_schema.strict", "a boolean", strict)
    schema = spec.get("schema", {})
    if not isinstance(schema, dict | bool):
        raise invalid_type("response_format.json_schema.schema", "a JSON schema object", schema)
    return {"json_schema": schema}


@attrs.frozen
class ToolChoice:
    """The tools a request offers, as the template sees them, and how the reply must use
    them: ``mode`` is ``none``, ``auto`` or ``required`` (``required`` also for a named
    function, then the only tool in ``forced``)."""

    tools: tuple[Tool, ...] = ()
    mode: str = "none"
    forced: tuple[Tool, ...] = ()
    parallel: bool = True

    @property
    def parses(self) -> bool:
        """Whether the reply is searched for tool calls."""
        return bool(self.tools) and self.mode != "none"

    def generate_options(self) -> dict[str, Any]:
        """The :class:`GenerateRequest` keyword arguments: the tools the template sees and
        how calls are constrained (the engine builds the grammar in the template's format)."""
        if self.mode == "none":
            return {}
        named = self.forced[0].name if len(self.forced) == 1 else None
        return {
            "tools": self.tools,
            "tool_choice": self.mode,
            "tool_name": named,
            "parallel_tool_calls": self.parallel,
        }


def parse_tools(data: dict[str, Any]) -> ToolChoice:
    """``tools`` (functions only), ``tool_choice`` and ``parallel_tool_calls``."""
    value = data.get("tools")
    tools: list[Tool] = []
    if value is not None:
        if not isinstance(value, list):
            raise invalid_type("tools", "an array", value)
        for i, item in enumerate(value):
            where = f"tools[{i}]"
            if not isinstance(item, dict):
                raise invalid_type(where, "an object", item)
            if item.get("type", "function") != "function":
                raise invalid_value(
                    f"{where}.type",
                    f"{show(item.get('type'))}. This server supports 'function' tools only.",
                )
            function = item.get("function")
            if not isinstance(function, dict):
                raise invalid_type(f"{where}.function", "an object", function)
            name = function.get("name")
            if not isinstance(name, str) or not name:
                raise invalid_type(f"{where}.function.name", "a non-empty string", name)
            description = function.get("description") or ""
            if not isinstance(description, str):
                raise invalid_type(f"{where}.function.description", "a string", description)
            parameters = function.get("parameters")
            if parameters is None or parameters == {}:
                # OpenAI: no parameters is an empty parameter list, and clients write {} for
                # it; as the empty JSON Schema (any value) a call could be any JSON at all.
                parameters = {"type": "object", "properties": {}}
            if not isinstance(parameters, dict):
                raise invalid_type(f"{where}.function.parameters", "an object", parameters)
            if any(t.name == name for t in tools):
                raise invalid_value("tools", f"the name {show(name)} is used twice.")
            tools.append(Tool(name, description, parameters))
    parallel = data.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid_type("parallel_tool_calls", "a boolean", parallel)
    choice = data.get("tool_choice")
    if choice is None:
        mode = "auto" if tools else "none"
        forced: tuple[Tool, ...] = ()
    elif isinstance(choice, str):
        if choice not in _TOOL_CHOICES:
            raise invalid_value(
                "tool_choice",
                f"{show(choice)}. Supported values are: 'none', 'auto', 'required' or a named "
                f"function.",
            )
        mode = choice
        forced = tuple(tools) if choice == "required" else ()
    elif isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise invalid_value(
                "tool_choice", 'expected {"type": "function", "function": {"name": ...}}.'
            )
        named = [t for t in tools if t.name == name]
        if not named:
            raise invalid_value("tool_choice", f"no tool named {show(name)} in 'tools'.")
        mode, forced = "required", tuple(named)
    else:
        raise invalid_type("tool_choice", "a string or an object", choice)
    if mode != "none" and not tools:
        raise invalid_value("tool_choice", f"{show(mode)} needs 'tools'.")
    return ToolChoice(tuple(tools), mode, forced, parallel is not False)


def parse_assistant_tool_calls(value: object, where: str) -> list[ToolCall]:
    """An assistant message's ``tool_calls`` from the history."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid_type(where, "an array", value)
    calls = []
    for i, item in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise invalid_type(at, "an object", item)
        function = item.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise invalid_type(f"{at}.function", 'an object with a "name"', function)
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments)
        call_id = item.get("id")
        calls.append(
            ToolCall(
                call_id if isinstance(call_id, str) else new_tool_call_id(),
                function["name"],
                arguments,
            )
        )
    return calls


def tool_message(content: str, item: dict[str, Any], where: str) -> ChatMessage:
    """A ``tool`` message of the history (the result of an earlier call)."""
    call_id = item.get("tool_call_id")
    if call_id is not None and not isinstance(call_id, str):
        raise invalid_type(f"{where}.tool_call_id", "a string", call_id)
    return ChatMessage("tool", content, tool_call_id=call_id)
