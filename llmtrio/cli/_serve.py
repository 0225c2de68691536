"""The composition root of ``llmtrio serve``: the ingress's bring-up (``_ingress``), alone
or with a local worker per model (an engine attached to the in-process ring) started in it.

:func:`serving` makes that choice. The engine and the worker (and llama.cpp with them) are
imported only where a local worker runs, so that an ingress alone never loads them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from functools import partial
from typing import TYPE_CHECKING

import attrs
import trio
from prometheus_client import CollectorRegistry

from ..api import RequestLimits
from ..ring import ControlConfig, Ring
from ..web import ServeConfig
from ._ingress import serve_ring_ingress, until_signalled

if TYPE_CHECKING:
    from ..engine import EmbeddingEngine, Engine, EngineConfig, EngineFailedError
    from ..worker import HostConfig, HostedModel, ModelHost, WorkerMetrics
    from ._catalog import CatalogModel

__all__ = ["serve", "serve_until_signalled", "serving"]

logger = logging.getLogger("llmtrio.serve")


async def serve(
    engine_config: EngineConfig | Sequence[EngineConfig],
    config: ServeConfig,
    *,
    shutdown: trio.Event,
    control: ControlConfig | None = None,
    limits: RequestLimits | None = None,
    on_demand: Sequence[CatalogModel] = (),
    host: HostConfig | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Load each model (one engine per config, each with its own slots), attach a local
    worker per engine to a new ring, and serve HTTP until ``shutdown`` is set;
    ``task_status.started`` gets the bound addresses (``http://127.0.0.1:PORT``). Each local
    worker claims for its own model only, so one model's full queue or failed request never
    touches another's. With one model and no ``config.default_model``, that model is the
    default (a client naming any model, as clients of llama.cpp's server do, is served by it).
    The ingress's ``/metrics`` shows every engine's figures, each labelled with its
    ``model_name``; request bodies are checked against ``limits``.

    The ``on_demand`` catalog models are listed from the start, each on its own local
    worker, and loaded on their first request within ``host``'s budget
    (``llmtrio.worker.ModelHost``; those whose ``load`` says so at start, too); the
    ``--model`` engines count in that budget and are never unloaded.

    Resource handling: after ``shutdown``, no new connection is accepted; in-flight
    responses get ``config.graceful_timeout`` seconds, then are cancelled (which cancels
    their generations); then the workers stop and the models are freed.

    Error handling: :class:`EngineFailedError` when an engine's decode loop dies: its local
    worker detaches at once (``/health`` answers 503 with the reason), the server shuts down
    as on ``shutdown``, then this raises. A llama.cpp abort takes the whole process down.
    """
    from ..engine import EngineConfig, EngineFailedError, open_engine, oversubscription, read_cores
    from ..worker import HostConfig, HostedModel, ModelHost, Pinned, WorkerMetrics, serve_link

    configs = [engine_config] if isinstance(engine_config, EngineConfig) else list(engine_config)
    crowded = oversubscription(sum(each.threads for each in configs), read_cores())
    if crowded is not None:
        logger.warning("%s", crowded)
    async with AsyncExitStack() as stack:
        engines = [await stack.enter_async_context(open_engine(each)) for each in configs]
        hosted = [HostedModel.of(m.name, m.config, m.keep_alive, m.aliases) for m in on_demand]
        if len(engines) == 1 and not hosted and config.default_model is None:
            config = attrs.evolve(config, default_model=engines[0].model_name)
        ring = Ring.from_config(config.ring)
        registry = CollectorRegistry()
        model_host = ModelHost.of(hosted, host or HostConfig(), registry if hosted else None)
        books = {
            engine.model_name: model_host.pin(
                engine.model_name, HostedModel.of(engine.model_name, each).cost, each
            )
            for engine, each in zip(engines, configs, strict=True)
        }
        # Every engine's figures, labelled with its model's name; the ingress exports the
        # picker's gauges for the whole ring, these engines included.
        metrics = WorkerMetrics(
            registry, engines, models=[m.name for m in hosted], picker_gauges=False
        )
        failure: EngineFailedError | None = None

        async def local_worker(
            engine: Engine | EmbeddingEngine, *, task_status: trio.TaskStatus[None]
        ) -> None:
            nonlocal failure
            worker_id = "local" if len(engines) == 1 else f"local-{engine.model_name}"
            try:
                async with ring.attach(
                    worker_id,
                    engine.capacity().max_inflight,
                    models=[engine.model_name],
                    kinds=[engine.kind],
                    vision=[engine.model_name] if engine.takes_images else [],
                    contexts=[engine.context_length],
                    audio=[engine.model_name] if engine.takes_audio else [],
                ) as link:
                    await serve_link(
                        Pinned(engine, adapters=books[engine.model_name]),
                        link,
                        metrics=metrics,
                        limits=limits,
                        task_status=task_status,
                    )
            except EngineFailedError as exc:
                failure = exc
                logger.critical("%s: the server stops", exc)
                shutdown.set()

        async def start_local_workers(ring: Ring, nursery: trio.Nursery) -> None:
            for engine in engines:
                await nursery.start(local_worker, engine)
            if hosted:
                await _start_hosted(ring, nursery, model_host, hosted, metrics, limits)
            for model in on_demand:
                if model.load:
                    nursery.start_soon(_preload, model_host, model.name)

        await serve_ring_ingress(
            config,
            control,
            model_name=engines[0].model_name if len(engines) == 1 else "",
            shutdown=shutdown,
            ring=ring,
            registry=registry,
            limits=limits,
            workers=start_local_workers,
            task_status=task_status,
        )
    if failure is not None:
        raise failure


async def _start_hosted(
    ring: Ring,
    nursery: trio.Nursery,
    host: ModelHost,
    hosted: Sequence[HostedModel],
    metrics: WorkerMetrics,
    limits: RequestLimits | None,
) -> None:
    """The host's loop and a local worker per on-demand model, each on its own link."""
    from ..worker import LOAD_WAITERS, OnDemand, serve_link

    await nursery.start(host.run)

    async def hosted_worker(model: HostedModel, *, task_status: trio.TaskStatus[None]) -> None:
        async with ring.attach(
            f"local-{model.name}",
            max(model.config.max_inflight, LOAD_WAITERS),
            models=model.names,
            kinds=[model.kind] * len(model.names),
            contexts=[model.context_length] * len(model.names),
        ) as link:
            await serve_link(
                OnDemand(host, model.name),
                link,
                metrics=metrics,
                limits=limits,
                task_status=task_status,
            )

    for model in hosted:
        await nursery.start(hosted_worker, model)


async def _preload(host: ModelHost, name: str) -> None:
    """Load ``name`` at start (its ``load = true``); then it idles as any loaded model."""
    from ..worker import ModelLoadFailed

    try:
        await host.acquire(name)
    except ModelLoadFailed as exc:
        logger.error("cannot load %s at start: %s", name, exc.reason)
        return
    host.release(name)


async def serve_until_signalled(
    engine_config: EngineConfig | Sequence[EngineConfig],
    config: ServeConfig,
    control: ControlConfig | None = None,
    limits: RequestLimits | None = None,
    on_demand: Sequence[CatalogModel] = (),
    host: HostConfig | None = None,
) -> None:
    """``serve`` with SIGINT/SIGTERM as the shutdown trigger; a second signal stops at once.

    Error handling: :class:`EngineFailedError` as ``serve`` raises it (the command exits
    non-zero)."""
    from ..engine import EngineFailedError

    failure: EngineFailedError | None = None

    async def run(shutdown: trio.Event) -> None:
        nonlocal failure
        try:
            await serve(
                engine_config,
                config,
                shutdown=shutdown,
                control=control,
                limits=limits,
                on_demand=on_demand,
                host=host,
            )
        except EngineFailedError as exc:
            failure = exc

    await until_signalled(run, graceful_timeout=config.graceful_timeout)
    if failure is not None:
        raise failure


def serving(
    config: ServeConfig,
    control: ControlConfig | None,
    limits: RequestLimits | None,
    *,
    local_worker: bool,
    engine_configs: Callable[[], Sequence[EngineConfig]],
    model_name: str = "",
    on_demand: Callable[[], Sequence[CatalogModel]] = tuple,
    host: Callable[[], HostConfig | None] = lambda: None,
) -> Callable[[], Awaitable[None]]:
    """What ``llmtrio serve`` runs (under ``trio.run``) until SIGINT or SIGTERM, a second
    one stopping at once: with ``local_worker``, the ingress and a local worker per model of
    ``engine_configs()`` (:func:`serve_until_signalled`); else the ingress alone under
    ``model_name``, served by the remote workers that attach to ``control``'s listener
    (``engine_configs`` is never called and llama.cpp never loaded).

    Error handling: ``ValueError``, here, where no worker could ever serve (no local worker
    and no ``control``); the function returned raises :class:`EngineFailedError` as
    :func:`serve` does.
    """
    if local_worker:
        return partial(
            serve_until_signalled,
            engine_configs(),
            config,
            control,
            limits,
            on_demand(),
            host(),
        )
    if control is None:
        raise ValueError(
            "an ingress with no local worker needs a control listener (or nothing serves)"
        )

    async def ingress(shutdown: trio.Event) -> None:
        await serve_ring_ingress(
            config, control, model_name=model_name, shutdown=shutdown, limits=limits
        )

    return partial(until_signalled, ingress, graceful_timeout=config.graceful_timeout)
