"""The ingress's HTTP server: the app on hypercorn, over TLS or on loopback.

Hypercorn's own ``serve`` writes to a client with no time limit (its writes are shielded), so
a client that stops reading would hold its connection, its request and its stream forever.
This module runs hypercorn's connection handler over streams whose ``send_all`` gives up
after ``send_timeout`` seconds without progress: the connection is then closed, the app sees
the client's disconnect, and the request's stream and generation are cancelled.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
from collections.abc import Iterable
from functools import partial
from pathlib import Path
from typing import Any

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio.lifespan import Lifespan
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from hypercorn.utils import repr_socket_addr, wrap_app
from prometheus_client import CollectorRegistry

from ..api import DEFAULT_MAX_BODY_BYTES, RequestLimits
from ..ring import MAX_FRAME_SIZE, Ring, RingConfig
from ._app import create_app
from ._auth import ApiKeys
from ._checks import Gate
from ._drain import Drain
from ._guard import OriginPolicy
from ._metrics import IngressMetrics

__all__ = ["ServeConfig", "serve_ingress"]

logger = logging.getLogger("llmtrio.serve")

#: What a request's head (path, headers, ids) may take of a frame beside its body.
_FRAME_ROOM = 1 << 20

#: Seconds the connections get, once the drain is over, to send their last bytes.
_CLOSE_S = 2.0


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _strings(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


@attrs.frozen
class ServeConfig:
    """Where and how to listen. Without ``tls_cert``/``tls_key`` only a loopback ``host`` is
    allowed (plain HTTP); ``port=None`` means 8443 with TLS, 8080 without; 0 picks a free one.
    ``graceful_timeout`` is how long in-flight streams may run on after a shutdown signal.
    ``send_timeout`` is how long a client may take nothing before it is disconnected.
    ``allowed_origins`` are the web origins (besides this server's own and loopback ones)
    whose pages may call the API; ``*`` allows all. ``ring`` is the settings of the ring the
    ingress parks requests on (how many, and for how long).

    Guards (see :class:`~llmtrio.web.Gate`): ``api_keys`` asked of the API and
    ``/metrics``; ``rate_limit`` completion requests per key (or client address) per
    minute; ``request_timeout`` seconds per completion request, arrival to last byte;
    ``body_timeout`` seconds for its body to arrive. ``idle_timeout`` is how long a
    connection may sit without a request in flight, which bounds the wait for a request's
    headers too (hypercorn's ``keep_alive_timeout``: its idle timer runs until a request's
    headers are complete).

    Error handling: ``ValueError`` naming the field (``tls_cert``, ``send_timeout``, ...) for
    a value out of range or a combination refused."""

    host: str = "127.0.0.1"
    port: int | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    ring: RingConfig = attrs.field(factory=RingConfig)
    graceful_timeout: float = 10.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: The largest body of a request that holds an image part (base64 images are larger than
    #: any text); below the ring's frame limit, which a request's body crosses whole.
    max_image_body_bytes: int = 12 * 2**20
    #: The largest body of a request that holds an audio part, or of a transcription's form
    #: (an audio file); below the ring's frame limit, as the image one.
    max_audio_body_bytes: int = 15 * 2**20
    send_timeout: float = 60.0
    #: The kernel's send buffer per connection (SO_SNDBUF): what a client that stopped
    #: reading can still be sent before the send timeout starts to count.
    send_buffer: int = 64 * 1024
    allowed_origins: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    api_keys: tuple[str, ...] = attrs.field(default=(), converter=_strings, repr=False)
    rate_limit: int | None = None
    request_timeout: float | None = 600.0
    body_timeout: float = 60.0
    idle_timeout: float = 5.0
    default_model: str | None = None
    """Where a request naming an unknown model, or none, goes (``--default-model``; ``llmtrio
    serve`` with one ``--model`` sets it to that model's name)."""

    def __attrs_post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("give both tls_cert and tls_key, or neither")
        if self.tls_cert is None and not _is_loopback(self.host):
            raise ValueError(
                f"refusing plain HTTP on {self.host}: without tls_cert/tls_key llmtrio "
                "serves on loopback only"
            )
        if self.max_body_bytes < 1:
            raise ValueError("max_body_bytes must be at least 1")
        for name in ("max_image_body_bytes", "max_audio_body_bytes"):
            if not 0 <= getattr(self, name) <= MAX_FRAME_SIZE - _FRAME_ROOM:
                raise ValueError(
                    f"{name} must be between 0 and {MAX_FRAME_SIZE - _FRAME_ROOM} (the ring's "
                    "frame limit, less room for the request's head)"
                )
        if self.rate_limit is not None and self.rate_limit < 1:
            raise ValueError("rate_limit must be at least 1")
        if self.request_timeout is not None and not self.request_timeout > 0:
            raise ValueError("request_timeout must be more than 0")
        for name in ("send_timeout", "body_timeout", "idle_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be more than 0")

    def gate(self) -> Gate:
        return Gate(
            keys=ApiKeys(self.api_keys),
            rate_limit=self.rate_limit,
            request_timeout=self.request_timeout,
            body_timeout=self.body_timeout,
        )

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def bind(self) -> str:
        port = self.port if self.port is not None else (8443 if self.tls else 8080)
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{port}"


async def serve_ingress(
    ring: Ring,
    config: ServeConfig,
    *,
    model_name: str,
    shutdown: trio.Event,
    registry: CollectorRegistry | None = None,
    limits: RequestLimits | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the OpenAI API in front of ``ring`` until ``shutdown`` is set;
    ``task_status.started`` gets the bound addresses (``http://127.0.0.1:PORT``).
    ``GET /metrics`` shows ``registry`` (a new one unless given), with the ingress's own
    metrics added to it; ``/openapi.json`` states the workers' request ``limits``.

    Resource handling: after ``shutdown`` the ingress drains: new ring requests are refused
    with 503 (``shutting_down``, with ``Retry-After``) and ``/health`` answers 503
    ``draining``, while the requests already in (parked or running) get
    ``config.graceful_timeout`` seconds to finish; those still running then end with a
    ``shutting_down`` error (which cancels their streams on the ring), and the server closes.
    A client that takes nothing for ``config.send_timeout`` seconds is disconnected.
    """
    policy = OriginPolicy(
        config.allowed_origins, loopback_listener=_is_loopback(config.host), bound_host=config.host
    )
    drain = Drain()
    app = create_app(
        ring,
        model_name=model_name,
        max_body_bytes=config.max_body_bytes,
        image_body_bytes=config.max_image_body_bytes,
        audio_body_bytes=config.max_audio_body_bytes,
        policy=policy,
        gate=config.gate(),
        metrics=IngressMetrics(ring, registry),
        drain=drain,
        limits=limits,
        default_model=config.default_model,
    )
    hypercorn = HypercornConfig()
    hypercorn.bind = [config.bind()]
    hypercorn.graceful_timeout = config.graceful_timeout
    hypercorn.keep_alive_timeout = config.idle_timeout
    # No read_timeout: hypercorn applies it to every read, also while a long response
    # streams to a client that has nothing more to send, which would cut it.
    hypercorn.accesslog = None
    hypercorn.errorlog = logging.getLogger("hypercorn.error")
    if config.tls_cert is not None and config.tls_key is not None:
        hypercorn.certfile = str(config.tls_cert)
        hypercorn.keyfile = str(config.tls_key)
    else:
        logger.warning(
            "serving plain HTTP on %s (loopback only); give --tls-cert and --tls-key for HTTPS",
            config.host,
        )
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            partial(
                _serve_hypercorn,
                app,
                hypercorn,
                send_timeout=config.send_timeout,
                send_buffer=config.send_buffer,
                shutdown=shutdown,
                drain=drain,
            )
        )
        logger.info("serving %s on %s", model_name, ", ".join(binds))
        task_status.started(binds)


async def _serve_hypercorn(
    app: Any,
    config: HypercornConfig,
    *,
    send_timeout: float,
    send_buffer: int,
    shutdown: trio.Event,
    drain: Drain,
    task_status: trio.TaskStatus[list[str]],
) -> None:
    """Hypercorn's ``worker_serve`` for HTTP/1.1 and HTTP/2 over TCP (with TLS when the
    config has a certificate), each connection's stream wrapped by :class:`_ConnectionStream`
    and its kernel send buffer capped at ``send_buffer`` bytes (Linux autotunes it up to
    megabytes, which would hide a client that stops reading for as long).

    The shutdown follows hypercorn's ``trio/run.py`` (a trigger, then a deadline on the
    connections), with a drain before it: after ``shutdown`` the listeners go on accepting,
    so that new requests get their 503 rather than a refused connection, until the ring
    requests in ``drain`` finished or ``graceful_timeout`` passed; then ``drain`` is cut,
    the listeners close, and the connections get ``_CLOSE_S`` to say goodbye."""
    asgi = wrap_app(app, config.wsgi_max_body_size, "asgi")
    state: dict[str, Any] = {}
    lifespan = Lifespan(asgi, config, state)
    context = WorkerContext(None)
    async with trio.open_nursery() as lifespan_nursery:
        await lifespan_nursery.start(lifespan.handle_lifespan)
        await lifespan.wait_for_startup()
        async with trio.open_nursery() as connections:
            sockets = config.create_sockets()
            ssl_context = config.create_ssl_context()
            listeners: list[trio.abc.Listener[Any]] = []
            binds = []
            for sock in (*sockets.secure_sockets, *sockets.insecure_sockets):
                sock.listen(config.backlog)
                listener: trio.abc.Listener[Any] = trio.SocketListener(
                    trio.socket.from_stdlib_socket(sock)
                )
                scheme = "http"
                if sock in sockets.secure_sockets:
                    assert ssl_context is not None
                    listener = trio.SSLListener(listener, ssl_context, https_compatible=True)
                    scheme = "https"
                listeners.append(listener)
                binds.append(f"{scheme}://{repr_socket_addr(sock.family, sock.getsockname())}")

            async def handle(stream: trio.abc.Stream) -> None:
                transport: Any = getattr(stream, "transport_stream", stream)
                transport.socket.setsockopt(
                    trio.socket.SOL_SOCKET, trio.socket.SO_SNDBUF, send_buffer
                )
                await TCPServer(
                    asgi,
                    config,
                    context,
                    ConnectionState(state.copy()),
                    _ConnectionStream(stream, send_timeout),  # type: ignore[arg-type]
                )

            async with trio.open_nursery() as accepting:
                accepting.start_soon(
                    partial(trio.serve_listeners, handle, listeners, handler_nursery=connections)
                )
                task_status.started(binds)
                await shutdown.wait()
                drain.start()
                logger.info(
                    "draining: %d requests in flight, up to %gs to finish",
                    drain.active,
                    config.graceful_timeout,
                )
                with trio.move_on_after(config.graceful_timeout):
                    await drain.wait_idle()
                if drain.active:
                    logger.warning(
                        "%d requests still running after %gs: cutting them",
                        drain.active,
                        config.graceful_timeout,
                    )
                drain.cut()
                with trio.move_on_after(_CLOSE_S):
                    await drain.wait_idle()
                accepting.cancel_scope.cancel()
            await context.terminated.set()
            connections.cancel_scope.deadline = trio.current_time() + _CLOSE_S
        await lifespan.wait_for_shutdown()
        lifespan_nursery.cancel_scope.cancel()


class _ConnectionStream:
    """A connection's stream as hypercorn writes to it: writes give up after ``timeout``
    seconds without completing, and an HTTP/1.1 response head goes out with the write after
    it, in one ``send``.

    The timeout: the client took nothing for that long. The connection is then closed and
    ``trio.BrokenResourceError`` raised, which hypercorn handles as the client leaving.

    The head: hypercorn's HTTP/1.1 protocol writes each h11 event on its own, so a response
    went out in two ``send`` calls, its head and its body, each a system call and a wake-up of
    the client (one fewer: 0.35-0.5 ms less of this thread's CPU a single-input embeddings
    request, PERFORMANCE.md "Embeddings"). A write that is a whole final response head
    (``HTTP/1.1 `` and a status of 200 or more, ending with the blank line; h11 writes a head
    in one piece) is held and sent with the next write, which always comes: the body, a chunk
    of it, or the end of the message (hypercorn writes it even when it is empty). A ``100
    Continue`` goes at once (the client waits for it), and so does anything on an HTTP/2
    connection (its frames do not start so); closing the stream sends a held head first.

    Everything else (reads, the TLS handshake, the socket) is the wrapped stream's.
    """

    def __init__(self, stream: trio.abc.Stream, timeout: float) -> None:
        self._stream = stream
        self._timeout = timeout
        self._held = b""

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        if not self._held and _is_response_head(data):
            # Held, without a schedule point: hypercorn writes under a shield and goes on to
            # the next write, which sends it.
            self._held = bytes(data)
            return
        if self._held:
            data, self._held = self._held + bytes(data), b""
        elif not data:  # the end of a body of known length: nothing to wait for
            await self._stream.send_all(data)
            return
        with trio.move_on_after(self._timeout) as waiting:
            await self._stream.send_all(data)
        if waiting.cancelled_caught:
            await trio.aclose_forcefully(self._stream)
            raise trio.BrokenResourceError(
                f"the client took nothing for {self._timeout:g}s; disconnected"
            )

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        return await self._stream.receive_some(max_bytes)

    async def aclose(self) -> None:
        if self._held:
            with trio.move_on_after(self._timeout):
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self.send_all(b"")
        await self._stream.aclose()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _is_response_head(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` is a whole HTTP/1.1 final response head (status 200 or more)."""
    return data[:9] == b"HTTP/1.1 " and data[9:10] in b"2345" and data[-4:] == b"\r\n\r\n"
