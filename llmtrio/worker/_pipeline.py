"""The request pipeline of the worker: one :class:`Endpoint` shape, one serve path.

An endpoint is a small value: the route it answers, the kind of model it needs, how to parse
its request body into engine work (:meth:`Endpoint.parse`, pure), how to run that work on the
engine (:meth:`Endpoint.run`, an ``async with`` giving the events), and how to encode the
events as a JSON body or as server-sent events (:meth:`Endpoint.encoder`, pure). Every route
the worker serves is one instance (``_endpoints.ENDPOINTS``: OpenAI's chat and text
completions, Responses API and embeddings, Anthropic's Messages API, the token counts,
reranking's four routes, llama.cpp's tokenizer routes); a new endpoint is a new instance.

The events of the work end with the engine's ``Done`` (a generation), a ``Failed``, or an
:class:`~._encoding.Answer` (work that is not a generation: a tokenizer's answer, the vectors
of an embeddings request, a token count), each answer kind its own type; the metrics observe
generations only, and count each kind of answer in a counter of its own.

:func:`serve_request` is the one path every endpoint's requests go through:

- a body the endpoint refuses, or work the engine refuses before it starts, gets its error
  response (OpenAI's shape, its status);
- the response head goes out with the first event of an event stream (so a request that
  fails before its first token still gets its error status), or with the whole body of a
  JSON response; an encoder that :class:`KeepsAlive` (Anthropic's stream) opens its stream
  before the first event when that is slow to come (a long prompt), and pings until it does;
- every error is told in the shape of the endpoint's route family
  (``llmtrio.api.error_family``: OpenAI's, or Anthropic's on ``/v1/messages*``), and an
  engine's refusal in its words (``from_engine_error``: a prompt too long for the context is
  "maximum context length" to OpenAI's clients, "prompt is too long" to Anthropic's);
- an event stream is relayed with back-pressure while the engine works and flushed in one
  last chunk once it has finished, so the slot is free however slowly the client reads;
- a failure after the head is an error event on an event stream, worded by the encoder
  (:meth:`Encoder.failure`: chat's ``data: {"error": ...}``, the Responses API's
  ``response.failed``); a JSON body cut after its head can only be failed;
- every end states the response's :class:`~llmtrio.ring.Outcome` (its finish reason and
  token counts, or its error code) on the ring, for the ingress's access log and metrics,
  which never read the response's bytes;
- anything unexpected is the caller's to turn into a 500 (``_link``): this request only.

The shapes an endpoint is made of (``Endpoint``, ``Encoder``, ``Events``) are in ``_shapes``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import trio

from ..api import (
    OPENAI_ERRORS,
    ApiError,
    ErrorFamily,
    RequestLimits,
    error_family,
    server_error,
    wrong_model_kind,
)
from ..engine import (
    Done,
    EngineError,
    Failed,
    PromptTooLongError,
    Token,
)
from ..ring import ClaimedStream, Outcome, StreamCancelledError
from ._encoding import Answer, ResponseMeta, from_engine_error, new_id
from ._metrics import WorkerMetrics
from ._shapes import (
    Encoder,
    Endpoint,
    Events,
    KeepsAlive,
    ModelEngine,
    TypedBody,
    WorkEvent,
)

__all__ = ["JSON_HEADERS", "serve_request"]

logger = logging.getLogger("llmtrio.worker")

SSE_HEADERS = (
    ("content-type", "text/event-stream"),
    ("cache-control", "no-cache"),
    ("x-accel-buffering", "no"),
)
JSON_HEADERS = (("content-type", "application/json"),)


class _Response:
    """One stream's response as the worker writes it: remembers whether the head went out,
    so a failure can still be told in the right form, and what the response ended with
    (``outcome``), which every end states."""

    def __init__(
        self,
        claimed: ClaimedStream,
        metrics: WorkerMetrics | None,
        engine: ModelEngine,
        family: ErrorFamily = OPENAI_ERRORS,
    ) -> None:
        self.claimed = claimed
        self.family = family  # the shape its errors are told in (its route's)
        self.metrics = metrics
        self.engine = engine
        self.streaming = False  # the head of an event stream was sent
        self.sent_head = False
        self.outcome: Outcome | None = None
        #: The response's encoder, once the request is parsed (it words a stream's failure).
        self.encoder: Encoder[Any] | None = None

    async def head(
        self, status: int, headers: tuple[tuple[str, str], ...], *, streaming: bool = False
    ) -> None:
        self.sent_head = True
        self.streaming = streaming
        await self.claimed.send_head(status, headers)

    def finished(self, end: Done | Answer, encoder: Encoder[Any]) -> None:
        """The work is done: its finish reason as the response gives it, and its counts (an
        answer's prompt tokens; nothing reused, nothing generated)."""
        model = self.engine.model_name
        if isinstance(end, Answer):
            if self.metrics is not None:
                self.metrics.answered(end, model)
            cached, completion = 0, 0
        else:
            if self.metrics is not None:
                self.metrics.generated(end, model)
            cached, completion = end.cached_tokens, end.completion_tokens
        self.outcome = Outcome(
            finish_reason=encoder.finish_reason(end),
            prompt_tokens=end.prompt_tokens,
            cached_tokens=cached,
            completion_tokens=completion,
        )

    def failed(self, error: ApiError, *, prompt_tokens: int | None = None) -> ApiError:
        """The response tells ``error``: its code, besides the counts known so far."""
        known = self.outcome or Outcome(prompt_tokens=prompt_tokens)
        self.outcome = attrs.evolve(known, error_code=error.error_code)
        return error

    async def end(self, last: bytes) -> None:
        await self.claimed.end(last, outcome=self.outcome)

    async def whole(self, status: int, headers: tuple[tuple[str, str], ...], body: bytes) -> None:
        """A whole response at once: status, headers, body, end."""
        self.sent_head = True
        await self.claimed.respond(status, headers, body, outcome=self.outcome)

    async def error(self, error: ApiError, *, prompt_tokens: int | None = None) -> None:
        """A whole error response: status, JSON body, end."""
        self.failed(error, prompt_tokens=prompt_tokens)
        await self.whole(*self.family.response(error))

    async def fail(self, error: ApiError) -> None:
        """End with ``error``: an error response before the head, an error event on an event
        stream; a JSON body cut after its head can only be failed."""
        if not self.sent_head:
            await self.error(error)
            return
        self.failed(error)
        if self.streaming:
            encoder = self.encoder
            await self.end(self.family.event(error) if encoder is None else encoder.failure(error))
        else:
            self.claimed.fail(error.message, outcome=self.outcome)


async def serve_request(
    endpoint: Endpoint[Any],
    engine: ModelEngine,
    claimed: ClaimedStream,
    *,
    limits: RequestLimits,
    metrics: WorkerMetrics | None,
    request_id: str,
) -> None:
    """Respond to one claimed stream with ``endpoint``; the client going away cancels the
    response (and so the engine's work). A fault ends this stream with a 500 (or an error
    event once streaming); the caller's ``with claimed:`` acknowledges a cancellation or
    fails a stream left unfinished."""
    response = _Response(claimed, metrics, engine, error_family(endpoint.route))
    # The claimed stream's own scope: the ring cancels it when the client goes away, which
    # ends the engine's work at its next checkpoint (no task watches for it).
    with claimed.cancel_scope:
        try:
            try:
                await _respond(endpoint, engine, response, limits)
            except* StreamCancelledError:
                # The client went away. except*: the send that found it gone may raise in a
                # nursery (an event stream's relay) while the scope cancels it, so it comes
                # out grouped with a Cancelled (which the scope absorbs).
                pass
        except Exception:
            logger.exception("request %s failed", request_id)
            await response.fail(server_error())


async def _respond(
    endpoint: Endpoint[Any], engine: ModelEngine, response: _Response, limits: RequestLimits
) -> None:
    if endpoint.model_kind not in (None, engine.kind):
        await response.error(wrong_model_kind(engine.model_name, engine.kind, endpoint.route))
        return
    try:
        request = endpoint.parse(response.claimed.body, limits)
    except ApiError as error:
        await response.error(error)
        return
    meta = ResponseMeta(new_id(endpoint.id_prefix), int(time.time()), engine.model_name)
    try:
        async with endpoint.run(engine, request) as events:
            meta = attrs.evolve(meta, prompt_tokens=events.prompt_tokens)
            encoder = response.encoder = endpoint.encoder(request, meta)
            if encoder.streaming:
                await _stream(response, encoder, events)
            else:
                await _whole(response, encoder, events)
    except ApiError as error:
        await response.error(error)
    except EngineError as exc:
        await response.error(
            from_engine_error(exc, response.family), prompt_tokens=_prompt_tokens(exc)
        )


async def _stream(response: _Response, encoder: Encoder[Any], events: Events) -> None:
    """An event stream; its head goes out with the first event, so a request that fails
    before any token gets a plain error response with its status."""

    def encode(event: WorkEvent) -> bytes:
        if isinstance(event, Token):
            return encoder.event(event)
        if isinstance(event, Done | Answer):
            last = encoder.finish(event)
            response.finished(event, encoder)
            return last
        assert isinstance(event, Failed)
        error = response.failed(
            _failure(event, response.family), prompt_tokens=_prompt_tokens(event.error)
        )
        return encoder.failure(error)

    iterator = aiter(events)
    if isinstance(encoder, KeepsAlive):
        first = await _first_keeping_alive(response, encoder, iterator)
    else:
        first = await anext(iterator)
    if response.sent_head:
        opening = b""
    elif isinstance(first, Failed):
        await response.error(
            _failure(first, response.family), prompt_tokens=_prompt_tokens(first.error)
        )
        return
    else:
        await response.head(200, SSE_HEADERS, streaming=True)
        opening = encoder.start()
    await _relay(response, events, iterator, encode, opening + encode(first))


async def _first_keeping_alive(
    response: _Response, encoder: Encoder[Any], iterator: AsyncIterator[WorkEvent]
) -> WorkEvent:
    """The work's first event; if it takes longer than the encoder's ``keepalive_s``, the
    stream opens (head, :meth:`Encoder.start`) and pings while it waits (``KeepsAlive``)."""
    assert isinstance(encoder, KeepsAlive)
    while True:
        with trio.move_on_after(encoder.keepalive_s):
            return await anext(iterator)  # a memory channel's receive: cancel-safe
        if not response.sent_head:
            await response.head(200, SSE_HEADERS, streaming=True)
            await response.claimed.send(encoder.start() + encoder.ping())
        else:
            await response.claimed.send(encoder.ping())


async def _relay(
    response: _Response,
    events: Events,
    iterator: AsyncIterator[WorkEvent],
    encode: Callable[[WorkEvent], bytes],
    first: bytes,
) -> None:
    """Send each event's bytes as the work produces them, waiting on the client's buffer
    (back-pressure) only while the work runs; once it has ended, everything left goes out in
    one last chunk and the response ends, so the slot is free at once."""
    claimed = response.claimed
    unsent = [first]
    async with trio.open_nursery() as nursery:

        async def stop_waiting_at_the_end() -> None:
            await events.ended.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(stop_waiting_at_the_end)
        while True:
            while unsent:
                if unsent[0]:
                    await claimed.send(unsent[0])  # a send cancelled here delivered nothing
                del unsent[0]
            try:
                event = await anext(iterator)
            except StopAsyncIteration:
                break
            unsent.append(encode(event))
    unsent += [encode(event) for event in events.drain()]
    await response.end(b"".join(unsent))


async def _whole(response: _Response, encoder: Encoder[Any], events: Events) -> None:
    """One JSON body, written once the work is done: its head goes out with it, so a
    failure at any point is still an error response with its status. The events are read to
    their end (the last is a ``Done``, an ``Answer`` or a ``Failed``), so that no async
    generator of theirs is left for the garbage collector to close in a task of its own."""
    last: WorkEvent | None = None
    async for event in events:
        if isinstance(event, Token):
            encoder.event(event)
        else:
            last = event
    if isinstance(last, Done | Answer):
        body = encoder.finish(last)
        response.finished(last, encoder)
        headers = JSON_HEADERS
        if isinstance(encoder, TypedBody):
            headers = (("content-type", encoder.content_type),)
        await response.whole(200, headers, body)
    else:
        assert isinstance(last, Failed), "the work's events end with a Done, an Answer or a Failed"
        await response.error(
            _failure(last, response.family), prompt_tokens=_prompt_tokens(last.error)
        )


def _prompt_tokens(error: Exception) -> int | None:
    """The prompt's length, when an error knows it exactly (a prompt too long for the
    context, measured whole)."""
    if isinstance(error, PromptTooLongError) and not error.at_least:
        return error.prompt_tokens
    return None


def _failure(event: Failed, family: ErrorFamily) -> ApiError:
    logger.warning("generation failed: %s", event.error)
    if isinstance(event.error, EngineError):
        return from_engine_error(event.error, family)
    return server_error()
