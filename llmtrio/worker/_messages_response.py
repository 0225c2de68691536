"""An Anthropic Messages API response, streamed or whole: events in, bytes out. Pure.

- :class:`MessageStream`, the server-sent events: ``message_start``; per content block a
  ``content_block_start``, its deltas (``thinking_delta`` then one ``signature_delta``,
  ``text_delta``, or ``input_json_delta`` as a tool call's arguments are generated, through
  the engine's :class:`ToolCallStream` as chat's stream reads them) and a
  ``content_block_stop``; then ``message_delta`` (stop reason, usage) and ``message_stop``.
  While a long prompt is ingested the stream opens at once and sends a ``ping`` every few
  seconds (:attr:`MessageStream.keepalive_s`, the serve path's ``KeepsAlive``).
- :class:`MessageBody`, the one ``message`` of a request that did not stream.
- :class:`TokenCount`, ``count_tokens``' ``{"input_tokens": N}``.

A thinking block's ``signature`` is an opaque value of this server's (a digest of the
block's text); a signature that comes back in a later turn is not checked.

Usage follows Anthropic's sums: ``input_tokens`` are the prompt tokens ingested for this
request, ``cache_read_input_tokens`` those reused from an earlier prompt's memory (their sum
is the prompt's length, which ``count_tokens`` answers), ``cache_creation_input_tokens`` is 0.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from ..api import ANTHROPIC_ERRORS, ApiError, dumps, sse
from ..engine import (
    Done,
    StopReason,
    Token,
    ToolCall,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallEvent,
    ToolCallParser,
    ToolCallStart,
    ToolCallStream,
)
from ._encoding import Counted, ResponseMeta, WholeBody, finish_reason
from ._messages_request import MessagesRequest

__all__ = ["MessageBody", "MessageStream", "TokenCount", "signature", "stop_reason"]

#: Seconds without an event before a stream opens and pings (then between pings).
KEEPALIVE_S = 5.0


def signature(thinking: str) -> str:
    """The opaque ``signature`` of a thinking block (not checked when it comes back)."""
    return "llmtrio-" + hashlib.sha256(thinking.encode("utf-8", "replace")).hexdigest()[:32]


def stop_reason(done: Done, calls: int) -> str:
    """Anthropic's ``stop_reason``: ``tool_use`` for a reply with calls (unless it ran out
    of tokens), ``max_tokens``, ``stop_sequence`` or ``end_turn``."""
    if done.stop in (StopReason.MAX_TOKENS, StopReason.CONTEXT_END):
        return "max_tokens"
    if calls:
        return "tool_use"
    if done.stop is StopReason.STOP_STRING:
        return "stop_sequence"
    return "end_turn"


def usage_json(done: Done) -> dict[str, int]:
    return {
        "input_tokens": done.prompt_tokens - done.cached_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": done.cached_tokens,
        "output_tokens": done.completion_tokens,
    }


def _tool_input(call: ToolCall) -> Any:
    """A call's arguments as the object Anthropic's ``input`` is (``{}`` for arguments cut
    short by ``max_tokens``)."""
    try:
        value = json.loads(call.arguments or "{}")
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _message(meta: ResponseMeta, content: list[dict[str, Any]], **rest: Any) -> dict[str, Any]:
    return {
        "id": meta.id,
        "type": "message",
        "role": "assistant",
        "model": meta.model,
        "content": content,
        **rest,
    }


def _event(name: str, data: dict[str, Any]) -> bytes:
    return sse(dumps({"type": name, **data}), name)


class MessageStream:
    """The server-sent events of one streamed message (see the module's doc)."""

    streaming = True
    keepalive_s = KEEPALIVE_S

    def __init__(self, request: MessagesRequest, meta: ResponseMeta) -> None:
        self._request = request
        self._meta = meta
        self._parser = ToolCallStream(request.tools.tools) if request.tools.parses else None
        self._index = -1  # the open block's index
        self._open: str | None = None  # its type
        self._thinking: list[str] = []
        self._held = ""  # whitespace before any text block opened
        self._calls = 0
        self._skipping = False  # arguments of a call left out (parallel calls off)

    def start(self) -> bytes:
        """``message_start``: the message with no content yet, and the prompt's length."""
        prompt = self._meta.prompt_tokens or 0
        usage = {"input_tokens": prompt, "cache_creation_input_tokens": 0,
                 "cache_read_input_tokens": 0, "output_tokens": 0}  # fmt: skip
        message = _message(self._meta, [], stop_reason=None, stop_sequence=None, usage=usage)
        return _event("message_start", {"message": message})

    def ping(self) -> bytes:
        return _event("ping", {})

    def event(self, token: Token) -> bytes:
        if token.reasoning:
            out = self._switch("thinking", {"type": "thinking", "thinking": "", "signature": ""})
            self._thinking.append(token.text)
            return out + self._delta({"type": "thinking_delta", "thinking": token.text})
        if self._parser is None:
            return self._text(token.text)
        return self._items(self._parser.feed(token.text))

    def finish(self, done: Done) -> bytes:
        out = b"" if self._parser is None else self._items(self._parser.finish())
        out += self._close()
        delta = {"stop_reason": stop_reason(done, self._calls), "stop_sequence": done.stop_string}
        out += _event("message_delta", {"delta": delta, "usage": usage_json(done)})
        return out + _event("message_stop", {})

    def finish_reason(self, done: Done) -> str:
        return finish_reason(done, self._calls)

    def failure(self, error: ApiError) -> bytes:
        """Anthropic's ``error`` event."""
        return ANTHROPIC_ERRORS.event(error)

    def _text(self, text: str) -> bytes:
        if self._open != "text":
            if not text.strip():
                self._held += text
                return b""
            text, self._held = self._held + text, ""
        out = self._switch("text", {"type": "text", "text": ""})
        return out + self._delta({"type": "text_delta", "text": text})

    def _items(self, events: list[ToolCallEvent]) -> bytes:
        out = b""
        for event in events:
            if isinstance(event, str):
                if self._calls and not event.strip():
                    continue  # the newlines between and after calls
                out += self._text(event)
            elif isinstance(event, ToolCallStart):
                self._skipping = bool(self._calls) and not self._request.tools.parallel
                if not self._skipping:
                    block = {"type": "tool_use", "id": event.id, "name": event.name, "input": {}}
                    out += self._switch("tool_use", block, always=True)
                    self._calls += 1
            elif isinstance(event, ToolCallArguments):
                if not self._skipping and event.text:
                    out += self._delta({"type": "input_json_delta", "partial_json": event.text})
            elif isinstance(event, ToolCallEnd):
                out += b"" if self._skipping else self._close()
        return out

    def _switch(self, kind: str, block: dict[str, Any], *, always: bool = False) -> bytes:
        """Open a block of ``kind`` unless one is open (``always``: a new one anyway)."""
        if self._open == kind and not always:
            return b""
        out = self._close()
        self._index += 1
        self._open = kind
        return out + _event("content_block_start", {"index": self._index, "content_block": block})

    def _close(self) -> bytes:
        if self._open is None:
            return b""
        out = b""
        if self._open == "thinking":
            sign = {"type": "signature_delta", "signature": signature("".join(self._thinking))}
            out = self._delta(sign)
            self._thinking = []
        self._open = None
        return out + _event("content_block_stop", {"index": self._index})

    def _delta(self, delta: dict[str, Any]) -> bytes:
        return _event("content_block_delta", {"index": self._index, "delta": delta})


class MessageBody:
    """The ``message`` of a request that did not stream: the events are collected, the body
    is written at the end."""

    streaming = False

    def __init__(self, request: MessagesRequest, meta: ResponseMeta) -> None:
        self._request = request
        self._meta = meta
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._calls = 0

    def start(self) -> bytes:
        return b""

    def event(self, token: Token) -> bytes:
        (self._reasoning if token.reasoning else self._text).append(token.text)
        return b""

    def finish(self, done: Done) -> bytes:
        content: list[dict[str, Any]] = []
        thinking = "".join(self._reasoning)
        if thinking:
            content.append({"type": "thinking", "thinking": thinking,
                            "signature": signature(thinking)})  # fmt: skip
        text = "".join(self._text)
        tools = self._request.tools
        items: list[str | ToolCall] = [text]
        if tools.parses:
            parser = ToolCallParser(tools.tools)
            items = [*parser.feed(text), *parser.flush()]
        for item in items:
            if isinstance(item, str):
                if item.strip():  # not the newlines between and after calls
                    content.append({"type": "text", "text": item})
            elif tools.parallel or not self._calls:
                content.append({"type": "tool_use", "id": item.id, "name": item.name,
                                "input": _tool_input(item)})  # fmt: skip
                self._calls += 1
        body = _message(
            self._meta,
            _merged(content),
            stop_reason=stop_reason(done, self._calls),
            stop_sequence=done.stop_string,
            usage=usage_json(done),
        )
        return dumps(body)

    def finish_reason(self, done: Done) -> str:
        return finish_reason(done, self._calls)

    def failure(self, error: ApiError) -> bytes:
        """Anthropic's ``error`` event."""
        return ANTHROPIC_ERRORS.event(error)


def _merged(content: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Adjacent text blocks as one."""
    merged: list[dict[str, Any]] = []
    for block in content:
        if merged and block["type"] == "text" and merged[-1]["type"] == "text":
            merged[-1] = {"type": "text", "text": merged[-1]["text"] + block["text"]}
        else:
            merged.append(block)
    return merged


class TokenCount(WholeBody):
    """``count_tokens``' body: ``{"input_tokens": N}``, the prompt's length templated as a
    generation's is; a failure in Anthropic's words."""

    errors = ANTHROPIC_ERRORS

    def finish(self, counted: Counted) -> bytes:
        return dumps({"input_tokens": counted.prompt_tokens})
