"""The composition root of an ingress without an engine (``llmtrio serve --no-local-worker``):
a ring, its control listener for remote workers, and the HTTP ingress. Imports neither the
engine nor the worker, so llama.cpp is not even loaded."""

from __future__ import annotations

import logging
import signal
from collections.abc import Awaitable, Callable
from functools import partial

import trio

from .ring import ControlConfig, Ring, serve_control
from .web import ServeConfig, serve_ingress

__all__ = ["serve_ring_ingress", "until_signalled"]

logger = logging.getLogger("llmtrio.serve")


async def serve_ring_ingress(
    config: ServeConfig,
    control: ControlConfig,
    *,
    model_name: str,
    shutdown: trio.Event,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve HTTP in front of a ring that only remote workers serve, until ``shutdown``;
    ``task_status.started`` gets the HTTP addresses, then the control address.

    Resource handling: after ``shutdown`` the HTTP side drains for ``graceful_timeout``,
    then the control listener closes, which detaches every worker.
    """
    ring = Ring(max_streams=config.ring_streams, park_timeout=config.park_timeout)
    async with trio.open_nursery() as nursery:
        address = await nursery.start(serve_control, ring, control)
        async with trio.open_nursery() as web:
            binds = await web.start(
                partial(serve_ingress, ring, config, model_name=model_name, shutdown=shutdown)
            )
            task_status.started([*binds, address])
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
