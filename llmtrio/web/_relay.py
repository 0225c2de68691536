"""One request served through the ring, from its body to its last byte (``RingRequest``).

The body is read (within the body timeout, up to the size limit), parked on the ring under
the request's routing key (its ``model``, resolved by ``_models``: an unknown or unfit model
is refused before it parks), and the response lane is relayed to the client: a JSON body whole
(so a failure is still an error status), an event stream chunk by chunk. The ring stream is
cancelled however the request ends, unless its response ended.

What the request ended with is recorded on its :class:`Exchange` for the access log and
metrics, never read from the bytes: the outcome its worker stated once the stream ended, or
the error this ingress answered or ended it with (:func:`send_error`, an error event), or
``client_closed`` when the client left first.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from .._openai_errors import (
    OpenAIError,
    body_timeout,
    no_worker,
    request_timeout,
    request_too_large,
    ring_full,
    server_error,
    shutting_down,
    worker_failed,
)
from ..ring import (
    ParkTimeoutError,
    RequestHead,
    Ring,
    RingFullError,
    RingStream,
    WorkerFailedError,
)
from ._access import CLIENT_CLOSED, Exchange
from ._checks import Gate
from ._drain import Drain
from ._models import requested_model, resolve_model

__all__ = ["ClientGone", "RingRequest", "encode_headers", "read_body", "send_error"]

logger = logging.getLogger("llmtrio.web")

# Request headers a worker may care about; the rest stay at the ingress.
_FORWARDED = frozenset({"content-type", "accept", "user-agent"})

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def encode_headers(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]


async def send_error(
    send: Send, exchange: Exchange, error: OpenAIError, extra: list[tuple[str, str]] | None = None
) -> None:
    """Answer with ``error`` (its status, its JSON body), recording its code on ``exchange``."""
    exchange.ended_with(error.error_code)
    body = error.body()
    headers = [
        ("content-type", "application/json"),
        ("content-length", str(len(body))),
        *error.headers,
        *(extra or []),
    ]
    await send(
        {"type": "http.response.start", "status": error.status, "headers": encode_headers(headers)}
    )
    await send({"type": "http.response.body", "body": body})


class ClientGone(Exception):
    """The client disconnected while its request body was read."""


class RingRequest:
    """One request served through the ring, from its body to its last byte."""

    def __init__(
        self,
        ring: Ring,
        scope: Scope,
        headers: dict[str, str],
        extra: list[tuple[str, str]],
        exchange: Exchange,
        gate: Gate,
        default_model: str | None = None,
    ) -> None:
        self._ring = ring
        self._default_model = default_model
        self._scope = scope
        self._headers = headers
        self._exchange = exchange
        self._gate = gate
        self.request_id = exchange.request_id
        self._extra = extra
        self._started = False  # the response head is (being) sent
        self._streaming = False  # an event stream's head is sent: errors go as events

    async def serve(self, receive: Receive, send: Send, max_body_bytes: int, drain: Drain) -> None:
        """Serve the request; never raises but for cancellation.

        Resource handling: the ring stream is cancelled when this returns, however it
        returns, unless its response ended; a client that disconnects at any point cancels it
        at once, and so does ``drain`` being cut, which ends the response with a
        ``shutting_down`` error (a 503, or an error event on a started event stream).
        """
        try:
            cut = False
            async with trio.open_nursery() as nursery:

                async def end_when_cut() -> None:
                    nonlocal cut
                    await drain.cut_called.wait()
                    cut = True
                    nursery.cancel_scope.cancel()

                nursery.start_soon(end_when_cut)
                await self._serve(receive, send, max_body_bytes)
                nursery.cancel_scope.cancel()
            if cut:
                logger.warning("request %s: cut by the shutdown", self.request_id)
                await self._end_early(send, shutting_down(cut=True))
        except ClientGone:
            logger.debug("request %s: the client left before its body was read", self.request_id)
            self._exchange.ended_with(CLIENT_CLOSED)
        except Exception:
            logger.exception("request %s failed at the ingress", self.request_id)
            if not self._started:
                await self._send_error(send, server_error())
            else:
                self._exchange.ended_with(server_error().error_code)

    async def _serve(self, receive: Receive, send: Send, max_body_bytes: int) -> None:
        declared = self._headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body_bytes:
            await self._send_error(send, request_too_large(max_body_bytes))
            return
        body: bytes | None = None
        with trio.move_on_after(self._gate.body_timeout) as reading:
            body = await read_body(receive, max_body_bytes)
        if reading.cancelled_caught:
            await self._send_error(send, body_timeout(self._gate.body_timeout))
            return
        if body is None:
            await self._send_error(send, request_too_large(max_body_bytes))
            return
        head = RequestHead(
            "POST",
            self._scope["path"],
            [
                *((k, v) for k, v in self._headers.items() if k in _FORWARDED),
                ("x-request-id", self.request_id),
            ],
        )
        try:
            key = resolve_model(
                requested_model(body),
                self._scope["path"],
                self._ring.models(),
                self._default_model,
                takes_any=self._ring.takes_any_model,
            )
        except OpenAIError as error:
            await self._send_error(send, error)
            return
        try:
            stream = self._ring.park(head, body, key=key)
        except RingFullError as exc:
            await self._send_error(send, ring_full(max(1, round(exc.retry_after))))
            return
        deadline = self._gate.request_timeout
        left = False
        with stream:  # cancels the stream on any way out that did not end it
            with trio.move_on_at(
                self._exchange.started + deadline if deadline is not None else float("inf")
            ) as timer:
                async with trio.open_nursery() as nursery:

                    async def cancel_on_disconnect() -> None:
                        nonlocal left
                        while (await receive())["type"] != "http.disconnect":
                            pass
                        logger.debug("request %s: the client disconnected", self.request_id)
                        left = True
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(cancel_on_disconnect)
                    await self._relay(stream, send)
                    nursery.cancel_scope.cancel()
            if left and not self._exchange.observer.complete:
                self._exchange.ended_with(CLIENT_CLOSED)
            if timer.cancelled_caught and deadline is not None:
                logger.info("request %s: past its %gs deadline", self.request_id, deadline)
                stream.cancel()  # the generation ends at its next token
                await self._end_early(send, request_timeout(deadline))

    async def _end_early(self, send: Send, error: OpenAIError) -> None:
        """End the response with ``error`` as far as it got (the deadline passed, or the drain
        cut it): the error itself before the head, an error event on a started event stream;
        nothing once its last byte went out."""
        if self._exchange.observer.complete:  # its last byte went out as the time came
            return
        if not self._started:
            await self._send_error(send, error)
        elif self._streaming:
            await self._send_event(send, error)
            await send({"type": "http.response.body", "body": b""})
        else:  # a JSON body's head went out: it can only be cut
            self._exchange.ended_with(error.error_code)
            await send({"type": "http.response.body", "body": b""})

    async def _relay(self, stream: RingStream, send: Send) -> None:
        try:
            head = await stream.response_head()
            self._exchange.worker = stream.worker_id
            headers = [*head.headers, *self._extra]
            if not dict(head.headers).get("content-type", "").startswith("text/event-stream"):
                # One JSON body: whole before the head goes out, so a failure is still a 500.
                body = b"".join([chunk async for chunk in stream.body()])
                self._exchange.outcome = stream.outcome
                with trio.CancelScope(shield=True):  # whole or not at all; bounded by send_timeout
                    await self._start(
                        send, head.status, [*headers, ("content-length", str(len(body)))]
                    )
                    await send({"type": "http.response.body", "body": body})
                return
        except ParkTimeoutError as exc:
            await self._send_error(
                send, no_worker(exc.park_timeout, max(1, round(exc.retry_after)))
            )
            return
        except WorkerFailedError as exc:
            logger.warning("request %s: the worker failed: %s", self.request_id, exc)
            self._exchange.outcome = stream.outcome
            await self._send_error(send, worker_failed())
            return
        self._streaming = True
        await self._start(send, head.status, headers)
        try:
            async for chunk in stream.body():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            self._exchange.outcome = stream.outcome
        except WorkerFailedError as exc:
            logger.warning("request %s: the worker failed mid-stream: %s", self.request_id, exc)
            self._exchange.outcome = stream.outcome
            await self._send_event(send, worker_failed())
        # The last send is shielded where every response's is (``Exchange.watch``).
        await send({"type": "http.response.body", "body": b""})

    async def _start(self, send: Send, status: int, headers: list[tuple[str, str]]) -> None:
        self._started = True
        await send(
            {"type": "http.response.start", "status": status, "headers": encode_headers(headers)}
        )

    async def _send_error(self, send: Send, error: OpenAIError) -> None:
        self._started = True
        await send_error(send, self._exchange, error, self._extra)

    async def _send_event(self, send: Send, error: OpenAIError) -> None:
        """``error`` as an event on the started event stream, recording its code."""
        self._exchange.ended_with(error.error_code)
        await send({"type": "http.response.body", "body": error.sse(), "more_body": True})


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body, or ``None`` once it grows past ``limit`` bytes.

    Error handling: :class:`ClientGone` when the client disconnects first.
    """
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        body += message.get("body", b"")
        if len(body) > limit:
            return None
        if not message.get("more_body", False):
            return bytes(body)
