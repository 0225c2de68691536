"""The inside of one in-process ``Ring``: its ``RingCore`` and where each effect goes.

``Router`` owns the core. The ring's faces use it by its methods only: ``Ring`` parks and
attaches through it, a ``RingStream`` reads its stream's ``ResponseState`` and asks the router
for the stream's state, and a ``WorkerLink`` hands it its worker's messages. An ``Assign``
lands in a worker's delivery (its link's inbox, or its relay), a ``Cancel`` too, and a response
message lands in the stream's ``ResponseState``.

Chunks are never refused: a worker in this process waits for room in the client's buffer
before its chunk reaches the core (``WorkerLink.send_data``), a relayed worker is bounded by
its credits; a chunk beyond the buffer's bound is credited to its relay when it enters the
buffer.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from typing import TypeAlias

import attrs
import trio

from ._core import Effect, RingCore, ToClient, ToWorker
from ._messages import (
    Assign,
    Attach,
    Cancel,
    Credit,
    Detach,
    Heartbeat,
    Message,
    Outcome,
    RequestHead,
    ResponseData,
    ResponseEnd,
    ResponseError,
    ResponseHead,
    ResponseMessage,
    Withdrawn,
)
from ._states import StreamState
from ._stats import ModelStats, RingStats

__all__ = ["Relay"]  # Router and ResponseState serve the ring's own modules only

Relay: TypeAlias = Callable[[Assign | Cancel | Credit | Withdrawn], None]
"""Takes the ring's messages for a relayed worker: ``Assign``, ``Cancel``, ``Withdrawn`` (the
answer to its ``Withdraw``) and ``Credit`` (a chunk of it entered its client's buffer). Called
from whichever task caused the message; it must not block or raise."""

Delivery: TypeAlias = Callable[[Assign | Cancel | Credit | Withdrawn | Detach], None]
"""Where the ring's messages for one attached worker go (its ``WorkerLink``)."""


@attrs.define(eq=False)
class ResponseState:
    """One stream's response as it arrives: written by the router, read through the stream's
    ``RingStream`` (one state for both ends, as trio's memory channels share one)."""

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
    moved: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    """Unparked when the stream is assigned or parked again (its park-time watch waits here:
    one stream's move wakes that stream only, however many others are parked)."""

    @property
    def full(self) -> bool:
        """Whether the client's buffer holds its bound of chunks (or more)."""
        return len(self.chunks) >= self.bound

    def deliver(self, message: ResponseMessage, worker_id: str | None) -> None:
        match message:
            case ResponseHead():
                self.head = message
                self.worker_id = worker_id
                self.settled.set()
                self.moved.unpark_all()
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
        self.moved.unpark_all()
        self.changed.unpark_all()

    def close(self) -> None:
        self.closed = True
        self.chunks.clear()
        self.changed.unpark_all()

    def take(self) -> bytes:
        """The oldest chunk (there is one), making room for the worker's next."""
        data = self.chunks.popleft()
        self.changed.unpark_all()
        return data

    async def room(self) -> bool:
        """Wait while the client's buffer is full, or until the stream is over; returns
        whether it waited."""
        waited = False
        while self.full and self.over is None:
            await self.changed.park()
            waited = True
        return waited


@attrs.define(eq=False)
class Router:
    """The inside of one ``Ring``, shared by its streams and links: the core, and where each
    of its effects goes. Not exported: only ``Ring``, ``RingStream`` and ``WorkerLink`` use it."""

    _core: RingCore
    response_buffer: int
    park_timeout: float | None
    """Seconds a stream may stay parked (unclaimed) before its client gives up."""
    _responses: dict[int, ResponseState] = attrs.field(init=False, factory=dict)
    _workers: dict[str, Delivery] = attrs.field(init=False, factory=dict)
    _relays: dict[str, Relay] = attrs.field(init=False, factory=dict)  # the relayed workers
    _gone: dict[str, tuple[str, float]] = attrs.field(init=False, factory=dict)
    """Models no attached worker serves any more: their kind, and when their last one left."""

    # -- queries -------------------------------------------------------------------------------

    @property
    def retry_after(self) -> float:
        return self._core.retry_after

    @property
    def takes_any_model(self) -> bool:
        return self._core.takes_any_model

    def stats(self) -> RingStats:
        return self._core.stats()

    def state(self, stream_id: int) -> StreamState | None:
        """The core's state of a stream it tracks; ``None`` once it is forgotten."""
        return self._core.state(stream_id)

    def models(self) -> dict[str, ModelStats]:
        """Every model an attached worker serves, and every model whose last worker left
        within ``park_timeout`` (with ``workers`` 0), by name in attach order."""
        served = self._core.models()
        now = trio.current_time()
        window = math.inf if self.park_timeout is None else self.park_timeout
        for name, (kind, since) in list(self._gone.items()):
            if name in served or now - since > window:
                del self._gone[name]
            else:
                served[name] = ModelStats(name, kind, workers=0)
        return served

    # -- the client side -----------------------------------------------------------------------

    def park(
        self,
        head: RequestHead,
        body: bytes,
        key: str,
        prefixes: Sequence[tuple[str, int]] = (),
    ) -> tuple[int, ResponseState]:
        """Park a request; returns its stream id and the state its response arrives in.
        Error handling: ``RingFullError`` (nothing parked)."""
        stream_id, effects = self._core.park(head, body, key=key, prefixes=prefixes)
        response = self._responses[stream_id] = ResponseState(self.response_buffer)
        self._apply(effects)
        return stream_id, response

    def cancel(self, stream_id: int) -> None:
        """The client of ``stream_id`` went away."""
        self._responses.pop(stream_id, None)
        self._apply(self._core.cancel(stream_id))

    def credit(self, stream_id: int) -> None:
        """A chunk entered the client's buffer: the worker, if relayed, may send one more."""
        if not self._relays:
            return
        holder = self._core.holder(stream_id)
        relay = None if holder is None else self._relays.get(holder)
        if relay is not None:
            relay(Credit(stream_id, 1))

    # -- the worker side -----------------------------------------------------------------------

    def attach(self, message: Attach, deliver: Delivery, relay: Relay | None) -> None:
        """Error handling: ``ProtocolError`` if the worker's id is already attached."""
        self._core.attach(message)
        self._workers[message.worker_id] = deliver
        if relay is not None:
            self._relays[message.worker_id] = relay

    def detach(self, worker_id: str, reason: str) -> None:
        """The worker left: its delivery gets a ``Detach``, its streams are requeued or failed."""
        deliver = self._workers.pop(worker_id, None)
        self._relays.pop(worker_id, None)
        if deliver is not None:
            deliver(Detach(reason))
            before = self._core.models()
            held = self._core.held(worker_id)
            self._apply(self._core.detach(worker_id, reason))
            self._moved(held)  # requeued ones watch their park time again
            after = self._core.models()
            now = trio.current_time()
            for name, model in before.items():
                if name not in after:
                    self._gone[name] = (model.kind, now)

    def heartbeat(self, worker_id: str, beat: Heartbeat) -> None:
        self._apply(self._core.heartbeat(worker_id, beat, at=trio.current_time()))

    def withdraw(self, worker_id: str, count: int, model: str | None) -> int:
        """Take back up to ``count`` unfilled claims; returns how many were still unfilled."""
        return self._core.withdraw(worker_id, count, model)

    def respond(self, worker_id: str, data: ResponseData) -> None:
        """A body chunk (the most frequent message, and it moves no stream)."""
        self._apply(self._core.respond(worker_id, data))

    def judge(self, worker_id: str, message: Message) -> list[Effect]:
        """Apply any other message of the worker's to the core; returns the effects, for
        ``deliver`` once the caller has forgotten what the message finished.

        Error handling: ``ProtocolError`` (nothing changed) for one illegal now."""
        return self._core.receive(worker_id, message)

    def deliver(self, effects: Iterable[Effect]) -> None:
        """Deliver the effects ``judge`` returned."""
        self._apply(effects)

    def moved(self, stream_id: int) -> None:
        """``stream_id`` was parked again: wake its park-time watch."""
        self._moved((stream_id,))

    def response(self, stream_id: int) -> ResponseState | None:
        """The response state of a stream whose client still waits."""
        return self._responses.get(stream_id)

    # -- delivering effects --------------------------------------------------------------------

    def _moved(self, stream_ids: Iterable[int]) -> None:
        """These streams were assigned or parked again: wake their park-time watches."""
        for stream_id in stream_ids:
            response = self._responses.get(stream_id)
            if response is not None:
                response.moved.unpark_all()

    def _apply(self, effects: Iterable[Effect]) -> None:
        """Deliver the core's effects; none waits. A chunk past the client's buffer bound
        waits beyond it (a worker in this process waited for room before the core saw it,
        unless it is its last; a relayed worker's credits bound it): it is credited when it
        enters the buffer. An assigned stream's park-time watch is woken (that one only)."""
        for effect in effects:
            match effect:
                case ToClient(stream_id=stream_id, message=ResponseData() as data):
                    response = self._responses[stream_id]
                    response.deliver(data, None)
                    if len(response.chunks) <= response.bound:
                        self.credit(stream_id)
                case ToWorker(worker_id=worker_id, message=message):
                    if isinstance(message, Assign):
                        self._moved((message.stream_id,))
                    self._workers[worker_id](message)
                case ToClient(stream_id=stream_id, message=ResponseEnd() | ResponseError() as end):
                    self._responses.pop(stream_id).deliver(end, None)
                case ToClient(stream_id=stream_id, message=message):
                    self._responses[stream_id].deliver(message, self._core.holder(stream_id))
