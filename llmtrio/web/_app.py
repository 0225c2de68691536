"""The Quart-Trio app: the OpenAI-compatible ingress in front of a ring.

It parks each chat-completion request on the ring and relays the response lane; it knows
nothing of the engine. Health and model information come from what the workers report.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from .._openai_errors import (
    DEFAULT_MAX_BODY_BYTES,
    OpenAIError,
    method_not_allowed,
    no_worker,
    not_found,
    request_too_large,
    ring_full,
    server_error,
)
from ..ring import (
    ParkTimeoutError,
    RequestHead,
    Ring,
    RingFullError,
    RingStream,
    WorkerFailedError,
    WorkerStats,
)

__all__ = ["create_app"]

logger = logging.getLogger("llmtrio.web")

# Request headers a worker may care about; the rest stay at the ingress.
_FORWARDED = frozenset({"content-type", "accept", "user-agent"})


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


def create_app(
    ring: Ring, *, model_name: str, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
) -> QuartTrio:
    """The app serving ``/v1/chat/completions``, ``/health``, ``/v1/models`` and ``/``."""
    app = QuartTrio(__name__)
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    app.config["RESPONSE_TIMEOUT"] = None  # streams last as long as their generation
    app.config["BODY_TIMEOUT"] = 60
    page = resources.files("llmtrio.web").joinpath("static/index.html").read_bytes()

    @app.get("/")
    async def index() -> Response:
        return Response(page, content_type="text/html; charset=utf-8")

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
        return _json(
            {
                "status": "ok" if stats.workers else "no_workers",
                "model": model_name or next(iter(_models(ring)), ""),
                "capacity": capacity,
                "ring": {
                    "parked": stats.parked,
                    "serving": stats.assigned + stats.responding,
                    "max_streams": stats.max_streams,
                    "workers": len(stats.workers),
                },
                "workers": [_worker_health(w, now) for w in stats.workers],
            }
        )

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

    @app.route("/v1/chat/completions", methods=["POST"])
    async def chat_completions() -> Response:
        body = await request.get_data(cache=False)
        assert isinstance(body, bytes)
        head = RequestHead(
            "POST",
            request.path,
            [(k.lower(), v) for k, v in request.headers.items() if k.lower() in _FORWARDED],
        )
        try:
            stream = ring.park(head, body)
        except RingFullError as exc:
            return _error(ring_full(max(1, round(exc.retry_after))))
        try:
            response_head = await stream.response_head()
            headers = dict(response_head.headers)
            if not headers.get("content-type", "").startswith("text/event-stream"):
                chunks = [chunk async for chunk in stream.body()]
                return Response(b"".join(chunks), status=response_head.status, headers=headers)
        except ParkTimeoutError as exc:
            return _error(no_worker(exc.park_timeout, max(1, round(exc.retry_after))))
        except WorkerFailedError as exc:
            stream.cancel()
            logger.warning("worker failed before responding: %s", exc)
            return _error(server_error(f"the worker failed: {exc}"))
        except BaseException:
            stream.cancel()
            raise
        response = Response(_relay(stream), status=response_head.status, headers=headers)
        response.timeout = None
        return response

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        code = exc.code or 500
        if code == 404:
            return _error(not_found(request.method, request.path))
        if code == 405:
            allowed = ["POST"] if request.path == "/v1/chat/completions" else ["GET"]
            return _error(method_not_allowed(request.method, request.path, allowed))
        if code == 413:
            return _error(request_too_large(max_body_bytes))
        error = OpenAIError(code, exc.description or exc.name, type="invalid_request_error")
        return _error(error)

    return app


def _models(ring: Ring) -> list[str]:
    """What the attached workers serve, each model once, in attach order."""
    return list(dict.fromkeys(m for w in ring.stats().workers for m in w.models))


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
        },
        "last_heartbeat_s_ago": None
        if worker.last_heartbeat is None
        else round(now - worker.last_heartbeat, 3),
    }


async def _relay(stream: RingStream) -> AsyncIterator[bytes]:
    """The response lane as an SSE body; the client hanging up cancels the stream (Quart-Trio
    cancels this generator), which tells the worker to stop."""
    try:
        async for chunk in stream.body():
            yield chunk
    except WorkerFailedError as exc:
        logger.warning("worker failed mid-stream: %s", exc)
        yield server_error(f"the worker failed: {exc}").sse()
    finally:
        stream.cancel()
