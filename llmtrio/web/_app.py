"""The ingress app: the API in front of a ring (OpenAI's, Anthropic's Messages API,
llama.cpp's tokenizer routes, the models' load and unload), and the chat page.

It parks each ring request on the ring and relays the response lane; it knows nothing of the
engine. One ASGI app, three parts, one module each:

- :class:`Ingress` (here), at the ASGI level, owns every request's whole life: it gives it
  an id, runs the checks (``_checks``: origin and host, preflight, API key, and for the ring's
  routes the drain and the rate limit), serves the ring's routes (``POST`` on
  ``llmtrio.api.RING_PATHS``: chat and text completions, the Responses API, embeddings,
  Messages, the token counts, tokenize and detokenize, the models' load and unload) itself
  (``_relay``), and hands the rest to the pages app. A ring request's stream is cancelled by
  the request's own scope, whenever and however it ends, never by a body generator that may
  not start.
- ``_pages``, a Quart-Trio app: ``/``, ``/health``, ``/v1/models``, ``/metrics``,
  ``/openapi.json`` and the 404/405s.

Faults stay in their request: anything unexpected while serving one becomes that request's
500 in its route's error family (no internals in it) and a logged traceback with its request
id.

Every request gets an id (the client's own ``X-Request-Id`` when it is sane), sent back as
``X-Request-Id`` and carried to the worker; when it ends it is counted in the ingress's
metrics (``GET /metrics``) and logged as one ``llmtrio.access`` line.
"""

from __future__ import annotations

import logging
from typing import Any

import trio

from ..api import DEFAULT_MAX_BODY_BYTES, RequestLimits
from ..ring import Ring
from ._access import CLIENT_CLOSED, Exchange, request_id, with_exchange
from ._checks import Admitted, Checks, Gate
from ._drain import Drain
from ._guard import OriginPolicy, header_map
from ._metrics import IngressMetrics
from ._pages import pages_app
from ._relay import (
    ClientGone,
    Message,
    Receive,
    RingRequest,
    Scope,
    Send,
    encode_headers,
    read_body,
    send_error,
)

__all__ = ["Ingress", "create_app"]

logger = logging.getLogger("llmtrio.web")


def create_app(
    ring: Ring,
    *,
    model_name: str,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    policy: OriginPolicy | None = None,
    gate: Gate | None = None,
    metrics: IngressMetrics | None = None,
    drain: Drain | None = None,
    limits: RequestLimits | None = None,
    default_model: str | None = None,
    image_body_bytes: int = 0,
    audio_body_bytes: int = 0,
) -> Ingress:
    """The ASGI app serving the ring's routes, ``/health``, ``/v1/models``, ``/metrics``,
    ``/openapi.json`` and ``/``. ``metrics`` (its own registry unless given) counts what it
    answers; ``limits`` are the workers' request limits, which ``/openapi.json`` states;
    ``default_model`` is where a request for an unknown model, or for none, goes (see
    ``_models``). A body that holds an image part may be up to ``image_body_bytes``, one
    that holds an audio part or is a transcription's form up to ``audio_body_bytes`` (when
    more than ``max_body_bytes``).

    ``drain`` is the server's shutdown state: once it drains, ring requests are refused with
    503 and ``/health`` answers 503 ``draining``; once it is cut, requests still running end
    with an error."""
    metrics = metrics if metrics is not None else IngressMetrics(ring)
    drain = drain or Drain()
    pages = pages_app(
        ring,
        model_name=model_name,
        max_body_bytes=max_body_bytes,
        metrics=metrics,
        drain=drain,
        limits=limits or RequestLimits(),
    )
    checks = Checks(policy or OriginPolicy(), gate or Gate(), drain)
    return Ingress(
        pages,
        ring,
        checks,
        max_body_bytes,
        metrics,
        default_model,
        image_body_bytes,
        audio_body_bytes,
    )


class Ingress:
    """The ASGI app in front (see the module's doc)."""

    def __init__(
        self,
        app: Any,
        ring: Ring,
        checks: Checks,
        max_body_bytes: int,
        metrics: IngressMetrics,
        default_model: str | None = None,
        image_body_bytes: int = 0,
        audio_body_bytes: int = 0,
    ) -> None:
        self.app: Any = app  # called with plain ASGI dicts
        self._default_model = default_model
        self._ring = ring
        self._checks = checks
        self._max_body_bytes = max_body_bytes
        self._image_body_bytes = image_body_bytes
        self._audio_body_bytes = audio_body_bytes
        self.metrics = metrics

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
            self.metrics.request_ended(exchange, ended)

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
        method, path = scope["method"], scope["path"]
        checks = self._checks
        refusal = checks.origin(method, scope.get("scheme", "http"), headers)
        if refusal is not None:
            await send_error(send, exchange, refusal, [("x-request-id", exchange.request_id)])
            return
        preflight = checks.preflight(method, headers)
        if preflight is not None:
            start: Message = {
                "type": "http.response.start",
                "status": 204,
                "headers": encode_headers(preflight),
            }
            await send(start)
            await send({"type": "http.response.body", "body": b""})
            return
        extra = checks.response_headers(exchange.request_id, headers)
        verdict = checks.admit(
            method,
            path,
            headers,
            client=exchange.client,
            http2=scope.get("http_version", "1.1") >= "2",
            now=trio.current_time(),
        )
        if not isinstance(verdict, Admitted):
            if verdict.read_body:
                try:
                    await read_body(receive, self._max_body_bytes)
                except ClientGone:
                    exchange.ended_with(CLIENT_CLOSED)
                    return
            close = [("connection", "close")] if verdict.close else []
            await send_error(send, exchange, verdict.error, [*extra, *close])
            return
        if not verdict.ring:
            await self.app(with_exchange(scope, exchange), receive, _adding_headers(send, extra))
            return
        drain = checks.drain
        with drain.track():
            request = RingRequest(
                self._ring, scope, headers, extra, exchange, checks.gate, self._default_model
            )
            await request.serve(
                receive,
                send,
                self._max_body_bytes,
                drain,
                self._image_body_bytes,
                self._audio_body_bytes,
            )


def _adding_headers(send: Send, extra: list[tuple[str, str]]) -> Send:
    if not extra:
        return send

    async def wrapped(message: Message) -> None:
        if message["type"] == "http.response.start":
            message = {**message, "headers": [*message.get("headers", []), *encode_headers(extra)]}
        await send(message)

    return wrapped
