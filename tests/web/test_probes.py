"""Kubernetes probes: ``/livez`` and ``/readyz`` on an ingress's public port (ready while
listening and not draining, whatever its workers) and on a worker's metrics port (ready once
its model is loaded and an ingress attached, until it drains)."""

from __future__ import annotations

import contextlib
import json
from functools import partial
from pathlib import Path

import attrs
import httpx
import trio

from llmtrio.api import CHAT_PATH, answer_probe
from llmtrio.cli import run_worker
from llmtrio.ring import (
    ControlConfig,
    DialConfig,
    RequestHead,
    Ring,
    client_ssl_context,
    serve_control,
    server_ssl_context,
)
from llmtrio.web import ServeConfig, serve_ingress

from .._helpers import engine_config, eventually
from ..ring.test_ring_remote import Pki, pki, wait_attached

__all__ = ["pki"]  # the fixture, used by name


def test_the_answers() -> None:
    assert answer_probe("/livez", lambda: "anything").status == 200
    assert answer_probe("/readyz", lambda: None).body == b"ok\n"
    draining = answer_probe("/readyz", lambda: "draining")
    assert (draining.status, draining.body) == (503, b"not ready: draining\n")


async def test_an_ingress_is_ready_while_it_listens_and_not_once_it_drains() -> None:
    ring = Ring(max_streams=4, park_timeout=60)
    config = ServeConfig(port=0, graceful_timeout=30, api_keys=["secret"])
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            partial(serve_ingress, ring, config, model_name="m", shutdown=shutdown)
        )
        async with httpx.AsyncClient(base_url=binds[0], timeout=30) as http:
            # No worker: /health says so (503), but the ingress is alive and ready: a parked
            # request waits for a worker; no API key is asked of the probes.
            assert (await http.get("/health")).status_code == 503
            live, ready = await http.get("/livez"), await http.get("/readyz")
            assert (live.status_code, live.text) == (200, "ok\n")
            assert (ready.status_code, ready.text) == (200, "ok\n")
            assert ready.headers["content-type"].startswith("text/plain")
            assert (await http.get(CHAT_PATH)).status_code == 401
            # A request parked (the drain waits for it), then a shutdown: draining, not
            # ready, still alive.
            key = {"Authorization": "Bearer secret"}
            nursery.start_soon(partial(http.post, CHAT_PATH, json={"messages": []}, headers=key))
            await eventually(lambda: ring.stats().parked)
            shutdown.set()

            async def not_ready() -> httpx.Response | None:
                ready = await http.get("/readyz")
                return None if ready.status_code == 200 else ready

            ready = await eventually(not_ready, "/readyz no longer 200")
            assert (ready.status_code, ready.text) == (503, "not ready: draining\n")
            assert (await http.get("/livez")).status_code == 200
            nursery.cancel_scope.cancel()


@attrs.define
class Gate:
    """A loopback port (from the system: port 0 read back) that turns connections away until
    :meth:`open_to` names a port, and from then relays them there: a worker can be given an
    ingress's address before that ingress listens."""

    _target: int | None = None

    async def serve(self, *, task_status: trio.TaskStatus[int]) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        task_status.started(listeners[0].socket.getsockname()[1])
        await trio.serve_listeners(self._relay, listeners)

    def open_to(self, port: int) -> None:
        self._target = port

    async def _relay(self, client: trio.SocketStream) -> None:
        async with client:
            if self._target is None:
                return  # closed at once: the worker's dial fails, and it tries again later
            async with (
                await trio.open_tcp_stream("127.0.0.1", self._target) as upstream,
                trio.open_nursery() as nursery,
            ):
                nursery.start_soon(_pipe, client, upstream)
                nursery.start_soon(_pipe, upstream, client)


async def _pipe(source: trio.SocketStream, sink: trio.SocketStream) -> None:
    with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
        async for data in source:
            await sink.send_all(data)
        await sink.send_eof()


async def test_a_worker_is_ready_once_loaded_and_attached_until_it_drains(
    gemma_path: Path, pki: Pki
) -> None:
    engine = engine_config(gemma_path, max_inflight=1, ctx_size=512)
    ring = Ring(max_streams=4, park_timeout=60)
    shutdown = trio.Event()
    seen: list[str] = []
    gate = Gate()

    async with trio.open_nursery() as nursery, httpx.AsyncClient(timeout=30) as http:
        url = f"wss://127.0.0.1:{await nursery.start(gate.serve)}"

        async def readiness() -> str:
            """The worker's /readyz, remembered in ``seen`` when it changes."""
            response = await http.get(probes + "/readyz")
            state = response.text.strip()
            assert (response.status_code == 200) == (state == "ok"), state
            if not seen or seen[-1] != state:
                seen.append(state)
            return state

        async def probe_until(state: str) -> None:
            async def reached() -> bool:
                return await readiness() == state

            await eventually(reached, f"/readyz saying {state!r}", within=60)

        context = client_ssl_context(pki.worker("w1"), None, pki.ingress_ca)
        worker = partial(
            run_worker,
            engine,
            [url],
            context,
            shutdown=shutdown,
            metrics_address=("127.0.0.1", 0),
            dial=DialConfig(handshake_timeout=2),
        )
        # Started: the model loaded, the probes listening (their port read back), the worker
        # dialing. The ingress is not up yet: attached to nothing.
        metrics = await nursery.start(worker)
        assert metrics is not None
        probes = metrics.removesuffix("/metrics")
        await probe_until("not ready: attached to no ingress")
        assert (await http.get(probes + "/livez")).text == "ok\n"
        server = server_ssl_context(pki.ingress, pki.ingress, pki.worker_ca)
        control = await nursery.start(serve_control, ring, ControlConfig(server, port=0))
        gate.open_to(int(control.rsplit(":", 1)[1]))
        await wait_attached(ring, 1)
        await probe_until("ok")
        # Draining: a stream still held keeps the worker up, and not ready.
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 400}
        head = RequestHead("POST", CHAT_PATH, [("content-type", "application/json")])
        stream = ring.park(head, json.dumps({**body, "ignore_eos": True, "stream": True}).encode())
        await stream.response_head()
        shutdown.set()
        await probe_until("not ready: draining")
        stream.cancel()
        nursery.cancel_scope.cancel()
    # The states came in this order (the probes' port is known once the model is loaded).
    assert seen == ["not ready: attached to no ingress", "ok", "not ready: draining"], seen
