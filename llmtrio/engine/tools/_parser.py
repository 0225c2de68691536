"""Tool calling: describing tools to a model that has no template for them, and finding the
model's calls in its text. Pure: no llama.cpp, no Trio.

Two output formats are understood, both inside ``<tool_call>...</tool_call>``:

- Hermes / Qwen 2.5-3 JSON: ``{"name": "get_weather", "arguments": {"city": "Paris"}}``;
- Qwen3-Coder / Qwen3.5 XML: ``<function=get_weather><parameter=city>Paris</parameter>
  </function>``.

Calls are read by :class:`ToolCallStream` (``_stream``), which streams their arguments;
:class:`ToolCallParser` gathers its events into whole calls, so a reply read whole and one
streamed give the same calls.

A model whose chat template has no ``tools`` variable (or no template at all, like gemma's
built-in one) is told about the tools Hermes-style, in a system message; earlier calls and
tool results in the history are written the same way.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import attrs

from .._types import ChatMessage, Tool, ToolCall
from ._grammar import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from ._stream import ToolCallArguments, ToolCallEnd, ToolCallStart, ToolCallStream, new_tool_call_id

__all__ = [
    "TOOL_CALL_CLOSE",
    "TOOL_CALL_OPEN",
    "ToolCallParser",
    "describe_tools",
    "new_tool_call_id",
    "template_message",
]


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
                last = out[-1]
                media = (*last.media, *message.media)
                out[-1] = ChatMessage("user", last.content + "\n" + text, media=media)
            else:
                out.append(ChatMessage("user", text, media=message.media))
        else:  # a result's or a user's media stay where their markers are
            out.append(ChatMessage(message.role, message.content, media=message.media))
    return out


@attrs.define
class ToolCallParser:
    """Splits generated text into content and whole tool calls, incrementally.

    ``feed`` returns what is settled: content strings and :class:`ToolCall` values, in
    order (a call once it has ended). Text that may be the start of ``<tool_call>`` is held
    back. A block that is not a call of a known tool is returned as content, unchanged.
    """

    tools: tuple[Tool, ...]
    _stream: ToolCallStream | None = None
    _open: dict[int, list[str]] = attrs.Factory(dict)
    calls: int = 0

    def feed(self, text: str) -> list[str | ToolCall]:
        if self._stream is None:
            self._stream = ToolCallStream(self.tools)
        return self._gather(self._stream.feed(text))

    def flush(self) -> list[str | ToolCall]:
        """The rest at the end: held text as content, a call cut short as far as it got."""
        if self._stream is None:
            return []
        stream, self._stream = self._stream, None
        return self._gather(stream.finish())

    def _gather(self, events: list[Any]) -> list[str | ToolCall]:
        out: list[str | ToolCall] = []
        for event in events:
            if isinstance(event, str):
                out.append(event)
            elif isinstance(event, ToolCallStart):
                self._open[event.index] = [event.id, event.name, ""]
            elif isinstance(event, ToolCallArguments):
                self._open[event.index][2] += event.text
            elif isinstance(event, ToolCallEnd):
                call_id, name, arguments = self._open.pop(event.index)
                self.calls += 1
                out.append(ToolCall(call_id, name, arguments))
        return out
