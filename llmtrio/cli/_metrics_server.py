"""A tiny HTTP server for ``GET /metrics`` on Trio (h11 over ``trio.serve_tcp``), for a
process with no HTTP server of its own: a remote worker (``llmtrio worker
--metrics-port``). On loopback by default; it serves the registry's text and, when given a
readiness check, the probes ``/livez`` and ``/readyz`` (``llmtrio.api._probes``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import h11
import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ..api import PROBE_PATHS, NotReady, answer_probe

__all__ = ["serve_metrics"]

logger = logging.getLogger("llmtrio.metrics")

_READ_TIMEOUT_S = 10.0
_MAX_REQUEST_BYTES = 16 * 1024


async def serve_metrics(
    registry: CollectorRegistry,
    *,
    host: str = "127.0.0.1",
    port: int = 0,
    not_ready: NotReady | None = None,
    task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve ``registry`` at ``http://host:port/metrics`` until cancelled, and the probes
    beside it when ``not_ready`` is given (asked at each ``/readyz``); ``task_status.started``
    gets the metrics URL (with the port bound, when ``port`` is 0).

    Resource handling: each connection answers one request and closes; a client that sends
    no complete request within 10 seconds is dropped."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    bound = listeners[0].socket.getsockname()
    where = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    url = f"http://{where}:{bound[1]}/metrics"
    logger.info("metrics on %s", url)
    async with trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, _handler(registry, not_ready), listeners)
        task_status.started(url)


def _handler(
    registry: CollectorRegistry, not_ready: NotReady | None
) -> Callable[[trio.SocketStream], Awaitable[None]]:
    async def handle(stream: trio.SocketStream) -> None:
        try:
            await _answer(stream, registry, not_ready)
        except (trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError):
            pass
        finally:
            await trio.aclose_forcefully(stream)

    return handle


async def _answer(
    stream: trio.SocketStream, registry: CollectorRegistry, not_ready: NotReady | None
) -> None:
    connection = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_REQUEST_BYTES)
    event: object = h11.NEED_DATA
    with trio.move_on_after(_READ_TIMEOUT_S):
        while event is h11.NEED_DATA:
            connection.receive_data(await stream.receive_some(4096))
            event = connection.next_event()
    if not isinstance(event, h11.Request):
        return
    target = event.target.split(b"?", 1)[0].decode("latin-1")
    probes = PROBE_PATHS if not_ready is not None else frozenset()
    if target != "/metrics" and target not in probes:
        status, body, content_type = 404, b"only /metrics here\n", b"text/plain"
    elif event.method not in (b"GET", b"HEAD"):
        status, body, content_type = 405, f"GET {target}\n".encode(), b"text/plain"
    elif not_ready is not None and target in probes:
        answer = answer_probe(target, not_ready)
        status, body, content_type = answer.status, answer.body, answer.content_type.encode()
    else:
        status, content_type = 200, CONTENT_TYPE_LATEST.encode()
        body = generate_latest(registry)
    headers = [
        (b"content-type", content_type),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    data = connection.send(h11.Response(status_code=status, headers=headers))
    if event.method != b"HEAD":
        data += connection.send(h11.Data(data=body))
    data += connection.send(h11.EndOfMessage())
    await stream.send_all(data)
