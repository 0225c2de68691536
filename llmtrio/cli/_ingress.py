"""The composition root of an ingress: a ring, its control listener for remote workers, and
the HTTP ingress (``llmtrio serve --no-local-worker`` is this alone; ``llmtrio serve`` adds a
local worker, ``server.py``). Imports neither the engine nor the worker, so llama.cpp is not
even loaded."""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable
from functools import partial

import trio
from prometheus_client import CollectorRegistry

from ..api import RequestLimits
from ..ring import ControlConfig, Ring, serve_control
from ..web import ServeConfig, serve_ingress

__all__ = ["serve_ring_ingress", "until_signalled"]

logger = logging.getLogger("llmtrio.serve")


async def serve_ring_ingress(
    config: ServeConfig,
    control: ControlConfig | None,
    *,
    model_name: str,
    shutdown: trio.Event,
    ring: Ring | None = None,
    registry: CollectorRegistry | None = None,
    limits: RequestLimits | None = None,
    workers: Callable[[Ring, trio.Nursery], Awaitable[None]] | None = None,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve HTTP in front of ``ring`` (a new one unless given) until ``shutdown``;
    ``task_status.started`` gets the HTTP addresses, then the control address (with
    ``control``: the listener remote workers attach to). ``workers(ring, nursery)`` starts
    the workers of this process (``llmtrio serve``'s local one) in ``nursery`` before the
    listeners open; ``limits`` are the workers' request limits (``/openapi.json`` states them).

    Resource handling: after ``shutdown`` the HTTP side drains for ``graceful_timeout``,
    then the control listener closes (which detaches every remote worker) and the local
    workers are cancelled.
    """
    ring = ring or Ring.from_config(config.ring)
    async with trio.open_nursery() as nursery:
        if workers is not None:
            await workers(ring, nursery)
        addresses = [] if control is None else [await nursery.start(serve_control, ring, control)]
        async with trio.open_nursery() as web:
            binds = await web.start(
                partial(
                    serve_ingress,
                    ring,
                    config,
                    model_name=model_name,
                    shutdown=shutdown,
                    registry=registry,
                    limits=limits,
                )
            )
            task_status.started([*binds, *addresses])
        # hypercorn returns once in-flight responses drained (or graceful_timeout passed).
        nursery.cancel_scope.cancel()


async def until_signalled(
    run: Callable[[trio.Event], Awaitable[None]], *, graceful_timeout: float
) -> None:
    """Run ``run(shutdown)`` with SIGINT/SIGTERM setting ``shutdown``; a second signal stops
    at once."""
    shutdown = trio.Event()
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                async for signum in signals:
                    if shutdown.is_set():
                        logger.warning("second signal: stopping now")
                        nursery.cancel_scope.cancel()
                        return
                    logger.info(
                        "%s: finishing in-flight requests (up to %.0fs); again to stop now",
                        signal.Signals(signum).name,
                        graceful_timeout,
                    )
                    shutdown.set()

            nursery.start_soon(watch)
            await run(shutdown)
            nursery.cancel_scope.cancel()
