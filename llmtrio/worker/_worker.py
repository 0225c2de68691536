"""The ring adapter: claims request lanes while the engine has free slots, runs each as an
engine generation, and writes OpenAI chat-completion bytes to the response lane.

Each claimed stream is handled in its own task and its own cancel scope: the client going
away (``Claimed.cancelled``) cancels that scope, which ends the generation and frees the slot
at the next token boundary. Whatever goes wrong while serving one stream ends that stream
only, with a 500 in OpenAI's shape; the link and the other streams go on.

Capacity follows the generation: a stream holds one of the link's slots while its generation
runs; once the generation has ended, what it produced is handed to the ring in one last chunk
(past the client's buffer bound) and the slot is free, however slowly the client reads.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from .._routes import CHAT_PATH, COMPLETIONS_PATH
from ..engine import (
    Done,
    Engine,
    EngineError,
    EngineFailedError,
    Event,
    Failed,
    Generation,
    Token,
    TokenLogprob,
)
from ..ring import ClaimedStream, Heartbeat, RingLink, StreamCancelledError
from ._chat_output import chat_body, chat_stream
from ._completions import (
    CompletionStream,
    completion_text_body,
    new_text_completion_id,
    parse_completion_request,
)
from ._metrics import WorkerMetrics
from ._openai import (
    ChatCompletionRequest,
    OpenAIError,
    RequestLimits,
    from_engine_error,
    new_completion_id,
    parse_chat_request,
    server_error,
)

__all__ = ["HEARTBEAT_INTERVAL_S", "serve_link"]

logger = logging.getLogger("llmtrio.worker")

HEARTBEAT_INTERVAL_S = 0.5
SSE_HEADERS = (
    ("content-type", "text/event-stream"),
    ("cache-control", "no-cache"),
    ("x-accel-buffering", "no"),
)
JSON_HEADERS = (("content-type", "application/json"),)


async def serve_link(
    engine: Engine,
    link: RingLink,
    *,
    metrics: WorkerMetrics | None = None,
    limits: RequestLimits | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve one ring attachment with ``engine`` until cancelled; each finished request is
    observed by ``metrics``, each request body checked against ``limits``.

    Claims a stream only while fewer than the link's ``max_inflight`` generations run (pull,
    never push); requests beyond the engine's admission wait inside the engine. Sends a
    capacity heartbeat whenever the engine's inflight count changes, and every
    ``HEARTBEAT_INTERVAL_S`` (for ``decoding``).

    Resource handling: cancelling this cancels every generation it runs; each stream is
    finished (ended or failed) before its task returns.

    Error handling: a fault while serving one stream ends that stream only (logged, and a 500
    to its client). :class:`EngineFailedError` when the engine's decode loop dies: nothing
    can be served any more, so the link should detach.
    """
    slots = trio.Semaphore(link.max_inflight)

    def heartbeat() -> None:
        capacity = engine.capacity()
        link.heartbeat(
            Heartbeat(
                capacity.inflight,
                capacity.max_inflight,
                capacity.available_slots,
                capacity.decoding,
                cache_hits=capacity.cache_hits,
                cached_tokens=capacity.cached_tokens,
                cache_bytes=capacity.cache_bytes,
                spec_drafted=capacity.spec_drafted,
                spec_accepted=capacity.spec_accepted,
            )
        )

    async def beat() -> None:
        while True:
            heartbeat()
            with trio.move_on_after(HEARTBEAT_INTERVAL_S):
                await engine.capacity_changed()

    async def handle(claimed: ClaimedStream) -> None:
        try:
            with claimed:
                await _serve_stream(engine, claimed, metrics, limits or RequestLimits())
        except Exception:  # the stream is failed by `with claimed`; nothing else is touched
            logger.exception("request %s: the worker failed", _request_id(claimed))
        finally:
            slots.release()

    failure: EngineFailedError | None = None
    async with trio.open_nursery() as nursery:

        async def watch_engine() -> None:
            nonlocal failure
            failure = await engine.wait_failed()
            nursery.cancel_scope.cancel()

        nursery.start_soon(beat)
        nursery.start_soon(watch_engine)
        task_status.started()
        while True:
            await slots.acquire()
            try:
                claimed = await link.claim()
            except BaseException:
                slots.release()
                raise
            nursery.start_soon(handle, claimed)
    assert failure is not None  # the loop above ends only by cancellation
    raise failure


def _request_id(claimed: ClaimedStream) -> str:
    for name, value in claimed.head.headers:
        if name == "x-request-id":
            return value
    return f"stream-{claimed.stream_id}"


async def _serve_stream(
    engine: Engine,
    claimed: ClaimedStream,
    metrics: WorkerMetrics | None,
    limits: RequestLimits,
) -> None:
    """Respond to one stream; its client going away cancels the response (and so the
    generation). A fault ends this stream with a 500 (or an error event once streaming).
    The caller's ``with claimed:`` acknowledges a cancellation or fails a stream left
    unfinished."""
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            await claimed.cancelled.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        response = _Response(claimed, metrics, limits)
        try:
            await _respond(engine, response)
        except StreamCancelledError:
            pass
        except Exception:
            logger.exception("request %s failed", _request_id(claimed))
            await response.fail(server_error())
        nursery.cancel_scope.cancel()


class _Response:
    """One stream's response as the worker writes it: remembers whether the head went out,
    so a failure can still be told in the right form."""

    def __init__(
        self, claimed: ClaimedStream, metrics: WorkerMetrics | None, limits: RequestLimits
    ) -> None:
        self.claimed = claimed
        self.metrics = metrics
        self.limits = limits
        self.streaming = False  # the head of an event stream was sent
        self.sent_head = False

    async def head(
        self, status: int, headers: tuple[tuple[str, str], ...], *, streaming: bool = False
    ) -> None:
        self.sent_head = True
        self.streaming = streaming
        await self.claimed.send_head(status, headers)

    def finished(self, done: Done) -> None:
        if self.metrics is not None:
            self.metrics.finished(done)

    async def error(self, error: OpenAIError) -> None:
        """A whole error response: status, JSON body, end."""
        await self.head(error.status, (*JSON_HEADERS, *error.headers))
        await self.claimed.end(error.body())

    async def fail(self, error: OpenAIError) -> None:
        """End with ``error``: an error response before the head, an error event on an event
        stream; a JSON body cut after its head can only be failed."""
        if not self.sent_head:
            await self.error(error)
        elif self.streaming:
            await self.claimed.end(error.sse())
        else:
            self.claimed.fail(error.message)


async def _respond(engine: Engine, response: _Response) -> None:
    """Dispatch on the path the ingress routed here (``llmtrio._routes``): the ingress owns
    routing, so a path without a handler is a fault (a 500, logged), not a 404."""
    claimed = response.claimed
    path = claimed.head.path.split("?", 1)[0]
    if path == COMPLETIONS_PATH:
        await _respond_text(engine, response)
        return
    if path != CHAT_PATH:
        raise LookupError(f"the ingress routed {path!r} to this worker, which does not serve it")
    try:
        request = parse_chat_request(claimed.body, response.limits)
    except OpenAIError as error:
        await response.error(error)
        return
    try:
        async with engine.submit(request.generate) as generation:
            if request.stream:
                await _stream(engine, response, request, generation)
            else:
                await _complete(engine, response, request, generation)
    except EngineError as exc:
        await response.error(from_engine_error(exc))


async def _stream(
    engine: Engine, response: _Response, request: ChatCompletionRequest, generation: Generation
) -> None:
    """An event stream; its head goes out with the first event of the generation, so a
    request that fails before any token gets a plain error response with its status."""
    encoder = chat_stream(
        request, id=new_completion_id(), created=int(time.time()), model=engine.model_name
    )

    def encode(event: Event) -> bytes:
        if isinstance(event, Token):
            return encoder.token(event)  # empty while a possible tool call is held back
        if isinstance(event, Done):
            response.finished(event)
            tail = encoder.finish(event)
            if request.include_usage:
                tail += encoder.usage(event)
            return tail + encoder.done()
        return _failure(event).sse()

    first = await anext(generation)
    if isinstance(first, Failed):
        await response.error(_failure(first))
        return
    await response.head(200, SSE_HEADERS, streaming=True)
    await _relay(response.claimed, generation, encode, encoder.role() + encode(first))


async def _relay(
    claimed: ClaimedStream, generation: Generation, encode: Callable[[Event], bytes], first: bytes
) -> None:
    """Send each event's bytes as the generation produces them, waiting on the client's
    buffer (back-pressure) only while the generation runs; once it has ended, everything
    left goes out in one last chunk and the response ends, so the slot is free at once."""
    unsent = [first]
    async with trio.open_nursery() as nursery:

        async def stop_waiting_at_the_end() -> None:
            await generation.ended.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(stop_waiting_at_the_end)
        while True:
            while unsent:
                if unsent[0]:
                    await claimed.send(unsent[0])  # a send cancelled here delivered nothing
                del unsent[0]
            try:
                event = await anext(generation)
            except StopAsyncIteration:
                break
            unsent.append(encode(event))
    unsent += [encode(event) for event in generation.drain()]
    await claimed.end(b"".join(unsent))


async def _complete(
    engine: Engine, response: _Response, request: ChatCompletionRequest, generation: Generation
) -> None:
    text: list[str] = []
    reasoning: list[str] = []
    logprobs: list[TokenLogprob] = []
    async for event in generation:
        if isinstance(event, Token):
            (reasoning if event.reasoning else text).append(event.text)
            logprobs += event.logprobs
        elif isinstance(event, Done):
            response.finished(event)
            body = chat_body(
                request,
                "".join(text),
                "".join(reasoning),
                logprobs,
                event,
                model=engine.model_name,
                id=new_completion_id(),
                created=int(time.time()),
            )
            await response.head(200, JSON_HEADERS)
            await response.claimed.end(body)
            return
        elif isinstance(event, Failed):
            await response.error(_failure(event))
            return


def _failure(event: Failed) -> OpenAIError:
    logger.warning("generation failed: %s", event.error)
    if isinstance(event.error, EngineError):
        return from_engine_error(event.error)
    return server_error()


async def _respond_text(engine: Engine, response: _Response) -> None:
    """``POST /v1/completions``: a raw prompt, streamed or not."""
    claimed = response.claimed
    try:
        request = parse_completion_request(claimed.body, response.limits)
    except OpenAIError as error:
        await response.error(error)
        return
    completion_id, created = new_text_completion_id(), int(time.time())
    try:
        # Tokenizing a long prompt takes a while: never on the event loop.
        generate = await trio.to_thread.run_sync(
            request.generate, lambda text: engine.tokenize(text, add_special=True)
        )
        async with engine.submit(generate) as generation:
            if request.stream:
                encoder = CompletionStream(
                    completion_id,
                    created,
                    engine.model_name,
                    include_usage=request.include_usage,
                    logprobs=request.logprobs is not None,
                )

                def encode(event: Event) -> bytes:
                    if isinstance(event, Token):
                        return encoder.token(event)
                    if isinstance(event, Done):
                        response.finished(event)
                        return encoder.finish(event)
                    return _failure(event).sse()

                first = await anext(generation)
                if isinstance(first, Failed):
                    await response.error(_failure(first))
                    return
                await response.head(200, SSE_HEADERS, streaming=True)
                await _relay(claimed, generation, encode, encode(first))
                return
            text: list[str] = []
            logprobs: list[TokenLogprob] = []
            async for event in generation:
                if isinstance(event, Token):
                    text.append(event.text)
                    logprobs += event.logprobs
                elif isinstance(event, Done):
                    response.finished(event)
                    body = completion_text_body(
                        "".join(text),
                        logprobs if request.logprobs is not None else None,
                        event,
                        model=engine.model_name,
                        id=completion_id,
                        created=created,
                    )
                    await response.head(200, JSON_HEADERS)
                    await claimed.end(body)
                    return
                elif isinstance(event, Failed):
                    await response.error(_failure(event))
                    return
    except OpenAIError as error:
        await response.error(error)
    except EngineError as exc:
        await response.error(from_engine_error(exc))
