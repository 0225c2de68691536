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
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Self

import attrs
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from ._dial import DialConfig, Dialer, IngressURL, follow
from ._errors import ControlRefusedError, ProtocolError, StreamCancelledError
from ._framing import FrameDecoder, encode_available
from ._link import unfinished_reason
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
    ResponseHead,
    Withdraw,
    Withdrawn,
)
from ._tls import open_control_websocket

__all__ = ["RemoteClaimed", "RemoteLink", "connect_ring"]

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
    config: DialConfig | None = None,
) -> AsyncIterator[RemoteLink]:
    """Attach to every ingress in ``urls`` (``wss://HOST:PORT``) and yield the link. A HOST
    that is a name is resolved, and every address it stands for is an ingress (see
    ``DialConfig``).

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
    link = RemoteLink(worker_id, max_inflight, tuple(models), ssl_context, config or DialConfig())
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
    """One attached ingress, as the worker sees it."""

    name: str
    _outbox: trio.MemorySendChannel[Message]
    outstanding: int = 0  # claims sent and not yet answered by an Assign or a Withdrawn
    withdrawing: int = 0  # claims asked back, not yet answered
    withdraws: deque[int] = attrs.field(factory=deque)
    held: dict[int, RemoteClaimed] = attrs.field(factory=dict)
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


@attrs.define(eq=False)
class RemoteLink:
    """A worker's attachment to every ingress it reaches (a ``RingLink``)."""

    worker_id: str
    max_inflight: int
    models: tuple[str, ...]
    _ssl_context: ssl.SSLContext
    _config: DialConfig = attrs.field(factory=DialConfig)
    _connections: list[_Connection] = attrs.field(init=False, factory=list)
    _wanted: int = attrs.field(init=False, default=0)  # claim() calls waiting
    _ready: deque[RemoteClaimed] = attrs.field(init=False, factory=deque)
    _changed: trio.lowlevel.ParkingLot = attrs.field(init=False, factory=trio.lowlevel.ParkingLot)
    _capacity: Heartbeat | None = attrs.field(init=False, default=None)
    _draining: bool = attrs.field(init=False, default=False)
    _closing: bool = attrs.field(init=False, default=False)

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

    async def claim(self) -> RemoteClaimed:
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
                claimed = self._ready.popleft()
                if not claimed.cancelled.is_set():
                    return claimed
                claimed._finish(Release(claimed.stream_id))  # acknowledges the cancel
        finally:
            self._wanted -= 1
            self._rebalance()

    def drain(self) -> None:
        """Stop claiming: every unfilled claim is withdrawn; held streams go on."""
        self._draining = True
        self._rebalance()
        self._changed.unpark_all()

    async def wait_idle(self) -> None:
        """Wait until no stream is held (after ``drain``, the moment to leave)."""
        while self.held:
            await self._changed.park()

    # -- claims over every ingress ---------------------------------------------------------------

    def _rebalance(self) -> None:
        """Offer each free slot to every ingress; take back what is no longer wanted."""
        while len(self._ready) > self._wanted:
            surplus = self._ready.pop()
            surplus._finish(Release(surplus.stream_id))
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
                    connection.send(Claim(count))
            elif effective > target:
                count = effective - target
                connection.withdrawing += count
                connection.withdraws.append(count)
                connection.send(Withdraw(count))

    def _assigned(self, connection: _Connection, message: Assign) -> None:
        connection.outstanding -= 1
        claimed = RemoteClaimed(
            self, connection, message.stream_id, message.head, message.body, message.credits
        )
        connection.held[message.stream_id] = claimed
        if len(self._ready) < self._wanted and not self._draining:
            self._ready.append(claimed)
            self._changed.unpark_all()
        else:
            claimed._finish(Release(message.stream_id))
        self._rebalance()

    def _withdrawn(self, connection: _Connection, message: Withdrawn) -> None:
        if not connection.withdraws:
            raise ProtocolError("Withdrawn without a Withdraw", message)
        connection.withdrawing -= connection.withdraws.popleft()
        connection.outstanding -= message.count
        self._rebalance()

    def _finished(self, connection: _Connection, stream_id: int) -> None:
        connection.held.pop(stream_id, None)
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
            connection = _Connection(name, send)
            connection.send(Attach(self.worker_id, self.max_inflight, models=self.models))
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
            case Credit(stream_id=stream_id, count=count):
                claimed = connection.held.get(stream_id)
                if claimed is not None:
                    claimed._credit(count)
            case Cancel(stream_id=stream_id):
                claimed = connection.held.get(stream_id)
                if claimed is not None:
                    claimed._cancel()
            case Detach(reason=reason):
                raise ControlRefusedError(f"the ingress sent us away: {reason}")
            case _:
                raise ProtocolError(f"an ingress may not send {type(message).__name__}", message)

    def _lose(self, connection: _Connection) -> None:
        """The connection ended: its streams are cancelled here (the ingress requeues or fails
        them), its claims are gone."""
        if connection in self._connections:
            self._connections.remove(connection)
        connection.close()
        self._ready = deque(c for c in self._ready if c._connection is not connection)
        for claimed in list(connection.held.values()):
            claimed._cancel()
            claimed._finished = True
        connection.held.clear()
        self._rebalance()
        self._changed.unpark_all()

    def _is_closing(self) -> bool:
        return self._closing

    def _close(self, reason: str) -> None:
        self._closing = True
        for connection in self._connections:
            connection.send(Detach(reason))
            connection.close()


@attrs.define(eq=False)
class RemoteClaimed:
    """A stream assigned by a remote ingress (a ``ClaimedStream``).

    ``send`` spends one of the stream's credits and waits, this stream only, while it has
    none. The ingress going away sets ``cancelled``.
    """

    _link: RemoteLink
    _connection: _Connection
    stream_id: int
    head: RequestHead
    body: bytes = attrs.field(repr=lambda body: f"<{len(body)} bytes>")
    _credits: int = 0
    cancelled: trio.Event = attrs.field(init=False, factory=trio.Event)
    _finished: bool = attrs.field(init=False, default=False)
    _wake: trio.Event = attrs.field(init=False, factory=trio.Event)

    async def send_head(
        self, status: int, headers: Iterable[tuple[str, str]] | Mapping[str, str] = ()
    ) -> None:
        """Send the status and headers. ``StreamCancelledError`` once the client is gone."""
        await trio.lowlevel.checkpoint_if_cancelled()
        self._check_open()
        self._connection.send(ResponseHead(self.stream_id, status, headers))
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def send(self, data: bytes) -> None:
        """Send a body chunk, waiting for a credit. ``StreamCancelledError`` once the client
        is gone, also while waiting."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while True:
            self._check_open()
            if self._credits > 0:
                break
            self._wake = trio.Event()
            await self._wake.wait()
        self._credits -= 1
        self._connection.send(ResponseData(self.stream_id, data))
        await trio.lowlevel.cancel_shielded_checkpoint()

    async def end(self, last: bytes = b"") -> None:
        """The response is complete; on a cancelled stream, acknowledges the cancel.

        ``last`` is a final body chunk, sent without waiting for a credit (the one chunk a
        worker may send past its credits, right before its end): a worker whose work is done
        frees its slot at once, however slowly its client reads; see docs/ring-protocol.md.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        if last and not self.cancelled.is_set():
            self._check_open()
            self._connection.send(ResponseData(self.stream_id, last))
        if self._finished:
            raise ProtocolError(f"stream {self.stream_id} is already finished")
        self._finish(ResponseEnd(self.stream_id))
        await trio.lowlevel.cancel_shielded_checkpoint()

    def fail(self, message: str) -> None:
        """The worker cannot finish: the client gets an error. Never blocks."""
        if not self._finished:
            self._finish(ResponseError(self.stream_id, message))

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
            raise ProtocolError(f"stream {self.stream_id} is already finished")

    def _finish(self, message: ResponseEnd | ResponseError | Release) -> None:
        self._finished = True
        self._connection.send(message)
        self._link._finished(self._connection, self.stream_id)

    def _credit(self, count: int) -> None:
        self._credits += count
        self._wake.set()

    def _cancel(self) -> None:
        self.cancelled.set()
        self._wake.set()
