"""The ingress's control listener: remote workers attach to the ring over mutual TLS.

One WebSocket (over TLS, client certificate required) per worker connection, one frame per
WebSocket message. Each connection is attached to the ring as a worker named after its
certificate, and its session relays between the wire and the in-process ``WorkerLink``:

- a ``Claim`` starts a claim on the link per slot; an ``Assign`` goes out when it is filled;
  ``Withdraw`` takes back claims not yet filled and is answered by ``Withdrawn``;
- each assigned stream has its own task and inbox: response messages are written to the
  client's lane in order, and every body chunk the client's buffer takes is answered with a
  ``Credit``, so a slow client holds back its own stream only (a worker that sends beyond its
  credits is cut off);
- the client going away sends ``Cancel``; a worker that does not acknowledge within
  ``cancel_ack_timeout`` loses the stream (it is acknowledged here, later messages for it are
  dropped) and nothing else waits;
- a worker silent for ``worker_timeout`` seconds is declared dead; a dead, disconnected or
  misbehaving worker is detached, and the ring requeues what it held without a response head.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import ssl
from functools import partial

import attrs
import trio
from trio_websocket import ConnectionClosed, WebSocketConnection

from ._errors import ProtocolError, StreamCancelledError
from ._framing import FrameDecoder, encode, encode_available
from ._messages import (
    PROTOCOL_VERSION,
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
    ResponseMessage,
    Withdraw,
    Withdrawn,
)
from ._ring import Claimed, Ring, WorkerLink
from ._tls import accept_control_websocket, describe_tls_error, peer_identity

__all__ = ["ControlConfig", "serve_control"]

logger = logging.getLogger("llmtrio.ring.control")


@attrs.frozen
class ControlConfig:
    """Where the control listener listens and how it judges workers.

    ``ssl_context`` must require client certificates (``server_ssl_context``).
    ``worker_timeout``: seconds without any message before a worker is declared dead.
    ``cancel_ack_timeout``: seconds a worker has to acknowledge a ``Cancel``.
    ``credits``: body chunks a worker may send on one stream ahead of its client.
    """

    ssl_context: ssl.SSLContext
    host: str = "127.0.0.1"
    port: int = 9443
    worker_timeout: float = 10.0
    cancel_ack_timeout: float = 5.0
    handshake_timeout: float = 5.0
    credits: int = 16

    def __attrs_post_init__(self) -> None:
        for name in ("worker_timeout", "cancel_ack_timeout", "handshake_timeout"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive")
        if self.credits < 1:
            raise ValueError("credits must be at least 1")


_serial = itertools.count(1)


async def serve_control(
    ring: Ring,
    config: ControlConfig,
    *,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Accept remote workers onto ``ring`` until cancelled; ``task_status.started`` gets the
    address workers use (``wss://HOST:PORT``, the real port when ``config.port`` is 0).

    Resource handling: cancelling this sends every worker ``Detach`` and closes its
    connection, which detaches the workers (their unanswered streams are requeued or failed
    by the ring).
    """
    listeners = await trio.open_tcp_listeners(config.port, host=config.host)
    port = listeners[0].socket.getsockname()[1]
    host = f"[{config.host}]" if ":" in config.host else config.host
    address = f"wss://{host}:{port}"
    logger.info("control listener for workers on %s", address)
    async with trio.open_nursery() as nursery:
        task_status.started(address)
        await trio.serve_listeners(
            partial(_connection, ring, config), listeners, handler_nursery=nursery
        )


async def _connection(ring: Ring, config: ControlConfig, tcp: trio.SocketStream) -> None:
    """One worker connection, from the TLS handshake to the detach. Never raises: whatever
    ends the connection is logged and ends this connection only."""
    try:
        peer = tcp.socket.getpeername()
        where = f"{peer[0]}:{peer[1]}"
    except OSError:
        where = "?"
    tls = trio.SSLStream(tcp, config.ssl_context, server_side=True)
    try:
        with trio.fail_after(config.handshake_timeout):
            await tls.do_handshake()
    except (trio.BrokenResourceError, trio.TooSlowError) as exc:
        reason = (
            describe_tls_error(exc)
            if isinstance(exc, trio.BrokenResourceError)
            else (f"no TLS handshake within {config.handshake_timeout:g}s")
        )
        logger.warning("refused a worker from %s: %s", where, reason)
        await trio.aclose_forcefully(tls)
        return
    identity = peer_identity(tls)
    try:
        async with trio.open_nursery() as nursery:
            with trio.fail_after(config.handshake_timeout):
                ws = await accept_control_websocket(nursery, tls)
            try:
                await _serve_worker(ring, config, ws, identity, where)
            finally:
                with trio.move_on_after(1, shield=True):
                    await ws.aclose()
                nursery.cancel_scope.cancel()
    except Exception as exc:
        logger.warning("worker %s from %s: connection ended: %r", identity, where, exc)


async def _serve_worker(
    ring: Ring, config: ControlConfig, ws: WebSocketConnection, identity: str, where: str
) -> None:
    decoder = FrameDecoder()
    with trio.move_on_after(config.worker_timeout) as scope:
        first = await _receive(ws, decoder)
    if scope.cancelled_caught or first is None:
        logger.warning("worker %s from %s sent no Attach; closing", identity, where)
        return
    if not isinstance(first, Attach):
        await _refuse(ws, identity, where, f"the first message must be Attach, not {first!r}")
        return
    if first.version != PROTOCOL_VERSION:
        await _refuse(
            ws,
            identity,
            where,
            f"incompatible protocol version {first.version}: this ingress speaks version "
            f"{PROTOCOL_VERSION}",
        )
        return
    worker_id = f"{identity}#{next(_serial)}"
    logger.info(
        "worker %s attached from %s (max_inflight %d, models %s; it calls itself %r)",
        worker_id,
        where,
        first.max_inflight,
        ", ".join(first.models) or "-",
        first.worker_id,
    )
    reason = "the connection closed"
    async with ring.attach(worker_id, first.max_inflight, models=first.models) as link:
        session = _Session(link, ws, config, worker_id)
        try:
            reason = await session.run(decoder)
        except* trio.Cancelled:
            # The listener is closing (the ingress shuts down): tell the worker why, so that
            # it knows why (it reattaches by itself once the ingress is back).
            reason = "the ingress is shutting down"
            with trio.move_on_after(1, shield=True), contextlib.suppress(ConnectionClosed):
                await ws.send_message(encode(Detach(reason)))
            raise
        finally:
            logger.info("worker %s detached: %s", worker_id, reason)


async def _refuse(ws: WebSocketConnection, identity: str, where: str, reason: str) -> None:
    logger.warning("refused worker %s from %s: %s", identity, where, reason)
    with trio.move_on_after(1):
        await ws.send_message(encode(Detach(reason)))
        await ws.aclose(1008, reason[:120])


async def _receive(ws: WebSocketConnection, decoder: FrameDecoder) -> Message | None:
    """The next message; ``None`` when the connection closed."""
    while (message := decoder.next_message()) is None:
        try:
            data = await ws.get_message()
        except ConnectionClosed:
            return None
        if isinstance(data, str):
            raise ProtocolError("the control channel carries binary frames, not text")
        decoder.receive_data(data)
    return message


class _WorkerGone(Exception):
    """The session ends: the reason is the message."""


@attrs.define(eq=False)
class _Stream:
    claimed: Claimed
    inbox: trio.MemorySendChannel[ResponseMessage]
    outbox: trio.MemoryReceiveChannel[ResponseMessage]
    scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    ending: bool = False  # its end or error arrived and is being relayed
    ended: trio.Event = attrs.field(factory=trio.Event)  # set with ``ending``


@attrs.define(eq=False)
class _Session:
    """Relays between one worker connection and its ``WorkerLink``."""

    _link: WorkerLink
    _ws: WebSocketConnection
    _config: ControlConfig
    _worker_id: str
    _send: trio.MemorySendChannel[Message] = attrs.field(init=False)
    _sending: trio.MemoryReceiveChannel[Message] = attrs.field(init=False)
    _waiting: dict[int, trio.CancelScope] = attrs.field(init=False, factory=dict)  # claims
    _streams: dict[int, _Stream] = attrs.field(init=False, factory=dict)
    _lost: set[int] = attrs.field(init=False, factory=set)  # cancels not acknowledged in time
    _keys: itertools.count[int] = attrs.field(init=False, factory=itertools.count)
    _in_core: int = attrs.field(init=False, default=0)  # claims waiting in the ring
    _relaying: int = attrs.field(init=False, default=0)  # streams whose end is not relayed
    _room: trio.lowlevel.ParkingLot = attrs.field(init=False, factory=trio.lowlevel.ParkingLot)
    _ending: int = attrs.field(init=False, default=0)  # streams relaying their last messages
    _ended: trio.lowlevel.ParkingLot = attrs.field(init=False, factory=trio.lowlevel.ParkingLot)
    _nursery: trio.Nursery | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        # Unbounded: what goes out is bounded by the worker's claims and its streams' credits.
        self._send, self._sending = trio.open_memory_channel[Message](math.inf)

    async def run(self, decoder: FrameDecoder) -> str:
        """Serve until the worker leaves, dies or misbehaves; returns why it ended."""
        reason = "the connection closed"
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._write)
                try:
                    await self._read(decoder)
                except _WorkerGone as exc:
                    reason = str(exc)
                # Responses the worker finished before it left still reach their clients.
                with trio.move_on_after(self._config.worker_timeout):
                    while self._ending:
                        await self._ended.park()
                nursery.cancel_scope.cancel()
        except* _WorkerGone as group:
            reason = str(group.exceptions[0])
        except* ProtocolError as group:
            reason = f"protocol error: {group.exceptions[0]}"
            logger.warning("worker %s broke the protocol: %s", self._worker_id, reason)
            with trio.move_on_after(1, shield=True):
                await self._ws.send_message(encode(Detach(reason)))
        return reason

    async def _write(self) -> None:
        async for message in self._sending:
            try:
                await self._ws.send_message(encode_available(message, self._sending))
            except ConnectionClosed:
                return  # the reader sees the close too, and ends the session

    async def _read(self, decoder: FrameDecoder) -> None:
        timeout = self._config.worker_timeout
        while True:
            with trio.move_on_after(timeout) as scope:
                message = await _receive(self._ws, decoder)
            if scope.cancelled_caught:
                logger.warning("worker %s silent for %gs: declared dead", self._worker_id, timeout)
                raise _WorkerGone(f"silent for {timeout:g}s: declared dead")
            if message is None:
                raise _WorkerGone("the connection closed")
            self._handle(message)

    def _handle(self, message: Message) -> None:
        assert self._nursery is not None
        match message:
            case Heartbeat():
                self._link.heartbeat(message)
            case Claim(count=count):
                if len(self._waiting) + count > self._link.max_inflight:
                    raise ProtocolError(
                        f"the worker claims {count} more slots with {len(self._waiting)} "
                        f"unfilled, beyond its max_inflight of {self._link.max_inflight}",
                        message,
                    )
                for _ in range(count):
                    key = next(self._keys)
                    self._waiting[key] = trio.CancelScope()
                    self._nursery.start_soon(self._claim, key)
            case Withdraw(count=count):
                taken = 0
                for key in list(self._waiting)[-count:]:
                    self._waiting.pop(key).cancel()
                    taken += 1
                self._send.send_nowait(Withdrawn(taken))
            case Release(stream_id=stream_id):
                stream = self._streams.pop(stream_id, None)
                if stream is None:
                    self._unknown(stream_id, message)
                    return
                stream.scope.cancel()
                stream.claimed.release()
            case ResponseHead() | ResponseData() | ResponseEnd() | ResponseError():
                stream = self._streams.get(message.stream_id)
                if stream is None:
                    self._unknown(message.stream_id, message)
                    return
                try:
                    stream.inbox.send_nowait(message)
                except trio.WouldBlock:
                    raise ProtocolError(
                        f"the worker sent beyond its credits on stream {message.stream_id}",
                        message,
                    ) from None
                if isinstance(message, ResponseEnd | ResponseError):
                    del self._streams[message.stream_id]
                    stream.inbox.close()
                    stream.ending = True
                    stream.ended.set()
                    self._ending += 1
            case Detach(reason=reason):
                raise _WorkerGone(f"the worker left: {reason}" if reason else "the worker left")
            case _:
                raise ProtocolError(f"a worker may not send {type(message).__name__}", message)

    def _unknown(self, stream_id: int, message: Message) -> None:
        if stream_id in self._lost:
            return  # a late answer on a stream whose Cancel was not acknowledged in time
        raise ProtocolError(f"the worker does not hold stream {stream_id}", message)

    async def _claim(self, key: int) -> None:
        """One slot the worker claimed: wait for a stream, send its ``Assign``, relay it.

        The ring counts a stream against the worker until its end is relayed, which may be
        after the worker sent it (the client still reading) and after the worker claimed the
        freed slot again: such a claim waits here for the room, it is not an error.
        """
        scope = self._waiting.get(key)
        if scope is None:
            return  # withdrawn before it started
        claimed: Claimed | None = None
        with scope:
            while self._in_core + self._relaying >= self._link.max_inflight:
                await self._room.park()
            self._in_core += 1
            try:
                claimed = await self._link.claim()
            finally:
                self._in_core -= 1
        self._waiting.pop(key, None)
        if claimed is None:
            return
        if scope.cancel_called:  # withdrawn as the stream arrived: not counted as assigned
            claimed.release()
            self._room.unpark_all()
            return
        self._relaying += 1
        # The head, the credited chunks, one last chunk past the credits, and the end.
        inbox, outbox = trio.open_memory_channel[ResponseMessage](self._config.credits + 3)
        stream = _Stream(claimed, inbox, outbox)
        try:
            self._streams[claimed.stream_id] = stream
            self._send.send_nowait(
                Assign(claimed.stream_id, claimed.head, claimed.body, credits=self._config.credits)
            )
            await self._pump(stream)
        finally:
            self._relaying -= 1
            self._room.unpark_all()
            if stream.ending:
                self._ending -= 1
                self._ended.unpark_all()

    async def _pump(self, stream: _Stream) -> None:
        """Write one stream's response messages to its client's lane, in order, waiting on
        the client while the worker is still producing; once the worker's end (or error) has
        arrived, what is left is handed over at once, so the stream stops counting against
        the worker however slowly its client reads."""
        pending: ResponseMessage | None = None
        with stream.scope:  # cancelled when the stream is released or lost
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_cancel, stream)
                with trio.CancelScope() as relaying:

                    async def stop_waiting_at_the_end() -> None:
                        await stream.ended.wait()
                        relaying.cancel()

                    nursery.start_soon(stop_waiting_at_the_end)
                    async for message in stream.outbox:
                        pending = message  # a relay cancelled here delivered nothing
                        # The client may leave meanwhile: the worker is being told.
                        with contextlib.suppress(StreamCancelledError):
                            await self._relay(stream.claimed, message)
                        pending = None
                left = [] if pending is None else [pending]
                with contextlib.suppress(trio.WouldBlock, trio.EndOfChannel):
                    while True:
                        left.append(stream.outbox.receive_nowait())
                if left:
                    with contextlib.suppress(StreamCancelledError):
                        await self._flush(stream.claimed, left)
                nursery.cancel_scope.cancel()

    async def _flush(self, claimed: Claimed, messages: list[ResponseMessage]) -> None:
        """Relay a finished stream's last messages without waiting on its client: its
        chunks go out as one last chunk with the end."""
        data = b"".join(m.data for m in messages if isinstance(m, ResponseData))
        for message in messages:
            match message:
                case ResponseHead():
                    await self._relay(claimed, message)
                case ResponseEnd():
                    if claimed.cancelled.is_set():
                        await claimed.end()
                    else:
                        await claimed.end(data)
                case ResponseError(message=text):
                    claimed.fail(text)

    async def _relay(self, claimed: Claimed, message: ResponseMessage) -> None:
        stream_id = claimed.stream_id
        match message:
            case ResponseHead(status=status, headers=headers):
                if not claimed.cancelled.is_set():
                    # Which worker served it, by its certificate: for logs and debugging.
                    await claimed.send_head(
                        status, (*headers, ("x-llmtrio-worker", self._worker_id))
                    )
            case ResponseData(data=data):
                if claimed.cancelled.is_set():
                    return
                try:
                    await claimed.send(data)
                except StreamCancelledError:
                    return
                self._send.send_nowait(Credit(stream_id, 1))
            case ResponseEnd():
                await claimed.end()
            case ResponseError(message=text):
                claimed.fail(text)

    async def _watch_cancel(self, stream: _Stream) -> None:
        claimed = stream.claimed
        await claimed.cancelled.wait()
        self._send.send_nowait(Cancel(claimed.stream_id))
        await trio.sleep(self._config.cancel_ack_timeout)
        # No acknowledgement in time: the stream is lost to this worker; acknowledge it here.
        logger.warning(
            "worker %s did not acknowledge the cancel of stream %d within %gs; dropping it",
            self._worker_id,
            claimed.stream_id,
            self._config.cancel_ack_timeout,
        )
        self._lost.add(claimed.stream_id)
        self._streams.pop(claimed.stream_id, None)
        claimed.fail("the worker did not acknowledge the cancel")
        stream.scope.cancel()
