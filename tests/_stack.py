"""The whole serving stack (engine, ring, local worker, HTTP ingress) in the test's own Trio
run, so a test can reach the engine and the ring while it talks HTTP to the server."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial

import attrs
import trio
from prometheus_client import CollectorRegistry

from llmtrio.engine import Engine, EngineConfig, EngineFailedError
from llmtrio.ring import Ring
from llmtrio.web import ServeConfig, serve_ingress
from llmtrio.worker import RequestLimits, WorkerMetrics, serve_link

__all__ = ["Stack", "open_stack"]


@attrs.define
class Stack:
    engine: Engine
    ring: Ring
    url: str
    #: The registry ``GET /metrics`` shows (the ingress's and the local worker's metrics).
    registry: CollectorRegistry
    #: Set when the local worker stopped because the engine died (as ``serve`` does).
    failure: EngineFailedError | None = None
    detached: trio.Event = attrs.field(factory=trio.Event)

    def idle(self) -> bool:
        """Nothing parked, nothing being served, nothing in the engine, and every completion
        request counted by the ingress."""
        stats = self.ring.stats()
        return (
            self.registry.get_sample_value("llmtrio_requests_in_progress") == 0
            and stats.parked == 0
            and stats.assigned + stats.responding == 0
            and self.engine.capacity().inflight == 0
        )

    async def wait_idle(self) -> None:
        """Wait (a minute at most) until :meth:`idle`; fails with what is still held."""
        with trio.move_on_after(60):
            while not self.idle():
                with trio.move_on_after(0.05):  # the ring's counts change without an event
                    await self.engine.capacity_changed()
        assert self.idle(), (self.ring.stats(), self.engine.capacity())


@asynccontextmanager
async def open_stack(
    engine_config: EngineConfig, config: ServeConfig, limits: RequestLimits | None = None
) -> AsyncIterator[Stack]:
    """``llmtrio serve``'s stack, put together as ``llmtrio.cli.serve`` does, on a free
    loopback port; torn down on exit."""
    async with Engine.open(engine_config) as engine:
        ring = Ring(max_streams=config.ring.max_streams)
        registry = CollectorRegistry()
        metrics = WorkerMetrics(registry, engine, picker_gauges=False)
        async with trio.open_nursery() as nursery:
            stack: Stack | None = None

            async def worker(*, task_status: trio.TaskStatus[None]) -> None:
                try:
                    async with ring.attach("local", engine_config.max_inflight) as link:
                        await serve_link(
                            engine, link, metrics=metrics, limits=limits, task_status=task_status
                        )
                except EngineFailedError as exc:
                    assert stack is not None
                    stack.failure = exc
                    stack.detached.set()

            await nursery.start(worker)
            shutdown = trio.Event()
            binds = await nursery.start(
                partial(
                    serve_ingress,
                    ring,
                    config,
                    model_name="test",
                    shutdown=shutdown,
                    registry=registry,
                )
            )
            stack = Stack(engine, ring, binds[0], registry)
            try:
                yield stack
            finally:
                nursery.cancel_scope.cancel()
