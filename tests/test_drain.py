"""The ingress's graceful drain, in process: the real HTTP server and ring, a worker written
by hand (so each step happens exactly when the test says). The same drain with real processes
and real signals is in ``test_drain_processes.py``."""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import pytest
import trio
import trustme

from llmtrio.ring import Claimed, Ring, WorkerLink
from llmtrio.web import ServeConfig, serve_ingress

CHAT = "/v1/chat/completions"
BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}
SSE = [("content-type", "text/event-stream")]


@attrs.define
class Server:
    client: httpx.AsyncClient
    shutdown: trio.Event
    stopped: trio.Event


@asynccontextmanager
async def ingress(
    ring: Ring, graceful_timeout: float, tls: Path | None = None, **more: Any
) -> AsyncIterator[Server]:
    """The HTTP ingress in front of ``ring`` on a free loopback port (HTTPS with HTTP/2 when
    ``tls`` is a directory with ``cert.pem``, ``key.pem`` and ``ca.pem``; ``more``, more of
    its ``ServeConfig``); leaving the block waits (10 s at most) for the server to stop,
    which the test triggers with ``shutdown``."""
    shutdown, stopped = trio.Event(), trio.Event()
    async with trio.open_nursery() as nursery:

        async def run(*, task_status: trio.TaskStatus[list[str]]) -> None:
            config = ServeConfig(
                port=0,
                graceful_timeout=graceful_timeout,
                tls_cert=None if tls is None else tls / "cert.pem",
                tls_key=None if tls is None else tls / "key.pem",
                **more,
            )
            await serve_ingress(
                ring, config, model_name="m", shutdown=shutdown, task_status=task_status
            )
            stopped.set()

        binds = await nursery.start(run)
        verify = True if tls is None else ssl.create_default_context(cafile=tls / "ca.pem")
        async with httpx.AsyncClient(
            base_url=binds[0], timeout=30, verify=verify, http2=tls is not None
        ) as client:
            yield Server(client, shutdown, stopped)
        shutdown.set()
        with trio.fail_after(10):
            await stopped.wait()


async def wait_draining(client: httpx.AsyncClient) -> httpx.Response:
    """``/health`` once the shutdown signal reached the app (it is delivered by a task)."""
    with trio.fail_after(10):
        while (health := await client.get("/health")).json()["status"] != "draining":  # noqa: ASYNC110
            await trio.sleep(0.01)
    return health


async def eventually(predicate: Callable[[], bool]) -> None:
    with trio.fail_after(10):
        while not predicate():  # noqa: ASYNC110
            await trio.sleep(0.01)


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
async def test_a_running_stream_finishes_while_new_requests_get_503(http: str, tls: Path) -> None:
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
        async with server.client.stream("POST", CHAT, json=BODY) as response:
            chunks = response.aiter_raw()
            assert await anext(chunks) == b"data: one\n\n"
            await claimed.wait()

            server.shutdown.set()
            health = await wait_draining(server.client)
            assert health.status_code == 503  # a load balancer stops sending here
            # A body larger than HTTP/2's first flow-control window: some of it arrives after
            # the refusal was sent (which must not break the connection, nor its other stream).
            big = {**BODY, "messages": [{"role": "user", "content": "hi " * 100_000}]}
            refused = await server.client.post(CHAT, json=big)
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
        with trio.fail_after(10):
            await server.stopped.wait()  # stops as soon as the last stream is done
    assert ring.stats().tracked == 0


async def test_requests_outliving_the_graceful_timeout_are_cut_with_an_error() -> None:
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
            results["parked"] = await server.client.post(CHAT, json={**BODY, "stream": False})

        nursery.start_soon(serve)
        async with server.client.stream("POST", CHAT, json=BODY) as response:
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
    assert ring.stats().tracked == 0


async def test_a_shutdown_with_nothing_running_stops_at_once() -> None:
    ring = Ring(max_streams=8)
    async with ingress(ring, 3600) as server:
        server.shutdown.set()
        with trio.fail_after(10):
            await server.stopped.wait()


async def test_a_request_whose_body_is_still_coming_is_part_of_the_drain() -> None:
    """A request counts from its first byte: one still uploading its body at the shutdown is
    parked and served, not refused."""
    ring = Ring(max_streams=8)
    async with ring.attach("w#1", 2, models=["m"]) as link, ingress(ring, 30) as server:
        body = json.dumps(BODY).encode()
        gate = trio.Event()

        async def upload() -> AsyncIterator[bytes]:
            yield body[:5]
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
                                CHAT,
                                content=upload(),
                                headers={"content-length": str(len(body))},
                            )
                        )

                    uploading.start_soon(post)
                    await trio.sleep(0.5)  # the head and the first bytes are in
                    server.shutdown.set()
                    await wait_draining(server.client)
                    gate.set()
        assert results[0].status_code == 200, results[0].text
        assert results[0].text == "data: [DONE]\n\n"
