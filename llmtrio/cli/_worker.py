"""The composition root of a remote worker (``llmtrio worker``): one engine, attached to every
ingress's control listener, served by the same ``serve_link`` as the in-process worker."""

from __future__ import annotations

import logging
import socket
import ssl
from collections.abc import Sequence
from contextlib import AsyncExitStack
from functools import partial
from typing import TYPE_CHECKING

import trio
from prometheus_client import CollectorRegistry

from ..api import RequestLimits
from ..ring import DialConfig, RemoteLink, connect_ring
from ._metrics_server import serve_metrics

if TYPE_CHECKING:
    from ..engine import EngineConfig
    from ..worker import HostConfig
    from ._catalog import CatalogModel

__all__ = ["run_worker"]

logger = logging.getLogger("llmtrio.worker")


async def run_worker(
    engine_config: EngineConfig | Sequence[EngineConfig],
    urls: Sequence[str],
    ssl_context: ssl.SSLContext,
    *,
    shutdown: trio.Event,
    name: str | None = None,
    graceful_timeout: float = 30.0,
    limits: RequestLimits | None = None,
    metrics_address: tuple[str, int] | None = None,
    dial: DialConfig | None = None,
    on_demand: Sequence[CatalogModel] = (),
    host: HostConfig | None = None,
    task_status: trio.TaskStatus[str | None] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Load each model (one engine per config; each attaches on its own links and claims for
    its own model only), attach to every ingress in ``urls`` (a URL whose host is a name: to
    every address it resolves to, see ``dial``) and serve until ``shutdown``; request bodies
    are checked against ``limits``. With ``metrics_address`` (host, port), the engines' metrics
    (each family labelled ``model_name``) are served at ``http://host:port/metrics``, with the
    probes ``/livez`` and ``/readyz`` beside them from the start (ready once the model is
    loaded and an ingress attached, until ``shutdown``); ``task_status.started`` gets that
    URL (``None`` without) once the worker is connecting.

    The ``on_demand`` catalog models attach from the start, each on its own links, and load
    on their first request within ``host``'s budget (``llmtrio.worker.ModelHost``).

    Resource handling: after ``shutdown`` the worker stops claiming, lets the streams it
    holds finish (up to ``graceful_timeout`` seconds; then they are cancelled and their
    ingresses fail them), detaches from every ingress and frees the model.
    """
    # Imported here: the CLI's face loads neither the engine nor llama.cpp.
    from ..engine import EngineConfig, open_engine, oversubscription, read_cores
    from ..worker import (
        LOAD_WAITERS,
        HostConfig,
        HostedModel,
        ModelHost,
        OnDemand,
        Pinned,
        WorkerMetrics,
        serve_link,
    )

    configs = [engine_config] if isinstance(engine_config, EngineConfig) else list(engine_config)
    crowded = oversubscription(sum(each.threads for each in configs), read_cores())
    if crowded is not None:
        logger.warning("%s", crowded)
    registry = CollectorRegistry()
    link: RemoteLink | None = None

    def not_ready() -> str | None:
        if shutdown.is_set():
            return "draining"
        if link is None:
            return "loading the model"
        if not link.attached:
            return "attached to no ingress"
        return None

    failure: Exception | None = None
    async with trio.open_nursery() as probes:
        url = None
        if metrics_address is not None:
            address, port = metrics_address
            url = await probes.start(
                partial(serve_metrics, registry, host=address, port=port, not_ready=not_ready)
            )
        try:
            async with AsyncExitStack() as stack:
                engines = [await stack.enter_async_context(open_engine(each)) for each in configs]
                links: list[RemoteLink] = []
                base = name or socket.gethostname()
                for engine in engines:
                    several = len(engines) > 1 or bool(on_demand)
                    links.append(
                        await stack.enter_async_context(
                            connect_ring(
                                urls,
                                ssl_context,
                                worker_id=f"{base}/{engine.model_name}" if several else base,
                                max_inflight=engine.capacity().max_inflight,
                                models=[engine.model_name],
                                kinds=[engine.kind],
                                config=dial,
                                vision=[engine.model_name] if engine.takes_images else [],
                                contexts=[engine.context_length],
                                audio=[engine.model_name] if engine.takes_audio else [],
                            )
                        )
                    )
                hosted = [
                    HostedModel.of(m.name, m.config, m.keep_alive, m.aliases) for m in on_demand
                ]
                model_host = ModelHost.of(
                    hosted, host or HostConfig(), registry if hosted else None
                )
                books = {}
                for engine, config in zip(engines, configs, strict=True):
                    cost = HostedModel.of(engine.model_name, config).cost
                    books[engine.model_name] = model_host.pin(engine.model_name, cost, config)
                for model in hosted:
                    links.append(
                        await stack.enter_async_context(
                            connect_ring(
                                urls,
                                ssl_context,
                                worker_id=f"{base}/{model.name}",
                                max_inflight=max(model.config.max_inflight, LOAD_WAITERS),
                                models=model.names,
                                kinds=[model.kind] * len(model.names),
                                contexts=[model.context_length] * len(model.names),
                                config=dial,
                            )
                        )
                    )
                # Entered last, left first: the streams end before the links close.
                nursery = await stack.enter_async_context(trio.open_nursery())
                # Every engine's figures, labelled with its model's name.
                metrics = WorkerMetrics(registry, engines, models=[m.name for m in hosted])
                for engine, one in zip(engines, links, strict=False):
                    pinned = Pinned(engine, adapters=books[engine.model_name])
                    await nursery.start(
                        partial(serve_link, pinned, one, metrics=metrics, limits=limits)
                    )
                if hosted:
                    await nursery.start(model_host.run)
                for model, one in zip(hosted, links[len(engines) :], strict=True):
                    await nursery.start(
                        partial(
                            serve_link,
                            OnDemand(model_host, model.name),
                            one,
                            metrics=metrics,
                            limits=limits,
                        )
                    )
                link = links[0]
                logger.info(
                    "worker ready: %s, pulling from %s",
                    ", ".join(
                        [engine.model_name for engine in engines]
                        + [f"{model.name} (on demand)" for model in hosted]
                    ),
                    ", ".join(urls),
                )
                task_status.started(url)
                await shutdown.wait()
                for each in links:
                    each.drain()
                with trio.move_on_after(graceful_timeout) as scope:
                    for each in links:
                        await each.wait_idle()
                if scope.cancelled_caught:
                    logger.warning("streams still running after %gs: cancelling", graceful_timeout)
                nursery.cancel_scope.cancel()
            logger.info("worker detached from every ingress")
        except Exception as exc:  # raised below as it is, not inside this nursery's group
            failure = exc
        probes.cancel_scope.cancel()
    if failure is not None:
        raise failure
