"""The ingress's graceful drain, in process: the real HTTP server and ring, a worker written
by hand (so each step happens exactly when the test says). The same drain with real processes
and real signals is in ``test_drain_processes.py``."""

from __future__ import annotations

import json
import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trustme
from prometheus_client import CollectorRegistry

from llmtrio.api import CHAT_PATH
from llmtrio.ring import Claimed, Ring, WorkerLink
from llmtrio.web import ServeConfig
from llmtrio.web._drain import Drain

from .._helpers import Ingress, eventually, open_ingress

BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
SSE = [("content-type", "text/event-stream")]


@asynccontextmanager
async def ingress(
    ring: Ring,
    graceful_timeout: float,
    tls: Path | None = None,
    registry: CollectorRegistry | None = None,
    **more: Any,
) -> AsyncIterator[Ingress]:
    """:func:`open_ingress` in front of ``ring`` (HTTPS with HTTP/2 when ``tls`` is a
    directory with ``cert.pem``, ``key.pem`` and ``ca.pem``; ``more``, more of its
    ``ServeConfig``); the test triggers the shutdown with ``shutdown``."""
    config = ServeConfig(
        port=0,
        graceful_timeout=graceful_timeout,
        tls_cert=None if tls is None else tls / "cert.pem",
        tls_key=None if tls is None else tls / "key.pem",
        **more,
    )
    verify = True if tls is None else ssl.create_default_context(cafile=tls / "ca.pem")
    async with open_ingress(
        ring, config, registry=registry, verify=verify, http2=tls is not None
    ) as server:
        yield server


async def wait_draining(client: httpx.AsyncClient) -> httpx.Response:
    """``/health`` once the shutdown signal reached the app (it is delivered by a task)."""

    async def draining() -> httpx.Response | None:
        health = await client.get("/health")
        return health if health.json()["status"] == "draining" else None

    return await eventually(draining, "/health saying draining")


async def start_stream(
    link: WorkerLink, *, task_status: trio.TaskStatus[Claimed] = trio.TASK_STATUS_IGNORED
) -> None:
    """Claim the next stream and start its event stream with one event; hand it over."""
    with trio.fail_after(10):
        claimed = await link.claim()
    await claimed.send_head(200, SSE)
    await claimed.send(b"data: one\n\n")
    task_status.started(claimed)


@pytest.fixture
def tls(tmp_path: Path) -> Path:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    return tmp_path


@pytest.mark.parametrize("http", ["http/1.1", "h2"])
async def test_a_running_stream_finishes_while_new_requests_get_503(
    http: str, tls: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ring = Ring(max_streams=8)
    async with (
        ring.attach("w#1", 2, models=["m"]) as link,
        ingress(ring, 30, tls if http == "h2" else None) as server,
        trio.open_nursery() as nursery,
    ):
        claimed = trio.Event()
        worker: list[Claimed] = []

        async def serve() -> None:
            worker.append(await nursery.start(start_stream, link))
            claimed.set()

        nursery.start_soon(serve)
        async with server.client.stream("POST", CHAT_PATH, json=BODY) as response:
            chunks = response.aiter_raw()
            assert await anext(chunks) == b"data: one\n\n"
            await claimed.wait()

            server.shutdown.set()
            health = await wait_draining(server.client)
            assert health.status_code == 503  # a load balancer stops sending here
            # A body larger than HTTP/2's first flow-control window: some of it arrives after
            # the refusal was sent (which must not break the connection, nor its other stream).
            big = {**BODY, "messages": [{"role": "user", "content": "hi " * 100_000}]}
            refused = await server.client.post(CHAT_PATH, json=big)
            assert refused.status_code == 503
            assert refused.headers["retry-after"] == "1"
            if http == "h2":  # HTTP/2 has no Connection header; the stream ends there
                assert refused.http_version == "HTTP/2"
                assert "connection" not in refused.headers
            else:  # a kept-alive client reconnects, and its next request goes elsewhere
                assert refused.headers["connection"] == "close"
            assert refused.json()["error"]["code"] == "shutting_down"
            assert refused.json()["error"]["type"] == "server_error"
            assert ring.stats().open == 1  # the refused request never reached the ring
            assert not server.stopped.is_set()  # the running stream holds the server open

            await worker[0].send(b"data: two\n\n")
            await worker[0].end(b"data: [DONE]\n\n")
            rest = b"".join([chunk async for chunk in chunks])
        assert rest == b"data: two\n\ndata: [DONE]\n\n"
        with trio.fail_after(10):  # a bound on a hang
            await server.stopped.wait()
    # It stopped because its last stream was done: the 30 s graceful timeout cut nothing.
    assert "cutting them" not in caplog.text
    assert ring.stats().tracked == 0


async def test_requests_outliving_the_graceful_timeout_are_cut_with_an_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ring = Ring(max_streams=8)
    async with (
        ring.attach("w#1", 2, models=["m"]) as link,
        ingress(ring, 0.5) as server,
        trio.open_nursery() as nursery,
    ):
        results: dict[str, httpx.Response] = {}
        worker: list[Claimed] = []

        async def serve() -> None:
            worker.append(await nursery.start(start_stream, link))

        async def parked() -> None:  # no worker will claim it
            results["parked"] = await server.client.post(CHAT_PATH, json={**BODY, "stream": False})

        nursery.start_soon(serve)
        async with server.client.stream("POST", CHAT_PATH, json=BODY) as response:
            chunks = response.aiter_raw()
            assert await anext(chunks) == b"data: one\n\n"
            nursery.start_soon(parked)
            await eventually(lambda: ring.stats().parked == 1)
            server.shutdown.set()
            with trio.fail_after(10):
                rest = b"".join([chunk async for chunk in chunks])
        assert rest.startswith(b"data: {")
        assert rest.endswith(b"\n\n")
        event = json.loads(rest.removeprefix(b"data: "))
        assert event["error"]["code"] == "shutting_down"
        assert "shut down before this request finished" in event["error"]["message"]
        await eventually(lambda: "parked" in results)
        assert results["parked"].status_code == 503
        assert results["parked"].json()["error"]["code"] == "shutting_down"
        assert worker[0].cancelled.is_set()  # the cut cancels the worker's generation
        await worker[0].end()  # acknowledges the cancel
        with trio.fail_after(10):
            await server.stopped.wait()
    assert "2 requests still running after 0.5s: cutting them" in caplog.text
    assert ring.stats().tracked == 0


async def test_a_shutdown_with_nothing_running_does_not_wait_out_the_graceful_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, "llmtrio")
    ring = Ring(max_streams=8)
    async with ingress(ring, 3600) as server:
        server.shutdown.set()
        with trio.fail_after(10):  # far below the hour of graceful timeout: nothing waited
            await server.stopped.wait()
    assert "draining: 0 requests in flight" in caplog.text
    assert "cutting them" not in caplog.text


async def test_a_request_whose_body_is_still_coming_is_part_of_the_drain() -> None:
    """A request counts from its first byte: one still uploading its body at the shutdown is
    parked and served, not refused."""
    ring = Ring(max_streams=8)
    registry = CollectorRegistry()
    async with (
        ring.attach("w#1", 2, models=["m"]) as link,
        ingress(ring, 30, registry=registry) as server,
    ):
        body = json.dumps(BODY).encode()
        first_sent, gate = trio.Event(), trio.Event()

        async def upload() -> AsyncIterator[bytes]:
            yield body[:5]
            first_sent.set()  # the client asks for more: the head and the first bytes went
            await gate.wait()
            yield body[5:]

        async def serve_one() -> None:
            with trio.fail_after(10):
                claimed = await link.claim()
            assert claimed.body == body  # the whole body, sent after the shutdown began
            await claimed.send_head(200, SSE)
            await claimed.end(b"data: [DONE]\n\n")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_one)
            with trio.fail_after(10):
                async with trio.open_nursery() as uploading:
                    results: list[httpx.Response] = []

                    async def post() -> None:
                        results.append(
                            await server.client.post(
                                CHAT_PATH,
                                content=upload(),
                                headers={"content-length": str(len(body))},
                            )
                        )

                    uploading.start_soon(post)
                    await first_sent.wait()
                    # The app counts a request as it arrives, and admits and tracks it for
                    # the drain in the same step: once counted, it is part of the drain.
                    await eventually(
                        lambda: registry.get_sample_value("llmtrio_requests_in_progress") == 1
                    )
                    server.shutdown.set()
                    await wait_draining(server.client)
                    gate.set()
        assert results[0].status_code == 200, results[0].text
        assert results[0].text == "data: [DONE]\n\n"


async def test_the_cut_cancels_the_request_scopes_it_holds_and_only_those() -> None:
    """No task watches the drain: it cancels the scopes handed to it, at once for one handed
    over after the cut, and never one whose request has left."""
    drain = Drain()
    gone = trio.CancelScope()
    with drain.cuts(gone):
        pass
    with trio.CancelScope() as running, drain.cuts(running):
        drain.start()
        drain.cut()
        await trio.sleep_forever()
    assert running.cancelled_caught
    assert not gone.cancel_called
    with trio.CancelScope() as late, drain.cuts(late):
        await trio.sleep_forever()
    assert late.cancelled_caught
