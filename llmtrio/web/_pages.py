"""The ingress's own pages, a Quart-Trio app: ``/`` (the chat page), ``/health``,
``/v1/models``, ``/metrics``, ``/openapi.json``, and the 404s and 405s in OpenAI's shape.

Health and model information come from what the workers report to the ring.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

import trio
from quart import Response, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from ..api import (
    CONTEXT_LENGTH_NAMES,
    HEALTH_PATH,
    MODELS_PATH,
    OPENAPI_PATH,
    RING_PATHS,
    ApiError,
    RequestLimits,
    error_family,
    method_not_allowed,
    not_found,
    openapi,
    request_too_large,
)
from ..ring import CHAT_MODEL, ModelStats, Ring, WorkerStats
from ._access import exchange_of
from ._drain import Drain
from ._metrics import CONTENT_TYPE, IngressMetrics
from ._probes import add_probes

__all__ = ["pages_app"]


def _json(data: Any, status: int = 200, headers: dict[str, str] | None = None) -> Response:
    return Response(
        json.dumps(data), status=status, headers=headers, content_type="application/json"
    )


def _error(error: ApiError) -> Response:
    """``error`` as the response (in the shape of its path's route family), its code recorded
    for the access log and metrics."""
    exchange = exchange_of(request.scope)
    if exchange is not None:
        exchange.ended_with(error.error_code)
    status, headers, body = error_family(request.path).response(error)
    return Response(body, status=status, headers=dict(headers))


def pages_app(
    ring: Ring,
    *,
    model_name: str,
    max_body_bytes: int,
    metrics: IngressMetrics,
    drain: Drain,
    limits: RequestLimits,
) -> QuartTrio:
    """The app serving ``/``, ``/health``, ``/livez``, ``/readyz``, ``/v1/models``,
    ``/metrics`` (``metrics``) and
    ``/openapi.json`` (with the workers' request ``limits``); ``/health`` answers 503
    ``draining`` once ``drain`` drains."""
    app = QuartTrio(__name__)
    app.config["MAX_CONTENT_LENGTH"] = max_body_bytes
    app.config["BODY_TIMEOUT"] = 60
    page = resources.files("llmtrio.web").joinpath("static/index.html").read_bytes()

    @app.get("/")
    async def index() -> Response:
        return Response(page, content_type="text/html; charset=utf-8")

    document = json.dumps(openapi(limits)).encode()

    @app.get(OPENAPI_PATH)
    async def openapi_json() -> Response:
        return Response(document, content_type="application/json")

    @app.get(HEALTH_PATH)
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
            "models": {
                model.name: {"kind": model.kind, "workers": model.workers}
                for model in ring.models().values()
            },
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

    add_probes(app, lambda: "draining" if drain.draining else None)

    @app.get(MODELS_PATH)
    async def models() -> Response:
        known = ring.models()
        if not known and model_name:
            known = {model_name: ModelStats(model_name, CHAT_MODEL, workers=0)}
        return _json(
            {
                "object": "list",
                "data": [
                    {
                        "id": model.name,
                        "object": "model",
                        "created": 0,
                        "owned_by": "llmtrio",
                        "kind": model.kind,
                        "workers": model.workers,
                        "input_modalities": [
                            "text",
                            *(["image"] if model.vision else []),
                            *(["audio"] if model.audio else []),
                        ],
                        "state": model.state,
                        **_context(model.context_length),
                        **({"bytes": model.bytes} if model.bytes else {}),
                        **({"unload_in_s": model.unload_in_s} if model.unload_in_s else {}),
                    }
                    for model in known.values()
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
        error = ApiError(code, exc.description or exc.name, type="invalid_request_error")
        return _error(error)

    return app


def _context(length: int) -> dict[str, int]:
    """A model's context length under each name clients read it by (none when not stated)."""
    return dict.fromkeys(CONTEXT_LENGTH_NAMES, length) if length else {}


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
        "kinds": [worker.kind(model) for model in worker.models],
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
