"""The in-process Trio ring: a router of ``RingCore`` effects to clients and attached workers.

The ingress side parks each request as a ``RingStream`` and reads its response lane; workers
attach (``Ring.attach``), claim streams when they have a free slot and write responses through
a ``Claimed``. All decisions (who gets which stream, what is legal, what a detach does) are the
core's; this module only delivers its effects: an ``Assign`` lands in a worker link's inbox, a
``Cancel`` sets ``Claimed.cancelled``, a response head is stored on the stream, body chunks go
through a bounded memory channel (the back-pressure), and an end or error closes that channel.
A transport for remote workers routes the same effects.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Never, Self

import attrs
import trio

from ._core import Effect, RingCore, RingStats, StreamState, ToClient, ToWorker
from ._errors import ParkTimeoutError, ProtocolError, StreamCancelledError, WorkerFailedError
from ._link import unfinished_reason
from ._messages import (
    Assign,
    Attach,
    Cancel,
    Claim,
    Heartbeat,
    RequestHead,
    ResponseData,
    ResponseEnd,
    ResponseError,
    ResponseHead,
    ResponseMessage,
)

__all__ = ["Claimed", "Ring", "RingStream", "WorkerLink"]


@attrs.define(eq=False)
class Ring:
    """An upload-response ring in this process.

    ``max_streams`` bounds the open streams (parked or being served); ``park`` beyond it
    raises ``RingFullError`` carrying ``retry_after``. ``response_buffer`` is how many body
    chunks a worker may write ahead of its client before ``Claimed.send`` waits.
    ``max_assignments`` is how many times a stream is handed to a worker: when a worker
    detaches before sending a stream's response head, the stream is parked again, at the
    front, until it has been assigned that many times; then its client gets
    ``WorkerFailedError``. ``max_assignments=1`` fails such streams at once.
    """

    max_streams: int = attrs.field(default=64, on_setattr=attrs.setters.frozen)
    retry_after: float = attrs.field(default=1.0, on_setattr=attrs.setters.frozen)
    response_buffer: int = attrs.field(default=16, kw_only=True, on_setattr=attrs.setters.frozen)
    max_assignments: int = attrs.field(default=3, kw_only=True, on_setattr=attrs.setters.frozen)
    park_timeout: float | None = attrs.field(
        default=None, kw_only=True, on_setattr=attrs.setters.frozen
    )
    """Seconds a stream may stay parked (unclaimed) before ``response_head`` gives up."""
    _core: RingCore = attrs.field(init=False)
    #: The last worker that detached because it failed, and why (shown by ``/health``).
    last_detach: tuple[str, str] | None = attrs.field(init=False, default=None)
    _moved: trio.lowlevel.ParkingLot = attrs.field(init=False, factory=trio.lowlevel.ParkingLot)
    _streams: dict[int, RingStream] = attrs.field(init=False, factory=dict)
    _links: dict[str, WorkerLink] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        if self.response_buffer < 0:
            raise ValueError(f"response_buffer must not be negative, not {self.response_buffer}")
        self._core = RingCore(
            self.max_streams, self.retry_after, max_assignments=self.max_assignments
        )

    def park(self, head: RequestHead, body: bytes = b"") -> RingStream:
        """Park a request; a worker with a free slot will claim it.

        Resource handling: the stream holds a spot until its response ends or fails, or until
        ``cancel()``; use it as a context manager (``with ring.park(...) as stream:``) so that
        leaving early cancels it.

        Error handling: raises ``RingFullError`` (nothing parked) when ``max_streams`` streams
        are open.
        """
        stream_id, effects = self._core.park(head, body)
        send, receive = trio.open_memory_channel[bytes](self.response_buffer)
        stream = RingStream(self, stream_id, head, send, receive)
        self._streams[stream_id] = stream
        self._route(effects)
        return stream

    @asynccontextmanager
    async def attach(
        self, worker_id: str, max_inflight: int, *, models: Iterable[str] = ()
    ) -> AsyncIterator[WorkerLink]:
        """Attach a worker that will hold at most ``max_inflight`` streams at once, serving
        ``models`` (listed by ``stats``).

        Resource handling: leaving the block detaches the worker, however it is left (an
        exception, a cancellation): streams it held without a response head are requeued
        (see ``max_assignments``), those responding fail with ``WorkerFailedError`` on the
        client side, so no client waits on a worker that is gone. Detaching needs no waiting,
        so it cannot be interrupted. Every task that uses the link must end inside the block.

        Error handling: ``ProtocolError`` if ``worker_id`` is already attached.
        """
        await trio.lowlevel.checkpoint()
        self._core.attach(Attach(worker_id, max_inflight, models=models))
        link = WorkerLink(self, worker_id, max_inflight)
        self._links[worker_id] = link
        reason = "the worker left"
        try:
            yield link
        except trio.Cancelled:
            reason = "the worker was cancelled"
            raise
        except Exception as exc:
            reason = f"the worker failed: {exc}"
            self.last_detach = (worker_id, str(exc))
            raise
        finally:
            link._detach(reason)

    def stats(self) -> RingStats:
        """Stream counts by state, and every attached worker with what it holds."""
        return self._core.stats()

    # -- routing the core's effects ------------------------------------------------------------

    def _route(self, effects: Iterable[Effect]) -> None:
        """Deliver effects that need no waiting: everything but body chunks. Called after
        every change of the core, so it also wakes the streams watching their park time."""
        self._moved.unpark_all()
        for effect in effects:
            match effect:
                case ToWorker(worker_id=worker_id, message=message):
                    self._links[worker_id]._deliver(message)
                case ToClient(stream_id=stream_id, message=ResponseHead() as head):
                    self._streams[stream_id]._deliver_head(head, self._core.holder(stream_id))
                case ToClient(stream_id=stream_id, message=ResponseEnd()):
                    self._streams.pop(stream_id)._finish(StreamState.ENDED, None)
                case ToClient(stream_id=stream_id, message=ResponseError(message=text)):
                    self._streams.pop(stream_id)._finish(StreamState.FAILED, text)
                case ToClient(message=ResponseData()):
                    raise AssertionError("body chunks are delivered with back-pressure")

    async def _deliver(self, effects: Iterable[Effect]) -> None:
        """Deliver effects, waiting for room in the client's buffer for body chunks."""
        for effect in effects:
            if isinstance(effect, ToClient) and isinstance(effect.message, ResponseData):
                await self._streams[effect.stream_id]._put(effect.message.data)
            else:
                self._route((effect,))

    def _deliver_final(self, effects: Iterable[Effect]) -> None:
        """Deliver effects without waiting: body chunks go past the client's buffer bound
        (the last chunks of a response whose producer is done)."""
        for effect in effects:
            if isinstance(effect, ToClient) and isinstance(effect.message, ResponseData):
                self._streams[effect.stream_id]._tail.append(effect.message.data)
            else:
                self._route((effect,))


@attrs.define(eq=False)
class RingStream:
    """The client side of one parked request: its response lane.

    Read it with ``await response_head()`` then ``async for chunk in body()``. ``cancel()``
    (or leaving ``with stream:``) says the client went away.
    """

    _ring: Ring
    stream_id: int
    request_head: RequestHead
    _send: trio.MemorySendChannel[bytes]
    _receive: trio.MemoryReceiveChannel[bytes]
    _head: ResponseHead | None = attrs.field(init=False, default=None)
    #: The worker that sent the response head (for logs), once it has.
    worker_id: str | None = attrs.field(init=False, default=None)
    _outcome: StreamState | None = attrs.field(init=False, default=None)
    _error: str = attrs.field(init=False, default="")
    # Chunks written by Claimed.end past the buffer bound; read after the buffered ones.
    _tail: list[bytes] = attrs.field(init=False, factory=list)
    _settled: trio.Event = attrs.field(init=False, factory=trio.Event)  # head in, or finished

    @property
    def state(self) -> StreamState:
        """PARKED, ASSIGNED or RESPONDING while live; then ENDED, FAILED or CANCELLED."""
        if self._outcome is not None:
            return self._outcome
        state = self._ring._core.state(self.stream_id)
        assert state is not None, "a live stream is tracked by the core"
        return state

    async def response_head(self) -> ResponseHead:
        """Wait for the response head (status and headers); returns it again on later calls.

        Error handling: ``WorkerFailedError`` if the worker failed or detached before sending
        it; ``StreamCancelledError`` if this stream was cancelled first; ``ParkTimeoutError``
        (the stream is cancelled) if it stayed parked for the ring's ``park_timeout`` seconds
        at a time (each requeue starts a new wait).
        """
        timeout = self._ring.park_timeout
        if timeout is not None:
            await self._watch_park(timeout)
        await self._settled.wait()
        if self._head is not None:
            return self._head
        self._raise_outcome()

    def body(self) -> AsyncIterator[bytes]:
        """The response body, chunk by chunk, as the worker writes it.

        Waits for the head first if ``response_head()`` was not awaited. Iteration stops when
        the worker ends the response. Error handling: raises ``WorkerFailedError`` after the
        chunks that arrived if the worker fails or detaches mid-way, ``StreamCancelledError``
        if this stream was cancelled.
        """
        return _ResponseBody(self)

    def cancel(self) -> None:
        """The client went away. Idempotent, never blocks.

        Resource handling: frees the stream's spot in the ring at once, drops buffered
        chunks, and tells the worker holding it (``Claimed.cancelled`` is set and its
        ``send`` raises ``StreamCancelledError``). Does nothing to a stream that has ended or
        failed, beyond dropping what was not read.
        """
        self._receive.close()
        self._tail.clear()
        if self._outcome is not None:
            return
        self._outcome = StreamState.CANCELLED
        self._settled.set()
        del self._ring._streams[self.stream_id]
        self._ring._route(self._ring._core.cancel(self.stream_id))

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc_value: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.cancel()

    async def _watch_park(self, limit_s: float) -> None:
        parked_at = trio.current_time()
        while not self._settled.is_set():
            if self._is_parked():
                with trio.move_on_at(parked_at + limit_s):
                    await self._ring._moved.park()
                    continue
                self.cancel()
                raise ParkTimeoutError(limit_s, self._ring.retry_after)
            await self._ring._moved.park()
            if self._is_parked():  # requeued: its worker went away
                parked_at = trio.current_time()

    def _is_parked(self) -> bool:
        return self.state is StreamState.PARKED

    # -- called by the ring ----------------------------------------------------------------------

    def _raise_outcome(self) -> Never:
        if self._outcome is StreamState.FAILED:
            raise WorkerFailedError(self._error)
        if self._outcome is StreamState.CANCELLED:
            raise StreamCancelledError(f"stream {self.stream_id} was cancelled by its client")
        raise AssertionError(f"no response to report in outcome {self._outcome}")

    def _deliver_head(self, head: ResponseHead, worker_id: str | None) -> None:
        self._head = head
        self.worker_id = worker_id
        self._settled.set()

    async def _put(self, data: bytes) -> None:
        try:
            await self._send.send(data)
        except trio.BrokenResourceError:
            raise StreamCancelledError(f"the client of stream {self.stream_id} went away") from None
        except trio.ClosedResourceError:
            raise ProtocolError(
                f"stream {self.stream_id} was finished while a send on it waited"
            ) from None

    def _finish(self, outcome: StreamState, error: str | None) -> None:
        self._outcome = outcome
        self._error = error or ""
        self._send.close()
        self._settled.set()


@attrs.define(eq=False)
class _ResponseBody:
    _stream: RingStream

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        stream = self._stream
        if stream._head is None:
            await stream.response_head()
        try:
            return await stream._receive.receive()
        except trio.EndOfChannel:
            if stream._tail:
                return stream._tail.pop(0)
            if stream._outcome is StreamState.ENDED:
                raise StopAsyncIteration from None
            stream._raise_outcome()
        except trio.ClosedResourceError:  # closed by cancel(), maybe after the end
            raise StreamCancelledError(f"stream {stream.stream_id} was cancelled") from None


@attrs.define(eq=False)
class WorkerLink:
    """A worker's attachment to the ring, handed out by ``Ring.attach``."""

    _ring: Ring
    worker_id: str
    max_inflight: int
    _claimed: dict[int, Claimed] = attrs.field(init=False, factory=dict)
    _inbox: trio.MemorySendChannel[Claimed] = attrs.field(init=False)
    _outbox: trio.MemoryReceiveChannel[Claimed] = attrs.field(init=False)
    _detached: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        # Every item is backed by a claim the core accepted, and the core bounds claims plus
        # held streams by max_inflight: the inbox never overflows.
        self._inbox, self._outbox = trio.open_memory_channel[Claimed](self.max_inflight)

    def heartbeat(self, beat: Heartbeat) -> None:
        """Report the engine's capacity (shown by ``Ring.stats``)."""
        self._ring._core.heartbeat(self.worker_id, beat, at=trio.current_time())

    async def claim(self) -> Claimed:
        """Wait for the oldest parked stream; call it only when a slot is free.

        Streams whose client went away before this returned are skipped. Use the result as
        ``with claimed:`` so it is finished however the handler ends.

        Resource handling: if cancelled while waiting, the claim is taken back (and a stream
        already assigned for it is requeued at the front), so nothing is lost or stuck.

        Error handling: ``ProtocolError`` when this worker already holds or waits for
        ``max_inflight`` streams, or has detached; ``trio.ClosedResourceError`` if it detaches
        while this waits.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        core = self._ring._core
        self._ring._route(core.claim(self.worker_id, Claim(1)))
        while True:
            claimed = await self._take()
            if not claimed.cancelled.is_set():
                return claimed
            # Its client went away before the worker saw it: acknowledge, and claim again.
            del self._claimed[claimed.stream_id]
            self._ring._route(core.release(self.worker_id, claimed.stream_id))
            self._ring._route(core.claim(self.worker_id, Claim(1)))

    async def _take(self) -> Claimed:
        """Receive the assignment for one claim the core holds for this worker."""
        taken = False
        try:
            claimed = await self._outbox.receive()
            taken = True
            return claimed
        except trio.EndOfChannel:
            raise trio.ClosedResourceError(f"worker {self.worker_id!r} detached") from None
        finally:
            if not taken and not self._detached:
                self._give_back_claim()

    def _give_back_claim(self) -> None:
        core = self._ring._core
        if core.withdraw(self.worker_id, 1):
            return
        # The claim was filled already: its assignment sits in the inbox; park it again.
        claimed = self._outbox.receive_nowait()
        del self._claimed[claimed.stream_id]
        self._ring._route(core.release(self.worker_id, claimed.stream_id))

    def _deliver(self, message: Assign | Cancel) -> None:
        match message:
            case Assign(stream_id=stream_id, head=head, body=body):
                stream = self._ring._streams[stream_id]
                claimed = Claimed(self, stream, stream_id, head, body)
                self._claimed[stream_id] = claimed
                self._inbox.send_nowait(claimed)
            case Cancel(stream_id=stream_id):
                self._claimed[stream_id].cancelled.set()

    def _detach(self, reason: str) -> None:
        if self._detached:
            return
        self._detached = True
        self._inbox.close()
        for claimed in self._claimed.values():
            claimed._finished = True
        self._claimed.clear()
        del self._ring._links[self.worker_id]
        self._ring._route(self._ring._core.detach(self.worker_id, reason))


@attrs.define(eq=False)
class Claimed:
    """A stream a worker claimed: the request to serve and the response lane to write.

    Write ``send_head``, then any number of ``send``, then ``end`` (or ``fail`` at any
    point). ``cancelled`` is set when the client goes away; the worker should stop its work
    and finish the stream, which acknowledges the cancellation.

    Resource handling: leaving ``with claimed:`` without ending fails the stream (the client
    gets ``WorkerFailedError``) or, if the client had gone, acknowledges the cancellation.
    """

    _link: WorkerLink
    _stream: RingStream
    stream_id: int
    head: RequestHead
    body: bytes = attrs.field(repr=lambda body: f"<{len(body)} bytes>")
    cancelled: trio.Event = attrs.field(init=False, factory=trio.Event)
    _finished: bool = attrs.field(init=False, default=False)
    _sending: bool = attrs.field(init=False, default=False)

    async def send_head(
        self, status: int, headers: Iterable[tuple[str, str]] | Mapping[str, str] = ()
    ) -> None:
        """Send the response status and headers; the stream can no longer be requeued.

        Error handling: ``StreamCancelledError`` once the client is gone; ``ProtocolError`` if
        a head was already sent or the stream is finished.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._respond(ResponseHead(self.stream_id, status, headers))
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def send(self, data: bytes) -> None:
        """Send a body chunk, waiting while the client's buffer is full (back-pressure).

        Error handling: ``StreamCancelledError`` once the client is gone, also while waiting;
        ``ProtocolError`` before the head or after the end; ``trio.BusyResourceError`` if
        another task is sending on this stream.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        if self._sending:
            raise trio.BusyResourceError("another task is sending on this stream")
        effects = self._link._ring._core.respond(
            self._link.worker_id, ResponseData(self.stream_id, data)
        )
        self._sending = True
        try:
            await self._link._ring._deliver(effects)
        finally:
            self._sending = False

    async def end(self, last: bytes = b"") -> None:
        """The response is complete; the client's body iteration stops after the last chunk.

        ``last``, when given, is a final body chunk delivered without waiting for room in the
        client's buffer: a worker whose work is done hands over what is left and frees its
        slot at once, however slowly its client reads.

        Ending a cancelled stream acknowledges the cancellation and raises nothing.
        Error handling: ``ProtocolError`` before the head or if the stream is finished.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if last and not self.cancelled.is_set():
            self._check_open()
            ring = self._link._ring
            ring._deliver_final(
                ring._core.respond(self._link.worker_id, ResponseData(self.stream_id, last))
            )
        self._finish(ResponseEnd(self.stream_id))
        await trio.lowlevel.cancel_shielded_checkpoint()

    def fail(self, message: str) -> None:
        """The worker cannot finish: the client gets ``WorkerFailedError(message)``.

        Never blocks, so it is safe in cleanup; does nothing once the stream is finished.
        """
        if not self._finished:
            self._finish(ResponseError(self.stream_id, message))

    def release(self) -> None:
        """Give the stream back without responding: it is parked again at the front (this
        does not count as an assignment); on a cancelled stream, acknowledges the cancel.

        Never blocks. Error handling: ``ProtocolError`` once a head was sent or the stream
        is finished.
        """
        if self._finished:
            raise ProtocolError(
                f"stream {self.stream_id} is already finished, or its worker detached"
            )
        ring = self._link._ring
        effects = ring._core.release(self._link.worker_id, self.stream_id)
        self._finished = True
        del self._link._claimed[self.stream_id]
        ring._route(effects)

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
        if self._finished:
            raise ProtocolError(
                f"stream {self.stream_id} is already finished, or its worker detached"
            )

    def _respond(self, message: ResponseMessage) -> None:
        self._check_open()
        self._link._ring._route(self._link._ring._core.respond(self._link.worker_id, message))

    def _finish(self, message: ResponseEnd | ResponseError) -> None:
        if self._finished:
            raise ProtocolError(
                f"stream {self.stream_id} is already finished, or its worker detached", message
            )
        ring = self._link._ring
        ring._route(ring._core.respond(self._link.worker_id, message))
        self._finished = True
        del self._link._claimed[self.stream_id]
