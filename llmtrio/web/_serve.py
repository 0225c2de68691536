"""The ingress's HTTP server: the app on hypercorn, over TLS or on loopback."""

from __future__ import annotations

import ipaddress
import logging
from functools import partial
from pathlib import Path

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from .._openai_errors import DEFAULT_MAX_BODY_BYTES
from ..ring import Ring
from ._app import create_app

__all__ = ["ServeConfig", "serve_ingress"]

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
    park_timeout: float = 30.0
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
        if self.park_timeout <= 0:
            raise ValueError("--park-timeout must be positive")
        if self.ring_streams < 1:
            raise ValueError("--ring-streams must be at least 1")

    @property
    def tls(self) -> bool:
        return self.tls_cert is not None

    def bind(self) -> str:
        port = self.port if self.port is not None else (8443 if self.tls else 8080)
        host = f"[{self.host}]" if ":" in self.host and not self.host.startswith("[") else self.host
        return f"{host}:{port}"


async def serve_ingress(
    ring: Ring,
    config: ServeConfig,
    *,
    model_name: str,
    shutdown: trio.Event,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the OpenAI API in front of ``ring`` until ``shutdown`` is set;
    ``task_status.started`` gets the bound addresses (``http://127.0.0.1:PORT``).

    Resource handling: after ``shutdown``, no new connection is accepted; in-flight
    responses get ``config.graceful_timeout`` seconds, then are cancelled (which cancels
    their streams on the ring).
    """
    app = create_app(ring, model_name=model_name, max_body_bytes=config.max_body_bytes)
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
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            partial(hypercorn_serve, app, hypercorn, shutdown_trigger=shutdown.wait)
        )
        logger.info("serving %s on %s", model_name, ", ".join(binds))
        task_status.started(binds)
