"""The ingress's control listener: remote workers attach to the ring over mutual TLS.

One WebSocket (over TLS, client certificate required) per worker connection; each binary
WebSocket message carries whole frames. This module is the I/O shell: the TLS handshake, the
WebSocket, one reader and one writer per connection, and the clock. What the worker may do on
its connection (the ``Attach``, its claims, its credits, acknowledging a ``Cancel``, staying
heard) is the connection's ``SessionCore`` (``_session.py``); what the ring does with its
streams is ``RingCore``. The shell attaches each connection to the ring as a relayed worker
named after its certificate, and carries messages both ways as they are:

- what the worker sends goes through its session core to ``WorkerLink.post``: a body chunk
  lands in its client's buffer at once (its credits bound it), an end or error finishes the
  stream at once, so the worker's slot follows its work, however slowly its client reads;
- what the ring has for the worker (an ``Assign``, a ``Cancel``, a ``Credit`` for each chunk
  its client read, a ``Withdrawn``) comes through the link's relay and the session core;
- a session ends when the worker leaves, falls silent, breaks the protocol or the connection
  closes; leaving ``Ring.attach`` then detaches it, and the ring requeues what it held without
  a response head and fails the rest.
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

from ._errors import ProtocolError
from ._framing import FrameDecoder, encode, encode_available
from ._messages import Assign, Attach, Cancel, Credit, Message, Withdrawn
from ._ring import Ring, WorkerLink
from ._session import SessionClosed, SessionCore, SessionEffect, StreamLost, ToRing, ToWire
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
    core = SessionCore(
        f"{identity}#{next(_serial)}",
        opened=trio.current_time(),
        credits=config.credits,
        worker_timeout=config.worker_timeout,
        cancel_ack_timeout=config.cancel_ack_timeout,
    )
    decoder = FrameDecoder()
    while True:  # the handshake: an Attach, or a refusal
        with trio.move_on_at(core.deadline) as waiting:
            first = await _receive(ws, decoder)
        if not waiting.cancelled_caught:
            if first is None:
                logger.warning(
                    "worker %s from %s closed the connection unattached", identity, where
                )
                return
            effects = core.receive(first, trio.current_time())
            break
        if effects := core.expire(trio.current_time()):
            break
    match effects:
        case [ToRing(message=Attach() as attach)]:
            pass
        case [*_, SessionClosed(reason=reason)]:
            logger.warning("refused worker %s from %s: %s", identity, where, reason)
            with trio.move_on_after(1):
                for effect in effects:
                    if isinstance(effect, ToWire):
                        await ws.send_message(encode(effect.message))
                await ws.aclose(1008, reason[:120])
            return
    assert isinstance(first, Attach)
    worker_id = attach.worker_id
    logger.info(
        "worker %s attached from %s (max_inflight %d, models %s; it calls itself %r)",
        worker_id,
        where,
        attach.max_inflight,
        ", ".join(attach.models) or "-",
        first.worker_id,
    )
    reason = "the connection closed"
    session = _Session(core, ws)
    async with ring.attach(
        worker_id,
        attach.max_inflight,
        models=attach.models,
        kinds=attach.kinds,
        vision=attach.vision,
        contexts=attach.contexts,
        audio=attach.audio,
        relay=session.relay,
    ) as link:
        try:
            reason = await session.run(link, decoder)
        except* trio.Cancelled:
            # The listener is closing (the ingress shuts down): tell the worker why, so that
            # it knows why (it reattaches by itself once the ingress is back).
            reason = "the ingress is shutting down"
            session.apply(core.close(reason))
            with trio.move_on_after(1, shield=True), contextlib.suppress(ConnectionClosed):
                await session.flush()
            raise
        finally:
            logger.info("worker %s detached: %s", worker_id, reason)


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


@attrs.define(eq=False)
class _Session:
    """The I/O shell of one worker connection: feeds its ``SessionCore`` what the worker
    sends, what the ring has for the worker (``relay``) and the time, and carries out the
    effects: messages onto the wire (through one writer task) or into the ring as they are."""

    _core: SessionCore
    _ws: WebSocketConnection
    _link: WorkerLink | None = None
    _send: trio.MemorySendChannel[Message] = attrs.field(init=False)
    _sending: trio.MemoryReceiveChannel[Message] = attrs.field(init=False)
    _reading: trio.CancelScope = attrs.field(init=False, factory=trio.CancelScope)

    def __attrs_post_init__(self) -> None:
        # Unbounded: what goes out is bounded by the worker's claims and its streams' credits.
        self._send, self._sending = trio.open_memory_channel[Message](math.inf)

    def relay(self, message: Assign | Cancel | Credit | Withdrawn) -> None:
        """The ring's messages for the worker (``Ring.attach``'s relay)."""
        self.apply(self._core.from_ring(message, trio.current_time()))

    def apply(self, effects: list[SessionEffect]) -> str | None:
        """Carry out the core's effects; returns the reason when the session is over."""
        for effect in effects:
            match effect:
                case ToWire(message=message):
                    self._send.send_nowait(message)
                case ToRing(message=message):
                    assert self._link is not None, "attached before anything goes to the ring"
                    self._link.post(message)
                case StreamLost(stream_id=stream_id):
                    logger.warning(
                        "worker %s did not acknowledge the cancel of stream %d within %gs; "
                        "dropping it",
                        self._core.worker_id,
                        stream_id,
                        self._core.cancel_ack_timeout,
                    )
                case SessionClosed(reason=reason, fault=fault):
                    if fault:
                        logger.warning("worker %s: %s", self._core.worker_id, reason)
                    return reason
        self._reading.deadline = self._core.deadline
        return None

    async def run(self, link: WorkerLink, decoder: FrameDecoder) -> str:
        """Serve until the worker leaves, dies or misbehaves; returns why it ended."""
        self._link = link
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._write)
                reason = await self._read(decoder)
                nursery.cancel_scope.cancel()
        except* ProtocolError as group:
            reason = f"protocol error: {group.exceptions[0]}"
            logger.warning("worker %s broke the protocol: %s", self._core.worker_id, reason)
            self.apply(self._core.close(reason))
            with trio.move_on_after(1, shield=True), contextlib.suppress(ConnectionClosed):
                await self.flush()
        return reason

    async def flush(self) -> None:
        """Write what is waiting to go out (the writer task is gone by then)."""
        with contextlib.suppress(trio.WouldBlock):
            await self._ws.send_message(
                encode_available(self._sending.receive_nowait(), self._sending)
            )

    async def _write(self) -> None:
        async for message in self._sending:
            try:
                await self._ws.send_message(encode_available(message, self._sending))
            except ConnectionClosed:
                return  # the reader sees the close too, and ends the session

    async def _read(self, decoder: FrameDecoder) -> str:
        core = self._core
        while True:
            self._reading = trio.CancelScope(deadline=core.deadline)
            with self._reading:
                message = await _receive(self._ws, decoder)
            if self._reading.cancelled_caught:
                effects = core.expire(trio.current_time())
            elif message is None:
                return "the connection closed"
            else:
                effects = core.receive(message, trio.current_time())
            reason = self.apply(effects)
            if reason is not None:
                return reason
