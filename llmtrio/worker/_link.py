"""The ring adapter: one loop per ring link (:func:`serve_link`) claims request streams and
serves each with the endpoint of its route (``_pipeline.serve_request``), writing the
response bytes to the response lane.

One loop for every model: how the link's model is held is a policy the loop is given
(:class:`Hosting`): :class:`Pinned`, an engine loaded for the link's whole life (``--model``),
or ``_on_demand.OnDemand``, a catalog model its host loads on a request and unloads when idle.
The policy says whether the model is loaded, acquires and releases it around each request,
answers ``POST /models/unload``, keeps the model's LoRA adapters (``_adapters.AdapterBook``:
the link serves vLLM's ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` with it, and
states their names in its heartbeats), and says when the link's claims must be withdrawn
(:class:`Claims`). Everything else is this loop's, for both: the heartbeat's figures (the
engine's capacity, prompt reuse and speculation, the policy's model state, and the prompt
prefixes it holds: ``_held_prefixes``), the metrics, and the error handling.

Each claimed stream is handled in its own task, inside the stream's own cancel scope
(``Claimed.cancel_scope``): the client going away cancels that scope, which ends the generation
and frees the slot at the next token boundary. Whatever goes wrong while serving one stream
ends that stream only, with a 500 in its route's error family; the link and the other streams
go on. A refusal of the policy's (a model that cannot be loaded, a ``keep_alive`` that is no
duration) is told in the route's family too (Anthropic's shape on ``/v1/messages``).

Capacity follows the generation: a stream holds one of the model's slots while its generation
runs; once the generation has ended, what it produced is handed to the ring in one last chunk
(past the client's buffer bound) and the slot is free, however slowly the client reads.
"""

from __future__ import annotations

import contextlib
import logging

import attrs
import trio

from ..api import (
    LOAD_LORA_ADAPTER_PATH,
    MODELS_LOAD_PATH,
    MODELS_UNLOAD_PATH,
    UNLOAD_LORA_ADAPTER_PATH,
    ApiError,
    RequestLimits,
)
from ..engine import EngineFailedError
from ..ring import ClaimedStream, Heartbeat, ProtocolError, RingLink
from ._adapters import AdapterLoad, load_adapter, unload_adapter
from ._endpoints import ENDPOINTS
from ._held_prefixes import PrefixLog
from ._link_policy import Hosting, Pinned
from ._manage import path_of, respond_error, respond_state
from ._metrics import WorkerMetrics
from ._pipeline import serve_request
from ._shapes import ModelEngine

__all__ = ["HEARTBEAT_INTERVAL_S", "serve_link"]

logger = logging.getLogger("llmtrio.worker")

HEARTBEAT_INTERVAL_S = 0.5


@attrs.frozen
class _Taken:
    """A claimed stream with what it holds of the link's bounds: its room on the link and,
    when the model was loaded as it was claimed, one of the model's slots; and how many of
    the model's unloads had begun when it was claimed."""

    claimed: ClaimedStream
    slot: bool
    unloads: int


def _request_id(claimed: ClaimedStream) -> str:
    """The request's id as the ingress set it (``x-request-id``), for the log."""
    for name, value in claimed.head.headers:
        if name == "x-request-id":
            return value
    return f"stream-{claimed.stream_id}"


async def serve_link(
    model: ModelEngine | Hosting,
    link: RingLink,
    *,
    metrics: WorkerMetrics | None = None,
    limits: RequestLimits | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve one ring attachment with ``model`` (an engine, pinned; or a :class:`Hosting`
    policy) until cancelled; each finished request is observed by ``metrics``, each request
    body checked against ``limits``.

    Claims a stream only while the link has room for it (its ``max_inflight``: pull, never
    push) and, once the model is loaded, one of its slots is free; requests beyond the
    engine's admission wait inside the engine. While a model on demand is not loaded, every
    stream parked for it is claimed (up to the link's bound: they wait on its load, not on a
    slot), and the first one starts the load. Sends a heartbeat whenever the engine's
    inflight count changes, every ``HEARTBEAT_INTERVAL_S`` (for ``decoding``), and at once
    when the model's state changes for a request (loaded, failed, unloading).

    Resource handling: cancelling this cancels every generation it runs; each stream is
    finished (ended, failed or handed back) before its task returns. When the model begins to
    unload, the link's claims are withdrawn (waiting for every ingress to answer) and a
    stream claimed before is handed back unanswered (``release``: parked again at the front,
    for another worker or the next load); the unload waits for that.

    Error handling: a fault while serving one stream ends that stream only (logged, and a 500
    to its client); a refusal of the policy's is told in the route's family.
    :class:`EngineFailedError` when a pinned engine's decode loop dies: nothing can be served
    any more, so the link should detach.
    """
    hosting = model if isinstance(model, Hosting) else Pinned(model)
    limits = limits or RequestLimits()
    claims = hosting.claims
    # ``room`` bounds what the link holds (the ring's bound: the attach's max_inflight, those
    # waiting on a load included); ``slots`` bounds what runs once the model is loaded.
    room = trio.Semaphore(link.max_inflight)
    slots = trio.Semaphore(hosting.slots or link.max_inflight)
    waiting = 0  # claimed streams waiting on the model's load
    prefixes = PrefixLog()  # what the model's prompt cache holds, for prefix affinity

    def heartbeat() -> None:
        engine = hosting.engine()
        model = hosting.status()
        if engine is None:
            link.heartbeat(
                Heartbeat(
                    waiting,
                    slots.value + waiting,
                    slots.value,
                    model_state=model.state,
                    free_bytes=model.free_bytes,
                    adapters=model.adapters,
                )
            )
            return
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
                model_state=model.state,
                model_bytes=model.bytes,
                unload_in_s=model.unload_in_s,
                free_bytes=model.free_bytes,
                adapters=model.adapters,
                prefixes=prefixes.held(),
            )
        )

    async def beat() -> None:
        while True:
            heartbeat()
            engine = hosting.engine()
            with trio.move_on_after(HEARTBEAT_INTERVAL_S):
                if engine is None:
                    await trio.sleep_forever()
                await engine.capacity_changed()

    def free(taken: _Taken) -> None:
        room.release()
        if taken.slot:
            slots.release()

    def hand_back(claimed: ClaimedStream) -> None:
        """Give back a stream claimed before the model began to unload: parked again at
        the front, for another worker or the next load."""
        logger.info(
            "request %s handed back: %s is unloading", _request_id(claimed), hosting.model_name
        )
        with contextlib.suppress(ProtocolError):  # its ingress is gone, and requeued it
            claimed.release()

    async def handle(taken: _Taken) -> None:
        nonlocal waiting
        claimed = taken.claimed
        try:
            with claimed:
                path = path_of(claimed)
                if path == MODELS_UNLOAD_PATH:
                    await hosting.unload(claimed)
                    return
                if path == UNLOAD_LORA_ADAPTER_PATH:
                    state = hosting.status().state
                    engine = hosting.engine()
                    await unload_adapter(claimed, hosting.adapters, engine, state, limits)
                    heartbeat()  # the ring routes its name here no more
                    return
                if taken.unloads != claims.unloads:
                    hand_back(claimed)
                    return
                adapter: AdapterLoad | None = None
                if path == LOAD_LORA_ADAPTER_PATH:
                    try:  # checked before the model is loaded for it
                        adapter = AdapterLoad.parse(claimed.body, hosting.adapters, limits)
                    except ApiError as refused:
                        await respond_error(claimed, refused)
                        return
                waiting += 1
                try:
                    lease = await hosting.acquire(claimed)
                except ApiError as refused:
                    heartbeat()  # the ring hears a failed load before the answers
                    await respond_error(claimed, refused)
                    return
                finally:
                    waiting -= 1
                if not taken.slot:  # it waited on the load: the ring hears it loaded first
                    heartbeat()
                try:
                    if adapter is not None:
                        await load_adapter(claimed, hosting.adapters, lease.engine, adapter)
                        heartbeat()  # the ring routes its name here from now on
                    elif path != MODELS_LOAD_PATH:
                        if prefixes.serving(path, claimed.body):
                            heartbeat()  # the ring hears it before the response's end
                        await _serve_stream(lease.engine, claimed, metrics, limits)
                finally:
                    hosting.release(lease)
                    if hosting.on_demand:
                        # The ring hears when the now idle model unloads at once, not at the
                        # next beat (the engine's own capacity change came before the release).
                        heartbeat()
                if path == MODELS_LOAD_PATH:
                    await respond_state(claimed, hosting.model_name, "loaded")
        except Exception:  # the stream is failed by `with claimed`; nothing else is touched
            logger.exception("request %s: the worker failed", _request_id(claimed))
        finally:
            free(taken)

    async def take(unloads: int) -> _Taken:
        """A stream, holding its room on the link and, when the model is loaded, a slot."""
        await room.acquire()
        slot = hosting.engine() is not None
        try:
            if slot:
                await slots.acquire()
            try:
                return _Taken(await link.claim(), slot, unloads)
            except BaseException:
                if slot:
                    slots.release()
                raise
        except BaseException:
            room.release()
            raise

    failure: EngineFailedError | None = None
    async with trio.open_nursery() as nursery:

        async def watch_engine() -> None:
            nonlocal failure
            failure = await hosting.failed()
            nursery.cancel_scope.cancel()

        nursery.start_soon(beat)
        nursery.start_soon(watch_engine)
        task_status.started()
        while True:
            await claims.settled.wait()
            if hosting.engine() is None:
                # A claim that may ask for a load waits until every earlier claim taken
                # back is answered: no stream meant for the model before it unloaded fills it.
                await link.wait_withdrawn()
            unloads = claims.unloads
            with claims.claiming() as scope:
                taken: _Taken | None = None
                with scope:
                    while True:
                        taken = await take(unloads)
                        if scope.cancel_called:
                            break
                        nursery.start_soon(handle, taken)
                        taken = None
                # The model began to unload: the claims are taken back (a stream assigned
                # in the race given back), the ring hears it unloaded, and the unload waits
                # until every ingress has answered.
                if taken is not None:
                    hand_back(taken.claimed)
                    free(taken)
                heartbeat()
                await link.wait_withdrawn()
    assert failure is not None  # the loop above ends only by cancellation
    raise failure


async def _serve_stream(
    engine: ModelEngine,
    claimed: ClaimedStream,
    metrics: WorkerMetrics | None,
    limits: RequestLimits,
) -> None:
    """Respond to one stream with the endpoint of its route. The ingress owns routing, so a
    path without an endpoint is a fault (a 500, logged), not a 404."""
    path = path_of(claimed)
    endpoint = ENDPOINTS.get(path)
    if endpoint is None:
        raise LookupError(f"the ingress routed {path!r} to this worker, which does not serve it")
    await serve_request(
        endpoint, engine, claimed, limits=limits, metrics=metrics, request_id=_request_id(claimed)
    )
