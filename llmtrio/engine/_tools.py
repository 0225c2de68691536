"""Tool calling: describing tools to a model that has no template for them, and finding the
model's calls in its text. Pure: no llama.cpp, no Trio.

Two output formats are understood, both inside ``<tool_call>...</tool_call>``:

- Hermes / Qwen 2.5-3 JSON: ``{"name": "get_weather", "arguments": {"city": "Paris"}}``;
- Qwen3-Coder / Qwen3.5 XML: ``<function=get_weather><parameter=city>Paris</parameter>
  </function>``.

A model whose chat template has no ``tools`` variable (or no template at all, like gemma's
built-in one) is told about the tools Hermes-style, in a system message; earlier calls and
tool results in the history are written the same way.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Sequence
from typing import Any

import attrs

from ._types import ChatMessage, Tool, ToolCall

__all__ = [
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "ToolCallParser",
    "describe_tools",
    "new_tool_call_id",
    "parse_tool_call",
    "template_message",
]

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"

_FUNCTION = re.compile(r"^\s*<function=([^>\s]+)>(.*?)</function>\s*$", re.S)
_PARAMETER = re.compile(r"<parameter=([^>\s]+)>\n?(.*?)\n?</parameter>", re.S)


def new_tool_call_id() -> str:
    return "call_" + secrets.token_hex(12)


def _arguments_value(arguments: str) -> object:
    """A call's arguments as templates expect them: the parsed object when it is one."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    return value if isinstance(value, dict) else arguments


def template_message(message: ChatMessage) -> dict[str, Any]:
    """``message`` as a Jinja chat template sees it (OpenAI's message shape)."""
    role = "system" if message.role == "developer" else message.role
    out: dict[str, Any] = {"role": role, "content": message.content}
    if message.tool_calls:
        out["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": _arguments_value(call.arguments)},
            }
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        out["tool_call_id"] = message.tool_call_id
    return out


def _hermes_system(tools: Sequence[Tool]) -> str:
    listing = "\n".join(json.dumps(tool.as_openai(), ensure_ascii=False) for tool in tools)
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{listing}\n</tools>\n\n"
        "For each function call, return a json object with function name and arguments "
        "within <tool_call></tool_call> XML tags:\n"
        '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>'
    )


def _hermes_call(call: ToolCall) -> str:
    arguments = _arguments_value(call.arguments)
    body = json.dumps({"name": call.name, "arguments": arguments}, ensure_ascii=False)
    return f"{TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def describe_tools(messages: Sequence[ChatMessage], tools: Sequence[Tool]) -> list[ChatMessage]:
    """The messages rewritten for a template without tools support: the tools described in
    the (first) system message, Hermes-style; assistant calls written as ``<tool_call>``
    blocks; tool results as user messages in ``<tool_response>`` tags."""
    out: list[ChatMessage] = []
    rest = list(messages)
    if tools:
        system = _hermes_system(tools)
        if rest and rest[0].role in ("system", "developer"):
            system = rest.pop(0).content + "\n\n" + system
        out.append(ChatMessage("system", system))
    for message in rest:
        if message.role == "assistant" and message.tool_calls:
            parts = [message.content] if message.content else []
            parts += [_hermes_call(call) for call in message.tool_calls]
            out.append(ChatMessage("assistant", "\n".join(parts)))
        elif message.role == "tool":
            text = f"<tool_response>\n{message.content}\n</tool_response>"
            if out and out[-1].role == "user" and out[-1].content.startswith("<tool_response>"):
                out[-1] = ChatMessage("user", out[-1].content + "\n" + text)
            else:
                out.append(ChatMessage("user", text))
        else:
            out.append(ChatMessage(message.role, message.content))
    return out


def parse_tool_call(body: str, tools: Sequence[Tool]) -> ToolCall | None:
    """The call in the text between ``<tool_call>`` and ``</tool_call>``, or ``None`` when
    it is neither format or names no known tool."""
    known = {tool.name: tool for tool in tools}
    text = body.strip()
    if text.startswith("{"):
        try:
            data = json.loads(text)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        name = data.get("name")
        arguments = data.get("arguments", data.get("parameters", {}))
        if not isinstance(name, str) or name not in known:
            return None
        if isinstance(arguments, str):
            arguments_text = arguments
        else:
            arguments_text = json.dumps(arguments, ensure_ascii=False)
        return ToolCall(new_tool_call_id(), name, arguments_text)
    match = _FUNCTION.match(text)
    if match is None or match.group(1) not in known:
        return None
    name = match.group(1)
    properties = known[name].parameters.get("properties", {})
    values: dict[str, object] = {}
    for key, raw in _PARAMETER.findall(match.group(2)):
        kind = properties.get(key, {}).get("type") if isinstance(properties, dict) else None
        if kind == "string":
            values[key] = raw
            continue
        try:
            values[key] = json.loads(raw)
        except ValueError:
            values[key] = raw
    return ToolCall(new_tool_call_id(), name, json.dumps(values, ensure_ascii=False))


def _held(text: str, tag: str) -> int:
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0


@attrs.define
class ToolCallParser:
    """Splits generated text into content and tool calls, incrementally.

    ``feed`` returns what is settled: content strings and :class:`ToolCall` values, in
    order. Text that may be the start of ``<tool_call>`` is held back; a call is returned
    once its ``</tool_call>`` arrives. A block that does not parse as a call is returned as
    content, unchanged.
    """

    tools: tuple[Tool, ...]
    _pending: str = ""
    _inside: bool = False
    calls: int = 0

    def feed(self, text: str) -> list[str | ToolCall]:
        out: list[str | ToolCall] = []
        buffer = self._pending + text
        while buffer:
            if not self._inside:
                at = buffer.find(TOOL_CALL_OPEN)
                if at < 0:
                    held = _held(buffer, TOOL_CALL_OPEN)
                    if len(buffer) > held:
                        out.append(buffer[: len(buffer) - held])
                    buffer = buffer[len(buffer) - held :]
                    break
                if at:
                    out.append(buffer[:at])
                buffer = buffer[at:]
                self._inside = True
            end = buffer.find(TOOL_CALL_CLOSE)
            if end < 0:
                break
            block = buffer[: end + len(TOOL_CALL_CLOSE)]
            buffer = buffer[end + len(TOOL_CALL_CLOSE) :]
            self._inside = False
            call = parse_tool_call(block[len(TOOL_CALL_OPEN) : -len(TOOL_CALL_CLOSE)], self.tools)
            if call is None:
                out.append(block)
            else:
                self.calls += 1
                out.append(call)
        self._pending = buffer
        return out

    def flush(self) -> list[str | ToolCall]:
        """The rest at the end: an unfinished block is content as it stands; a block whose
        closing tag the generation ended on (a stop, the grammar's end) is tried as a call."""
        pending, self._pending = self._pending, ""
        if not pending:
            return []
        if self._inside:
            self._inside = False
            call = parse_tool_call(pending[len(TOOL_CALL_OPEN) :], self.tools)
            if call is not None:
                self.calls += 1
                return [call]
        return [pending]
