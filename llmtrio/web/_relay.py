"""One request served through the ring, from its body to its last byte (``RingRequest``).

The body is read (within the body timeout, up to the size limit), parked on the ring under
the request's routing key (its ``model``, resolved by ``_models``: an unknown or unfit model
is refused before it parks) with what its prompt begins with (``llmtrio.api.prefixes_of``:
the ring prefers a worker holding that prefix), and the response lane is relayed to the
client: a JSON body whole (so a failure is still an error status), an event stream chunk by
chunk. The ring stream is
cancelled however the request ends, unless its response ended.

What the request ended with is recorded on its :class:`Exchange` for the access log and
metrics, never read from the bytes: the outcome its worker stated once the stream ended, or
the error this ingress answered or ended it with (:func:`send_error`, an error event), or
``client_closed`` when the client left first.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import trio

from ..api import (
    AUDIO_PARTS,
    FORM_PATHS,
    IMAGE_PARTS,
    ApiError,
    body_timeout,
    error_family,
    no_worker,
    prefixes_of,
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


def encode_headers(headers: Iterable[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]


async def send_error(
    send: Send, exchange: Exchange, error: ApiError, extra: list[tuple[str, str]] | None = None
) -> None:
    """Answer with ``error`` (its status, its JSON body, in the shape of the request's route:
    ``llmtrio.api.error_family``), recording its code on ``exchange``."""
    exchange.ended_with(error.error_code)
    status, headers, body = error_family(exchange.path).response(error)
    headers = (*headers, ("content-length", str(len(body))), *(extra or []))
    await send(
        {"type": "http.response.start", "status": status, "headers": encode_headers(headers)}
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
        self._left = False  # the client disconnected
        self._done = False  # served to the end (an error response included)
        self._streaming = False  # an event stream's head is sent: errors go as events

    async def serve(
        self,
        receive: Receive,
        send: Send,
        max_body_bytes: int,
        drain: Drain,
        image_body_bytes: int = 0,
        audio_body_bytes: int = 0,
    ) -> None:
        """Serve the request; never raises but for cancellation. Its body may be up to
        ``max_body_bytes``, or ``image_body_bytes`` when it holds an image part, or
        ``audio_body_bytes`` when it holds an audio part or is a form route's (see
        :func:`media_body_bytes`).

        One cancel scope ends the request early, whatever ends it: the scope of the nursery
        the request runs in, which holds its one task beside this one (the disconnect
        watcher, once the body is read). The client disconnecting cancels it (and so the
        ring stream, at once), ``drain`` being cut cancels it (the response ends with a
        ``shutting_down`` error: a 503, or an error event on a started event stream), and its
        deadline is the request's (``request_timeout`` from arrival, once it is parked: a
        ``request_timeout`` error, told the same way).

        Resource handling: the ring stream is cancelled when this returns, however it
        returns, unless its response ended.
        """
        try:
            async with trio.open_nursery() as nursery:
                with drain.cuts(nursery.cancel_scope):
                    try:
                        await self._serve(
                            receive,
                            send,
                            max_body_bytes,
                            nursery,
                            image_body_bytes,
                            audio_body_bytes,
                        )
                    except ClientGone:
                        logger.debug(
                            "request %s: the client left before its body was read",
                            self.request_id,
                        )
                        self._exchange.ended_with(CLIENT_CLOSED)
                    except Exception:
                        await self._fault(send)
                    self._done = True
                    nursery.cancel_scope.cancel()  # the disconnect watcher
        except Exception:  # the disconnect watcher's, grouped by the nursery
            await self._fault(send)
            return
        if self._left:
            if not self._exchange.observer.complete:
                self._exchange.ended_with(CLIENT_CLOSED)
        elif self._done:
            pass
        elif drain.cut_called.is_set():
            logger.warning("request %s: cut by the shutdown", self.request_id)
            await self._end_early(send, shutting_down(cut=True))
        else:
            deadline = self._gate.request_timeout
            assert deadline is not None, "only the request's deadline is left to end it"
            logger.info("request %s: past its %gs deadline", self.request_id, deadline)
            await self._end_early(send, request_timeout(deadline))

    async def _serve(
        self,
        receive: Receive,
        send: Send,
        max_body_bytes: int,
        nursery: trio.Nursery,
        image_body_bytes: int = 0,
        audio_body_bytes: int = 0,
    ) -> None:
        path = self._scope["path"]
        most = max(max_body_bytes, image_body_bytes, audio_body_bytes)
        declared = self._headers.get("content-length", "")
        if declared.isdigit() and int(declared) > most:
            await self._send_error(send, request_too_large(most))
            return
        body: bytes | None = None
        with trio.move_on_after(self._gate.body_timeout) as reading:
            body = await read_body(receive, most)
        if reading.cancelled_caught:
            await self._send_error(send, body_timeout(self._gate.body_timeout))
            return
        if body is None:
            await self._send_error(send, request_too_large(most))
            return
        if len(body) > max_body_bytes:
            allowed = media_body_bytes(path, body, image_body_bytes, audio_body_bytes)
            if len(body) > allowed:
                await self._send_error(send, request_too_large(max(max_body_bytes, allowed)))
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
                requested_model(body, form=path in FORM_PATHS),
                self._scope["path"],
                self._ring.models(),
                self._default_model,
                takes_any=self._ring.takes_any_model,
            )
        except ApiError as error:
            await self._send_error(send, error)
            return
        try:
            prefixes = [(p.digest, p.size) for p in prefixes_of(self._scope["path"], body)]
            stream = self._ring.park(head, body, key=key, prefixes=prefixes)
        except RingFullError as exc:
            await self._send_error(send, ring_full(max(1, round(exc.retry_after))))
            return
        deadline = self._gate.request_timeout
        if deadline is not None:
            nursery.cancel_scope.deadline = self._exchange.started + deadline
        with stream:  # cancels the stream on any way out that did not end it

            async def cancel_on_disconnect() -> None:
                while (await receive())["type"] != "http.disconnect":
                    pass
                logger.debug("request %s: the client disconnected", self.request_id)
                self._left = True
                nursery.cancel_scope.cancel()

            nursery.start_soon(cancel_on_disconnect)
            await self._relay(stream, send)

    async def _fault(self, send: Send) -> None:
        """Something unexpected: a 500 if nothing was sent, else the response is cut."""
        logger.exception("request %s failed at the ingress", self.request_id)
        if not self._started:
            await self._send_error(send, server_error())
        else:
            self._exchange.ended_with(server_error().error_code)

    async def _end_early(self, send: Send, error: ApiError) -> None:
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
                body = await stream.whole_body()
                self._exchange.outcome = stream.outcome
                # Whole or not at all: one shield for the head and the body (the last body's
                # own, ``Exchange.watch``'s), bounded by the send timeout.
                with self._exchange.shielded():
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

    async def _send_error(self, send: Send, error: ApiError) -> None:
        self._started = True
        await send_error(send, self._exchange, error, self._extra)

    async def _send_event(self, send: Send, error: ApiError) -> None:
        """``error`` as an event on the started event stream, recording its code."""
        self._exchange.ended_with(error.error_code)
        body = error_family(self._exchange.path).event(error)
        await send({"type": "http.response.body", "body": body, "more_body": True})


def _part_types(types: Iterable[str]) -> re.Pattern[bytes]:
    alternatives = b"|".join(sorted({t.encode() for t in types}))
    return re.compile(rb'"type"\s*:\s*"(?:' + alternatives + rb')"')


#: An image part of any API (each route's ``image_part``: chat completions' ``image_url``,
#: the Responses API's ``input_image``, Anthropic's ``image``).
_IMAGE_PART = _part_types(IMAGE_PARTS.values())
#: An audio part of any API (each route's ``audio_part``: ``input_audio``).
_AUDIO_PART = _part_types(AUDIO_PARTS.values())


def holds_images(body: bytes) -> bool:
    """Whether a request body holds an image part (a ``"type"`` of ``image_url``,
    ``input_image`` or ``image``)."""
    return _IMAGE_PART.search(body) is not None


def media_body_bytes(path: str, body: bytes, image_body_bytes: int, audio_body_bytes: int) -> int:
    """How large a body may be for the media it holds, beyond ``--max-body-bytes``: up to
    ``--max-audio-body-bytes`` for a form route's (a transcription's file) or one holding an
    audio part (``input_audio``), ``--max-image-body-bytes`` for one holding an image part,
    the larger of the two for one holding both; 0 for one holding neither. A body that merely
    says so is still parsed, and refused, by the worker, so the larger limit is all it
    gains."""
    allowed = 0
    if path in FORM_PATHS or _AUDIO_PART.search(body) is not None:
        allowed = audio_body_bytes
    if path not in FORM_PATHS and holds_images(body):
        allowed = max(allowed, image_body_bytes)
    return allowed


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
