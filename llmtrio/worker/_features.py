"""The OpenAI request fields beyond plain chat: penalties, logprobs, structured output, tools,
and the fields this server refuses rather than ignores. Pure, like ``_openai``.

Each function reads its fields from the parsed JSON body and raises :class:`OpenAIError`
(400, naming the field) for anything it cannot honour.
"""

from __future__ import annotations

import json
import math
from typing import Any

import attrs

from .._openai_errors import OpenAIError, invalid_request
from ..engine import (
    JSON_OBJECT_GRAMMAR,
    MAX_TOP_LOGPROBS,
    ChatMessage,
    Tool,
    ToolCall,
    new_tool_call_id,
)

__all__ = [
    "ToolChoice",
    "parse_assistant_tool_calls",
    "parse_chat_logprobs",
    "parse_penalties",
    "parse_response_format",
    "parse_tools",
    "reject_unimplemented",
]

# OpenAI chat-completion fields this server does not implement: a request that sets one gets
# a 400 naming it, instead of an answer that silently lacks it. (Bookkeeping fields that do
# not change the output, such as ``user``, ``metadata``, ``store`` or ``service_tier``, are
# accepted and ignored.)
_UNIMPLEMENTED = {
    "audio": "audio output",
    "modalities": "output modalities other than text",
    "prediction": "predicted outputs",
    "web_search_options": "web search",
    "functions": "the deprecated 'functions' (use 'tools')",
    "function_call": "the deprecated 'function_call' (use 'tool_choice')",
    "reasoning_effort": "reasoning effort (use 'think' or 'chat_template_kwargs.enable_thinking')",
    "verbosity": "verbosity",
}
_TOOL_CHOICES = ("none", "auto", "required")


def _invalid(message: str, param: str, code: str = "invalid_value") -> OpenAIError:
    return invalid_request(message, param=param, code=code)


def _type_error(param: str, expected: str) -> OpenAIError:
    return _invalid(f"Invalid type for '{param}': expected {expected}.", param, "invalid_type")


def reject_unimplemented(data: dict[str, Any]) -> None:
    """A 400 for the first OpenAI field set that this server does not implement."""
    for key, what in _UNIMPLEMENTED.items():
        value = data.get(key)
        if value is None:
            continue
        if key == "modalities" and value == ["text"]:
            continue
        raise _invalid(
            f"Unsupported parameter: '{key}': this server does not implement {what}.",
            key,
            "unsupported_parameter",
        )


def _number(data: dict[str, Any], key: str, low: float, high: float) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _type_error(key, "a number")
    if not (math.isfinite(value) and low <= value <= high):
        raise _invalid(
            f"Invalid '{key}': expected a number from {low:g} to {high:g}, but got {value!r}.",
            key,
        )
    return float(value)


def parse_penalties(data: dict[str, Any]) -> dict[str, Any]:
    """``presence_penalty`` and ``frequency_penalty`` (OpenAI's, -2 to 2), llama.cpp's
    ``repeat_penalty`` (0 to 10, 1 is off) and ``repeat_last_n`` (0 or more, llama.cpp's
    -1: the whole context), as :class:`Sampling` keyword arguments."""
    out: dict[str, Any] = {}
    for key, low, high in (
        ("presence_penalty", -2.0, 2.0),
        ("frequency_penalty", -2.0, 2.0),
        ("repeat_penalty", 0.0, 10.0),
    ):
        value = _number(data, key, low, high)
        if value is not None:
            out[key] = value
    if out.get("repeat_penalty") == 0.0:
        raise _invalid("Invalid 'repeat_penalty': it must be above 0 (1 is off).", "repeat_penalty")
    last_n = data.get("repeat_last_n")
    if last_n is not None:
        if isinstance(last_n, bool) or not isinstance(last_n, int):
            raise _type_error("repeat_last_n", "an integer")
        if last_n < -1:
            raise _invalid("Invalid 'repeat_last_n': expected -1 (all) or more.", "repeat_last_n")
        out["repeat_last_n"] = 1 << 30 if last_n == -1 else last_n
    return out


def parse_chat_logprobs(data: dict[str, Any]) -> int | None:
    """``logprobs`` (a boolean) and ``top_logprobs`` (0 to 20, only with ``logprobs``): the
    number of alternatives to report, or ``None`` for no log-probabilities."""
    logprobs = data.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise _type_error("logprobs", "a boolean")
    top = data.get("top_logprobs")
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int):
            raise _type_error("top_logprobs", "an integer")
        if not 0 <= top <= MAX_TOP_LOGPROBS:
            raise _invalid(
                f"Invalid 'top_logprobs': expected a value from 0 to {MAX_TOP_LOGPROBS}, but "
                f"got {top}.",
                "top_logprobs",
            )
        if not logprobs:
            raise _invalid(
                "Invalid 'top_logprobs': 'logprobs' must be set to true when 'top_logprobs' "
                "is used.",
                "top_logprobs",
            )
    return (top or 0) if logprobs else None


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
        raise _type_error("response_format", "an object")
    kind = value.get("type")
    if kind == "text":
        return {}
    if kind == "json_object":
        return {"grammar": JSON_OBJECT_GRAMMAR}
    if kind != "json_schema":
        raise _invalid(
            f"Invalid 'response_format.type': {kind!r}. Supported values are: 'text', "
            f"'json_object' and 'json_schema'.",
            "response_format.type",
        )
    spec = value.get("json_schema")
    if not isinstance(spec, dict):
        raise _invalid(
            "Missing required parameter: 'response_format.json_schema'.",
            "response_format.json_schema",
            "missing_required_parameter",
        )
    if not isinstance(spec.get("name"), str):
        raise _invalid(
            "Missing required parameter: 'response_format.json_schema.name'.",
            "response_format.json_schema.name",
            "missing_required_parameter",
        )
    strict = spec.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise _type_error("response_format.json_schema.strict", "a boolean")
    schema = spec.get("schema", {})
    if not isinstance(schema, dict | bool):
        raise _type_error("response_format.json_schema.schema", "a JSON schema object")
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
            raise _type_error("tools", "an array")
        for i, item in enumerate(value):
            where = f"tools[{i}]"
            if not isinstance(item, dict):
                raise _type_error(where, "an object")
            if item.get("type", "function") != "function":
                raise _invalid(
                    f"Invalid '{where}.type': {item.get('type')!r}. This server supports "
                    f"'function' tools only.",
                    f"{where}.type",
                )
            function = item.get("function")
            if not isinstance(function, dict):
                raise _type_error(f"{where}.function", "an object")
            name = function.get("name")
            if not isinstance(name, str) or not name:
                raise _type_error(f"{where}.function.name", "a non-empty string")
            description = function.get("description") or ""
            if not isinstance(description, str):
                raise _type_error(f"{where}.function.description", "a string")
            parameters = function.get("parameters")
            if parameters is None:
                parameters = {"type": "object", "properties": {}}
            if not isinstance(parameters, dict):
                raise _type_error(f"{where}.function.parameters", "an object")
            if any(t.name == name for t in tools):
                raise _invalid(f"Invalid 'tools': the name {name!r} is used twice.", "tools")
            tools.append(Tool(name, description, parameters))
    parallel = data.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise _type_error("parallel_tool_calls", "a boolean")
    choice = data.get("tool_choice")
    if choice is None:
        mode = "auto" if tools else "none"
        forced: tuple[Tool, ...] = ()
    elif isinstance(choice, str):
        if choice not in _TOOL_CHOICES:
            raise _invalid(
                f"Invalid 'tool_choice': {choice!r}. Supported values are: 'none', 'auto', "
                f"'required' or a named function.",
                "tool_choice",
            )
        mode = choice
        forced = tuple(tools) if choice == "required" else ()
    elif isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise _invalid(
                'Invalid \'tool_choice\': expected {"type": "function", "function": '
                '{"name": ...}}.',
                "tool_choice",
            )
        named = [t for t in tools if t.name == name]
        if not named:
            raise _invalid(
                f"Invalid 'tool_choice': no tool named {name!r} in 'tools'.", "tool_choice"
            )
        mode, forced = "required", tuple(named)
    else:
        raise _type_error("tool_choice", "a string or an object")
    if mode != "none" and not tools:
        raise _invalid(f"Invalid 'tool_choice': {mode!r} needs 'tools'.", "tool_choice")
    return ToolChoice(tuple(tools), mode, forced, parallel is not False)


def parse_assistant_tool_calls(value: object, where: str) -> list[ToolCall]:
    """An assistant message's ``tool_calls`` from the history."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise _type_error(where, "an array")
    calls = []
    for i, item in enumerate(value):
        at = f"{where}[{i}]"
        if not isinstance(item, dict):
            raise _type_error(at, "an object")
        function = item.get("function")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise _type_error(f"{at}.function", 'an object with a "name"')
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
        raise _type_error(f"{where}.tool_call_id", "a string")
    return ChatMessage("tool", content, tool_call_id=call_id)
