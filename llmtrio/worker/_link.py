"""The ring adapter: claims request lanes while the engine has free slots, and serves each
with the endpoint of its route (``_endpoint.serve_request``), writing OpenAI response bytes
to the response lane.

Each claimed stream is handled in its own task, inside the stream's own cancel scope
(``Claimed.cancel_scope``): the client going away cancels that scope, which ends the generation
and frees the slot at the next token boundary. Whatever goes wrong while serving one stream
ends that stream only, with a 500 in OpenAI's shape; the link and the other streams go on.

Capacity follows the generation: a stream holds one of the link's slots while its generation
runs; once the generation has ended, what it produced is handed to the ring in one last chunk
(past the client's buffer bound) and the slot is free, however slowly the client reads.
"""

from __future__ import annotations

import logging

import trio

from ..api import RequestLimits
from ..engine import EngineFailedError
from ..ring import ClaimedStream, Heartbeat, RingLink
from ._pipeline import ModelEngine, serve_request
from ._endpoints import ENDPOINTS
from ._manage import MANAGE_PATHS, answer_pinned, path_of
from ._metrics import WorkerMetrics

__all__ = ["HEARTBEAT_INTERVAL_S", "serve_link"]

logger = logging.getLogger("llmtrio.worker")

HEARTBEAT_INTERVAL_S = 0.5


async def serve_link(
    engine: ModelEngine,
    link: RingLink,
    *,
    metrics: WorkerMetrics | None = None,
    limits: RequestLimits | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve one ring attachment with ``engine`` until cancelled; each finished request is
    observed by ``metrics``, each request body checked against ``limits``.

    Claims a stream only while fewer than the link's ``max_inflight`` generations run (pull,
    never push); requests beyond the engine's admission wait inside the engine. Sends a
    capacity heartbeat whenever the engine's inflight count changes, and every
    ``HEARTBEAT_INTERVAL_S`` (for ``decoding``).

    Resource handling: cancelling this cancels every generation it runs; each stream is
    finished (ended or failed) before its task returns.

    Error handling: a fault while serving one stream ends that stream only (logged, and a 500
    to its client). :class:`EngineFailedError` when the engine's decode loop dies: nothing
    can be served any more, so the link should detach.
    """
    slots = trio.Semaphore(link.max_inflight)

    def heartbeat() -> None:
        capacity = engine.capacity()
        link.heartbeat(
            Heartbeat(
                capacity.inflight,
                capacity.max_inflight,
                capacity.available_slots,
                capacity.decoding,
                cache_hits=capacity.cache_hits,
                cached_tokens=capacity.cached_tokens,
                cache_bytes=capacity.cache_bytes,
                kv_used=capacity.kv_used,
                kv_total=capacity.kv_total,
                spec_drafted=capacity.spec_drafted,
                spec_accepted=capacity.spec_accepted,
            )
        )

    async def beat() -> None:
        while True:
            heartbeat()
            with trio.move_on_after(HEARTBEAT_INTERVAL_S):
                await engine.capacity_changed()

    async def handle(claimed: ClaimedStream) -> None:
        try:
            with claimed:
                if path_of(claimed) in MANAGE_PATHS:
                    await answer_pinned(claimed, engine.model_name)
                    return
                await _serve_stream(engine, claimed, metrics, limits or RequestLimits())
        except Exception:  # the stream is failed by `with claimed`; nothing else is touched
            logger.exception("request %s: the worker failed", _request_id(claimed))
        finally:
            slots.release()

    failure: EngineFailedError | None = None
    async with trio.open_nursery() as nursery:

        async def watch_engine() -> None:
            nonlocal failure
            failure = await engine.wait_failed()
            nursery.cancel_scope.cancel()

        nursery.start_soon(beat)
        nursery.start_soon(watch_engine)
        task_status.started()
        while True:
            await slots.acquire()
            try:
                claimed = await link.claim()
            except BaseException:
                slots.release()
                raise
            nursery.start_soon(handle, claimed)
    assert failure is not None  # the loop above ends only by cancellation
    raise failure


def _request_id(claimed: ClaimedStream) -> str:
    for name, value in claimed.head.headers:
        if name == "x-request-id":
            return value
    return f"stream-{claimed.stream_id}"


async def _serve_stream(
    engine: ModelEngine,
    claimed: ClaimedStream,
    metrics: WorkerMetrics | None,
    limits: RequestLimits,
) -> None:
    """Respond to one stream with the endpoint of its route. The ingress owns routing, so a
    path without an endpoint is a fault (a 500, logged), not a 404."""
    path = claimed.head.path.split("?", 1)[0]
    endpoint = ENDPOINTS.get(path)
    if endpoint is None:
        raise LookupError(f"the ingress routed {path!r} to this worker, which does not serve it")
    await serve_request(
        endpoint, engine, claimed, limits=limits, metrics=metrics, request_id=_request_id(claimed)
    )
