"""The composition root of ``llmtrio serve``: the ingress's bring-up (``_ingress``) with one
local worker (an engine attached to the in-process ring) started in it."""

from __future__ import annotations

import logging

import trio
from prometheus_client import CollectorRegistry

from ._ingress import serve_ring_ingress, until_signalled
from .engine import EngineConfig, EngineFailedError, open_engine
from .ring import ControlConfig, Ring
from .web import ServeConfig
from .worker import RequestLimits, WorkerMetrics, serve_link

__all__ = ["serve", "serve_until_signalled"]

logger = logging.getLogger("llmtrio.serve")


async def serve(
    engine_config: EngineConfig,
    config: ServeConfig,
    *,
    shutdown: trio.Event,
    control: ControlConfig | None = None,
    limits: RequestLimits | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Load the model, attach a local worker to a new ring, and serve HTTP until ``shutdown``
    is set; ``task_status.started`` gets the bound addresses (``http://127.0.0.1:PORT``).
    The ingress's ``/metrics`` shows the local engine's figures too; request bodies are
    checked against ``limits``.

    Resource handling: after ``shutdown``, no new connection is accepted; in-flight
    responses get ``config.graceful_timeout`` seconds, then are cancelled (which cancels
    their generations); then the worker stops and the model is freed.

    Error handling: :class:`EngineFailedError` when the engine's decode loop dies: the local
    worker detaches at once (``/health`` answers 503 with the reason), the server shuts down
    as on ``shutdown``, then this raises.
    """
    async with open_engine(engine_config) as engine:
        ring = Ring.from_config(config.ring)
        registry = CollectorRegistry()
        # The ingress exports the picker's gauges for the whole ring, this engine included.
        metrics = WorkerMetrics(registry, engine, picker_gauges=False)
        failure: EngineFailedError | None = None

        async def local_worker(*, task_status: trio.TaskStatus[None]) -> None:
            nonlocal failure
            try:
                async with ring.attach(
                    "local", engine.capacity().max_inflight, models=[engine.model_name]
                ) as link:
                    await serve_link(
                        engine, link, metrics=metrics, limits=limits, task_status=task_status
                    )
            except EngineFailedError as exc:
                failure = exc
                logger.critical("%s: the server stops", exc)
                shutdown.set()

        async def start_local_worker(ring: Ring, nursery: trio.Nursery) -> None:
            await nursery.start(local_worker)

        await serve_ring_ingress(
            config,
            control,
            model_name=engine.model_name,
            shutdown=shutdown,
            ring=ring,
            registry=registry,
            limits=limits,
            workers=start_local_worker,
            task_status=task_status,
        )
    if failure is not None:
        raise failure


async def serve_until_signalled(
    engine_config: EngineConfig,
    config: ServeConfig,
    control: ControlConfig | None = None,
    limits: RequestLimits | None = None,
) -> None:
    """``serve`` with SIGINT/SIGTERM as the shutdown trigger; a second signal stops at once.

    Error handling: :class:`EngineFailedError` as ``serve`` raises it (the command exits
    non-zero)."""
    failure: EngineFailedError | None = None

    async def run(shutdown: trio.Event) -> None:
        nonlocal failure
        try:
            await serve(engine_config, config, shutdown=shutdown, control=control, limits=limits)
        except EngineFailedError as exc:
            failure = exc

    await until_signalled(run, graceful_timeout=config.graceful_timeout)
    if failure is not None:
        raise failure
