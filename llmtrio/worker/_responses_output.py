"""A Responses API response, streamed or whole: events in, bytes out. Pure.

One state machine (:class:`_Output`) turns the generation's pieces into the response's output
items, in the order they were generated: a ``reasoning`` item (its text as one
``reasoning_text`` part), a ``message`` item (one ``output_text`` part), ``function_call``
items (their ``arguments`` streamed as they are generated, by the engine's
:class:`ToolCallStream`, as chat's stream does) and a custom tool's ``custom_tool_call``
items (their ``input`` text streamed the same way); a call of a namespace's tool carries its
``namespace`` and the tool's own ``name``. Each step also states the stream events
OpenAI's API sends for it (``response.output_item.added``, ``response.content_part.added``,
``response.output_text.delta``, ``response.reasoning_text.delta``,
``response.function_call_arguments.delta``, ``response.custom_tool_call_input.delta``, their
``.done`` events, ...), each with a rising
``sequence_number``.

- :class:`ResponsesStream` sends those events as server-sent events, between
  ``response.created`` + ``response.in_progress`` and one of ``response.completed``,
  ``response.incomplete`` (the output limit was reached) or ``response.failed``;
- :class:`ResponsesBody` writes the ``response`` object whole;
- :class:`InputTokensBody` answers ``/v1/responses/input_tokens``.
"""

from __future__ import annotations

import secrets
from typing import Any

from ..api import OPENAI_ERRORS, ApiError, dumps, sse
from ..engine import (
    Done,
    Token,
    TokenLogprob,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallEvent,
    ToolCallStart,
    ToolCallStream,
)
from ._encoding import Counted, ResponseMeta, WholeBody, finish_reason, token_logprob_json
from ._responses_request import ResponsesRequest
from ._responses_tools import OfferedTool

__all__ = ["InputTokensBody", "ResponsesBody", "ResponsesStream", "response_usage"]


def _item_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(12)}"


def response_usage(done: Done) -> dict[str, Any]:
    """The Responses API's usage: ``input_tokens`` counts the reused ones too, and
    ``input_tokens_details.cached_tokens`` says how many were reused (``cache_write_tokens``,
    which the SDK's type requires, is 0: nothing is written to a cache on request)."""
    return {
        "input_tokens": done.prompt_tokens,
        "input_tokens_details": {"cached_tokens": done.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": done.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": done.reasoning_tokens},
        "total_tokens": done.prompt_tokens + done.completion_tokens,
    }


class _Output:
    """The output items of one response and the stream events that write them."""

    def __init__(self, request: ResponsesRequest, meta: ResponseMeta) -> None:
        self._request = request
        self._meta = meta
        self._parser = ToolCallStream(request.tools.tools) if request.tools.parses else None
        self._limit = request.call_limit
        self.items: list[dict[str, Any]] = []
        self.calls = 0
        self._sequence = 0
        self._events: list[dict[str, Any]] = []
        #: The item being written (the last of ``items``), its text so far, and the
        #: log-probabilities of the text not yet sent.
        self._open: dict[str, Any] | None = None
        self._text: list[str] = []
        self._logprobs: list[dict[str, Any]] = []
        self._pending: list[TokenLogprob] = []
        self._space = ""  # whitespace not yet known to belong to a message

    # -- the response object --------------------------------------------------------------

    def response(self, status: str, done: Done | None = None, error: Any = None) -> dict[str, Any]:
        """The ``response`` object with its ``output`` so far."""
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self._meta.id,
            "object": "response",
            "created_at": self._meta.created,
            "status": status,
            "background": False,
            "error": error,
            "incomplete_details": incomplete,
            "model": self._meta.model,
            "output": list(self.items),
            "previous_response_id": None,
            "service_tier": "default",
            "store": False,
            "truncation": "disabled",
            **self._request.echo,
            "usage": None if done is None else response_usage(done),
        }

    # -- events ------------------------------------------------------------------------------

    def take(self) -> list[dict[str, Any]]:
        """The stream events stated since the last call."""
        events, self._events = self._events, []
        return events

    def event(self, kind: str, **fields: Any) -> None:
        self._events.append({"type": kind, "sequence_number": self._sequence, **fields})
        self._sequence += 1

    def _at(self) -> dict[str, Any]:
        assert self._open is not None
        return {"item_id": self._open["id"], "output_index": len(self.items) - 1}

    # -- pieces in ---------------------------------------------------------------------------

    def feed(self, token: Token) -> None:
        if self._request.logprobs:
            self._pending += token.logprobs
        if token.reasoning:
            self._reasoning(token.text)
        elif self._parser is not None:
            self._tool_events(self._parser.feed(token.text))
        else:
            self._message(token.text)

    def finish(self, done: Done) -> str:
        """Close what is open; the response's status."""
        if self._parser is not None:
            self._tool_events(self._parser.finish())
        if self._pending and self._open is not None and self._open["type"] == "message":
            self._logprobs += [token_logprob_json(e) for e in self._pending]
        self._pending = []
        length = done.stop.finish_reason == "length"
        self._close(complete=not length)
        return "incomplete" if length else "completed"

    def _reasoning(self, text: str) -> None:
        if self._open is None or self._open["type"] != "reasoning":
            self._close()
            self._start({"id": _item_id("rs"), "type": "reasoning", "summary": []})
            self.event("response.content_part.added", **self._at(), content_index=0,
                       part={"type": "reasoning_text", "text": ""})  # fmt: skip
        self._text.append(text)
        self.event("response.reasoning_text.delta", **self._at(), content_index=0, delta=text)

    def _message(self, text: str) -> None:
        if self._open is None or self._open["type"] != "message":
            if not text.strip():
                if not self.calls:
                    self._space += text  # a message does not open on whitespace alone
                return
            self._close()
            item = {"id": _item_id("msg"), "type": "message", "role": "assistant",
                    "status": "in_progress", "content": []}  # fmt: skip
            self._start(item)
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
            self.event("response.content_part.added", **self._at(), content_index=0, part=part)
            text, self._space = self._space + text, ""
        logprobs = [token_logprob_json(e) for e in self._pending]
        self._pending = []
        self._logprobs += logprobs
        self._text.append(text)
        self.event("response.output_text.delta", **self._at(), content_index=0, delta=text,
                   logprobs=logprobs)  # fmt: skip

    def _tool_events(self, events: list[ToolCallEvent]) -> None:
        for event in events:
            if isinstance(event, str):
                self._message(event)
            elif isinstance(event, ToolCallStart):
                if self._limit is None or self.calls < self._limit:
                    self._close()
                    self._space = ""
                    self._start(self._call_item(event))
                    self.calls += 1
            elif isinstance(event, ToolCallArguments):
                if self._is_call(event.index):
                    assert self._open is not None
                    self._text.append(event.text)
                    kind = _DELTAS[self._open["type"]]
                    self.event(kind, **self._at(), delta=event.text)
            elif isinstance(event, ToolCallEnd) and self._is_call(event.index):
                self._close(complete=event.complete)

    def _call_item(self, start: ToolCallStart) -> dict[str, Any]:
        """The output item a call starts: a ``function_call`` (``arguments``) or, for a custom
        tool, a ``custom_tool_call`` (``input``); named as the client named the tool, with its
        ``namespace`` when it has one."""
        named = self._request.offered.get(start.name, OfferedTool(start.name))
        item: dict[str, Any]
        if named.custom:
            item = {"id": _item_id("ctc"), "type": "custom_tool_call", "call_id": start.id,
                    "name": named.name, "input": "", "status": "in_progress"}  # fmt: skip
        else:
            item = {"id": _item_id("fc"), "type": "function_call", "call_id": start.id,
                    "name": named.name, "arguments": "", "status": "in_progress"}  # fmt: skip
        if named.namespace is not None:
            item["namespace"] = named.namespace
        return item

    def _is_call(self, index: int) -> bool:
        """Whether call ``index`` is the open item (a call past the limit is left out)."""
        return self._open is not None and self._open["type"] in _DELTAS and index == self.calls - 1

    # -- items -------------------------------------------------------------------------------

    def _start(self, item: dict[str, Any]) -> None:
        self._open = item
        self._text = []
        self._logprobs = []
        self.items.append(item)
        self.event("response.output_item.added", output_index=len(self.items) - 1,
                   item=dict(item))  # fmt: skip

    def _close(self, *, complete: bool = True) -> None:
        """The open item is written: its ``.done`` events, and its final form in ``items``."""
        item = self._open
        if item is None:
            return
        text = "".join(self._text)
        at = self._at()
        status = "completed" if complete else "incomplete"
        part: dict[str, Any]
        if item["type"] == "reasoning":
            part = {"type": "reasoning_text", "text": text}
            self.event("response.reasoning_text.done", **at, content_index=0, text=text)
            self.event("response.content_part.done", **at, content_index=0, part=part)
            item.update(content=[part], status=status)
        elif item["type"] == "message":
            part = {"type": "output_text", "text": text, "annotations": [],
                    "logprobs": self._logprobs}  # fmt: skip
            self.event("response.output_text.done", **at, content_index=0, text=text,
                       logprobs=self._logprobs)  # fmt: skip
            self.event("response.content_part.done", **at, content_index=0, part=part)
            item.update(content=[part], status=status)
        elif item["type"] == "custom_tool_call":
            self.event("response.custom_tool_call_input.done", **at, input=text)
            item.update(input=text, status=status)
        else:
            self.event("response.function_call_arguments.done", **at, arguments=text)
            item.update(arguments=text, status=status)
        self.event("response.output_item.done", output_index=at["output_index"], item=item)
        self._open = None
        self._text = []


#: The event that streams each kind of call's input.
_DELTAS = {
    "function_call": "response.function_call_arguments.delta",
    "custom_tool_call": "response.custom_tool_call_input.delta",
}


def _sse(event: dict[str, Any]) -> bytes:
    kind: str = event["type"]
    return sse(dumps(event), kind)


class ResponsesStream:
    """The server-sent events of one streamed response (see the module's doc). No ``[DONE]``
    follows the last event, as in OpenAI's API."""

    streaming = True

    def __init__(self, request: ResponsesRequest, meta: ResponseMeta) -> None:
        self._output = _Output(request, meta)

    def start(self) -> bytes:
        """``response.created`` and ``response.in_progress``."""
        head = self._output.response("in_progress")
        self._output.event("response.created", response=head)
        self._output.event("response.in_progress", response=head)
        return self._send()

    def event(self, token: Token) -> bytes:
        self._output.feed(token)
        return self._send()

    def finish(self, done: Done) -> bytes:
        """What is still open, closed, and ``response.completed`` (``response.incomplete``
        when the output limit was reached) with the whole response."""
        status = self._output.finish(done)
        self._output.event(f"response.{status}", response=self._output.response(status, done))
        return self._send()

    def failure(self, error: ApiError) -> bytes:
        """``response.failed``, its ``error`` saying what went wrong."""
        code = "server_error" if error.status >= 500 else error.error_code
        failed = self._output.response("failed", error={"code": code, "message": error.message})
        self._output.event("response.failed", response=failed)
        return self._send()

    def finish_reason(self, done: Done) -> str:
        return finish_reason(done, self._output.calls)

    def _send(self) -> bytes:
        return b"".join(_sse(event) for event in self._output.take())


class ResponsesBody:
    """The ``response`` object of a request that did not stream, written at the end."""

    streaming = False

    def __init__(self, request: ResponsesRequest, meta: ResponseMeta) -> None:
        self._output = _Output(request, meta)

    def start(self) -> bytes:
        return b""

    def event(self, token: Token) -> bytes:
        self._output.feed(token)
        self._output.take()
        return b""

    def finish(self, done: Done) -> bytes:
        status = self._output.finish(done)
        return dumps(self._output.response(status, done))

    def failure(self, error: ApiError) -> bytes:
        return OPENAI_ERRORS.event(error)

    def finish_reason(self, done: Done) -> str:
        return finish_reason(done, self._output.calls)


class InputTokensBody(WholeBody):
    """``{"object": "response.input_tokens", "input_tokens": N}``: the prompt's tokens,
    templated exactly as a generation's (its ``usage.input_tokens``)."""

    def finish(self, counted: Counted) -> bytes:
        return dumps({"object": "response.input_tokens", "input_tokens": counted.prompt_tokens})
