"""Tool calls found in a model's text as it arrives, their arguments streamed. Pure.

:class:`ToolCallStream` is fed the reply's content (not its reasoning) piece by piece and
returns events: content text, and for each call a :class:`ToolCallStart` (index, id, name:
OpenAI's first ``tool_calls`` delta), then :class:`ToolCallArguments` pieces (the later
deltas), then a :class:`ToolCallEnd`. Both call forms of :mod:`._tool_grammar` are read:

- JSON: the ``arguments`` value is passed on as the model writes it (a string value is
  decoded, whole). The call starts once its ``name`` is read, so arguments written before
  the name are held until then;
- XML: the arguments are written as a JSON object as the parameters arrive: a raw string
  value character by character (escaped), a JSON value once whole (or, when it does not
  parse, as a string).

A text tool's call (:attr:`Tool.text`) has its text as its arguments, not JSON: in the XML
form its ``input`` parameter's raw text, streamed as it comes; in the JSON form the
``input`` string of its arguments object (or the arguments themselves when they are a
string), decoded, once whole.

The pieces of one call concatenate to its arguments. Text in ``<tool_call>`` that is not a
call of a known tool (not JSON or XML, no name, an unknown name) is content, unchanged, once
the block closes.

A call that started and then turns out malformed keeps what was sent: its id, name and the
argument pieces already out are never taken back. Broken JSON ends the arguments where it
breaks; text after the arguments up to ``</tool_call>`` is dropped; a reply that ends inside
a call (``max_tokens``, a stop string) ends it with ``complete=False`` and its arguments as
far as they got (then usually not valid JSON, as with OpenAI's ``finish_reason: "length"``).
Under a grammar (a forced call, or ``tool_choice: "auto"``'s lazy one), a call can only be
cut short, never malformed.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from typing import Any

import attrs

from .._types import TEXT_INPUT, Tool
from ._grammar import (
    FUNCTION_CLOSE,
    PARAMETER_CLOSE,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    raw_parameter,
)

__all__ = [
    "ToolCallArguments",
    "ToolCallEnd",
    "ToolCallEvent",
    "ToolCallStart",
    "ToolCallStream",
    "new_tool_call_id",
]


def new_tool_call_id() -> str:
    return "call_" + secrets.token_hex(12)


@attrs.frozen
class ToolCallStart:
    """A call begins: OpenAI's first delta (``id``, ``type: "function"``, ``name``)."""

    index: int
    id: str
    name: str


@attrs.frozen
class ToolCallArguments:
    """A piece of call ``index``'s arguments (a later delta's ``function.arguments``)."""

    index: int
    text: str


@attrs.frozen
class ToolCallEnd:
    """Call ``index`` is over; ``complete``: its arguments were whole (false when the reply
    ended inside them, or they broke off: malformed)."""

    index: int
    complete: bool


ToolCallEvent = str | ToolCallStart | ToolCallArguments | ToolCallEnd

_SPACE = " \t\r\n"
_scanstring: Any = getattr(json.decoder, "scanstring")  # noqa: B009 (not in the stubs)
_ARGUMENT_KEYS = ("arguments", "parameters")


def _input_text(arguments: str) -> str:
    """A text tool's text from its JSON-form arguments: ``{"input": "..."}`` or a string
    (anything else is passed on as written)."""
    try:
        value = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(value, dict) and isinstance(value.get(TEXT_INPUT), str):
        return str(value[TEXT_INPUT])
    return value if isinstance(value, str) else arguments


def _held(text: str, tag: str) -> int:
    """How many characters at the end of ``text`` may begin ``tag``."""
    for length in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0


class _JsonValue:
    """Finds where one JSON value ends, a character at a time."""

    def __init__(self) -> None:
        self.depth = 0
        self.string = False
        self.escape = False
        self.scalar = False
        self.started = False

    def feed(self, char: str) -> str:
        """``"in"`` (the character is part of the value), ``"last"`` (and ends it),
        ``"after"`` (it is past the value's end), or ``"broken"``."""
        if not self.started:
            if char in _SPACE:
                return "in"
            self.started = True
            if char in "{[":
                self.depth = 1
            elif char == '"':
                self.string = True
            elif char in "-0123456789tfn":
                self.scalar = True
            else:
                return "broken"
            return "in"
        if self.string:
            if self.escape:
                self.escape = False
            elif char == "\\":
                self.escape = True
            elif char == '"':
                self.string = False
                return "last" if self.depth == 0 else "in"
            return "in"
        if self.scalar:
            if char.isalnum() or char in "+-.":
                return "in"
            return "after"
        if char == '"':
            self.string = True
        elif char in "{[":
            self.depth += 1
        elif char in "}]":
            self.depth -= 1
            if self.depth == 0:
                return "last"
        elif char == "<":
            return "broken"
        return "in"


class ToolCallStream:
    """Splits generated content into text and streamed tool calls (see the module notes).

    :meth:`feed` the content as it arrives, :meth:`finish` at the reply's end; both return
    the events settled so far. Text that may be the start of ``<tool_call>`` is held back.
    """

    def __init__(self, tools: Sequence[Tool]) -> None:
        self._tools = {tool.name: tool for tool in tools}
        self._buf = ""
        self._state = "text"
        self._block = ""  # the block's text while it may still turn out to be content
        self._index = -1  # the call being read, once started
        self._name = ""
        self._out: list[ToolCallEvent] = []
        #: Calls started so far.
        self.calls = 0
        # The JSON form: the key being read, its value's scanner and text.
        self._key = ""
        self._value = _JsonValue()
        self._value_text = ""
        self._held_arguments: str | None = None
        self._sent_arguments = False
        self._whole = False  # the call's arguments are all out
        # The XML form: parameters written, and whether the current one is raw.
        self._parameters = 0
        self._raw = False
        self._value_started = False
        self._text_call = False  # the call being read is a text tool's

    def feed(self, text: str) -> list[ToolCallEvent]:
        self._buf += text
        self._run(final=False)
        return self._take()

    def finish(self) -> list[ToolCallEvent]:
        """The rest, at the reply's end: held text as content; a call cut short ended."""
        self._run(final=True)
        if self._state == "text":
            self._out.append(self._buf)
        elif self._index >= 0:
            self._end_call(complete=self._whole)
        else:
            self._out.append(TOOL_CALL_OPEN + self._block + self._buf)
        self._buf, self._state = "", "text"
        return self._take()

    # -- machinery -----------------------------------------------------------------------

    def _take(self) -> list[ToolCallEvent]:
        """The events out so far, adjacent content and argument pieces joined."""
        merged: list[ToolCallEvent] = []
        for event in self._out:
            last = merged[-1] if merged else None
            if isinstance(event, str):
                if isinstance(last, str):
                    merged[-1] = last + event
                elif event:
                    merged.append(event)
            elif isinstance(event, ToolCallArguments):
                if isinstance(last, ToolCallArguments) and last.index == event.index:
                    merged[-1] = ToolCallArguments(event.index, last.text + event.text)
                elif event.text:
                    merged.append(event)
            else:
                merged.append(event)
        self._out = []
        return merged

    def _run(self, *, final: bool) -> None:
        """Step the state machine until it waits for more text."""
        while True:
            before = (self._state, len(self._buf))
            getattr(self, "_" + self._state)(final)
            if (self._state, len(self._buf)) == before:
                return

    def _consume(self, n: int) -> str:
        taken, self._buf = self._buf[:n], self._buf[n:]
        if self._index < 0:
            self._block += taken
        return taken

    def _start(self, name: str) -> None:
        self._index, self._name, self._whole = self.calls, name, False
        self._text_call = self._tools[name].text is not None
        self.calls += 1
        self._out.append(ToolCallStart(self._index, new_tool_call_id(), name))

    def _arguments(self, text: str) -> None:
        self._sent_arguments = True
        self._out.append(ToolCallArguments(self._index, text))

    def _end_call(self, *, complete: bool) -> None:
        self._out.append(ToolCallEnd(self._index, complete))
        self._index = -1

    def _text(self, final: bool) -> None:
        at = self._buf.find(TOOL_CALL_OPEN)
        if at < 0:
            keep = 0 if final else _held(self._buf, TOOL_CALL_OPEN)
            self._out.append(self._buf[: len(self._buf) - keep])
            self._buf = self._buf[len(self._buf) - keep :]
            return
        self._out.append(self._buf[:at])
        self._buf = self._buf[at + len(TOOL_CALL_OPEN) :]
        self._block, self._state = "", "head"

    def _head(self, final: bool) -> None:
        """Inside a block, before its form is known."""
        stripped = self._buf.lstrip(_SPACE)
        skip = len(self._buf) - len(stripped)
        if stripped.startswith("{"):
            self._consume(skip + 1)
            self._key, self._held_arguments, self._sent_arguments = "", None, False
            self._state = "json_key"
        elif stripped.startswith("<function="):
            end = stripped.find(">")
            if end < 0:
                return
            name = stripped[len("<function=") : end]
            self._consume(skip + end + 1)
            if name not in self._tools:
                self._state = "content_block"
                return
            self._start(name)
            self._parameters, self._state = 0, "xml_between"
        elif stripped and not "<function=".startswith(stripped):
            self._state = "content_block"

    def _content_block(self, final: bool) -> None:
        """A block that is not a call: content, unchanged, once it closes."""
        at = self._buf.find(TOOL_CALL_CLOSE)
        if at >= 0:
            self._consume(at + len(TOOL_CALL_CLOSE))
            self._out.append(TOOL_CALL_OPEN + self._block)
            self._state = "text"

    def _closing(self, final: bool) -> None:
        """After a call's body: whatever comes before ``</tool_call>`` is dropped."""
        at = self._buf.find(TOOL_CALL_CLOSE)
        if at >= 0:
            self._buf = self._buf[at + len(TOOL_CALL_CLOSE) :]
            self._end_call(complete=self._whole)  # not whole when they broke off
            self._state = "text"
        else:
            self._buf = self._buf[len(self._buf) - _held(self._buf, TOOL_CALL_CLOSE) :]

    # -- the JSON form -------------------------------------------------------------------

    def _broken(self) -> None:
        self._state = "closing" if self._index >= 0 else "content_block"

    def _json_key(self, final: bool) -> None:
        """Before a key, or the end, of the call's object."""
        stripped = self._buf.lstrip(_SPACE + ",")
        self._consume(len(self._buf) - len(stripped))
        if not stripped:
            return
        if stripped[0] == "}":
            self._consume(1)
            if self._index < 0:
                self._state = "content_block"
                return
            if not self._sent_arguments:
                self._arguments("{}")
            self._whole, self._state = True, "closing"
            return
        if stripped[0] != '"':
            self._broken()
            return
        try:
            key, end = _scanstring(stripped, 1)
        except ValueError:
            return  # not whole yet
        self._consume(end)
        self._key, self._state = key, "json_colon"

    def _json_colon(self, final: bool) -> None:
        stripped = self._buf.lstrip(_SPACE)
        self._consume(len(self._buf) - len(stripped))
        if not stripped:
            return
        if stripped[0] != ":":
            self._broken()
            return
        self._consume(1)
        self._value, self._value_text, self._state = _JsonValue(), "", "json_value"

    def _json_value(self, final: bool) -> None:
        value = self._value
        taken, verdict = 0, "in"
        for char in self._buf:
            verdict = value.feed(char)
            if verdict in ("after", "broken"):
                break
            taken += 1
            if verdict == "last":
                break
        text = self._consume(taken)
        if not self._value_text:
            text = text.lstrip(_SPACE)
        self._value_text += text
        arguments = self._key in _ARGUMENT_KEYS and not self._sent_arguments
        streamed = self._index >= 0 and not self._text_call
        if arguments and streamed and not self._value_text.startswith('"'):
            self._out.append(ToolCallArguments(self._index, text))  # streamed as it comes
        if verdict == "broken":
            self._broken()
        elif verdict in ("last", "after") or (final and value.scalar):
            self._json_value_done(arguments)

    def _json_value_done(self, arguments: bool) -> None:
        text, self._state = self._value_text, "json_key"
        if self._key == "name" and self._index < 0:
            try:
                name = json.loads(text)
            except ValueError:
                name = None
            if not isinstance(name, str) or name not in self._tools:
                self._state = "content_block"
                return
            self._start(name)
            if self._held_arguments is not None:
                held = self._held_arguments
                self._arguments(_input_text(held) if self._text_call else held)
                self._whole = True
        elif arguments:
            if self._text_call:
                self._arguments(_input_text(text))
                self._whole = True
                return
            if text.startswith('"'):  # arguments written as a JSON string: decoded
                try:
                    decoded = json.loads(text)
                except ValueError:
                    decoded = None
                text = decoded if isinstance(decoded, str) else text
            elif self._index >= 0:
                self._sent_arguments = self._whole = True  # streamed already
                return
            if self._index >= 0:
                self._arguments(text)
                self._whole = True
            else:
                self._held_arguments = text

    # -- the XML form --------------------------------------------------------------------

    def _close_arguments(self) -> None:
        if not self._text_call:
            self._arguments("}" if self._parameters else "{}")
        self._whole, self._state = True, "closing"

    def _xml_between(self, final: bool) -> None:
        """Between parameters: a ``<parameter=...>``, or the ``</function>``."""
        stripped = self._buf.lstrip(_SPACE)
        self._buf = stripped
        if not stripped:
            return
        if stripped.startswith(FUNCTION_CLOSE) or stripped.startswith(TOOL_CALL_CLOSE):
            if stripped.startswith(FUNCTION_CLOSE):
                self._buf = stripped[len(FUNCTION_CLOSE) :]
            self._close_arguments()
            return
        if stripped.startswith("<parameter="):
            end = stripped.find(">")
            if end < 0:
                return
            name = stripped[len("<parameter=") : end]
            self._buf = stripped[end + 1 :]
            if self._text_call:  # its text, raw: no JSON around it
                self._raw = True
            else:
                self._raw = raw_parameter(self._tools[self._name].parameters, name)
                head = (", " if self._parameters else "{") + json.dumps(name, ensure_ascii=False)
                self._arguments(head + ": " + ('"' if self._raw else ""))
            self._parameters += 1
            self._value_text, self._value_started = "", False
            self._state = "xml_value"
            return
        if not final and any(t.startswith(stripped) for t in (FUNCTION_CLOSE, "<parameter=")):
            return  # perhaps a tag, not whole yet
        self._buf = stripped[1:]  # not a tag: dropped

    def _xml_value(self, final: bool) -> None:
        """A parameter's value up to ``</parameter>``, one newline around it dropped."""
        if not self._value_started:
            if not self._buf:
                return
            if self._buf.startswith("\n"):
                self._buf = self._buf[1:]
            self._value_started = True
        end = self._buf.find(PARAMETER_CLOSE)
        cut = self._buf.find(TOOL_CALL_CLOSE)
        if cut >= 0 and (end < 0 or cut < end):  # the block closes inside the value
            self._xml_piece(self._buf[:cut], last=True)
            self._buf = self._buf[cut:]
            self._close_arguments()
            return
        if end >= 0:
            value, self._buf = self._buf[:end], self._buf[end + len(PARAMETER_CLOSE) :]
            self._xml_piece(value[:-1] if value.endswith("\n") else value, last=True)
            self._state = "xml_between"
            return
        # Held back: what may begin the closing tag (dropped if the reply ends there).
        keep = max(_held(self._buf, "\n" + PARAMETER_CLOSE), _held(self._buf, PARAMETER_CLOSE))
        keep = max(keep, _held(self._buf, TOOL_CALL_CLOSE))
        self._xml_piece(self._buf[: len(self._buf) - keep], last=False)
        self._buf = self._buf[len(self._buf) - keep :]

    def _xml_piece(self, text: str, *, last: bool) -> None:
        if self._text_call:
            self._arguments(text)
            return
        if self._raw:
            escaped = json.dumps(text, ensure_ascii=False)[1:-1]
            self._arguments(escaped + ('"' if last else ""))
            return
        self._value_text += text
        if last:
            try:
                value = json.dumps(json.loads(self._value_text), ensure_ascii=False)
            except ValueError:
                value = json.dumps(self._value_text, ensure_ascii=False)
            self._arguments(value)
