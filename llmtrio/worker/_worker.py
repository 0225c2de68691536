"""The ring adapter: claims request lanes while the engine has free slots, runs each as an
engine generation, and writes OpenAI chat-completion bytes to the response lane.

Each claimed stream is handled in its own task and its own cancel scope: the client going
away (``Claimed.cancelled``) cancels that scope, which ends the generation and frees the slot
at the next token boundary.
"""

from __future__ import annotations

import contextlib
import logging
import time

import trio

from ..engine import Done, Engine, EngineError, Failed, Generation, Token
from ..ring import ClaimedStream, RingLink, StreamCancelledError
from ._openai import (
    ChatCompletionRequest,
    ChatCompletionStream,
    OpenAIError,
    completion_body,
    from_engine_error,
    method_not_allowed,
    new_completion_id,
    not_found,
    parse_chat_request,
    server_error,
)

__all__ = ["HEARTBEAT_INTERVAL_S", "serve_link"]

logger = logging.getLogger("llmtrio.worker")

HEARTBEAT_INTERVAL_S = 0.5
CHAT_PATH = "/v1/chat/completions"
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
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve one ring attachment with ``engine`` until cancelled.

    Claims a stream only while fewer than the link's ``max_inflight`` are held (pull, never
    push); requests beyond the engine's admission wait inside the engine. Sends a capacity
    heartbeat whenever the engine's inflight count changes, and every
    ``HEARTBEAT_INTERVAL_S`` (for ``decoding``).

    Resource handling: cancelling this cancels every generation it runs; each stream is
    finished (ended or failed) before its task returns.
    """
    slots = trio.Semaphore(link.max_inflight)

    def heartbeat() -> None:
        capacity = engine.capacity()
        link.heartbeat(
            inflight=capacity.inflight,
            max_inflight=capacity.max_inflight,
            available_slots=capacity.available_slots,
            decoding=capacity.decoding,
        )

    async def beat() -> None:
        while True:
            heartbeat()
            with trio.move_on_after(HEARTBEAT_INTERVAL_S):
                await engine.capacity_changed()

    async def handle(claimed: ClaimedStream) -> None:
        try:
            with claimed:
                await _serve_stream(engine, claimed)
        finally:
            slots.release()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(beat)
        task_status.started()
        while True:
            await slots.acquire()
            try:
                claimed = await link.claim()
            except BaseException:
                slots.release()
                raise
            nursery.start_soon(handle, claimed)


async def _serve_stream(engine: Engine, claimed: ClaimedStream) -> None:
    """Respond to one stream; its client going away cancels the response (and so the
    generation). The caller's ``with claimed:`` acknowledges a cancellation or fails a
    stream left unfinished."""
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            await claimed.cancelled.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        with contextlib.suppress(StreamCancelledError):
            await _respond(engine, claimed)
        nursery.cancel_scope.cancel()


async def _respond(engine: Engine, claimed: ClaimedStream) -> None:
    head = claimed.head
    path = head.path.split("?", 1)[0]
    try:
        if path != CHAT_PATH:
            raise not_found(head.method, path)
        if head.method != "POST":
            raise method_not_allowed(head.method, path)
        request = parse_chat_request(claimed.body)
    except OpenAIError as error:
        await _send_error(claimed, error)
        return
    try:
        async with engine.submit(request.generate) as generation:
            if request.stream:
                await _stream(engine, claimed, request, generation)
            else:
                await _complete(engine, claimed, request, generation)
    except EngineError as exc:
        await _send_error(claimed, from_engine_error(exc))


async def _send_error(claimed: ClaimedStream, error: OpenAIError) -> None:
    await claimed.send_head(error.status, (*JSON_HEADERS, *error.headers))
    await claimed.send(error.body())
    await claimed.end()


async def _stream(
    engine: Engine, claimed: ClaimedStream, request: ChatCompletionRequest, generation: Generation
) -> None:
    encoder = ChatCompletionStream(
        id=new_completion_id(),
        created=int(time.time()),
        model=engine.model_name,
        include_usage=request.include_usage,
    )
    await claimed.send_head(200, SSE_HEADERS)
    await claimed.send(encoder.role())
    async for event in generation:
        if isinstance(event, Token):
            await claimed.send(encoder.token(event))
        elif isinstance(event, Done):
            tail = encoder.finish(event)
            if request.include_usage:
                tail += encoder.usage(event)
            await claimed.send(tail + encoder.done())
        elif isinstance(event, Failed):
            error = _failure(event)
            await claimed.send(error.sse())
    await claimed.end()


async def _complete(
    engine: Engine, claimed: ClaimedStream, request: ChatCompletionRequest, generation: Generation
) -> None:
    text: list[str] = []
    reasoning: list[str] = []
    async for event in generation:
        if isinstance(event, Token):
            (reasoning if event.reasoning else text).append(event.text)
        elif isinstance(event, Done):
            body = completion_body(
                "".join(text),
                "".join(reasoning),
                event,
                model=engine.model_name,
                id=new_completion_id(),
                created=int(time.time()),
            )
            await claimed.send_head(200, JSON_HEADERS)
            await claimed.send(body)
        elif isinstance(event, Failed):
            await _send_error(claimed, _failure(event))
            return
    await claimed.end()


def _failure(event: Failed) -> OpenAIError:
    logger.warning("generation failed: %s", event.error)
    if isinstance(event.error, EngineError):
        return from_engine_error(event.error)
    return server_error()
