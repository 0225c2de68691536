"""The chat request fields with more shape than a type and bounds: structured output
(``response_format``) and tools (``tools``, ``tool_choice``, ``parallel_tool_calls``, and the
tool calls and results in the history). Pure, like the rest of the request parsing.

The fields' shapes (nested parts included) are the field table's (``llmtrio.api._fields``), which
checks them; what is left here is what the table cannot say: which branch of a union a value
takes, defaults, and rules across items (a tool named twice, a forced tool that is not
offered). Each function reads its fields from the parsed JSON body and raises
:class:`ApiError` (400, naming the field, in the one shape of ``llmtrio.api._fields``) for
anything it cannot honour.
"""

from __future__ import annotations

import json
from typing import Any

import attrs

from ..api import (
    NAMED_TOOL_CHOICE,
    RESPONSE_FORMAT_JSON_SCHEMA,
    TOOL_CHOICE_MODE,
    Body,
    RequestLimits,
    check,
    invalid_type,
    invalid_value,
    read,
    show,
)
from ..engine import (
    JSON_OBJECT_GRAMMAR,
    Tool,
    ToolCall,
    new_tool_call_id,
)

__all__ = [
    "ToolChoice",
    "choose_tools",
    "parse_assistant_tool_calls",
    "parse_response_format",
    "parse_tools",
]


def parse_response_format(
    data: dict[str, Any], endpoint: str, limits: RequestLimits
) -> dict[str, Any]:
    """``response_format``: ``text`` (nothing), ``json_object`` (any JSON object) or
    ``json_schema`` (``{"name", "schema", "strict"}``), as :class:`GenerateRequest` keyword
    arguments (``grammar`` or ``json_schema``).

    The engine compiles the schema (off the event loop, once per schema): with ``strict:
    true`` a keyword the grammar cannot enforce is refused with a 400 naming it, else it is
    relaxed for its sub-schema with a warning."""
    value = read(data, endpoint, "response_format", limits)
    if value is None or value["type"] == "text":
        return {}
    if value["type"] == "json_object":
        return {"grammar": JSON_OBJECT_GRAMMAR}
    param = "response_format.json_schema"
    spec = check(RESPONSE_FORMAT_JSON_SCHEMA, value.get("json_schema"), limits, param)
    return {"json_schema": spec.get("schema", {}), "json_schema_strict": spec.get("strict") is True}


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


def choose_tools(
    tools: list[Tool],
    mode: str,
    *,
    name: str | None = None,
    parallel: bool = True,
    said: str | None = None,
    param: str = "tool_choice",
) -> ToolChoice:
    """The one rule of every API for which tools a reply may or must call, given the tools a
    request offers and its choice, read from the API's own shape: ``mode`` ``none``,
    ``auto`` or ``required`` (chat's and the Responses API's words; Anthropic's ``any`` is
    ``required``), or ``name``, the one tool the reply must call.

    - ``auto`` (or no choice at all) with no tools offered is ``none``: there is nothing to
      call, as when a client that always sends ``tool_choice`` has no tools this turn;
    - ``required`` or a named tool with no tools offered is a 400, as is a name no tool
      has; ``said`` is the value as the request spelt it, ``param`` the field that holds it.

    Error handling: :class:`ApiError` (400) naming ``param``."""
    if name is not None:
        forced = tuple(t for t in tools if t.name == name)
        if not forced:
            raise invalid_value(param, f"no tool named {show(name)} in 'tools'.")
        return ToolChoice(tuple(tools), "required", forced, parallel)
    if mode == "required" and not tools:
        raise invalid_value(param, f"{show(said or mode)} needs 'tools'.")
    if not tools:
        mode = "none"
    forced = tuple(tools) if mode == "required" else ()
    return ToolChoice(tuple(tools), mode, forced, parallel)


def parse_tools(data: dict[str, Any], limits: RequestLimits) -> ToolChoice:
    """``tools`` (functions only), ``tool_choice`` and ``parallel_tool_calls``."""
    tools: list[Tool] = []
    for item in read(data, Body.CHAT, "tools", limits) or ():
        function = item["function"]
        name = function["name"]
        if any(t.name == name for t in tools):
            raise invalid_value("tools", f"the name {show(name)} is used twice.")
        # OpenAI: no parameters is an empty parameter list, and clients write {} for it; as the
        # empty JSON Schema (any value) a call could be any JSON at all.
        parameters = function.get("parameters") or {"type": "object", "properties": {}}
        strict = function.get("strict") is True
        tools.append(Tool(name, function.get("description") or "", parameters, strict=strict))
    parallel = read(data, Body.CHAT, "parallel_tool_calls", limits) is not False
    choice = data.get("tool_choice")
    if choice is None:
        return choose_tools(tools, "auto", parallel=parallel)
    if isinstance(choice, str):
        mode = check(TOOL_CHOICE_MODE, choice, limits, "tool_choice")
        return choose_tools(tools, mode, parallel=parallel)
    if isinstance(choice, dict):
        name = check(NAMED_TOOL_CHOICE, choice, limits, "tool_choice")["function"]["name"]
        return choose_tools(tools, "required", name=name, parallel=parallel)
    raise invalid_type("tool_choice", "a string or an object", choice)


def parse_assistant_tool_calls(value: list[dict[str, Any]] | None) -> list[ToolCall]:
    """An assistant message's ``tool_calls`` from the history, as the field table checked
    them: an id that is not a string gets a new one, arguments that are not text are read as
    their JSON text."""
    calls = []
    for item in value or ():
        function = item["function"]
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
