"""The ingress app: the OpenAI-compatible API in front of a ring, and the chat page.

It parks each completion request on the ring and relays the response lane; it knows nothing
of the engine. Health and model information come from what the workers report.

Two layers, one ASGI app:

- :class:`Ingress`, at the ASGI level, owns every request's whole life: the origin and host
  checks, and the ring's routes (``POST /v1/chat/completions``, ``POST /v1/completions``).
  A ring request's stream is cancelled by the request's own scope, whenever and however it
  ends (the client hanging up before the response head, between head and first chunk,
  mid-stream, during the last flush), never by a body generator that may not start.
- a Quart-Trio app for the rest: ``/``, ``/health``, ``/v1/models`` and the 404/405s.

Faults stay in their request: anything unexpected while serving one becomes that request's
500 in OpenAI's shape (no internals in it) and a logged traceback with its request id.

Every request gets an id (the client's own ``X-Request-Id`` when it is sane), sent back as
``X-Request-Id`` and carried to the worker; when it ends it is counted in the ingress's
metrics (``GET /metrics``) and logged as one ``llmtrio.access`` line. The :class:`Gate`
holds what guards the API: API keys, the rate limit, the body and per-request deadlines.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

import attrs
import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from .._openai_errors import (
    DEFAULT_MAX_BODY_BYTES,
    OpenAIError,
    body_timeout,
    invalid_api_key,
    method_not_allowed,
    no_worker,
    not_found,
    rate_limited,
    request_timeout,
    request_too_large,
    ring_full,
    server_error,
    shutting_down,
    worker_failed,
)
from .._routes import RING_PATHS
from ..ring import (
    ParkTimeoutError,
    RequestHead,
    Ring,
    RingFullError,
    RingStream,
    WorkerFailedError,
    WorkerStats,
)
from ._access import Exchange, request_id
from ._auth import OPEN_PATHS, ApiKeys
from ._drain import Drain
from ._guard import OriginPolicy, header_map
from ._metrics import CONTENT_TYPE, IngressMetrics
from ._openapi import openapi
from ._ratelimit import RateLimiter, retry_after

__all__ = ["Gate", "Ingress", "create_app"]

logger = logging.getLogger("llmtrio.web")

# Request headers a worker may care about; the rest stay at the ingress.
_FORWARDED = frozenset({"content-type", "accept", "user-agent"})

Scope = dict[str, Any]
Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps(data), status=status, headers=headers, content_type="application/json"
    )


def _error(error: OpenAIError) -> Response:
    return Response(
        error.body(),
        status=error.status,
        headers=dict(error.headers),
        content_type="application/json",
    )


@attrs.frozen
class Gate:
    """What guards the API besides the origin policy.

    ``keys``: the API keys asked of every path but ``/``, ``/health`` and ``/v1/models``
    (none: no key asked). ``rate_limit``: completion requests per key (or per client address
    when no keys are set) per minute, then 429 (``None``: no limit). ``request_timeout``:
    seconds a completion request may take from its arrival to its last byte, then it is ended
    (504, or an error event once streaming; ``None``: no deadline). ``body_timeout``: seconds
    for a completion request's body to arrive, then 408."""

    keys: ApiKeys = attrs.field(factory=ApiKeys)
    rate_limit: int | None = None
    request_timeout: float | None = None
    body_timeout: float = 60.0


def create_app(
    ring: Ring,
    *,
    model_name: str,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    policy: OriginPolicy | None = None,
    gate: Gate | None = None,
    metrics: IngressMetrics | None = None,
    drain: Drain | None = None,
) -> Ingress:
    """The ASGI app serving the ring's routes, ``/health``, ``/v1/models``, ``/metrics``,
    ``/openapi.json`` and ``/``. ``metrics`` (its own registry unless given) counts what it
    answers.

    ``drain`` is the server's shutdown state: once it drains, ring requests are refused with
    503 and ``/health`` answers 503 ``draining``; once it is cut, requests still running end
    with an error."""
    metrics = metrics if metrics is not None else IngressMetrics(ring)
    drain = drain or Drain()
    app = QuartTrio(__name__)
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    app.config["BODY_TIMEOUT"] = 60
    page = resources.files("llmtrio.web").joinpath("static/index.html").read_bytes()

    @app.get("/")
    async def index() -> Response:
        return Response(page, content_type="text/html; charset=utf-8")

    document = json.dumps(openapi()).encode()

    @app.get("/openapi.json")
    async def openapi_json() -> Response:
        return Response(document, content_type="application/json")

    @app.get("/health")
    async def health() -> Response:
        stats = ring.stats()
        now = trio.current_time()
        beats = [w.capacity for w in stats.workers if w.capacity is not None]
        capacity = {
            "inflight": sum(b.inflight for b in beats),
            "decoding": sum(b.decoding for b in beats),
            "max_inflight": sum(b.max_inflight for b in beats),
            "available_slots": sum(b.available_slots for b in beats),
        }
        prompt_cache = {
            "hits": sum(b.cache_hits for b in beats),
            "cached_tokens": sum(b.cached_tokens for b in beats),
            "bytes": sum(b.cache_bytes for b in beats),
        }
        speculation = _speculation(
            sum(b.spec_drafted for b in beats), sum(b.spec_accepted for b in beats)
        )
        status = "ok" if stats.workers else "no_workers"
        if drain.draining:
            status = "draining"
        body: dict[str, Any] = {
            "status": status,
            "model": model_name or next(iter(_models(ring)), ""),
            "capacity": capacity,
            "prompt_cache": prompt_cache,
            "speculation": speculation,
            "ring": {
                "parked": stats.parked,
                "serving": stats.assigned + stats.responding,
                "max_streams": stats.max_streams,
                "workers": len(stats.workers),
            },
            "workers": [_worker_health(w, now) for w in stats.workers],
        }
        if not stats.workers and ring.last_detach is not None:
            worker, reason = ring.last_detach
            body["reason"] = f"worker {worker!r} detached: {reason}"
        # No worker, no service, or shutting down: a load balancer should send requests
        # elsewhere.
        return _json(body, status=200 if status == "ok" else 503)

    @app.get("/v1/models")
    async def models() -> Response:
        names = _models(ring) or ([model_name] if model_name else [])
        return _json(
            {
                "object": "list",
                "data": [
                    {"id": name, "object": "model", "created": 0, "owned_by": "llmtrio"}
                    for name in names
                ],
            }
        )

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(metrics.render(), content_type=CONTENT_TYPE)

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        code = exc.code or 500
        if request.path in RING_PATHS and code in (404, 405):
            return _error(method_not_allowed(request.method, request.path, ["POST"]))
        if code == 404:
            return _error(not_found(request.method, request.path))
        if code == 405:
            return _error(method_not_allowed(request.method, request.path, ["GET"]))
        if code == 413:
            return _error(request_too_large(max_body_bytes))
        error = OpenAIError(code, exc.description or exc.name, type="invalid_request_error")
        return _error(error)

    return Ingress(
        app, ring, policy or OriginPolicy(), max_body_bytes, gate or Gate(), metrics, drain
    )


class Ingress:
    """The ASGI app in front: checks origin and host, API key and rate limit, serves the
    ring's routes itself, and hands every other request to the Quart app; counts and logs
    every request as it ends."""

    def __init__(
        self,
        app: QuartTrio,
        ring: Ring,
        policy: OriginPolicy,
        max_body_bytes: int,
        gate: Gate,
        metrics: IngressMetrics,
        drain: Drain,
    ) -> None:
        self.app: Any = app  # called with plain ASGI dicts
        self._ring = ring
        self._policy = policy
        self._max_body_bytes = max_body_bytes
        self._gate = gate
        self._limiter = None if gate.rate_limit is None else RateLimiter(gate.rate_limit)
        self.metrics = metrics
        self._drain = drain

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = header_map(scope["headers"])
        client = scope.get("client") or ("", 0)
        exchange = Exchange(
            request_id(headers),
            scope["method"],
            scope["path"],
            str(client[0]),
            trio.current_time(),
        )
        self.metrics.request_started(exchange.path)
        accounted = False

        def account() -> None:
            """Log and count the request, once: before its last byte goes, or as it ends."""
            nonlocal accounted
            if accounted:
                return
            accounted = True
            ended = trio.current_time()
            exchange.log(ended)
            seen = exchange.observer
            self.metrics.request_ended(
                exchange.path,
                seen.status,
                error_code=seen.error_code,
                finish_reason=seen.finish_reason,
                ttfb=exchange.ttfb(),
                total=ended - exchange.started,
            )
            if seen.status is not None and not seen.complete:
                self.metrics.client_left()

        try:
            watched = exchange.watch(send, trio.current_time, on_last=account)
            await self._dispatch(scope, headers, receive, watched, exchange)
        finally:
            account()

    async def _dispatch(
        self,
        scope: Scope,
        headers: dict[str, str],
        receive: Receive,
        send: Send,
        exchange: Exchange,
    ) -> None:
        method = scope["method"]
        path = scope["path"]
        refusal = self._policy.refusal(method, scope.get("scheme", "http"), headers)
        if refusal is not None:
            await _send_error(send, refusal, [("x-request-id", exchange.request_id)])
            return
        if OriginPolicy.is_preflight(method, headers):
            await send(
                {
                    "type": "http.response.start",
                    "status": 204,
                    "headers": _encode(self._policy.preflight_headers(headers)),
                }
            )
            await send({"type": "http.response.body", "body": b""})
            return
        extra = [("x-request-id", exchange.request_id), *self._policy.cors_headers(headers)]
        key = None
        if self._gate.keys and path not in OPEN_PATHS:
            key = self._gate.keys.match(headers)
            if key is None:
                await _send_error(send, invalid_api_key(), extra)
                return
        if method == "POST" and path in RING_PATHS:
            if self._drain.draining:
                # Read the body first: hypercorn's HTTP/2 protocol fails the whole connection
                # (every stream on it) on data for a stream that was already answered.
                try:
                    await _read_body(receive, self._max_body_bytes)
                except _ClientGone:
                    return
                # HTTP/1: Connection: close, so that a kept-alive client reconnects (elsewhere);
                # HTTP/2 forbids the header (its streams end with their response anyway).
                close = [("connection", "close")] if scope.get("http_version", "1.1") < "2" else []
                await _send_error(send, shutting_down(), [*extra, *close])
                return
            if self._limiter is not None:
                wait = self._limiter.take(key or exchange.client, trio.current_time())
                if wait is not None:
                    assert self._gate.rate_limit is not None
                    error = rate_limited(self._gate.rate_limit, retry_after(wait))
                    await _send_error(send, error, extra)
                    return
            with self._drain.track():
                await _RingRequest(self._ring, scope, headers, extra, exchange, self._gate).serve(
                    receive, send, self._max_body_bytes, self._drain
                )
            return
        await self.app(scope, receive, _adding_headers(send, extra))


def _adding_headers(send: Send, extra: list[tuple[str, str]]) -> Send:
    if not extra:
        return send

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *_encode(extra)]}
        await send(message)

    return wrapped


def _encode(headers: list[tuple[str, str]]) -> list[tuple[bytes, bytes]]:
    return [(name.encode("latin-1"), value.encode("latin-1")) for name, value in headers]


async def _send_error(
    send: Send, error: OpenAIError, extra: list[tuple[str, str]] | None = None
) -> None:
    body = error.body()
    headers = [
        ("content-type", "application/json"),
        ("content-length", str(len(body))),
        *error.headers,
        *(extra or []),
    ]
    await send({"type": "http.response.start", "status": error.status, "headers": _encode(headers)})
    await send({"type": "http.response.body", "body": body})


class _ClientGone(Exception):
    """The client disconnected while its request body was read."""


class _RingRequest:
    """One request served through the ring, from its body to its last byte."""

    def __init__(
        self,
        ring: Ring,
        scope: Scope,
        headers: dict[str, str],
        extra: list[tuple[str, str]],
        exchange: Exchange,
        gate: Gate,
    ) -> None:
        self._ring = ring
        self._scope = scope
        self._headers = headers
        self._exchange = exchange
        self._gate = gate
        self.request_id = exchange.request_id
        self._extra = extra
        self._started = False  # the response head is (being) sent
        self._streaming = False  # an event stream's head is sent: errors go as events

    async def serve(self, receive: Receive, send: Send, max_body_bytes: int, drain: Drain) -> None:
        """Serve the request; never raises but for cancellation.

        Resource handling: the ring stream is cancelled when this returns, however it
        returns, unless its response ended; a client that disconnects at any point cancels it
        at once, and so does ``drain`` being cut, which ends the response with a
        ``shutting_down`` error (a 503, or an error event on a started event stream).
        """
        try:
            cut = False
            async with trio.open_nursery() as nursery:

                async def end_when_cut() -> None:
                    nonlocal cut
                    await drain.cut_called.wait()
                    cut = True
                    nursery.cancel_scope.cancel()

                nursery.start_soon(end_when_cut)
                await self._serve(receive, send, max_body_bytes)
                nursery.cancel_scope.cancel()
            if cut:
                logger.warning("request %s: cut by the shutdown", self.request_id)
                await self._end_early(send, shutting_down(cut=True))
        except _ClientGone:
            logger.debug("request %s: the client left before its body was read", self.request_id)
        except Exception:
            logger.exception("request %s failed at the ingress", self.request_id)
            if not self._started:
                await _send_error(send, server_error(), self._extra)

    async def _serve(self, receive: Receive, send: Send, max_body_bytes: int) -> None:
        declared = self._headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_body_bytes:
            await self._send_error(send, request_too_large(max_body_bytes))
            return
        body: bytes | None = None
        with trio.move_on_after(self._gate.body_timeout) as reading:
            body = await _read_body(receive, max_body_bytes)
        if reading.cancelled_caught:
            await self._send_error(send, body_timeout(self._gate.body_timeout))
            return
        if body is None:
            await self._send_error(send, request_too_large(max_body_bytes))
            return
        head = RequestHead(
            "POST",
            self._scope["path"],
            [
                *((k, v) for k, v in self._headers.items() if k in _FORWARDED),
                ("x-request-id", self.request_id),
            ],
        )
        try:
            stream = self._ring.park(head, body)
        except RingFullError as exc:
            await self._send_error(send, ring_full(max(1, round(exc.retry_after))))
            return
        deadline = self._gate.request_timeout
        with stream:  # cancels the stream on any way out that did not end it
            with trio.move_on_at(
                self._exchange.started + deadline if deadline is not None else float("inf")
            ) as timer:
                async with trio.open_nursery() as nursery:

                    async def cancel_on_disconnect() -> None:
                        while (await receive())["type"] != "http.disconnect":
                            pass
                        logger.debug("request %s: the client disconnected", self.request_id)
                        nursery.cancel_scope.cancel()

                    nursery.start_soon(cancel_on_disconnect)
                    await self._relay(stream, send)
                    nursery.cancel_scope.cancel()
            if timer.cancelled_caught and deadline is not None:
                logger.info("request %s: past its %gs deadline", self.request_id, deadline)
                stream.cancel()  # the generation ends at its next token
                await self._end_early(send, request_timeout(deadline))

    async def _end_early(self, send: Send, error: OpenAIError) -> None:
        """End the response with ``error`` as far as it got (the deadline passed, or the drain
        cut it): the error itself before the head, an error event on a started event stream;
        nothing once its last byte went out."""
        if self._exchange.observer.complete:  # its last byte went out as the time came
            return
        if not self._started:
            await self._send_error(send, error)
        elif self._streaming:
            await send({"type": "http.response.body", "body": error.sse(), "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        else:  # a JSON body's head went out: it can only be cut
            await send({"type": "http.response.body", "body": b""})

    async def _relay(self, stream: RingStream, send: Send) -> None:
        try:
            head = await stream.response_head()
            self._exchange.worker = stream.worker_id
            headers = [*head.headers, *self._extra]
            if not dict(head.headers).get("content-type", "").startswith("text/event-stream"):
                # One JSON body: whole before the head goes out, so a failure is still a 500.
                body = b"".join([chunk async for chunk in stream.body()])
                with trio.CancelScope(shield=True):  # whole or not at all; bounded by send_timeout
                    await self._start(
                        send, head.status, [*headers, ("content-length", str(len(body)))]
                    )
                    await send({"type": "http.response.body", "body": body})
                return
        except ParkTimeoutError as exc:
            await self._send_error(
                send, no_worker(exc.park_timeout, max(1, round(exc.retry_after)))
            )
            return
        except WorkerFailedError as exc:
            logger.warning("request %s: the worker failed: %s", self.request_id, exc)
            await self._send_error(send, worker_failed())
            return
        self._streaming = True
        await self._start(send, head.status, headers)
        try:
            async for chunk in stream.body():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        except WorkerFailedError as exc:
            logger.warning("request %s: the worker failed mid-stream: %s", self.request_id, exc)
            await send(
                {"type": "http.response.body", "body": worker_failed().sse(), "more_body": True}
            )
        # The last send is shielded where every response's is (``Exchange.watch``).
        await send({"type": "http.response.body", "body": b""})

    async def _start(self, send: Send, status: int, headers: list[tuple[str, str]]) -> None:
        self._started = True
        await send({"type": "http.response.start", "status": status, "headers": _encode(headers)})

    async def _send_error(self, send: Send, error: OpenAIError) -> None:
        self._started = True
        await _send_error(send, error, self._extra)


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The request body, or ``None`` once it grows past ``limit`` bytes.

    Error handling: :class:`_ClientGone` when the client disconnects first.
    """
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _ClientGone
        body += message.get("body", b"")
        if len(body) > limit:
            return None
        if not message.get("more_body", False):
            return bytes(body)


def _models(ring: Ring) -> list[str]:
    """What the attached workers serve, each model once, in attach order."""
    return list(dict.fromkeys(m for w in ring.stats().workers for m in w.models))


def _speculation(drafted: int, accepted: int) -> dict[str, Any]:
    """Speculative decoding's record: draft tokens verified, those right, and the rate."""
    return {
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance": round(accepted / drafted, 4) if drafted else None,
    }


def _worker_health(worker: WorkerStats, now: float) -> dict[str, Any]:
    beat = worker.capacity
    return {
        "id": worker.worker_id,
        "models": list(worker.models),
        "max_inflight": worker.max_inflight,
        "held": len(worker.held),
        "capacity": None
        if beat is None
        else {
            "inflight": beat.inflight,
            "decoding": beat.decoding,
            "max_inflight": beat.max_inflight,
            "available_slots": beat.available_slots,
            "prompt_cache": {
                "hits": beat.cache_hits,
                "cached_tokens": beat.cached_tokens,
                "bytes": beat.cache_bytes,
            },
            "speculation": _speculation(beat.spec_drafted, beat.spec_accepted),
        },
        "last_heartbeat_s_ago": None
        if worker.last_heartbeat is None
        else round(now - worker.last_heartbeat, 3),
    }
