"""Kubernetes probes: ``/livez`` and ``/readyz`` on an ingress's public port (ready while
listening and not draining, whatever its workers) and on a worker's metrics port (ready once
its model is loaded and an ingress attached, until it drains)."""

from __future__ import annotations

import json
import socket
from functools import partial
from pathlib import Path

import httpx
import trio

from llmtrio._probes import answer_probe
from llmtrio._remote_worker import run_worker
from llmtrio._routes import CHAT_PATH
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

from ._helpers import engine_config
from .test_ring_remote import Pki, pki, wait_attached

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
            with trio.fail_after(10):
                while not ring.stats().parked:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            shutdown.set()
            with trio.fail_after(10):
                while (ready := await http.get("/readyz")).status_code == 200:  # noqa: ASYNC110
                    await trio.sleep(0.01)
            assert (ready.status_code, ready.text) == (503, "not ready: draining\n")
            assert (await http.get("/livez")).status_code == 200
            nursery.cancel_scope.cancel()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def test_a_worker_is_ready_once_loaded_and_attached_until_it_drains(
    gemma_path: Path, pki: Pki
) -> None:
    engine = engine_config(gemma_path, max_inflight=1, ctx_size=512)
    ring = Ring(max_streams=4, park_timeout=60)
    control_port, metrics_port = free_port(), free_port()
    url = f"wss://127.0.0.1:{control_port}"
    probes = f"http://127.0.0.1:{metrics_port}"
    shutdown = trio.Event()
    seen: list[str] = []

    async with trio.open_nursery() as nursery, httpx.AsyncClient(timeout=30) as http:

        async def readiness() -> str:
            """The worker's /readyz, remembered in ``seen`` when it changes."""
            response = await http.get(probes + "/readyz")
            state = response.text.strip()
            assert (response.status_code == 200) == (state == "ok"), state
            if not seen or seen[-1] != state:
                seen.append(state)
            return state

        async def probe_until(state: str) -> None:
            with trio.fail_after(60):
                while True:
                    try:
                        if await readiness() == state:
                            return
                    except httpx.ConnectError:  # the probe port is not open yet
                        pass
                    await trio.sleep(0.02)

        context = client_ssl_context(pki.worker("w1"), None, pki.ingress_ca)
        worker = partial(
            run_worker,
            engine,
            [url],
            context,
            shutdown=shutdown,
            metrics_address=("127.0.0.1", metrics_port),
            dial=DialConfig(handshake_timeout=2),
        )
        nursery.start_soon(worker)
        # The ingress is not up yet: loaded, but attached to nothing.
        await probe_until("not ready: attached to no ingress")
        assert (await http.get(probes + "/livez")).text == "ok\n"
        server = server_ssl_context(pki.ingress, pki.ingress, pki.worker_ca)
        control = ControlConfig(server, port=control_port)
        await nursery.start(serve_control, ring, control)
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
    # The states came in this order (loading may pass before the first probe answers).
    expected = [
        "not ready: loading the model",
        "not ready: attached to no ingress",
        "ok",
        "not ready: draining",
    ]
    assert seen == expected[-len(seen) :], seen
