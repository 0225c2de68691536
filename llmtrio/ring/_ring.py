"""The in-process Trio ring: a router of ``RingCore`` effects to clients and attached workers.

The ingress side parks each request as a ``RingStream`` and reads its response; workers attach
(``Ring.attach``), claim streams when they have a free slot and write responses through a
``Claimed``, whose messages their ``WorkerLink`` hands to the core. All decisions (who gets
which stream, what is legal, what a detach does) are the core's; this module only delivers its
effects (``_router``): an ``Assign`` lands in a worker link's inbox, a ``Cancel`` cancels the
``Claimed`` (sets ``cancelled``, cancels its ``cancel_scope``), a response message lands in
the stream's ``ResponseState``, which its ``RingStream`` reads (``_stream``).

A *relayed* link (``Ring.attach(..., relay=...)``) hands the ring's messages for its worker to
a callable instead, and takes the worker's messages as they are (``WorkerLink.post``): the
control listener relays a remote worker so, message for message.

Back-pressure: an in-process worker's ``send`` waits while its client's buffer holds
``response_buffer`` chunks. A relayed worker's chunks never wait here (its credits bound
them): each chunk that enters its client's buffer is a ``Credit`` for its relay.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager

import attrs
import trio

from ._config import RingConfig, default
from ._core import RingCore
from ._errors import ProtocolError, StreamCancelledError
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
    Release,
    RequestHead,
    ResponseData,
    ResponseEnd,
    ResponseError,
    Withdraw,
    Withdrawn,
)
from ._router import Relay, Router
from ._stats import ModelStats, RingStats
from ._stream import RingStream

__all__ = ["Ring", "WorkerLink"]


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

    max_streams: int = attrs.field(default=default("max_streams"), on_setattr=attrs.setters.frozen)
    retry_after: float = attrs.field(
        default=default("retry_after"), on_setattr=attrs.setters.frozen
    )
    response_buffer: int = attrs.field(
        default=default("response_buffer"), kw_only=True, on_setattr=attrs.setters.frozen
    )
    max_assignments: int = attrs.field(
        default=default("max_assignments"), kw_only=True, on_setattr=attrs.setters.frozen
    )
    park_timeout: float | None = attrs.field(
        default=None, kw_only=True, on_setattr=attrs.setters.frozen
    )
    """Seconds a stream may stay parked (unclaimed) before ``response_head`` gives up."""
    _router: Router = attrs.field(init=False)
    #: The last worker that detached because it failed, and why (shown by ``/health``).
    last_detach: tuple[str, str] | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        if self.response_buffer < 1:
            raise ValueError(f"response_buffer must be at least 1, not {self.response_buffer}")
        core = RingCore(self.max_streams, self.retry_after, max_assignments=self.max_assignments)
        self._router = Router(core, self.response_buffer, self.park_timeout)

    @classmethod
    def from_config(cls, config: RingConfig) -> Ring:
        """A ring with ``config``'s settings."""
        return cls(
            max_streams=config.max_streams,
            retry_after=config.retry_after,
            response_buffer=config.response_buffer,
            max_assignments=config.max_assignments,
            park_timeout=config.park_timeout,
        )

    def park(
        self,
        head: RequestHead,
        body: bytes = b"",
        *,
        key: str = "",
        prefixes: Sequence[tuple[str, int]] = (),
    ) -> RingStream:
        """Park a request; a worker with a free slot will claim it. ``key`` is the request's
        routing key (its ``model``), kept with the stream; ``prefixes`` what its prompt begins
        with, as ``(digest, size)`` pairs: among the workers that may take it, one holding the
        longest of them is preferred (``RingCore``'s prefix affinity).

        Resource handling: the stream holds a spot until its response ends or fails, or until
        ``cancel()``; use it as a context manager (``with ring.park(...) as stream:``) so that
        leaving early cancels it.

        Error handling: raises ``RingFullError`` (nothing parked) when ``max_streams`` streams
        are open.
        """
        stream_id, response = self._router.park(head, body, key, prefixes)
        return RingStream(self._router, stream_id, head, key, response)

    @asynccontextmanager
    async def attach(
        self,
        worker_id: str,
        max_inflight: int,
        *,
        models: Iterable[str] = (),
        kinds: Iterable[str] = (),
        relay: Relay | None = None,
        vision: Iterable[str] = (),
        audio: Iterable[str] = (),
        contexts: Iterable[int] = (),
    ) -> AsyncIterator[WorkerLink]:
        """Attach a worker that will hold at most ``max_inflight`` streams at once, serving
        ``models`` (listed by ``stats``), each of the kind ``kinds`` says (empty: all chat);
        those in ``vision`` take images, those in ``audio`` audio; ``contexts`` gives each
        model's context length.
        A worker serving exactly one model claims streams for that model only; one that lists
        several or none claims for any it listed (or any at all).

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
        attach = Attach(
            worker_id,
            max_inflight,
            models=models,
            kinds=kinds,
            vision=vision,
            audio=audio,
            contexts=tuple(contexts),
        )
        link = WorkerLink(self._router, attach, relay)
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
        return self._router.stats()

    @property
    def takes_any_model(self) -> bool:
        """Whether an attached worker listed no model, and so takes a request for any."""
        return self._router.takes_any_model

    def models(self) -> dict[str, ModelStats]:
        """Every model an attached worker serves, and every model whose last worker left
        within ``park_timeout`` (with ``workers`` 0: its requests park, as its workers may be
        briefly away), by name in attach order."""
        return self._router.models()


@attrs.define(eq=False)
class WorkerLink:
    """A worker's attachment to the ring, handed out by ``Ring.attach``; the ``Lane`` of the
    ``Claimed`` streams it hands out: their messages go to the core as they are."""

    _router: Router
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

    @property
    def _model(self) -> str | None:
        """What its claims name: its one model, or none (any it listed) when it lists several."""
        models = self._attach.models
        return models[0] if len(models) == 1 else None

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
        self.post(Claim(1, model=self._model))
        while True:
            claimed = await self._take()
            if not claimed.cancelled.is_set():
                return claimed
            # Its client went away before the worker saw it: acknowledge, and claim again.
            claimed.release()
            self.post(Claim(1, model=self._model))

    async def wait_withdrawn(self) -> None:
        """Claims are taken back at once in process (a cancelled ``claim()`` returns after
        its claim is withdrawn, or its stream requeued): only a schedule point."""
        await trio.lowlevel.checkpoint()

    def post(self, message: Message) -> None:
        """Hand the ring one of this worker's messages, as it is, without waiting.

        ``Heartbeat``, ``Claim``, ``Withdraw`` (answered by a ``Withdrawn`` to the relay),
        ``Release`` and the response messages: a ``ResponseData`` posted here goes past the
        client's buffer bound (``send_data`` waits for room first). An ``Attach``, a
        ``Detach`` or a ring's message is refused: the worker leaves by leaving
        ``Ring.attach``'s block.

        Error handling: ``ProtocolError`` (nothing changed) for a message illegal now.
        """
        router, worker_id = self._router, self.worker_id
        match message:
            case ResponseData():  # the most frequent, and it moves no stream
                router.respond(worker_id, message)
            case Heartbeat():
                router.heartbeat(worker_id, message)
            case Withdraw(count=count, model=model):
                self._deliver(Withdrawn(router.withdraw(worker_id, count, model)))
            case Detach():
                raise ProtocolError("a worker detaches by leaving Ring.attach's block", message)
            case _:
                effects = router.judge(worker_id, message)
                if isinstance(message, ResponseEnd | ResponseError | Release):
                    self._claimed.pop(message.stream_id, None)
                router.deliver(effects)
                if isinstance(message, Release):
                    router.moved(message.stream_id)  # parked again

    async def send_data(self, message: ResponseData) -> None:
        """Post a body chunk once its client's buffer has room (back-pressure on this stream
        only). A send cancelled while it waits posted nothing.

        Error handling: ``StreamCancelledError`` if the client goes away meanwhile; as
        ``post`` otherwise.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        response = self._router.response(message.stream_id)
        waited = False
        if response is not None:
            if response.full:
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
        if self._router.withdraw(self.worker_id, 1, self._model):
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
            self._claimed[message.stream_id].cancel()
        # A Withdrawn needs nothing here: this worker takes its claims back by a call.
