"""A chat completion's response, streamed or whole: events in, bytes out. Pure.

One encoder per form, both on the response pieces of ``_responses``:

- :class:`ChatStream`, the server-sent events: the role chunk first, a ``content`` (or
  ``reasoning_content``) delta per piece, then the finish chunk, the usage chunk when asked
  for, and ``[DONE]``. A plain request's delta is pre-encoded bytes around one string escape;
  with tools, content that may be the start of a ``<tool_call>`` is held back and a call
  streams as OpenAI's API streams it: a first delta with its ``index``, ``id``, ``type`` and
  ``name`` (and ``arguments: ""``) once the name is read, then a delta per piece of its
  ``arguments`` as they are generated (:class:`ToolCallStream`); with logprobs, a content
  delta carries the log-probabilities of the tokens it completes.
- :class:`ChatBody`, the one ``chat.completion`` body of a request that did not stream, its
  tool calls parsed out of the whole text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..api import OPENAI_ERRORS, SSE_DONE, ApiError, dumps, json_string
from ..engine import (
    Done,
    Token,
    TokenLogprob,
    ToolCall,
    ToolCallArguments,
    ToolCallEvent,
    ToolCallParser,
    ToolCallStart,
    ToolCallStream,
)
from ._chat_request import ChatCompletionRequest
from ._encoding import (
    Envelope,
    ResponseMeta,
    chat_logprobs_json,
    finish_reason,
    timings_json,
    usage_json,
)

__all__ = ["ChatBody", "ChatStream", "split_tool_calls", "tool_call_json"]

_NO_FINISH = b',"logprobs":null,"finish_reason":null}'


def tool_call_json(call: ToolCall, index: int | None = None) -> dict[str, Any]:
    """A call in OpenAI's ``tool_calls`` shape (with ``index`` in a streamed delta)."""
    out: dict[str, Any] = {} if index is None else {"index": index}
    out.update(
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
    )
    return out


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


class ChatStream:
    """The server-sent events of one streamed chat completion (see the module's doc)."""

    streaming = True

    def __init__(self, request: ChatCompletionRequest, meta: ResponseMeta) -> None:
        self._request = request
        self._envelope = Envelope(meta, "chat.completion.chunk", request.include_usage)
        self._content = self._envelope.prefix(b'{"index":0,"delta":{"content":')
        self._reasoning = self._envelope.prefix(b'{"index":0,"delta":{"reasoning_content":')
        self._parser = ToolCallStream(request.tools.tools) if request.tools.parses else None
        #: Calls sent (their first delta out); with ``parallel_tool_calls`` off, one at most.
        self._calls = 0
        self._pending: list[TokenLogprob] = []

    def start(self) -> bytes:
        """The first chunk: ``delta: {"role": "assistant", "content": ""}``."""
        return self._delta({"role": "assistant", "content": ""})

    def event(self, token: Token) -> bytes:
        """The chunks for one piece of text (none while a possible tool call is held back)."""
        if self._request.logprobs:
            self._pending += token.logprobs
        if self._parser is not None and not token.reasoning:
            return self._items(self._parser.feed(token.text))
        return self._text(token.text, reasoning=token.reasoning)

    def finish(self, done: Done) -> bytes:
        """What is held back, the finish chunk (with llama.cpp's ``timings``), the usage chunk
        when the client asked for it, and ``[DONE]``."""
        out = b"" if self._parser is None else self._items(self._parser.finish())
        if self._pending:
            out += self._delta({}, chat_logprobs_json(self._pending))
            self._pending = []
        choice = (
            b'{"index":0,"delta":{},"logprobs":null,"finish_reason":"'
            + self.finish_reason(done).encode()
            + b'"}'
        )
        out += self._envelope.chunk(choice, timings=timings_json(done))
        if self._request.include_usage:
            out += self._envelope.usage(done)
        return out + SSE_DONE

    def finish_reason(self, done: Done) -> str:
        return finish_reason(done, self._calls)

    def failure(self, error: ApiError) -> bytes:
        return OPENAI_ERRORS.event(error)

    def _text(self, text: str, *, reasoning: bool = False) -> bytes:
        if self._pending:
            key = "reasoning_content" if reasoning else "content"
            delta = self._delta({key: text}, chat_logprobs_json(self._pending))
            self._pending = []
            return delta
        prefix = self._reasoning if reasoning else self._content
        return self._envelope.with_prefix(prefix, json_string(text) + b"}" + _NO_FINISH)

    def _delta(self, delta: dict[str, Any], logprobs: Any = None) -> bytes:
        choice = {"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": None}
        return self._envelope.chunk(dumps(choice))

    def _items(self, events: list[ToolCallEvent]) -> bytes:
        out = b""
        for event in events:
            if isinstance(event, str):
                if self._calls and not event.strip():
                    continue  # the newlines between and after calls
                out += self._text(event)
            elif isinstance(event, ToolCallStart):
                if self._request.tools.parallel or not self._calls:
                    out += self._call_delta(
                        {
                            "index": event.index,
                            "id": event.id,
                            "type": "function",
                            "function": {"name": event.name, "arguments": ""},
                        }
                    )
                    self._calls += 1
            elif isinstance(event, ToolCallArguments) and event.index < self._calls:
                out += self._call_delta(
                    {"index": event.index, "function": {"arguments": event.text}}
                )
            # A ToolCallEnd sends nothing: the finish chunk says ``tool_calls``.
        return out

    def _call_delta(self, call: dict[str, Any]) -> bytes:
        return self._delta({"tool_calls": [call]})


class ChatBody:
    """The ``chat.completion`` body of a request that did not stream: the events are
    collected, the body is written at the end."""

    streaming = False

    def __init__(self, request: ChatCompletionRequest, meta: ResponseMeta) -> None:
        self._request = request
        self._meta = meta
        self._text: list[str] = []
        self._reasoning: list[str] = []
        self._logprobs: list[TokenLogprob] = []
        self._calls: list[ToolCall] = []

    def start(self) -> bytes:
        return b""

    def event(self, token: Token) -> bytes:
        (self._reasoning if token.reasoning else self._text).append(token.text)
        self._logprobs += token.logprobs
        return b""

    def finish(self, done: Done) -> bytes:
        content, self._calls = split_tool_calls(self._request, "".join(self._text))
        return completion_body(
            content,
            "".join(self._reasoning),
            done,
            self._meta,
            tool_calls=self._calls,
            logprobs=self._logprobs if self._request.logprobs else None,
        )

    def finish_reason(self, done: Done) -> str:
        return finish_reason(done, len(self._calls))

    def failure(self, error: ApiError) -> bytes:
        return OPENAI_ERRORS.event(error)


def completion_body(
    text: str,
    reasoning: str,
    done: Done,
    meta: ResponseMeta,
    *,
    tool_calls: Sequence[ToolCall] = (),
    logprobs: Sequence[TokenLogprob] | None = None,
) -> bytes:
    """The ``chat.completion`` response body.

    ``message.reasoning_content`` is present only when ``reasoning`` is not empty; the
    non-standard ``timings`` follows llama.cpp's server. With ``tool_calls`` the message
    carries them (``content`` is then ``null`` when empty) and ``finish_reason`` is
    ``tool_calls`` (``length`` when the tokens ran out); ``logprobs`` (when asked for) go
    in OpenAI's ``{"content": [...]}``.
    """
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if reasoning:
        message["reasoning_content"] = reasoning
    if tool_calls:
        message["content"] = text.strip() or None
        message["tool_calls"] = [tool_call_json(call) for call in tool_calls]
    return dumps(
        {
            "id": meta.id,
            "object": "chat.completion",
            "created": meta.created,
            "model": meta.model,
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "logprobs": None if logprobs is None else chat_logprobs_json(logprobs),
                    "finish_reason": finish_reason(done, len(tool_calls)),
                }
            ],
            "usage": usage_json(done),
            "timings": timings_json(done),
        }
    )
