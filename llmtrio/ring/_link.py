"""The worker's side of the ring: what a worker (``llmtrio.worker.serve_link``) needs from its
attachment, whether the ring is in this process (``Ring.attach`` gives a ``WorkerLink``) or
across the network (``connect_ring`` gives a ``RemoteLink``), and the one claimed-stream type
both hand out.

``Claimed`` writes a stream's response as messages into a ``Lane``: the in-process link
hands them to the ring, a remote link's connection puts them on the wire. The lane alone
knows how a body chunk waits (for room in the client's buffer, or for a credit) and which
streams it still holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import TracebackType
from typing import Protocol, Self

import attrs
import trio

from ._errors import ProtocolError, StreamCancelledError
from ._messages import (
    Heartbeat,
    Outcome,
    Release,
    RequestHead,
    ResponseData,
    ResponseEnd,
    ResponseError,
    ResponseHead,
)

__all__ = ["Claimed", "ClaimedStream", "Lane", "RingLink"]


class ClaimedStream(Protocol):
    """A stream a worker claimed: the request to serve and the response lane to write.

    Write ``send_head``, then any number of ``send``, then ``end`` (or ``fail`` at any
    point). ``cancelled`` is set (and ``cancel_scope`` cancelled) when the client goes away;
    the worker stops and finishes the stream, which acknowledges the cancellation. Leaving
    ``with stream:`` without ending fails the stream (or acknowledges a cancellation).
    """

    @property
    def stream_id(self) -> int: ...

    @property
    def head(self) -> RequestHead: ...

    @property
    def body(self) -> bytes: ...

    @property
    def cancelled(self) -> trio.Event: ...

    @property
    def cancel_scope(self) -> trio.CancelScope:
        """Cancelled when ``cancelled`` is set: serve the stream inside it (``with
        stream.cancel_scope:``) and the client going away ends the work at its next
        checkpoint, with no task watching ``cancelled``. Enter it once, or never."""

    async def send_head(
        self, status: int, headers: Iterable[tuple[str, str]] | Mapping[str, str] = ()
    ) -> None:
        """Send the status and headers. ``StreamCancelledError`` once the client is gone."""

    async def send(self, data: bytes) -> None:
        """Send a body chunk, waiting while this stream's client is behind (back-pressure on
        this stream only). ``StreamCancelledError`` once the client is gone."""

    async def end(self, last: bytes = b"", *, outcome: Outcome | None = None) -> None:
        """The response is complete (or the cancellation is acknowledged); ``last`` is a
        final body chunk, handed over without waiting where the transport allows;
        ``outcome`` is what it ended with, for the ingress's log and metrics."""

    async def respond(
        self,
        status: int,
        headers: Iterable[tuple[str, str]] | Mapping[str, str] = (),
        body: bytes = b"",
        *,
        outcome: Outcome | None = None,
    ) -> None:
        """A whole response at once: ``send_head``, then ``end(body, outcome=outcome)``."""

    def fail(self, message: str, *, outcome: Outcome | None = None) -> None:
        """The worker cannot finish; never blocks; nothing once the stream is finished.
        ``outcome`` is what it ended with, for the ingress's log and metrics."""

    def release(self) -> None:
        """Give the stream back unanswered, before its head: it is parked again at the
        front, for another worker or a later claim. Never blocks."""

    def __enter__(self) -> Self: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None: ...


class RingLink(Protocol):
    """A worker's attachment to one or more rings: claim a stream when a slot is free.

    ``max_inflight`` bounds the streams held at once, over every ring the link reaches: the
    caller claims only while it holds fewer.
    """

    @property
    def worker_id(self) -> str: ...

    @property
    def max_inflight(self) -> int: ...

    def heartbeat(self, beat: Heartbeat) -> None:
        """Report the engine's capacity; never blocks."""

    async def claim(self) -> ClaimedStream:
        """Wait for the oldest parked stream; cancelling the wait takes the claim back."""

    async def wait_withdrawn(self) -> None:
        """Return once every claim taken back (a cancelled ``claim()``) has been answered by
        its ring, so that a stream assigned from then on answers a claim made after this
        call (one that crossed a withdrawal was given back). In process at once; over the
        network, once each ingress asked has answered ``Withdraw`` or is gone."""


class Lane(Protocol):
    """Where a ``Claimed`` stream's messages go: the ring in this process (``WorkerLink``) or an
    ingress across the network (a ``RemoteLink``'s connection to it)."""

    def post(
        self, message: ResponseHead | ResponseData | ResponseEnd | ResponseError | Release
    ) -> None:
        """Hand a message over without waiting (a body chunk goes past any bound: the last
        one, right before the end). An end, an error or a release finishes the stream here.

        Error handling: ``ProtocolError`` when the message is illegal in the stream's state,
        where the lane can tell at once (in process it can, over the network the ingress
        judges)."""

    async def send_data(self, message: ResponseData) -> None:
        """Hand a body chunk over once this stream may take one more (room in its client's
        buffer, or a credit), waiting for this stream only.

        Error handling: ``StreamCancelledError`` if the client goes away meanwhile."""

    def holds(self, stream_id: int) -> bool:
        """Whether ``stream_id`` is still this lane's to answer: not finished, and the worker
        still attached."""


@attrs.define(eq=False)
class Claimed:
    """A stream a worker claimed (a ``ClaimedStream``): the request to serve and the response
    to write, in process or over the network alike.

    Write ``send_head``, then any number of ``send``, then ``end`` (or ``fail`` at any
    point). ``cancelled`` is set when the client goes away (or the ingress does), and
    ``cancel_scope`` cancelled: the worker serves the stream inside that scope, so its work
    stops at the next checkpoint; it then finishes the stream, which acknowledges the
    cancellation.

    Resource handling: leaving ``with claimed:`` without ending fails the stream (the client
    gets ``WorkerFailedError``) or, if the client had gone, acknowledges the cancellation.
    """

    _lane: Lane
    stream_id: int
    head: RequestHead
    body: bytes = attrs.field(repr=lambda body: f"<{len(body)} bytes>")
    cancelled: trio.Event = attrs.field(init=False, factory=trio.Event)
    cancel_scope: trio.CancelScope = attrs.field(init=False, factory=trio.CancelScope)
    _sending: bool = attrs.field(init=False, default=False)

    def cancel(self) -> None:
        """The client (or the ingress) went away: set ``cancelled`` and cancel
        ``cancel_scope``. Called by the lane's ring side; never blocks; idempotent."""
        self.cancelled.set()
        self.cancel_scope.cancel()

    async def send_head(
        self, status: int, headers: Iterable[tuple[str, str]] | Mapping[str, str] = ()
    ) -> None:
        """Send the response status and headers; the stream can no longer be requeued.

        Error handling: ``StreamCancelledError`` once the client is gone; ``ProtocolError`` if
        a head was already sent or the stream is finished.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        self._lane.post(ResponseHead(self.stream_id, status, headers))
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def send(self, data: bytes) -> None:
        """Send a body chunk, waiting while this stream's client is behind (back-pressure on
        this stream only). A send cancelled while it waits delivered nothing.

        Error handling: ``StreamCancelledError`` once the client is gone, also while waiting;
        ``ProtocolError`` before the head or after the end; ``trio.BusyResourceError`` if
        another task is sending on this stream.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")
        self._sending = True
        try:
            await self._lane.send_data(ResponseData(self.stream_id, data))
        finally:
            self._sending = False

    async def end(self, last: bytes = b"", *, outcome: Outcome | None = None) -> None:
        """The response is complete; the client's body iteration stops after the last chunk.

        ``last``, when given, is a final body chunk handed over without waiting for room or a
        credit: a worker whose work is done hands over what is left and frees its slot at
        once, however slowly its client reads. ``outcome`` is what the response ended with
        (finish reason, token counts), carried to the ingress for its log and metrics.

        Ending a cancelled stream acknowledges the cancellation and raises nothing.
        Error handling: ``ProtocolError`` before the head or if the stream is finished.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if last and not self.cancelled.is_set():
            self._check_open()
            self._lane.post(ResponseData(self.stream_id, last))
        if not self._lane.holds(self.stream_id):
            raise ProtocolError(
                f"stream {self.stream_id} is already finished, or its worker detached"
            )
        self._lane.post(ResponseEnd(self.stream_id, outcome=outcome))
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def respond(
        self,
        status: int,
        headers: Iterable[tuple[str, str]] | Mapping[str, str] = (),
        body: bytes = b"",
        *,
        outcome: Outcome | None = None,
    ) -> None:
        """A whole response at once: as ``send_head`` then ``end(body, outcome=...)``, with
        one schedule point instead of two (a JSON body, an error response).

        Error handling: as ``send_head``.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        self._lane.post(ResponseHead(self.stream_id, status, headers))
        if body:
            self._lane.post(ResponseData(self.stream_id, body))
        self._lane.post(ResponseEnd(self.stream_id, outcome=outcome))
        await trio.lowlevel.cancel_shielded_checkpoint()

    def fail(self, message: str, *, outcome: Outcome | None = None) -> None:
        """The worker cannot finish: the client gets ``WorkerFailedError(message)``;
        ``outcome`` (an error code, the tokens used) goes to the ingress's log and metrics.

        Never blocks, so it is safe in cleanup; does nothing once the stream is finished.
        """
        if self._lane.holds(self.stream_id):
            self._lane.post(ResponseError(self.stream_id, message, outcome=outcome))

    def release(self) -> None:
        """Give the stream back without responding: it is parked again at the front (this
        does not count as an assignment); on a cancelled stream, acknowledges the cancel.

        Never blocks. Error handling: ``ProtocolError`` once the stream is finished, or (in
        process at once, over the network from the ingress) once a head was sent.
        """
        if not self._lane.holds(self.stream_id):
            raise ProtocolError(
                f"stream {self.stream_id} is already finished, or its worker detached"
            )
        self._lane.post(Release(self.stream_id))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.fail(unfinished_reason(exc_value))

    def _check_open(self) -> None:
        if self.cancelled.is_set():
            raise StreamCancelledError(f"the client of stream {self.stream_id} went away")
        if not self._lane.holds(self.stream_id):
            raise ProtocolError(
                f"stream {self.stream_id} is already finished, or its worker detached"
            )


def unfinished_reason(exc_value: BaseException | None) -> str:
    """Why a claimed stream left its ``with`` block unfinished, for its ``ResponseError``: the
    ingress logs it and tells its client no internals."""
    if exc_value is None:
        return "the worker finished without ending the response"
    if isinstance(exc_value, trio.Cancelled):
        return "the worker was cancelled"
    return f"the worker failed: {exc_value!r}"
