"""The in-process Trio ring: a router of ``RingCore`` effects to clients and attached workers.

The ingress side parks each request as a ``RingStream`` and reads its response; workers attach
(``Ring.attach``), claim streams when they have a free slot and write responses through a
``Claimed``, whose messages their ``WorkerLink`` hands to the core. All decisions (who gets
which stream, what is legal, what a detach does) are the core's; this module only delivers its
effects: an ``Assign`` lands in a worker link's inbox, a ``Cancel`` sets ``Claimed.cancelled``,
a response message lands in the stream's ``_Response``, which its ``RingStream`` reads.

A *relayed* link (``Ring.attach(..., relay=...)``) hands the ring's messages for its worker to
a callable instead, and takes the worker's messages as they are (``WorkerLink.post``): the
control listener relays a remote worker so, message for message.

Back-pressure: an in-process worker's ``send`` waits while its client's buffer holds
``response_buffer`` chunks. A relayed worker's chunks never wait here (its credits bound
them): each chunk that enters its client's buffer is a ``Credit`` for its relay.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Never, Self, TypeAlias

import attrs
import trio

from ._core import Effect, RingCore, RingStats, StreamState, ToClient, ToWorker
from ._errors import ParkTimeoutError, ProtocolError, StreamCancelledError, WorkerFailedError
from ._link import Claimed
from ._messages import (
    Assign,
    Attach,
    Cancel,
    Claim,
    Credit,
    Detach,
    Heartbeat,
    Message,
    Outcome,
    Release,
    RequestHead,
    ResponseData,
    ResponseEnd,
    ResponseError,
    ResponseHead,
    ResponseMessage,
    Withdraw,
    Withdrawn,
)

__all__ = ["Relay", "Ring", "RingStream", "WorkerLink"]

Relay: TypeAlias = Callable[[Assign | Cancel | Credit | Withdrawn], None]
"""Takes the ring's messages for a relayed worker: ``Assign``, ``Cancel``, ``Withdrawn`` (the
answer to its ``Withdraw``) and ``Credit`` (a chunk of it entered its client's buffer). Called
from whichever task caused the message; it must not block or raise."""

_Delivery: TypeAlias = Callable[[Assign | Cancel | Credit | Withdrawn | Detach], None]


@attrs.define(eq=False)
class Ring:
    """An upload-response ring in this process.

    ``max_streams`` bounds the open streams (parked or being served); ``park`` beyond it
    raises ``RingFullError`` carrying ``retry_after``. ``response_buffer`` (at least 1) is how
    many body chunks a worker in this process may write ahead of its client before
    ``Claimed.send`` waits. ``max_assignments`` is how many times a stream is handed to a
    worker: when a worker detaches before sending a stream's response head, the stream is
    parked again, at the front, until it has been assigned that many times; then its client
    gets ``WorkerFailedError``. ``max_assignments=1`` fails such streams at once.
    """

    max_streams: int = attrs.field(default=64, on_setattr=attrs.setters.frozen)
    retry_after: float = attrs.field(default=1.0, on_setattr=attrs.setters.frozen)
    response_buffer: int = attrs.field(default=16, kw_only=True, on_setattr=attrs.setters.frozen)
    max_assignments: int = attrs.field(default=3, kw_only=True, on_setattr=attrs.setters.frozen)
    park_timeout: float | None = attrs.field(
        default=None, kw_only=True, on_setattr=attrs.setters.frozen
    )
    """Seconds a stream may stay parked (unclaimed) before ``response_head`` gives up."""
    _router: _Router = attrs.field(init=False)
    #: The last worker that detached because it failed, and why (shown by ``/health``).
    last_detach: tuple[str, str] | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        if self.response_buffer < 1:
            raise ValueError(f"response_buffer must be at least 1, not {self.response_buffer}")
        core = RingCore(self.max_streams, self.retry_after, max_assignments=self.max_assignments)
        self._router = _Router(core, self.response_buffer, self.park_timeout)

    def park(self, head: RequestHead, body: bytes = b"", *, key: str = "") -> RingStream:
        """Park a request; a worker with a free slot will claim it. ``key`` is the request's
        routing key (its ``model``), kept with the stream; nothing routes on it yet.

        Resource handling: the stream holds a spot until its response ends or fails, or until
        ``cancel()``; use it as a context manager (``with ring.park(...) as stream:``) so that
        leaving early cancels it.

        Error handling: raises ``RingFullError`` (nothing parked) when ``max_streams`` streams
        are open.
        """
        stream_id, response = self._router.park(head, body, key)
        return RingStream(self._router, stream_id, head, key, response)

    @asynccontextmanager
    async def attach(
        self,
        worker_id: str,
        max_inflight: int,
        *,
        models: Iterable[str] = (),
        relay: Relay | None = None,
    ) -> AsyncIterator[WorkerLink]:
        """Attach a worker that will hold at most ``max_inflight`` streams at once, serving
        ``models`` (listed by ``stats``).

        Without ``relay``, the worker claims streams with ``WorkerLink.claim``. With it, the
        ring's messages for the worker go to ``relay`` and the worker's own go to
        ``WorkerLink.post`` (how the control listener attaches a remote worker).

        Resource handling: leaving the block detaches the worker, however it is left (an
        exception, a cancellation): streams it held without a response head are requeued
        (see ``max_assignments``), those responding fail with ``WorkerFailedError`` on the
        client side, so no client waits on a worker that is gone. Detaching needs no waiting,
        so it cannot be interrupted. Every task that uses the link must end inside the block.

        Error handling: ``ProtocolError`` if ``worker_id`` is already attached.
        """
        await trio.lowlevel.checkpoint()
        link = WorkerLink(self._router, Attach(worker_id, max_inflight, models=models), relay)
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
            self._router.detach(worker_id, reason)

    def stats(self) -> RingStats:
        """Stream counts by state, and every attached worker with what it holds."""
        return self._router.core.stats()


@attrs.define(eq=False)
class _Response:
    """One stream's response as it arrives: written by the ring's router, read through the
    stream's ``RingStream`` (one state for both ends, as trio's memory channels share one)."""

    bound: int
    head: ResponseHead | None = None
    worker_id: str | None = None
    chunks: deque[bytes] = attrs.field(factory=deque)
    over: StreamState | None = None
    """ENDED, FAILED or CANCELLED once the stream is over."""
    error: str = ""
    outcome: Outcome | None = None
    closed: bool = False
    """The client went away: nothing more is read."""
    settled: trio.Event = attrs.field(factory=trio.Event)  # the head came, or it is over
    changed: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    def deliver(self, message: ResponseMessage, worker_id: str | None) -> None:
        match message:
            case ResponseHead():
                self.head = message
                self.worker_id = worker_id
                self.settled.set()
            case ResponseData(data=data):
                self.chunks.append(data)
                self.changed.unpark_all()
            case ResponseEnd(outcome=outcome):
                self.finish(StreamState.ENDED, outcome=outcome)
            case ResponseError(message=text, outcome=outcome):
                self.finish(StreamState.FAILED, text, outcome)

    def finish(self, over: StreamState, error: str = "", outcome: Outcome | None = None) -> None:
        self.over, self.error, self.outcome = over, error, outcome
        self.settled.set()
        self.changed.unpark_all()

    def close(self) -> None:
        self.closed = True
        self.chunks.clear()
        self.changed.unpark_all()

    async def room(self) -> bool:
        """Wait while the client's buffer is full, or until the stream is over; returns
        whether it waited."""
        waited = False
        while len(self.chunks) >= self.bound and self.over is None:
            await self.changed.park()
            waited = True
        return waited


@attrs.define(eq=False)
class _Router:
    """The inside of one ``Ring``, shared by its streams and links: the core, and where each
    of its effects goes."""

    core: RingCore
    response_buffer: int
    park_timeout: float | None
    responses: dict[int, _Response] = attrs.field(factory=dict)
    workers: dict[str, _Delivery] = attrs.field(factory=dict)
    relays: dict[str, Relay] = attrs.field(factory=dict)  # the relayed workers
    moved: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    """Unparked after every change of the core (streams watching their park time wait here)."""

    def park(self, head: RequestHead, body: bytes, key: str) -> tuple[int, _Response]:
        stream_id, effects = self.core.park(head, body, key=key)
        response = self.responses[stream_id] = _Response(self.response_buffer)
        self.apply(effects)
        return stream_id, response

    def attach(self, message: Attach, deliver: _Delivery, relay: Relay | None) -> None:
        self.core.attach(message)
        self.workers[message.worker_id] = deliver
        if relay is not None:
            self.relays[message.worker_id] = relay

    def detach(self, worker_id: str, reason: str) -> None:
        deliver = self.workers.pop(worker_id, None)
        self.relays.pop(worker_id, None)
        if deliver is not None:
            deliver(Detach(reason))
            self.apply(self.core.detach(worker_id, reason))

    def cancel(self, stream_id: int) -> None:
        self.responses.pop(stream_id, None)
        self.apply(self.core.cancel(stream_id))

    def credit(self, stream_id: int) -> None:
        """A chunk entered the client's buffer: the worker, if relayed, may send one more."""
        holder = self.core.holder(stream_id)
        relay = None if holder is None else self.relays.get(holder)
        if relay is not None:
            relay(Credit(stream_id, 1))

    def apply(self, effects: Iterable[Effect]) -> None:
        """Deliver the core's effects; none waits. A chunk past the client's buffer bound
        waits beyond it (a worker in this process waited for room before the core saw it,
        unless it is its last; a relayed worker's credits bound it): it is credited when it
        enters the buffer."""
        self.moved.unpark_all()
        for effect in effects:
            match effect:
                case ToWorker(worker_id=worker_id, message=message):
                    self.workers[worker_id](message)
                case ToClient(stream_id=stream_id, message=ResponseEnd() | ResponseError() as end):
                    self.responses.pop(stream_id).deliver(end, None)
                case ToClient(stream_id=stream_id, message=ResponseData() as data):
                    response = self.responses[stream_id]
                    response.deliver(data, None)
                    if len(response.chunks) <= response.bound:
                        self.credit(stream_id)
                case ToClient(stream_id=stream_id, message=message):
                    self.responses[stream_id].deliver(message, self.core.holder(stream_id))


@attrs.define(eq=False)
class RingStream:
    """The client side of one parked request: its response.

    Read it with ``await response_head()`` then ``async for chunk in body()``. ``cancel()``
    (or leaving ``with stream:``) says the client went away. ``outcome`` is what the worker
    stated the response ended with, once it has.
    """

    _router: _Router
    stream_id: int
    request_head: RequestHead
    key: str
    """The routing key the request was parked with (its ``model``; may be empty)."""
    _response: _Response

    @property
    def state(self) -> StreamState:
        """PARKED, ASSIGNED or RESPONDING while live; then ENDED, FAILED or CANCELLED."""
        if self._response.over is not None:
            return self._response.over
        state = self._router.core.state(self.stream_id)
        assert state is not None, "a live stream is tracked by the core"
        return state

    @property
    def worker_id(self) -> str | None:
        """The worker that sent the response head (for logs), once it has."""
        return self._response.worker_id

    @property
    def outcome(self) -> Outcome | None:
        """What the worker stated the response ended with (``ResponseEnd``/``ResponseError``),
        once the stream has ended or failed; ``None`` before that, if it stated nothing, or if
        the stream was cancelled (by its client, or by the ring when the worker went away)."""
        return self._response.outcome

    async def response_head(self) -> ResponseHead:
        """Wait for the response head (status and headers); returns it again on later calls.

        Error handling: ``WorkerFailedError`` if the worker failed or detached before sending
        it; ``StreamCancelledError`` if this stream was cancelled first; ``ParkTimeoutError``
        (the stream is cancelled) if it stayed parked for the ring's ``park_timeout`` seconds
        at a time (each requeue starts a new wait).
        """
        timeout = self._router.park_timeout
        if timeout is not None:
            await self._watch_park(timeout)
        await self._response.settled.wait()
        if self._response.head is not None:
            return self._response.head
        self._raise_outcome()

    def body(self) -> AsyncIterator[bytes]:
        """The response body, chunk by chunk, as the worker writes it.

        Waits for the head first if ``response_head()`` was not awaited. Iteration stops when
        the worker ends the response. Error handling: raises ``WorkerFailedError`` after the
        chunks that arrived if the worker fails or detaches mid-way, ``StreamCancelledError``
        if this stream was cancelled.
        """
        return _ResponseBody(self._next_chunk)

    def cancel(self) -> None:
        """The client went away. Idempotent, never blocks.

        Resource handling: frees the stream's spot in the ring at once, drops buffered
        chunks, and tells the worker holding it (``Claimed.cancelled`` is set and its
        ``send`` raises ``StreamCancelledError``). Does nothing to a stream that has ended or
        failed, beyond dropping what was not read.
        """
        self._response.close()
        if self._response.over is not None:
            return
        self._response.finish(StreamState.CANCELLED)
        self._router.cancel(self.stream_id)

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
        moved = self._router.moved
        while not self._response.settled.is_set():
            if self._is_parked():
                with trio.move_on_at(parked_at + limit_s):
                    await moved.park()
                    continue
                self.cancel()
                raise ParkTimeoutError(limit_s, self._router.core.retry_after)
            await moved.park()
            if self._is_parked():  # requeued: its worker went away
                parked_at = trio.current_time()

    def _is_parked(self) -> bool:
        return self.state is StreamState.PARKED

    async def _next_chunk(self) -> bytes:
        response = self._response
        if response.head is None:
            await self.response_head()
        await trio.lowlevel.checkpoint_if_cancelled()
        waited = False
        while True:
            if response.closed:  # by cancel(), maybe after the end
                raise StreamCancelledError(f"stream {self.stream_id} was cancelled")
            if response.chunks:
                data = response.chunks.popleft()
                response.changed.unpark_all()  # room for the worker's next chunk
                if len(response.chunks) >= response.bound:  # one moved into the buffer
                    self._router.credit(self.stream_id)
                if not waited:
                    await trio.lowlevel.cancel_shielded_checkpoint()
                return data
            if response.over is StreamState.ENDED:
                raise StopAsyncIteration
            if response.over is not None:
                self._raise_outcome()
            await response.changed.park()
            waited = True

    def _raise_outcome(self) -> Never:
        over = self._response.over
        if over is StreamState.FAILED:
            raise WorkerFailedError(self._response.error)
        if over is StreamState.CANCELLED:
            raise StreamCancelledError(f"stream {self.stream_id} was cancelled by its client")
        raise AssertionError(f"no response to report in state {over}")


@attrs.define(eq=False)
class _ResponseBody:
    _next: Callable[[], Awaitable[bytes]]

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> bytes:
        return await self._next()


@attrs.define(eq=False)
class WorkerLink:
    """A worker's attachment to the ring, handed out by ``Ring.attach``; the ``Lane`` of the
    ``Claimed`` streams it hands out: their messages go to the core as they are."""

    _router: _Router
    _attach: Attach
    _relay: Relay | None = None
    _claimed: dict[int, Claimed] = attrs.field(init=False, factory=dict)
    _inbox: trio.MemorySendChannel[Claimed] = attrs.field(init=False)
    _outbox: trio.MemoryReceiveChannel[Claimed] = attrs.field(init=False)
    _detached: bool = attrs.field(init=False, default=False)

    def __attrs_post_init__(self) -> None:
        # Every item is backed by a claim the core accepted, and the core bounds claims plus
        # held streams by max_inflight: the inbox never overflows.
        self._inbox, self._outbox = trio.open_memory_channel[Claimed](self.max_inflight)
        self._router.attach(self._attach, self._deliver, self._relay)

    @property
    def worker_id(self) -> str:
        return self._attach.worker_id

    @property
    def max_inflight(self) -> int:
        return self._attach.max_inflight

    def heartbeat(self, beat: Heartbeat) -> None:
        """Report the engine's capacity (shown by ``Ring.stats``)."""
        self.post(beat)

    async def claim(self) -> Claimed:
        """Wait for the oldest parked stream; call it only when a slot is free.

        Streams whose client went away before this returned are skipped. Use the result as
        ``with claimed:`` so it is finished however the handler ends.

        Resource handling: if cancelled while waiting, the claim is taken back (and a stream
        already assigned for it is requeued at the front), so nothing is lost or stuck.

        Error handling: ``ProtocolError`` when this worker already holds or waits for
        ``max_inflight`` streams, has detached, or is relayed; ``trio.ClosedResourceError``
        if it detaches while this waits.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if self._relay is not None:
            raise ProtocolError("a relayed worker's streams go to its relay, not to claim()")
        self.post(Claim(1))
        while True:
            claimed = await self._take()
            if not claimed.cancelled.is_set():
                return claimed
            # Its client went away before the worker saw it: acknowledge, and claim again.
            claimed.release()
            self.post(Claim(1))

    def post(self, message: Message) -> None:
        """Hand the ring one of this worker's messages, as it is, without waiting.

        ``Heartbeat``, ``Claim``, ``Withdraw`` (answered by a ``Withdrawn`` to the relay),
        ``Release`` and the response messages: a ``ResponseData`` posted here goes past the
        client's buffer bound (``send_data`` waits for room first). An ``Attach``, a ``Detach`` or a
        ring's message is refused: the worker leaves by leaving ``Ring.attach``'s block.

        Error handling: ``ProtocolError`` (nothing changed) for a message illegal now.
        """
        core, worker_id = self._router.core, self.worker_id
        match message:
            case Heartbeat():
                core.heartbeat(worker_id, message, at=trio.current_time())
                return
            case Withdraw(count=count):
                self._deliver(Withdrawn(core.withdraw(worker_id, count)))
                return
            case Detach():
                raise ProtocolError("a worker detaches by leaving Ring.attach's block", message)
        effects = core.receive(worker_id, message)
        if isinstance(message, ResponseEnd | ResponseError | Release):
            self._claimed.pop(message.stream_id, None)
        self._router.apply(effects)

    async def send_data(self, message: ResponseData) -> None:
        """Post a body chunk once its client's buffer has room (back-pressure on this stream
        only). A send cancelled while it waits posted nothing.

        Error handling: ``StreamCancelledError`` if the client goes away meanwhile; as
        ``post`` otherwise.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        response = self._router.responses.get(message.stream_id)
        waited = False
        if response is not None:
            waited = await response.room()
            if response.closed:
                raise StreamCancelledError(f"the client of stream {message.stream_id} went away")
        self.post(message)
        if not waited:  # still a schedule point, as a send on a memory channel is
            await trio.lowlevel.cancel_shielded_checkpoint()

    def holds(self, stream_id: int) -> bool:
        """Whether ``stream_id`` was claimed here and is not finished (nor the worker gone)."""
        return stream_id in self._claimed

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
        if self._router.core.withdraw(self.worker_id, 1):
            return
        # The claim was filled already: its assignment sits in the inbox; park it again.
        self._outbox.receive_nowait().release()

    def _deliver(self, message: Assign | Cancel | Credit | Withdrawn | Detach) -> None:
        """The ring's messages for this worker."""
        if isinstance(message, Detach):
            self._detached = True
            self._inbox.close()
            self._claimed.clear()
        elif self._relay is not None:
            self._relay(message)
        elif isinstance(message, Assign):
            claimed = Claimed(self, message.stream_id, message.head, message.body)
            self._claimed[message.stream_id] = claimed
            self._inbox.send_nowait(claimed)
        elif isinstance(message, Cancel):
            self._claimed[message.stream_id].cancelled.set()
        # A Withdrawn needs nothing here: this worker takes its claims back by a call.
