"""``llmtrio serve``: an engine, an in-process ring with one local worker, and the HTTP
ingress, in one process."""

from __future__ import annotations

import ipaddress
import logging
import signal
from functools import partial
from pathlib import Path

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from ..engine import Engine, EngineConfig
from ..ring import Ring
from ..worker import serve_link
from ..worker._openai import DEFAULT_MAX_BODY_BYTES
from ._app import create_app

__all__ = ["ServeConfig", "serve", "serve_until_signalled"]

logger = logging.getLogger("llmtrio.serve")


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


@attrs.frozen
class ServeConfig:
    """Where and how to listen. Without ``tls_cert``/``tls_key`` only a loopback ``host`` is
    allowed (plain HTTP); ``port=None`` means 8443 with TLS, 8080 without; 0 picks a free one.
    ``graceful_timeout`` is how long in-flight streams may run on after a shutdown signal."""

    host: str = "127.0.0.1"
    port: int | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    ring_streams: int = 64
    graceful_timeout: float = 10.0
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES

    def __attrs_post_init__(self) -> None:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("give both --tls-cert and --tls-key, or neither")
        if self.tls_cert is None and not _is_loopback(self.host):
            raise ValueError(
                f"refusing plain HTTP on {self.host}: without --tls-cert/--tls-key llmtrio "
                "serves on loopback only"
            )
        if self.ring_streams < 1:
            raise ValueError("--ring-streams must be at least 1")

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def bind(self) -> str:
        port = self.port if self.port is not None else (8443 if self.tls else 8080)
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{port}"


async def serve(
    engine_config: EngineConfig,
    config: ServeConfig,
    *,
    shutdown: trio.Event,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Load the model, attach a local worker to a new ring, and serve HTTP until ``shutdown``
    is set; ``task_status.started`` gets the bound addresses (``http://127.0.0.1:PORT``).

    Resource handling: after ``shutdown``, no new connection is accepted; in-flight
    responses get ``config.graceful_timeout`` seconds, then are cancelled (which cancels
    their generations); then the worker stops and the model is freed.
    """
    async with Engine.open(engine_config) as engine:
        ring = Ring(max_streams=config.ring_streams)
        app = create_app(ring, model_name=engine.model_name, max_body_bytes=config.max_body_bytes)
        hypercorn = HypercornConfig()
        hypercorn.bind = [config.bind()]
        hypercorn.graceful_timeout = config.graceful_timeout
        hypercorn.accesslog = None
        hypercorn.errorlog = logging.getLogger("hypercorn.error")
        if config.tls_cert is not None and config.tls_key is not None:
            hypercorn.certfile = str(config.tls_cert)
            hypercorn.keyfile = str(config.tls_key)
        else:
            logger.warning(
                "serving plain HTTP on %s (loopback only); give --tls-cert and --tls-key for HTTPS",
                config.host,
            )
        async with (
            ring.attach("local", engine_config.max_inflight) as link,
            trio.open_nursery() as workers,
        ):
            await workers.start(serve_link, engine, link)
            async with trio.open_nursery() as web:
                binds = await web.start(
                    partial(hypercorn_serve, app, hypercorn, shutdown_trigger=shutdown.wait)
                )
                logger.info("serving %s on %s", engine.model_name, ", ".join(binds))
                task_status.started(binds)
            # hypercorn returns once in-flight responses drained (or graceful_timeout passed).
            workers.cancel_scope.cancel()


async def serve_until_signalled(engine_config: EngineConfig, config: ServeConfig) -> None:
    """``serve`` with SIGINT/SIGTERM as the shutdown trigger; a second signal stops at once."""
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
                        config.graceful_timeout,
                    )
                    shutdown.set()

            nursery.start_soon(watch)
            await serve(engine_config, config, shutdown=shutdown)
            nursery.cancel_scope.cancel()
