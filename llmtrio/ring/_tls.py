"""Mutual TLS for the control channel, and WebSocket handshakes that fail fast and say why.

Two facts shape this module. trio-websocket's client waits for its opening handshake forever
(or for ``connect_timeout``, 60 s) when the TLS stream breaks under it, since its reader task
swallows the error. And under TLS 1.3 a client learns that the server refused its certificate
only at its first read after the handshake (and trio's server closes without sending its alert).
So each side does the TLS handshake itself, the server logs the exact reason, and the client
watches its stream's first reads: an alert or an end of stream there ends the WebSocket
handshake at once with a ``ControlRefusedError`` that says so.
"""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import cast

import attrs
import trio
from trio_websocket import HandshakeError, WebSocketConnection, WebSocketRequest
from trio_websocket import wrap_client_stream as _wrap_client_stream
from trio_websocket import wrap_server_stream as _wrap_server_stream

from ._errors import ControlRefusedError

__all__ = ["client_ssl_context", "server_ssl_context"]

CONTROL_PATH = "/ring"


def server_ssl_context(cert: Path, key: Path, ca: Path) -> ssl.SSLContext:
    """The ingress's context: its own certificate, and client certificates required and
    verified against ``ca`` (the workers' CA)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(ca))
    context.load_cert_chain(str(cert), str(key))
    context.verify_mode = ssl.CERT_REQUIRED
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def client_ssl_context(cert: Path | None, key: Path | None, ca: Path) -> ssl.SSLContext:
    """The worker's context: the ingress is verified against ``ca`` (the ingresses' CA,
    hostname checked), and the worker shows ``cert`` (without one, every ingress refuses)."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    if cert is not None:
        context.load_cert_chain(str(cert), None if key is None else str(key))
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def describe_tls_error(exc: BaseException) -> str:
    """The reason inside a broken TLS stream (``ssl.SSLError``'s text, not trio's wrapper)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ssl.SSLError):
            return str(current)
        if isinstance(current, OSError):
            return str(current)
        current = current.__cause__ or current.__context__
    return str(exc) or type(exc).__name__


def _is_reset(exc: BaseException) -> bool:
    """Whether ``exc`` is (or was caused by) the peer resetting the connection."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, ConnectionResetError):
            return True
        current = current.__cause__ or current.__context__
    return False


def peer_identity(stream: trio.SSLStream[trio.SocketStream]) -> str:
    """The peer's name from its verified certificate: its first DNS name, else its CN."""
    cert = stream.getpeercert()
    if not cert:
        return "unknown"
    for kind, value in cert.get("subjectAltName", ()):
        if kind == "DNS":
            return str(value)
    for rdn in cert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return "unknown"


async def accept_control_websocket(
    nursery: trio.Nursery, stream: trio.SSLStream[trio.SocketStream]
) -> WebSocketConnection:
    """Server side, after the TLS handshake: accept the WebSocket on ``CONTROL_PATH``."""
    request: WebSocketRequest = await _wrap_server_stream(nursery, stream)
    if request.path != CONTROL_PATH:
        await request.reject(404, body=f"the control channel is at {CONTROL_PATH}".encode())
        raise ControlRefusedError(f"a client asked for {request.path!r}")
    return await request.accept()


@attrs.define(eq=False)
class _WatchedStream(trio.abc.Stream):
    """Passes everything through, and remembers the error that broke a read."""

    _stream: trio.SSLStream[trio.SocketStream]
    broken: trio.Event = attrs.field(factory=trio.Event)
    error: BaseException | None = None

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        try:
            data = await self._stream.receive_some(max_bytes)
        except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
            self.error = exc
            self.broken.set()
            raise
        if not data:
            self.broken.set()
        return data

    async def aclose(self) -> None:
        await self._stream.aclose()


async def open_control_websocket(
    nursery: trio.Nursery,
    host: str,
    port: int,
    context: ssl.SSLContext,
    *,
    limit_s: float,
    server_hostname: str | None = None,
) -> WebSocketConnection:
    """Connect to an ingress's control listener: TCP, TLS, then the WebSocket handshake,
    all within ``limit_s`` seconds. The connection's reader task runs in ``nursery``.
    ``server_hostname`` is the name the ingress's certificate must carry (and the WebSocket's
    ``Host``), when ``host`` is one of the addresses that name resolves to.

    Error handling: ``ControlRefusedError`` naming the cause when the TLS handshake fails
    (the ingress's certificate is not from our CA), when the ingress refuses our certificate
    (seen at the first read), or when the WebSocket handshake fails or times out; ``OSError``
    when nothing listens.
    """
    name = server_hostname or host
    with trio.move_on_after(limit_s) as scope:
        tcp = await trio.open_tcp_stream(host, port)
        tls = trio.SSLStream(tcp, context, server_hostname=name, https_compatible=True)
        try:
            await tls.do_handshake()
        except trio.BrokenResourceError as exc:
            await trio.aclose_forcefully(tls)
            raise ControlRefusedError(
                f"TLS handshake with {host}:{port} failed: {describe_tls_error(exc)}"
            ) from exc
        watched = _WatchedStream(tls)
        connection: WebSocketConnection | None = None
        async with trio.open_nursery() as race:

            async def handshake() -> None:
                nonlocal connection
                try:
                    connection = await _wrap_client_stream(
                        nursery,
                        cast(trio.SSLStream[trio.SocketStream], watched),
                        name,
                        CONTROL_PATH,
                    )
                except HandshakeError as exc:
                    raise ControlRefusedError(
                        f"{host}:{port} refused the WebSocket: {exc!r}"
                    ) from exc
                race.cancel_scope.cancel()

            async def watch() -> None:
                await watched.broken.wait()
                race.cancel_scope.cancel()

            race.start_soon(handshake)
            race.start_soon(watch)
        if connection is not None:
            return connection
        await trio.aclose_forcefully(tls)
        why = (
            # The ingress checks our certificate after our side of the handshake is done,
            # and trio closes without sending its alert: this is the only way to refuse.
            # When our WebSocket request is still unread in its socket as it closes, the
            # kernel sends a reset instead of the close: the same refusal.
            "it closed the connection after the TLS handshake, refusing this worker's "
            "certificate (none given, or not from a CA it trusts; its log says which)"
            if watched.error is None or _is_reset(watched.error)
            else describe_tls_error(watched.error)
        )
        raise ControlRefusedError(f"{host}:{port} refused the connection: {why}")
    assert scope.cancelled_caught
    raise ControlRefusedError(f"no control handshake with {host}:{port} within {limit_s:g}s")
