"""The ring adapter: one loop per ring link (:func:`serve_link`) claims request streams and
serves each with the endpoint of its route (``_pipeline.serve_request``), writing the
response bytes to the response lane.

One loop for every model: how the link's model is held is a policy the loop is given
(:class:`Hosting`): :class:`Pinned`, an engine loaded for the link's whole life (``--model``),
or ``_on_demand.OnDemand``, a catalog model its host loads on a request and unloads when idle.
The policy says whether the model is loaded, acquires and releases it around each request,
answers ``POST /models/unload``, and says when the link's claims must be withdrawn
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
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

import attrs
import trio

from ..api import (
    MODELS_LOAD_PATH,
    MODELS_UNLOAD_PATH,
    ApiError,
    RequestLimits,
)
from ..engine import EngineFailedError
from ..ring import ClaimedStream, Heartbeat, ProtocolError, RingLink
from ._endpoints import ENDPOINTS
from ._held_prefixes import PrefixLog
from ._manage import path_of, pinned, respond_error, respond_state
from ._metrics import WorkerMetrics
from ._pipeline import serve_request
from ._shapes import ModelEngine

__all__ = [
    "HEARTBEAT_INTERVAL_S",
    "Claims",
    "Hosting",
    "Lease",
    "ModelStatus",
    "Pinned",
    "serve_link",
]

logger = logging.getLogger("llmtrio.worker")

HEARTBEAT_INTERVAL_S = 0.5


def _set_event() -> trio.Event:
    event = trio.Event()
    event.set()
    return event


@attrs.define(eq=False)
class Claims:
    """A model's ring links as its unloads see them: each link claims inside a scope of
    :meth:`claiming`, which an unload cancels; the unload frees the model once no link is
    inside one (each has withdrawn its claims). A pinned model's never begin to unload."""

    #: How many unloads have begun: a stream claimed before the latest began is handed back.
    unloads: int = 0
    #: Set while no unload is under way: a link claims only then.
    settled: trio.Event = attrs.field(factory=_set_event)
    _scopes: set[trio.CancelScope] = attrs.field(factory=set)
    _left: trio.Event = attrs.field(factory=trio.Event)

    @contextmanager
    def claiming(self) -> Iterator[trio.CancelScope]:
        """Register one link's claiming: claim inside the scope yielded (``with scope:``),
        which is cancelled when an unload begins (at once when one is under way); withdraw
        before leaving the block, which the unload waits for."""
        scope = trio.CancelScope()
        if not self.settled.is_set():
            scope.cancel()
        self._scopes.add(scope)
        try:
            yield scope
        finally:
            self._scopes.discard(scope)
            self._left.set()

    def begin_unload(self) -> None:
        """An unload begins: cancel every claim and hold new ones until :meth:`unloaded`."""
        self.unloads += 1
        if self.settled.is_set():
            self.settled = trio.Event()
        for scope in self._scopes:
            scope.cancel()

    async def withdrawn(self) -> None:
        """Return once no link claims (each withdrew its claims and left :meth:`claiming`)."""
        while self._scopes:
            self._left = trio.Event()
            await self._left.wait()

    def unloaded(self) -> None:
        self.settled.set()


@attrs.frozen
class ModelStatus:
    """What a link's heartbeat states of its model beside the engine's capacity (the
    ``Heartbeat`` fields of the same names): its ``state`` (``""``: not stated, a pinned
    model), its estimated ``bytes``, the seconds until it unloads when idle, and the memory
    budget its worker still has free for a load (``free_bytes``)."""

    state: str = ""
    bytes: int = 0
    unload_in_s: int = 0
    free_bytes: int = 0


@attrs.frozen
class Lease:
    """A request's hold on the loaded model, from :meth:`Hosting.acquire` to
    :meth:`Hosting.release`: the engine, and the request's ``keep_alive`` (seconds; ``None``:
    the model's own)."""

    engine: ModelEngine
    keep_alive: float | None = None


@runtime_checkable
class Hosting(Protocol):
    """How a link's model is held, as :func:`serve_link` asks it (see the module)."""

    @property
    def model_name(self) -> str: ...

    @property
    def slots(self) -> int | None:
        """How many of the model's generations the link runs at once once it is loaded;
        ``None``: as many as the link holds."""

    @property
    def claims(self) -> Claims:
        """When the link's claims must be withdrawn (the model begins to unload)."""

    @property
    def on_demand(self) -> bool:
        """Whether the model loads and unloads as requests come and go: the ring then hears
        its state at once as each request ends (keep_alive 0 unloads it), not at the next
        beat."""

    def engine(self) -> ModelEngine | None:
        """The model's engine while it is loaded; ``None`` while it is not (loading,
        unloading, unloaded)."""

    def status(self) -> ModelStatus:
        """What the heartbeat states of the model now."""

    async def acquire(self, claimed: ClaimedStream) -> Lease:
        """The loaded model for ``claimed`` (loading it first if need be); it counts as in
        flight on the model until :meth:`release`.

        Error handling: :class:`ApiError` when the request cannot be served by it (the
        load failed or is backed off: 503; a ``keep_alive`` that is no duration: 400)."""

    def release(self, lease: Lease) -> None:
        """A request's work on the model ended."""

    async def unload(self, claimed: ClaimedStream) -> None:
        """Answer ``POST /models/unload`` for the model."""

    async def failed(self) -> EngineFailedError:
        """Return once the model's engine has failed and the link can serve no more (a
        pinned model's); never for a model on demand (its host unloads it instead)."""


@attrs.frozen
class Pinned:
    """A model loaded for the link's whole life (``--model``): always loaded, never
    unloaded; its link detaches when its engine fails."""

    _engine: ModelEngine
    _claims: Claims = attrs.field(factory=Claims, init=False)

    @property
    def model_name(self) -> str:
        return self._engine.model_name

    @property
    def slots(self) -> int | None:
        return None

    @property
    def claims(self) -> Claims:
        return self._claims

    @property
    def on_demand(self) -> bool:
        return False

    def engine(self) -> ModelEngine:
        return self._engine

    def status(self) -> ModelStatus:
        return ModelStatus()

    async def acquire(self, claimed: ClaimedStream) -> Lease:
        return Lease(self._engine)

    def release(self, lease: Lease) -> None:
        pass

    async def unload(self, claimed: ClaimedStream) -> None:
        await respond_error(claimed, pinned(self.model_name))

    async def failed(self) -> EngineFailedError:
        return await self._engine.wait_failed()


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
                if taken.unloads != claims.unloads:
                    hand_back(claimed)
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
                    if path != MODELS_LOAD_PATH:
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
