"""The worker's end of the control channel: one ``RemoteLink`` over any number of ingresses.

``connect_ring`` keeps a connection to every ingress URL (reconnecting with jittered
exponential backoff) and gives one ``RemoteLink``, a ``RingLink`` that ``serve_link`` runs
over exactly as over an in-process ``WorkerLink``. Claims are the worker's free slots: each
waiting ``claim()`` is offered to every attached ingress at once; when one assigns a stream
the others are sent ``Withdraw``, and an ``Assign`` that crosses a ``Withdraw`` on the wire is
given back with ``Release`` (parked again at the front there). So the worker never holds more
than ``max_inflight`` streams over all its ingresses together, every ingress sees its free
slots, and the oldest waiting request anywhere wins (a busy ingress does not starve a quiet
one). An ingress going away cancels only the streams it sent.

An ingress URL may name many ingresses (a DNS name with one address per replica): every
address is dialed and the name is resolved again every ``DialConfig.resolve_interval``
(``_dial`` holds the rules). A worker gives up an ingress that answers no ping for
``DialConfig.ingress_timeout`` seconds, as an ingress declares a silent worker dead.
"""

from __future__ import annotations

import logging
import math
import ssl
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from contextlib import asynccontextmanager

import attrs
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from ._dial import DialConfig, Dialer, IngressURL, follow
from ._errors import ControlRefusedError, ProtocolError, StreamCancelledError
from ._framing import FrameDecoder, encode_available
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
    ResponseData,
    ResponseEnd,
    ResponseError,
    ResponseHead,
    Withdraw,
    Withdrawn,
)
from ._tls import open_control_websocket

__all__ = ["RemoteLink", "connect_ring"]

logger = logging.getLogger("llmtrio.ring.remote")

KEEPALIVE_S = 1.0


@asynccontextmanager
async def connect_ring(
    urls: Sequence[str],
    ssl_context: ssl.SSLContext,
    *,
    worker_id: str,
    max_inflight: int,
    models: Iterable[str] = (),
    kinds: Iterable[str] = (),
    config: DialConfig | None = None,
    vision: Iterable[str] = (),
    audio: Iterable[str] = (),
    contexts: Iterable[int] = (),
) -> AsyncIterator[RemoteLink]:
    """Attach to every ingress in ``urls`` (``wss://HOST:PORT``) and yield the link. A HOST
    that is a name is resolved, and every address it stands for is an ingress (see
    ``DialConfig``). ``models``, their ``kinds``, those that take images (``vision``) and
    audio (``audio``) and their context lengths (``contexts``) go in the ``Attach``; a link
    serving exactly one model claims for that model (``Claim.model``).

    Connections are made and remade in the background: the link is usable at once, and
    streams come from whichever ingresses are attached. Refusals (TLS, protocol version)
    are logged with their reason and retried with backoff.

    Resource handling: leaving the block sends ``Detach`` to every ingress and closes the
    connections; streams still held are cancelled on the worker's side and requeued or
    failed by their ingress. Use ``RemoteLink.drain`` first for a graceful exit.

    Error handling: ``ValueError`` for a malformed URL.
    """
    targets = list(dict.fromkeys(IngressURL.parse(url) for url in urls))
    if not targets:
        raise ValueError("give at least one ingress URL")
    link = RemoteLink(
        worker_id,
        max_inflight,
        tuple(models),
        ssl_context,
        config or DialConfig(),
        kinds=tuple(kinds),
        vision=tuple(vision),
        audio=tuple(audio),
        contexts=tuple(contexts),
    )
    async with trio.open_nursery() as nursery:
        for target in targets:
            nursery.start_soon(follow, target, link._config, link._session, link._is_closing)
        try:
            yield link
        finally:
            link._close("the worker is shutting down")
            nursery.cancel_scope.deadline = trio.current_time() + 2


@attrs.define(eq=False)
class _Connection:
    """One attached ingress, as the worker sees it: its claims, the streams it assigned and
    their credits. The ``Lane`` of the ``Claimed`` streams it assigned: their messages go on
    the wire as they are; a body chunk waits for a credit of its own stream."""

    name: str
    _outbox: trio.MemorySendChannel[Message]
    _finished: Callable[[], None]  # a held stream was finished (its slot is free)
    outstanding: int = 0  # claims sent and not yet answered by an Assign or a Withdrawn
    withdrawing: int = 0  # claims asked back, not yet answered
    withdraws: deque[int] = attrs.field(factory=deque)
    held: dict[int, Claimed] = attrs.field(factory=dict)
    credits: dict[int, int] = attrs.field(factory=dict)  # per held stream
    _credited: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)
    alive: bool = True

    def send(self, message: Message) -> None:
        if self.alive:
            try:
                self._outbox.send_nowait(message)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                self.alive = False

    def close(self) -> None:
        self.alive = False
        self._outbox.close()

    def assigned(self, message: Assign) -> Claimed:
        """A stream this ingress assigned, to serve with its credits."""
        claimed = Claimed(self, message.stream_id, message.head, message.body)
        self.held[message.stream_id] = claimed
        self.credits[message.stream_id] = message.credits
        return claimed

    def credit(self, message: Credit) -> None:
        if message.stream_id in self.credits:
            self.credits[message.stream_id] += message.count
            self._credited.unpark_all()

    def cancel(self, stream_id: int) -> None:
        """The ingress cancelled the stream (its client went away)."""
        claimed = self.held.get(stream_id)
        if claimed is not None:
            claimed.cancel()
            self._credited.unpark_all()

    def lose(self) -> None:
        """The connection ended: its streams are cancelled here (the ingress requeues or fails
        them) and can no longer be answered."""
        self.close()
        for claimed in self.held.values():
            claimed.cancel()
        self.held.clear()
        self.credits.clear()
        self._credited.unpark_all()

    # -- the Lane of its streams ---------------------------------------------------------------

    def post(
        self, message: ResponseHead | ResponseData | ResponseEnd | ResponseError | Release
    ) -> None:
        self.send(message)
        if isinstance(message, ResponseEnd | ResponseError | Release):
            self.held.pop(message.stream_id, None)
            self.credits.pop(message.stream_id, None)
            self._finished()

    async def send_data(self, message: ResponseData) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        stream_id = message.stream_id
        claimed = self.held.get(stream_id)
        while True:
            if claimed is not None and claimed.cancelled.is_set():
                raise StreamCancelledError(f"the client of stream {stream_id} went away")
            if stream_id not in self.held:
                raise ProtocolError(f"stream {stream_id} is already finished")
            if self.credits[stream_id] > 0:
                break
            await self._credited.park()
        self.credits[stream_id] -= 1
        self.send(message)
        await trio.lowlevel.cancel_shielded_checkpoint()

    def holds(self, stream_id: int) -> bool:
        return stream_id in self.held


@attrs.define(eq=False)
class RemoteLink:
    """A worker's attachment to every ingress it reaches (a ``RingLink``)."""

    worker_id: str
    max_inflight: int
    models: tuple[str, ...]
    _ssl_context: ssl.SSLContext
    _config: DialConfig = attrs.field(factory=DialConfig)
    kinds: tuple[str, ...] = attrs.field(default=(), kw_only=True)
    vision: tuple[str, ...] = attrs.field(default=(), kw_only=True)
    audio: tuple[str, ...] = attrs.field(default=(), kw_only=True)
    contexts: tuple[int, ...] = attrs.field(default=(), kw_only=True)
    _connections: list[_Connection] = attrs.field(init=False, factory=list)
    _wanted: int = attrs.field(init=False, default=0)  # claim() calls waiting
    _ready: deque[tuple[_Connection, Claimed]] = attrs.field(init=False, factory=deque)
    _changed: trio.lowlevel.ParkingLot = attrs.field(init=False, factory=trio.lowlevel.ParkingLot)
    _capacity: Heartbeat | None = attrs.field(init=False, default=None)
    _draining: bool = attrs.field(init=False, default=False)
    _closing: bool = attrs.field(init=False, default=False)

    @property
    def _model(self) -> str | None:
        """What its claims name: its one model, or none (any it listed) when it lists several.
        An ingress of the previous version ignores the name: the claim is for any model."""
        return self.models[0] if len(self.models) == 1 else None

    @property
    def attached(self) -> int:
        """How many ingresses are attached now."""
        return len(self._connections)

    @property
    def held(self) -> int:
        """Streams held over every ingress (assigned and not finished)."""
        return sum(len(connection.held) for connection in self._connections)

    def heartbeat(self, beat: Heartbeat) -> None:
        """Send the engine's capacity to every attached ingress (never blocks)."""
        self._capacity = beat
        for connection in self._connections:
            connection.send(self._capacity)

    async def claim(self) -> Claimed:
        """Wait for a stream from any ingress; call it only when a slot is free.

        Resource handling: cancelling the wait takes the claims back (``Withdraw``); a
        stream that arrives for it anyway is given back (``Release``). While draining, this
        waits forever.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        self._wanted += 1
        try:
            self._rebalance()
            while True:
                while not self._ready or self._draining:
                    await self._changed.park()
                _, claimed = self._ready.popleft()
                if not claimed.cancelled.is_set():
                    return claimed
                claimed.release()  # acknowledges the cancel
        finally:
            self._wanted -= 1
            self._rebalance()

    def drain(self) -> None:
        """Stop claiming: every unfilled claim is withdrawn; held streams go on."""
        self._draining = True
        self._rebalance()
        self._changed.unpark_all()

    async def wait_withdrawn(self) -> None:
        """Return once every ``Withdraw`` sent has been answered (``Withdrawn``) or its
        ingress is gone: an ``Assign`` that crossed one was given back (``Release``), and no
        claim made from now on is filled by it. An ingress that answers nothing is given up
        after ``DialConfig.ingress_timeout``, which ends this wait too."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while any(connection.withdrawing for connection in self._connections):
            await self._changed.park()

    async def wait_idle(self) -> None:
        """Wait until no stream is held (after ``drain``, the moment to leave)."""
        while self.held:
            await self._changed.park()

    # -- claims over every ingress ---------------------------------------------------------------

    def _rebalance(self) -> None:
        """Offer each free slot to every ingress; take back what is no longer wanted."""
        while len(self._ready) > self._wanted:
            _, surplus = self._ready.pop()
            surplus.release()
        target = 0 if self._draining or self._closing else self._wanted - len(self._ready)
        for connection in self._connections:
            effective = max(0, connection.outstanding - connection.withdrawing)
            if effective < target:
                # The ingress counts held streams and claims against max_inflight; claims
                # being withdrawn still count until answered.
                room = self.max_inflight - len(connection.held) - connection.outstanding
                count = min(target - effective, room)
                if count > 0:
                    connection.outstanding += count
                    connection.send(Claim(count, model=self._model))
            elif effective > target:
                count = effective - target
                connection.withdrawing += count
                connection.withdraws.append(count)
                connection.send(Withdraw(count, model=self._model))

    def _assigned(self, connection: _Connection, message: Assign) -> None:
        connection.outstanding -= 1
        claimed = connection.assigned(message)
        if len(self._ready) < self._wanted and not self._draining:
            self._ready.append((connection, claimed))
            self._changed.unpark_all()
        else:
            claimed.release()
        self._rebalance()

    def _withdrawn(self, connection: _Connection, message: Withdrawn) -> None:
        if not connection.withdraws:
            raise ProtocolError("Withdrawn without a Withdraw", message)
        connection.withdrawing -= connection.withdraws.popleft()
        connection.outstanding -= message.count
        self._rebalance()
        self._changed.unpark_all()

    def _stream_finished(self) -> None:
        self._rebalance()
        self._changed.unpark_all()

    # -- connections -----------------------------------------------------------------------------

    async def _session(self, dialer: Dialer) -> None:
        async with trio.open_nursery() as nursery:
            ws = await open_control_websocket(
                nursery,
                dialer.address,
                dialer.url.port,
                self._ssl_context,
                limit_s=self._config.handshake_timeout,
                server_hostname=dialer.server_hostname,
            )
            try:
                await self._serve(ws, dialer.name)
            finally:
                nursery.cancel_scope.cancel()

    async def _serve(self, ws: WebSocketConnection, name: str) -> None:
        """Attach over an open control WebSocket and serve it until it closes (the seam the
        tests drive over memory streams)."""
        async with trio.open_nursery() as nursery:
            send, sending = trio.open_memory_channel[Message](math.inf)
            connection = _Connection(name, send, self._stream_finished)
            attach = Attach(
                self.worker_id,
                self.max_inflight,
                models=self.models,
                kinds=self.kinds,
                vision=self.vision,
                audio=self.audio,
                contexts=self.contexts,
            )
            connection.send(attach)
            if self._capacity is not None:
                connection.send(self._capacity)
            self._connections.append(connection)
            logger.info("attached to ingress %s", name)
            self._rebalance()
            try:
                nursery.start_soon(self._write, ws, sending)
                nursery.start_soon(self._keepalive, connection)
                nursery.start_soon(self._watch_ingress, ws, connection)
                await self._read(ws, connection)
            finally:
                self._lose(connection)
                with trio.move_on_after(1, shield=True):
                    await ws.aclose()
                nursery.cancel_scope.cancel()

    async def _watch_ingress(self, ws: WebSocketConnection, connection: _Connection) -> None:
        """Ping the ingress every ``KEEPALIVE_S``; one that answers nothing for
        ``ingress_timeout`` seconds is given up (a silent partition breaks no TCP connection):
        the session ends, which cancels the streams that ingress sent."""
        timeout = self._config.ingress_timeout
        while True:
            await trio.sleep(KEEPALIVE_S)
            with trio.move_on_after(timeout) as scope:
                await ws.ping()
            if scope.cancelled_caught:
                raise ControlRefusedError(
                    f"ingress {connection.name} answered no ping for {timeout:g}s"
                )

    async def _keepalive(self, connection: _Connection) -> None:
        """Repeat the last capacity every ``KEEPALIVE_S``, so that an ingress hears from a
        worker whose engine reports nothing new (or that runs no heartbeat of its own)."""
        while True:
            await trio.sleep(KEEPALIVE_S)
            idle = Heartbeat(self.held, self.max_inflight, self.max_inflight - self.held)
            connection.send(self._capacity or idle)

    @staticmethod
    async def _write(ws: WebSocketConnection, sending: trio.MemoryReceiveChannel[Message]) -> None:
        async for message in sending:
            try:
                await ws.send_message(encode_available(message, sending))
            except ConnectionClosed:
                return
        await ws.aclose()  # after a Detach: the outbox was closed

    async def _read(self, ws: WebSocketConnection, connection: _Connection) -> None:
        decoder = FrameDecoder()
        while True:
            while (message := decoder.next_message()) is None:
                try:
                    data = await ws.get_message()
                except ConnectionClosed as exc:
                    reason = exc.reason
                    if self._closing:
                        logger.info("detached from ingress %s", connection.name)
                    elif reason is not None and reason.reason:
                        logger.warning("ingress %s closed: %s", connection.name, reason.reason)
                    else:
                        logger.warning("lost ingress %s", connection.name)
                    return
                if isinstance(data, str):
                    raise ProtocolError("the control channel carries binary frames, not text")
                decoder.receive_data(data)
            self._handle(connection, message)

    def _handle(self, connection: _Connection, message: Message) -> None:
        match message:
            case Assign():
                self._assigned(connection, message)
            case Withdrawn():
                self._withdrawn(connection, message)
            case Credit():
                connection.credit(message)
            case Cancel(stream_id=stream_id):
                connection.cancel(stream_id)
            case Detach(reason=reason):
                raise ControlRefusedError(f"the ingress sent us away: {reason}")
            case _:
                raise ProtocolError(f"an ingress may not send {type(message).__name__}", message)

    def _lose(self, connection: _Connection) -> None:
        """The connection ended: its streams are cancelled here (the ingress requeues or fails
        them), its claims are gone."""
        if connection in self._connections:
            self._connections.remove(connection)
        self._ready = deque(entry for entry in self._ready if entry[0] is not connection)
        connection.lose()
        self._rebalance()
        self._changed.unpark_all()

    def _is_closing(self) -> bool:
        return self._closing

    def _close(self, reason: str) -> None:
        self._closing = True
        for connection in self._connections:
            connection.send(Detach(reason))
            connection.close()
