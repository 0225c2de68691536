"""Models on demand: a worker's catalog models, each loaded on its first request and
unloaded when idle, within the memory budget (the policy is ``_budget.LoadPolicy``; this is
its I/O shell).

Each catalog model has its own ring link (:func:`serve_hosted_link`), attached from the
start whether loaded or not, so that the ingress routes the model's requests to this worker
and parks them while none has claimed them. While the model is not loaded the link claims
every stream parked for it (no slot bound: they are waiting on the load, not on a slot), and
the first one claimed starts the load; every other request for the model joins that load
(one load however many arrive at once), up to ``LOAD_WAITERS`` of them. Once loaded, the
link claims only while one of the model's ``max_inflight`` slots is free, as any worker does.

How the timeouts combine: a request parked at the ingress is subject to the ingress's park
timeout until a worker claims it; a worker claims the requests of a model it is loading at
once (up to ``LOAD_WAITERS``), so from then on only ``load_timeout`` (the load's own) and
the request's own deadline (``--request-timeout``) apply: such a request is never refused
by the park timeout while its model loads. Requests beyond ``LOAD_WAITERS`` stay parked and
the park timeout applies to them as to any request waiting for a slot.

Unloading: before a model unloads, its links stop claiming for it. Each link claims inside
a scope the unload cancels (:meth:`Claims.claiming`); the link withdraws its unfilled
claims on every ingress, waits until each ingress has answered (``RingLink.wait_withdrawn``),
beats ``unloaded`` at once, and hands back (``release``: parked again at the front, for
another worker or the next load) a stream assigned in the race, or claimed before the unload
began and not yet started; the engine is freed only then. So no request reaches a model that
is gone, and none claimed before an unload loads the model again. A model whose engine dies
(its decode loop fails) unloads the same way once its failed requests have ended (503 in
OpenAI's shape), and is backed off as a failed load: a later request loads it again.

Threads: each model's engine has the ``threads`` of its config; the loaded set shares the
machine's cores as the engines' threads contend (no model's threads are changed as others
load or unload; give each model ``threads`` so that the loaded set's sum fits the cores).
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import attrs
import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..api import (
    MODELS_LOAD_PATH,
    MODELS_UNLOAD_PATH,
    OpenAIError,
    RequestLimits,
    invalid_request,
    keep_alive_seconds,
    model_load_failed,
)
from ..engine import EngineConfig, EngineError, open_engine
from ..engine.models import check_gguf, model_kind
from ..ring import ClaimedStream, Heartbeat, ProtocolError, RingLink
from ._load_policy import LoadPolicy, ModelCost, ModelState, estimate_cost
from ._pipeline import JSON_HEADERS, ModelEngine
from ._manage import path_of, pinned, respond_error, respond_state
from ._metrics import WorkerMetrics
from ._link import HEARTBEAT_INTERVAL_S, _request_id, _serve_stream

__all__ = [
    "LOAD_WAITERS",
    "HostConfig",
    "HostedModel",
    "ModelHost",
    "ModelLoadFailed",
    "serve_hosted_link",
]

#: The requests one worker holds waiting on a model's load (its link's bound in the ring):
#: more wait parked at the ingress, subject to its park timeout.
LOAD_WAITERS = 64
#: The longest an unload waits for its links to withdraw their claims (each ingress answers
#: within a round trip, or is given up after the dial's ``ingress_timeout``, 10 s).
WITHDRAW_TIMEOUT_S = 30.0

logger = logging.getLogger("llmtrio.worker")


def _keep_alive(value: object) -> float:
    try:
        return keep_alive_seconds(value)
    except ValueError as exc:
        raise ValueError(f"keep_alive {exc}") from None


@attrs.frozen
class HostConfig:
    """The budget of a worker's models on demand: ``max_loaded_models`` and
    ``memory_budget_mib`` (0: no bound; pinned models count), ``keep_alive`` (seconds an
    idle model stays loaded unless a request or its catalog entry says otherwise) and
    ``load_timeout`` (seconds a load may take before it fails)."""

    max_loaded_models: int = 0
    memory_budget_mib: int = 0
    keep_alive: float = attrs.field(default=300.0, converter=_keep_alive)
    load_timeout: float = 600.0

    def __attrs_post_init__(self) -> None:
        if self.max_loaded_models < 0:
            raise ValueError("max_loaded_models must be 0 (no bound) or more")
        if self.memory_budget_mib < 0:
            raise ValueError("memory_budget_mib must be 0 (no bound) or more")
        if not self.load_timeout > 0:
            raise ValueError("load_timeout must be more than 0")


@attrs.frozen
class HostedModel:
    """A catalog model as the host loads it: its engine config, kind, estimated cost, own
    keep-alive (``None``: the host's) and whether it is pinned."""

    name: str
    config: EngineConfig
    kind: str
    cost: ModelCost
    keep_alive: float | None = None
    pinned: bool = False
    aliases: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """What its link lists: its name, then its aliases (each routed to it)."""
        return (self.name, *self.aliases)

    @classmethod
    def of(
        cls,
        name: str,
        config: EngineConfig,
        keep_alive: float | None = None,
        aliases: Sequence[str] = (),
    ) -> HostedModel:
        """``config``'s model with its kind and cost from its GGUF header (a repo's model
        not on disk yet: a chat model of unknown weights, counted as 0 until loaded).

        A file that is not a usable GGUF file is listed all the same (as a chat model of no
        known cost): its load fails, naming why."""
        pinned = keep_alive == math.inf
        if config.model is None:
            return cls(name, config, "chat", ModelCost(0), keep_alive, pinned, tuple(aliases))
        try:
            weights = sum(p.stat().st_size for p in _parts(config.model))
            info = check_gguf(config.model)
        except (EngineError, OSError) as exc:
            # Listed all the same: its load fails with this reason, other models go on.
            logger.warning("catalog model %s: %s", name, str(exc).splitlines()[0])
            return cls(name, config, "chat", ModelCost(0), keep_alive, pinned, tuple(aliases))
        kind = model_kind(info)
        drafts = config.spec_draft_max if config.spec is not None else 0
        embeddings = kind == "embedding"
        cost = estimate_cost(
            info.metadata,
            weights,
            slots=config.max_inflight,
            ctx_size=config.ctx_size,
            n_batch=max(config.prefill_chunk + config.max_inflight * (1 + drafts), 64),
            cache_type_k=config.cache_type_k,
            cache_type_v=config.cache_type_v,
            cache_ram_mib=config.cache_ram_mib if config.prompt_cache else 0,
            rs_snapshots=min(drafts, 8),
            embeddings=embeddings,
        )
        return cls(name, config, kind, cost, keep_alive, pinned, tuple(aliases))


def _parts(path: Path) -> list[Path]:
    """A model's files: every part of a split model, else the file."""
    found = re.match(r"^(.*)-00001-of-(\d{5})\.gguf$", path.name, re.IGNORECASE)
    if found is None:
        return [path]
    total = int(found[2])
    return [path.with_name(f"{found[1]}-{i:05d}-of-{found[2]}.gguf") for i in range(1, total + 1)]


class ModelLoadFailed(Exception):
    """A model could not be loaded (or is within its back-off after a failure)."""

    def __init__(self, model: str, reason: str, retry_after: float | None = None) -> None:
        super().__init__(f"{model}: {reason}")
        self.model = model
        self.reason = reason
        self.retry_after = retry_after

    def error(self) -> OpenAIError:
        retry = None if self.retry_after is None else max(1, math.ceil(self.retry_after))
        return model_load_failed(self.model, self.reason, retry)


#: Load seconds: a small test model loads in well under a second, a large one from a cold
#: disk in minutes.
_LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0)


class HostMetrics:
    """The host's figures in ``registry``: loads by model and outcome (``ok``, ``failed``,
    ``timeout``), unloads by model, load seconds, and the loaded models and their estimated
    bytes (the budget's view)."""

    def __init__(self, registry: CollectorRegistry, host: ModelHost) -> None:
        self.loads = Counter(
            "llmtrio_model_loads",
            "Model loads by model and outcome (ok, failed, timeout).",
            ["model_name", "outcome"],
            registry=registry,
        )
        self.unloads = Counter(
            "llmtrio_model_unloads", "Model unloads by model.", ["model_name"], registry=registry
        )
        self.load_seconds = Histogram(
            "llmtrio_model_load_seconds",
            "Seconds a model's load took (successful loads).",
            ["model_name"],
            buckets=_LOAD_BUCKETS,
            registry=registry,
        )
        Gauge(
            "llmtrio_models_loaded", "Models loaded (pinned ones included).", registry=registry
        ).set_function(lambda: float(host.loaded_count()))
        Gauge(
            "llmtrio_models_loaded_bytes",
            "The estimated bytes of the models loading, loaded or unloading.",
            registry=registry,
        ).set_function(lambda: float(host.reserved_bytes()))


@attrs.define
class _Waiters:
    done: trio.Event = attrs.field(factory=trio.Event)
    failure: ModelLoadFailed | None = None


def _set_event() -> trio.Event:
    event = trio.Event()
    event.set()
    return event


@attrs.define(eq=False)
class Claims:
    """A model's ring links as its unloads see them (``ModelHost.claims``): each link claims
    inside a scope of :meth:`claiming`, which an unload cancels; the unload frees the model
    once no link is inside one (each has withdrawn its claims)."""

    #: How many unloads have begun: a stream claimed before the latest began is handed back.
    unloads: int = 0
    #: Set while no unload is under way: a link claims only then.
    settled: trio.Event = attrs.field(factory=_set_event)
    _scopes: set[trio.CancelScope] = attrs.field(factory=set)
    _left: trio.Event = attrs.field(factory=trio.Event)

    @contextmanager
    def claiming(self) -> Iterator[trio.CancelScope]:
        """Register one claim: claim inside the scope yielded (``with scope:``), which is
        cancelled when an unload begins (at once when one is under way); withdraw before
        leaving the block, which the unload waits for."""
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


@attrs.define(eq=False)
class ModelHost:
    """The loaded set of a worker's on-demand models; run :meth:`run` in a nursery, then
    :meth:`acquire` and :meth:`release` around each request.

    Resource handling: cancelling :meth:`run` unloads every model it loaded."""

    models: dict[str, HostedModel]
    config: HostConfig = attrs.field(factory=HostConfig)
    _policy: LoadPolicy = attrs.field(init=False)
    _engines: dict[str, ModelEngine] = attrs.field(init=False, factory=dict)
    _unload: dict[str, trio.Event] = attrs.field(init=False, factory=dict)
    _waiters: dict[str, _Waiters] = attrs.field(init=False, factory=dict)
    _claims: dict[str, Claims] = attrs.field(init=False, factory=dict)
    _wake: trio.Event = attrs.field(init=False, factory=trio.Event)
    #: Loads started and how each ended, by model: (model, "ok" | "failed").
    loads: list[tuple[str, str]] = attrs.field(init=False, factory=list)
    unloads: list[str] = attrs.field(init=False, factory=list)
    metrics: HostMetrics | None = attrs.field(init=False, default=None)

    def __attrs_post_init__(self) -> None:
        self._policy = LoadPolicy(
            max_models=self.config.max_loaded_models,
            memory_bytes=self.config.memory_budget_mib << 20,
            default_keep_alive=self.config.keep_alive,
        )
        self._claims = {name: Claims() for name in self.models}

    @classmethod
    def of(
        cls,
        models: Sequence[HostedModel],
        config: HostConfig,
        registry: CollectorRegistry | None = None,
    ) -> ModelHost:
        """A host of ``models``; its figures in ``registry`` when given."""
        host = cls({model.name: model for model in models}, config)
        if registry is not None:
            host.metrics = HostMetrics(registry, host)
        return host

    def loaded_count(self) -> int:
        return self._policy.loaded_count()

    def claims(self, name: str) -> Claims:
        """How the links of ``name`` claim so that its unloads wait for them (the module)."""
        return self._claims[name]

    def pin(self, name: str, cost: ModelCost) -> None:
        """Count a model loaded at start outside the host (``--model``) in the budget."""
        self._policy.pin(name, cost.total, trio.current_time())

    def state(self, name: str) -> ModelState | None:
        return self._policy.state(name)

    def engine(self, name: str) -> ModelEngine | None:
        return self._engines.get(name) if self.state(name) == "loaded" else None

    def unload_in(self, name: str) -> int:
        """Whole seconds until the idle loaded ``name`` unloads: -1 never (pinned), 0 when
        busy (or not loaded)."""
        if self.models[name].pinned:
            return -1
        if self._policy.inflight(name) or self.state(name) != "loaded":
            return 0
        expires = self._policy.expires(name)
        if expires == math.inf:
            return -1
        return max(1, math.ceil(expires - trio.current_time()))

    def reserved_bytes(self) -> int:
        return self._policy.reserved

    def free_bytes(self) -> int:
        """The memory budget a load could still have without evicting: -1 without a bound
        (a heartbeat's ``free_bytes``: the ring asks the worker stating the most to load)."""
        free = self._policy.free
        return -1 if free is None else free

    def _kick(self) -> None:
        self._wake.set()

    async def acquire(self, name: str) -> ModelEngine:
        """The loaded engine of ``name``, loading it first if need be (joining a load under
        way); the request counts as in flight on it until :meth:`release`.

        Error handling: :class:`ModelLoadFailed` when the load fails, times out, cannot fit
        the budget, or failed recently (within its back-off)."""
        model = self.models[name]
        while True:
            engine = self.engine(name)
            if engine is not None:
                self._policy.begin(name, trio.current_time())
                return engine
            refusal = self._policy.want(
                name,
                model.cost.total,
                trio.current_time(),
                pinned=model.pinned,
                keep_alive=model.keep_alive,
            )
            if refusal is not None:
                raise ModelLoadFailed(name, refusal.reason, refusal.retry_after)
            waiters = self._waiters.setdefault(name, _Waiters())
            self._kick()
            await waiters.done.wait()
            if waiters.failure is not None:
                raise waiters.failure

    def release(self, name: str, keep_alive: float | None = None) -> None:
        """A request on ``name`` ended; its ``keep_alive`` (``None``: the model's) sets when
        the idle model unloads (never for a pinned model)."""
        self._policy.end(name, trio.current_time(), keep_alive)
        if self._policy.state(name) == "unloading" and not self._policy.inflight(name):
            self._unload[name].set()  # a failed engine's last request ended
        self._kick()

    def unload(self, name: str) -> bool:
        """Unload an idle, unpinned loaded model now; ``False`` when it is not one."""
        if not self._policy.unload(name):
            return False
        self._begin_unload(name)
        return True

    def _begin_unload(self, name: str) -> None:
        """The policy made ``name`` unloading: its links stop claiming; its engine is freed
        once they have withdrawn (and nothing is in flight on it)."""
        self._claims[name].begin_unload()
        if not self._policy.inflight(name):
            self._unload[name].set()

    def _answer(self, name: str, failure: ModelLoadFailed | None) -> None:
        waiters = self._waiters.pop(name, None)
        if waiters is not None:
            waiters.failure = failure
            waiters.done.set()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Decide and do: start loads and unloads as the policy says, when something changed
        or a keep-alive runs out."""
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                self._wake = trio.Event()
                actions = self._policy.step(trio.current_time())
                for refusal in actions.refuse:
                    self._answer(refusal.model, ModelLoadFailed(refusal.model, refusal.reason))
                for name in actions.unload:
                    self._begin_unload(name)
                for name in actions.load:
                    self._unload[name] = trio.Event()
                    nursery.start_soon(self._hold, name)
                with trio.move_on_at(self._policy.next_expiry()):
                    await self._wake.wait()

    def _load_failed(self, name: str, reason: str, outcome: str = "failed") -> None:
        logger.error("cannot load %s: %s", name, reason)
        self.loads.append((name, "failed"))
        if self.metrics is not None:
            self.metrics.loads.labels(name, outcome).inc()
        self._policy.loaded(name, trio.current_time(), error=reason)
        self._answer(name, ModelLoadFailed(name, reason))
        self._kick()

    async def _serve_until_unloaded(self, name: str, engine: ModelEngine, started: float) -> None:
        """The model is loaded: hand it to its waiters, keep it until told to unload."""
        self._engines[name] = engine
        self.loads.append((name, "ok"))
        self._policy.loaded(name, trio.current_time())
        if self.metrics is not None:
            self.metrics.loads.labels(name, "ok").inc()
            self.metrics.load_seconds.labels(name).observe(trio.current_time() - started)
        logger.info("loaded %s in %.2fs", name, trio.current_time() - started)
        self._answer(name, None)
        self._kick()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._watch_engine, name, engine)
                await self._unload[name].wait()
                nursery.cancel_scope.cancel()
            with trio.move_on_after(WITHDRAW_TIMEOUT_S) as waited:
                await self._claims[name].withdrawn()
            if waited.cancelled_caught:
                logger.warning("unloading %s: its links did not withdraw their claims", name)
        finally:
            del self._engines[name]

    async def _watch_engine(self, name: str, engine: ModelEngine) -> None:
        """A loaded engine whose decode loop dies: the model unloads (once what was in
        flight on it has failed and ended) and is backed off as a failed load."""
        failure = await engine.wait_failed()
        if self._policy.state(name) != "loaded":
            return  # unloading already: nothing more to do
        reason = f"its engine failed while loaded ({failure})"
        logger.error("%s: %s; unloading it", name, reason)
        self._policy.failed(name, trio.current_time(), reason)
        self._begin_unload(name)
        self._kick()

    async def _hold(self, name: str) -> None:
        """Load ``name``, keep it until told to unload, then free it."""
        model = self.models[name]
        logger.info("loading %s (about %d MiB)", name, model.cost.total >> 20)
        started = trio.current_time()
        loaded = False
        try:
            # The deadline is the load's alone: it is lifted once the model is loaded.
            with trio.CancelScope(deadline=started + self.config.load_timeout) as load:
                async with open_engine(model.config) as engine:
                    loaded = True
                    load.deadline = math.inf
                    await self._serve_until_unloaded(name, engine, started)
        except (EngineError, OSError) as exc:
            if loaded:
                raise
            self._load_failed(name, str(exc).splitlines()[0])
            return
        if not loaded:
            timeout = f"the load took more than {self.config.load_timeout:g}s"
            self._load_failed(name, timeout, "timeout")
            return
        self.unloads.append(name)
        self._policy.unloaded(name)
        self._claims[name].unloaded()
        if self.metrics is not None:
            self.metrics.unloads.labels(name).inc()
        logger.info("unloaded %s", name)
        self._kick()


async def _unload(host: ModelHost, name: str, claimed: ClaimedStream) -> None:
    """``POST /models/unload``: an idle loaded model unloads now; a pinned one, one with
    requests in flight or one loading is refused (400, naming why)."""
    state = host.state(name)
    if state is None:
        await respond_state(claimed, name, "unloaded")
    elif host.unload(name) or state == "unloading":
        await respond_state(claimed, name, "unloading")
    elif host.models[name].pinned:
        await respond_error(claimed, pinned(name))
    else:
        why = "is loading" if state == "loading" else "has requests in flight"
        await respond_error(
            claimed,
            invalid_request(f"The model {name!r} {why}: it is not unloaded.", param="model"),
        )


def request_keep_alive(body: bytes) -> float | None:
    """A request body's ``keep_alive`` (Ollama's field) in seconds; ``None`` when absent.

    Error handling: :class:`OpenAIError` 400 naming ``keep_alive``."""
    try:
        fields = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(fields, dict) or fields.get("keep_alive") is None:
        return None
    try:
        return keep_alive_seconds(fields["keep_alive"])
    except ValueError as exc:
        raise invalid_request(f"'keep_alive' {exc}", param="keep_alive") from None


async def serve_hosted_link(
    host: ModelHost,
    name: str,
    link: RingLink,
    *,
    metrics: WorkerMetrics | None = None,
    limits: RequestLimits | None = None,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the ring link of the on-demand model ``name`` until cancelled (see the
    module): while it is not loaded, claim every stream parked for it, each waiting on
    its load; once loaded, claim while one of its ``max_inflight`` slots is free.

    Resource handling: when the model begins to unload, the link's claims are withdrawn
    (waiting for every ingress to answer) and a stream claimed before is handed back
    unanswered (``release``); the unload waits for that.

    Error handling: a request whose model cannot be loaded is answered 503
    ``model_load_failed`` naming the model and the reason; the link goes on."""
    # ``room`` bounds what the link holds (the ring's bound: the attach's max_inflight,
    # waiters on a load included); ``slots`` bounds what runs once loaded.
    room = trio.Semaphore(link.max_inflight)
    slots = trio.Semaphore(host.models[name].config.max_inflight)
    waiting = 0

    def heartbeat() -> None:
        engine = host.engine(name)
        if engine is None:
            state = "loading" if host.state(name) == "loading" else "unloaded"
            link.heartbeat(
                Heartbeat(
                    waiting,
                    slots.value + waiting,
                    slots.value,
                    model_state=state,
                    free_bytes=host.free_bytes(),
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
                kv_used=capacity.kv_used,
                kv_total=capacity.kv_total,
                model_state="loaded",
                model_bytes=host.models[name].cost.total,
                unload_in_s=host.unload_in(name),
                free_bytes=host.free_bytes(),
            )
        )

    async def beat() -> None:
        while True:
            heartbeat()
            await trio.sleep(HEARTBEAT_INTERVAL_S)

    def hand_back(claimed: ClaimedStream) -> None:
        """Give back a stream claimed before the model began to unload: parked again at
        the front, for another worker or the next load."""
        logger.info("request %s handed back: %s is unloading", _request_id(claimed), name)
        with contextlib.suppress(ProtocolError):  # its ingress is gone, and requeued it
            claimed.release()

    async def handle(claimed: ClaimedStream, slot: bool, unloads: int) -> None:
        nonlocal waiting
        try:
            with claimed:
                if path_of(claimed) == MODELS_UNLOAD_PATH:
                    await _unload(host, name, claimed)
                    return
                if claims.unloads != unloads:
                    hand_back(claimed)
                    return
                try:
                    keep_alive = request_keep_alive(claimed.body)
                except OpenAIError as refused:
                    await claimed.respond(refused.status, JSON_HEADERS, refused.body())
                    return
                waiting += 1
                try:
                    engine = await host.acquire(name)
                except ModelLoadFailed as failure:
                    heartbeat()  # the ring hears the load failed before the answers
                    error = failure.error()
                    await claimed.respond(
                        error.status, (*JSON_HEADERS, *error.headers), error.body()
                    )
                    return
                finally:
                    waiting -= 1
                if not slot:  # it waited on the load: the ring hears it loaded first
                    heartbeat()
                if path_of(claimed) == MODELS_LOAD_PATH:
                    host.release(name, keep_alive)
                    await respond_state(claimed, name, "loaded")
                    return
                try:
                    await _serve_stream(engine, claimed, metrics, limits or RequestLimits())
                finally:
                    host.release(name, keep_alive)
                    # The ring hears when the now idle model unloads at once, not at the
                    # next beat (the engine's own capacity change came before the release).
                    heartbeat()
        except Exception:
            logger.exception("request %s: the worker failed", _request_id(claimed))
        finally:
            room.release()
            if slot:
                slots.release()

    async def claim() -> tuple[ClaimedStream, bool]:
        """A stream, and whether it holds one of the loaded model's slots."""
        await room.acquire()
        slot = host.state(name) == "loaded"
        try:
            if slot:
                await slots.acquire()
            try:
                return await link.claim(), slot
            except BaseException:
                if slot:
                    slots.release()
                raise
        except BaseException:
            room.release()
            raise

    claims = host.claims(name)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(beat)
        task_status.started()
        while True:
            await claims.settled.wait()
            if host.state(name) != "loaded":
                # A claim that may ask for a load waits until every earlier claim taken
                # back is answered: no stream meant for the model before it unloaded fills it.
                await link.wait_withdrawn()
            unloads = claims.unloads
            with claims.claiming() as scope:
                taken: tuple[ClaimedStream, bool] | None = None
                with scope:
                    taken = await claim()
                if scope.cancel_called:
                    # The model began to unload: the claims are taken back (a stream
                    # assigned in the race given back), the ring hears it unloaded, and the
                    # unload waits until every ingress has answered.
                    if taken is not None:
                        hand_back(taken[0])
                        room.release()
                        if taken[1]:
                            slots.release()
                    heartbeat()
                    await link.wait_withdrawn()
                    continue
            assert taken is not None
            nursery.start_soon(handle, *taken, unloads)
