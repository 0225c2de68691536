"""Chat replies that need more than the text: tool calls found in the model's output and
log-probabilities. Pure.

A request without tools or logprobs keeps :class:`ChatCompletionStream`'s pre-encoded fast
path; :func:`chat_stream` picks the encoder.
"""

from __future__ import annotations

from typing import Any, Protocol

import attrs

from .._openai_errors import dumps
from ..engine import Done, Token, TokenLogprob, ToolCall, ToolCallParser
from ._openai import (
    ChatCompletionRequest,
    ChatCompletionStream,
    chat_logprobs_json,
    completion_body,
    tool_call_json,
)

__all__ = ["ChatEncoder", "chat_body", "chat_stream", "split_tool_calls"]


class ChatEncoder(Protocol):
    """What the worker writes a streamed chat completion with."""

    def role(self) -> bytes: ...

    def token(self, token: Token) -> bytes: ...

    def finish(self, done: Done) -> bytes: ...

    def usage(self, done: Done) -> bytes: ...

    def done(self) -> bytes: ...


def chat_stream(
    request: ChatCompletionRequest, *, id: str, created: int, model: str
) -> ChatEncoder:
    """The encoder for ``request``'s stream."""
    base = ChatCompletionStream(
        id=id, created=created, model=model, include_usage=request.include_usage
    )
    if not (request.tools.parses or request.logprobs):
        return base
    return _ExtendedStream(base, request)


def split_tool_calls(request: ChatCompletionRequest, text: str) -> tuple[str, list[ToolCall]]:
    """The content and the tool calls of a whole reply (no calls when the request offers no
    tools or ``tool_choice`` is ``none``; one call only when ``parallel_tool_calls`` is off)."""
    if not request.tools.parses:
        return text, []
    parser = ToolCallParser(request.tools.tools)
    content: list[str] = []
    calls: list[ToolCall] = []
    for item in [*parser.feed(text), *parser.flush()]:
        if isinstance(item, str):
            content.append(item)
        elif request.tools.parallel or not calls:
            calls.append(item)
    return "".join(content), calls


def chat_body(
    request: ChatCompletionRequest,
    text: str,
    reasoning: str,
    logprobs: list[TokenLogprob],
    done: Done,
    *,
    model: str,
    id: str,
    created: int,
) -> bytes:
    """The ``chat.completion`` body of a request that did not stream, its tool calls parsed
    out of the text."""
    content, calls = split_tool_calls(request, text)
    return completion_body(
        content,
        reasoning,
        done,
        model=model,
        id=id,
        created=created,
        tool_calls=calls,
        logprobs=logprobs if request.logprobs else None,
    )


@attrs.define
class _ExtendedStream:
    """Chunks with ``logprobs`` and ``tool_calls`` deltas.

    Content that may be the start of a ``<tool_call>`` is held back; a call goes out as one
    delta (id, name and all its arguments) once its closing tag arrives. Log-probabilities
    travel with the next content chunk sent.
    """

    _base: ChatCompletionStream
    _request: ChatCompletionRequest
    _parser: ToolCallParser | None = None
    _calls: int = 0
    _pending: list[TokenLogprob] = attrs.Factory(list)

    def __attrs_post_init__(self) -> None:
        if self._request.tools.parses:
            self._parser = ToolCallParser(self._request.tools.tools)

    def _chunk(self, delta: dict[str, Any], logprobs: Any = None) -> bytes:
        base = self._base
        body: dict[str, Any] = {
            "id": base.id,
            "object": "chat.completion.chunk",
            "created": base.created,
            "model": base.model,
            "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": None}],
        }
        if base.include_usage:
            body["usage"] = None
        return b"data: " + dumps(body) + b"\n\n"

    def _content(self, text: str, reasoning: bool = False) -> bytes:
        logprobs = None
        if self._pending and self._request.logprobs:
            logprobs = chat_logprobs_json(self._pending)
            self._pending = []
        key = "reasoning_content" if reasoning else "content"
        return self._chunk({key: text}, logprobs)

    def _items(self, items: list[str | ToolCall]) -> bytes:
        out = b""
        for item in items:
            if isinstance(item, str):
                if self._calls and not item.strip():
                    continue  # the newlines between and after calls
                out += self._content(item)
            elif self._request.tools.parallel or not self._calls:
                out += self._chunk({"tool_calls": [tool_call_json(item, self._calls)]})
                self._calls += 1
        return out

    def role(self) -> bytes:
        return self._base.role()

    def token(self, token: Token) -> bytes:
        self._pending += token.logprobs
        if token.reasoning:
            return self._content(token.text, reasoning=True)
        if self._parser is None:
            return self._content(token.text)
        return self._items(self._parser.feed(token.text))

    def finish(self, done: Done) -> bytes:
        out = b"" if self._parser is None else self._items(self._parser.flush())
        if self._pending and self._request.logprobs:
            out += self._chunk({}, chat_logprobs_json(self._pending))
            self._pending = []
        reason = "tool_calls" if self._calls else None
        return out + self._base.finish(done, finish_reason=reason)

    def usage(self, done: Done) -> bytes:
        return self._base.usage(done)

    def done(self) -> bytes:
        return self._base.done()
