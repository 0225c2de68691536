"""Models on demand: a worker's catalog models, each loaded on its first request and
unloaded when idle, within the memory budget (the policy is ``_load_policy.LoadPolicy``; this
is its I/O shell). Each model is served on its own ring link by the one link loop
(``_link.serve_link``), given the model as an ``_on_demand.OnDemand`` policy.

Loading: the first request that asks for a model starts its load; every other request for
it joins that load (one load however many arrive at once). A load that fails, times out or
cannot fit the budget answers every request waiting on it with :class:`ModelLoadFailed`, and
is backed off (a later request within the back-off is refused at once, with its reason).

Unloading: before a model unloads, its links stop claiming for it. Each link claims inside
a scope the unload cancels (``_link.Claims.claiming``); the link withdraws its unfilled
claims on every ingress, waits until each ingress has answered (``RingLink.wait_withdrawn``),
beats ``unloaded`` at once, and hands back (``release``: parked again at the front, for
another worker or the next load) a stream assigned in the race, or claimed before the unload
began and not yet started; the engine is freed only then. So no request reaches a model that
is gone, and none claimed before an unload loads the model again. A model whose engine dies
(its decode loop fails) unloads the same way once its failed requests have ended (503 in
their route's family), and is backed off as a failed load: a later request loads it again.

Threads: each model's engine has the ``threads`` of its config; the loaded set shares the
machine's cores as the engines' threads contend (no model's threads are changed as others
load or unload; give each model ``threads`` so that the loaded set's sum fits the cores).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence

import attrs
import trio
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from ..engine import EngineError, open_engine
from ._hosted import HostConfig, HostedModel, ModelLoadFailed
from ._link import Claims
from ._load_policy import LoadPolicy, ModelCost, ModelState
from ._shapes import ModelEngine

__all__ = ["WITHDRAW_TIMEOUT_S", "HostMetrics", "ModelHost"]

#: The longest an unload waits for its links to withdraw their claims (each ingress answers
#: within a round trip, or is given up after the dial's ``ingress_timeout``, 10 s).
WITHDRAW_TIMEOUT_S = 30.0

logger = logging.getLogger("llmtrio.worker")

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
