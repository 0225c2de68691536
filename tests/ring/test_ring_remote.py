"""The control channel in one process: a ring behind ``serve_control`` (real TLS on loopback,
trustme certificates: one CA for ingresses, another for workers) and workers attached with
``connect_ring``. The workers here are small fakes answering on the ``RingLink`` interface."""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import ssl
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path

import attrs
import pytest
import trio
import trustme

from llmtrio.ring import (
    PROTOCOL_VERSION,
    Attach,
    ClaimedStream,
    ControlConfig,
    ControlRefusedError,
    Detach,
    FrameDecoder,
    Outcome,
    RemoteLink,
    Ring,
    RingLink,
    RingStream,
    StreamCancelledError,
    WorkerFailedError,
    client_ssl_context,
    connect_ring,
    encode,
    serve_control,
    server_ssl_context,
)
from llmtrio.ring._tls import open_control_websocket

from .._helpers import HEAD, eventually, read_all

MAKE_CERTS = Path(__file__).resolve().parents[2] / "examples" / "ring" / "make-certs.sh"


@attrs.frozen
class Pki:
    ingress: Path  # the ingress's certificate and key, from the ingresses' CA
    ingress_ca: Path
    worker_ca: Path
    tmp: Path
    authority: trustme.CA  # the workers' CA itself, to issue worker certificates

    def worker(self, name: str, ca: trustme.CA | None = None) -> Path:
        path = self.tmp / f"{name}.pem"
        cert = (ca or self.authority).issue_cert(name)
        cert.private_key_and_cert_chain_pem.write_to_path(str(path))
        return path


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    ingress_ca, worker_ca = trustme.CA(), trustme.CA()
    ingress = tmp_path / "ingress.pem"
    ingress_ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(
        str(ingress)
    )
    ingress_ca.cert_pem.write_to_path(str(tmp_path / "ingress-ca.pem"))
    worker_ca.cert_pem.write_to_path(str(tmp_path / "worker-ca.pem"))
    return Pki(
        ingress, tmp_path / "ingress-ca.pem", tmp_path / "worker-ca.pem", tmp_path, worker_ca
    )


async def start_ingress(nursery: trio.Nursery, pki: Pki, ring: Ring, **config: float) -> str:
    context = server_ssl_context(pki.ingress, pki.ingress, pki.worker_ca)
    control = ControlConfig(context, port=0, **config)  # type: ignore[arg-type]
    url: str = await nursery.start(serve_control, ring, control)
    return url


@asynccontextmanager
async def worker(
    pki: Pki,
    urls: list[str],
    name: str,
    handler: Callable[[ClaimedStream], Awaitable[None]],
    *,
    max_inflight: int = 2,
) -> AsyncIterator[RemoteLink]:
    """A remote worker: ``max_inflight`` slots, each running ``handler`` on a claimed stream."""
    context = client_ssl_context(pki.worker(name), None, pki.ingress_ca)
    async with (
        connect_ring(
            urls, context, worker_id=name, max_inflight=max_inflight, models=["fake"]
        ) as link,
        trio.open_nursery() as nursery,
    ):
        nursery.start_soon(serve_slots, link, handler)
        yield link
        nursery.cancel_scope.cancel()


async def serve_slots(link: RingLink, handler: Callable[[ClaimedStream], Awaitable[None]]) -> None:
    async def slot() -> None:
        while True:
            claimed = await link.claim()
            with claimed, contextlib.suppress(StreamCancelledError):
                await handler(claimed)

    async with trio.open_nursery() as nursery:
        for _ in range(link.max_inflight):
            nursery.start_soon(slot)


def echo_as(name: str, chunks: int = 3) -> Callable[[ClaimedStream], Awaitable[None]]:
    async def echo(claimed: ClaimedStream) -> None:
        await claimed.send_head(200, [("content-type", "text/plain"), ("x-worker", name)])
        for i in range(chunks):
            await claimed.send(b"%d:" % i + claimed.body + b";")
        await claimed.end()

    return echo


async def served_by(stream: RingStream) -> tuple[str, bytes]:
    """Which worker served ``stream`` (its ``x-worker`` header), and the body."""
    head, body = await read_all(stream)
    return dict(head.headers)["x-worker"], body


async def wait_attached(ring: Ring, count: int) -> None:
    await eventually(lambda: len(ring.stats().workers) >= count)


async def test_requests_to_two_ingresses_are_served_by_two_workers(pki: Pki) -> None:
    rings = [Ring(max_streams=32), Ring(max_streams=32)]
    async with trio.open_nursery() as nursery:
        urls = [await start_ingress(nursery, pki, ring) for ring in rings]
        async with (
            worker(pki, urls, "worker-a", echo_as("a")),
            worker(pki, urls, "worker-b", echo_as("b")),
        ):
            for ring in rings:
                await wait_attached(ring, 2)
            streams = [(ring, ring.park(HEAD, b"r%d" % i)) for i in range(8) for ring in rings]
            results = [await served_by(stream) for _, stream in streams]
            bodies = [body for _, body in results]
            assert bodies == [
                b"".join(b"%d:r%d;" % (c, i) for c in range(3)) for i in range(8) for _ in rings
            ]
            # Both workers served, and each worker is named after its certificate.
            assert {name for name, _ in results} == {"a", "b"}
            names = sorted(w.worker_id for w in rings[0].stats().workers)
            assert [n.split("#")[0] for n in names] == ["worker-a", "worker-b"]
            assert all(w.models == ("fake",) for w in rings[0].stats().workers)
        for ring in rings:
            assert ring.stats().tracked == 0
        nursery.cancel_scope.cancel()


async def test_the_outcome_a_remote_worker_states_reaches_the_ingress(pki: Pki) -> None:
    ring = Ring(max_streams=8)
    stated = Outcome(finish_reason="length", prompt_tokens=7, cached_tokens=0, completion_tokens=3)
    refused = Outcome(error_code="invalid_value")

    async def state_it(claimed: ClaimedStream) -> None:
        if claimed.body == b"fail":
            claimed.fail("bad request", outcome=refused)
            return
        await claimed.send_head(200, [("x-worker", "a")])
        await claimed.send(b"x")
        await claimed.end(b"y", outcome=stated)

    async with trio.open_nursery() as nursery:
        url = await start_ingress(nursery, pki, ring)
        async with worker(pki, [url], "a", state_it, max_inflight=1):
            ended = ring.park(HEAD, b"ok")
            assert await served_by(ended) == ("a", b"xy")
            assert ended.outcome == stated
            failed = ring.park(HEAD, b"fail")
            with pytest.raises(WorkerFailedError, match="bad request"):
                await failed.response_head()
            assert failed.outcome == refused
        nursery.cancel_scope.cancel()


async def test_a_worker_holds_at_most_max_inflight_over_all_its_ingresses(pki: Pki) -> None:
    rings = [Ring(max_streams=32) for _ in range(3)]
    most = 0
    holding = 0

    async def slow(claimed: ClaimedStream) -> None:
        nonlocal most, holding
        holding += 1
        most = max(most, holding)
        await trio.sleep(0.02)
        holding -= 1
        await claimed.send_head(200, [("x-worker", "w")])
        await claimed.end()

    async with trio.open_nursery() as nursery:
        urls = [await start_ingress(nursery, pki, ring) for ring in rings]
        async with worker(pki, urls, "w", slow, max_inflight=2) as link:
            for ring in rings:
                await wait_attached(ring, 1)
            streams = [ring.park(HEAD) for ring in rings for _ in range(6)]
            for stream in streams:
                await read_all(stream)
            assert link.held == 0
        nursery.cancel_scope.cancel()
    assert most == 2
    for ring in rings:
        assert ring.stats().tracked == 0


async def test_a_worker_cut_off_before_its_head_is_replaced_invisibly(pki: Pki) -> None:
    ring = Ring(max_streams=8)
    claimed_by_a = trio.Event()

    async def stall(claimed: ClaimedStream) -> None:
        claimed_by_a.set()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        (url,) = [await start_ingress(nursery, pki, ring)]
        with trio.CancelScope() as a_scope:
            async with worker(pki, [url], "a", stall, max_inflight=1):
                await wait_attached(ring, 1)
                stream = ring.park(HEAD, b"x")
                await claimed_by_a.wait()
                a_scope.cancel()  # worker a goes away holding the stream
        async with worker(pki, [url], "b", echo_as("b", chunks=1)):
            name, body = await served_by(stream)
        assert (name, body) == ("b", b"0:x;")
        nursery.cancel_scope.cancel()


async def test_a_worker_cut_off_mid_response_fails_its_stream(pki: Pki) -> None:
    ring = Ring(max_streams=8)
    sent = trio.Event()

    async def half(claimed: ClaimedStream) -> None:
        await claimed.send_head(200, [("x-worker", "a")])
        await claimed.send(b"partial")
        sent.set()
        await trio.sleep_forever()

    async with trio.open_nursery() as nursery:
        url = await start_ingress(nursery, pki, ring)
        with trio.CancelScope() as scope:
            async with worker(pki, [url], "a", half, max_inflight=1):
                stream = ring.park(HEAD)
                await sent.wait()
                await stream.response_head()
                body = stream.body()
                assert await body.__anext__() == b"partial"
                scope.cancel()
        with pytest.raises(WorkerFailedError, match="detached mid-response"):
            await body.__anext__()
        nursery.cancel_scope.cancel()


async def test_a_client_leaving_cancels_the_remote_stream(pki: Pki) -> None:
    ring = Ring(max_streams=8)
    cancelled = trio.Event()

    async def endless(claimed: ClaimedStream) -> None:
        await claimed.send_head(200, [("x-worker", "a")])
        try:
            while True:
                await claimed.send(b"tok")
                await trio.sleep(0.005)
        finally:
            cancelled.set()

    async with trio.open_nursery() as nursery:
        url = await start_ingress(nursery, pki, ring)
        async with worker(pki, [url], "a", endless, max_inflight=1) as link:
            stream = ring.park(HEAD)
            await stream.response_head()
            async for _ in stream.body():
                break
            stream.cancel()
            with trio.fail_after(10):
                await cancelled.wait()
            await eventually(lambda: not (link.held or ring.stats().tracked))
        nursery.cancel_scope.cancel()


async def test_a_slow_client_holds_back_its_own_stream_only(pki: Pki) -> None:
    """Credits: a client reading nothing stops its stream after ``credits`` chunks, while
    another stream on the same worker connection runs to its end."""
    ring = Ring(max_streams=8, response_buffer=2)
    sent = {1: 0, 2: 0}

    async def many(claimed: ClaimedStream) -> None:
        await claimed.send_head(200, [("x-worker", "a")])
        for _ in range(200):
            await claimed.send(b"x" * 10)
            sent[claimed.stream_id] += 1
        await claimed.end()

    async with trio.open_nursery() as nursery:
        url = await start_ingress(nursery, pki, ring, credits=4)
        async with worker(pki, [url], "a", many, max_inflight=2):
            stalled = ring.park(HEAD)  # stream 1: never read
            await stalled.response_head()
            _, body = await read_all(ring.park(HEAD))  # stream 2
            assert body == b"x" * 2000
            # Stream 1 is bounded by its client's buffer plus its credits in flight.
            assert sent[1] <= 2 + 1 + 4 + 2
            stalled.cancel()
        nursery.cancel_scope.cancel()


async def test_a_worker_that_ends_with_a_last_chunk_is_free_whatever_its_client_reads(
    pki: Pki,
) -> None:
    """Capacity follows the work over the network too: a worker whose client reads nothing
    ends its stream with everything left as one last chunk (past its credits), its slot is
    free at once (it serves the next stream), and the stalled client still gets it all."""
    ring = Ring(max_streams=8, response_buffer=2)
    ended: list[int] = []

    async def produce_then_end(claimed: ClaimedStream) -> None:
        await claimed.send_head(200, [("x-worker", "a")])
        for _ in range(3):
            await claimed.send(b"x" * 10)
        await claimed.end(b"y" * 1000)  # what a finished generation hands over
        ended.append(claimed.stream_id)

    async with trio.open_nursery() as nursery:
        url = await start_ingress(nursery, pki, ring, credits=2)
        async with worker(pki, [url], "a", produce_then_end, max_inflight=1):
            stalled = ring.park(HEAD)  # never read until the end
            await stalled.response_head()
            with trio.fail_after(10):
                _, body = await read_all(ring.park(HEAD))  # served by the same one slot
            assert body == b"x" * 30 + b"y" * 1000
            assert len(ended) == 2
            stats = ring.stats()
            assert (stats.assigned, stats.responding) == (0, 0)
            rest = b"".join([chunk async for chunk in stalled.body()])
            assert rest == b"x" * 30 + b"y" * 1000
        nursery.cancel_scope.cancel()


async def test_a_cancel_not_acknowledged_in_time_loses_the_stream_only(pki: Pki) -> None:
    ring = Ring(max_streams=8)

    async def deaf(claimed: ClaimedStream) -> None:
        if claimed.body == b"deaf":
            await claimed.send_head(200, [("x-worker", "a")])
            await trio.sleep_forever()  # never looks at claimed.cancelled
        await echo_as("a", chunks=1)(claimed)

    async with trio.open_nursery() as nursery:
        url = await start_ingress(nursery, pki, ring, cancel_ack_timeout=0.2)
        async with worker(pki, [url], "a", deaf, max_inflight=2):
            stuck = ring.park(HEAD, b"deaf")
            await stuck.response_head()
            stuck.cancel()
            await eventually(lambda: not ring.stats().tracked)
            # The worker is still attached and serves others on its other slot.
            assert await served_by(ring.park(HEAD, b"ok")) == ("a", b"0:ok;")
            assert len(ring.stats().workers) == 1
            nursery.cancel_scope.cancel()


async def test_a_silent_worker_is_declared_dead(pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    ring = Ring(max_streams=8)
    context = client_ssl_context(pki.worker("mute"), None, pki.ingress_ca)
    async with trio.open_nursery() as nursery:
        url = await start_ingress(nursery, pki, ring, worker_timeout=0.3)
        port = int(url.rsplit(":", 1)[1])
        ws = await open_control_websocket(nursery, "127.0.0.1", port, context, limit_s=5)
        await ws.send_message(encode(Attach("mute", 1)))
        await wait_attached(ring, 1)
        await eventually(lambda: not ring.stats().workers)
        assert "silent for 0.3s: declared dead" in caplog.text
        nursery.cancel_scope.cancel()


async def test_an_incompatible_protocol_version_is_refused_with_a_reason(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    ring = Ring(max_streams=8)
    context = client_ssl_context(pki.worker("old"), None, pki.ingress_ca)
    async with trio.open_nursery() as nursery:
        url = await start_ingress(nursery, pki, ring)
        port = int(url.rsplit(":", 1)[1])
        ws = await open_control_websocket(nursery, "127.0.0.1", port, context, limit_s=5)
        await ws.send_message(encode(Attach("old", 1, version=PROTOCOL_VERSION + 1)))
        decoder = FrameDecoder()
        decoder.receive_data(bytes(await ws.get_message()))
        reply = decoder.next_message()
        assert isinstance(reply, Detach)
        assert f"incompatible protocol version {PROTOCOL_VERSION + 1}" in reply.reason
        assert "refused worker old" in caplog.text
        assert ring.stats().workers == ()
        nursery.cancel_scope.cancel()


@pytest.mark.parametrize("certificate", ["none", "other-ca"])
async def test_workers_without_a_good_certificate_are_refused_quickly_at_both_ends(
    pki: Pki, certificate: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    ring = Ring(max_streams=8)
    cert = None if certificate == "none" else pki.worker("stranger", trustme.CA())
    context = client_ssl_context(cert, None, pki.ingress_ca)
    async with trio.open_nursery() as nursery:
        url = await start_ingress(nursery, pki, ring)
        port = int(url.rsplit(":", 1)[1])
        # A generous bound: the point is that nothing waits out a 60 s timeout.
        with trio.fail_after(10), pytest.raises(ControlRefusedError) as info:
            await open_control_websocket(nursery, "127.0.0.1", port, context, limit_s=30)
        assert "refusing this worker's certificate" in str(info.value)
        await eventually(lambda: "refused a worker" in caplog.text)
        expected = "PEER_DID_NOT_RETURN_A_CERTIFICATE" if certificate == "none" else "VERIFY_FAILED"
        assert expected in caplog.text
        assert ring.stats().workers == ()
        nursery.cancel_scope.cancel()


async def test_an_ingress_with_a_certificate_from_another_ca_is_refused(pki: Pki) -> None:
    ring = Ring(max_streams=8)
    stranger = trustme.CA()
    stranger.cert_pem.write_to_path(str(pki.tmp / "stranger-ca.pem"))
    context = client_ssl_context(pki.worker("w"), None, pki.tmp / "stranger-ca.pem")
    async with trio.open_nursery() as nursery:
        url = await start_ingress(nursery, pki, ring)
        port = int(url.rsplit(":", 1)[1])
        with trio.fail_after(10), pytest.raises(ControlRefusedError, match="CERTIFICATE_VERIFY"):
            await open_control_websocket(nursery, "127.0.0.1", port, context, limit_s=30)
        nursery.cancel_scope.cancel()


async def test_a_worker_reattaches_when_its_ingress_restarts(
    pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    async with trio.open_nursery() as nursery:
        ring = Ring(max_streams=8)
        context = server_ssl_context(pki.ingress, pki.ingress, pki.worker_ca)

        async def first_ingress(task_status: trio.TaskStatus[tuple[str, trio.CancelScope]]) -> None:
            async with trio.open_nursery() as inner:
                address = await inner.start(serve_control, ring, ControlConfig(context, port=0))
                task_status.started((address, inner.cancel_scope))

        url, first = await nursery.start(first_ingress)
        port = int(url.rsplit(":", 1)[1])
        async with worker(pki, [url], "a", echo_as("a", chunks=1)):
            await wait_attached(ring, 1)
            first.cancel()
            await eventually(lambda: not ring.stats().workers)
            # The worker's attempts meanwhile are refused, and it says so.
            await eventually(
                lambda: "Connection refused" in caplog.text or "connect to" in caplog.text
            )
            second = Ring(max_streams=8)
            await nursery.start(serve_control, second, ControlConfig(context, port=port))
            await wait_attached(second, 1)
            assert await served_by(second.park(HEAD, b"again")) == ("a", b"0:again;")
        nursery.cancel_scope.cancel()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_the_readme_certificates_make_a_working_ring(tmp_path: Path) -> None:
    """examples/ring/make-certs.sh, run as the README says, gives certificates that work."""
    script = MAKE_CERTS
    env = {**os.environ, "INGRESS_NAMES": "DNS:localhost,IP:127.0.0.1"}
    await trio.run_process([str(script), str(tmp_path), "worker-1"], env=env, capture_stdout=True)
    ring = Ring(max_streams=4)
    context = server_ssl_context(
        tmp_path / "ingress.pem", tmp_path / "ingress.key", tmp_path / "workers-ca.pem"
    )
    client = client_ssl_context(
        tmp_path / "worker-1.pem", tmp_path / "worker-1.key", tmp_path / "ingress-ca.pem"
    )
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_control, ring, ControlConfig(context, port=0))
        url = url.replace("127.0.0.1", "localhost")  # the host name is checked too
        async with (
            connect_ring([url], client, worker_id="w", max_inflight=1) as link,
            trio.open_nursery() as workers,
        ):
            workers.start_soon(serve_slots, link, echo_as("w", chunks=1))
            await wait_attached(ring, 1)
            assert ring.stats().workers[0].worker_id.startswith("worker-1#")
            assert await served_by(ring.park(HEAD, b"hi")) == ("w", b"0:hi;")
            workers.cancel_scope.cancel()
        nursery.cancel_scope.cancel()


async def test_a_reset_right_after_the_handshake_reads_as_a_refusal(pki: Pki) -> None:
    """The ingress refuses by closing once the handshake is done; when the worker's WebSocket
    request is still unread in its socket then, the kernel sends a reset, not a close."""
    server = server_ssl_context(pki.ingress, pki.ingress, pki.worker_ca)
    server.verify_mode = ssl.CERT_OPTIONAL  # finish the handshake; refuse after it

    async def refuse(tcp: trio.SocketStream) -> None:
        tls = trio.SSLStream(tcp, server, server_side=True)
        await tls.do_handshake()
        await trio.lowlevel.wait_readable(tcp.socket)  # the request arrived, unread
        tcp.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        tcp.socket.close()  # a reset

    context = client_ssl_context(pki.worker("w"), None, pki.ingress_ca)
    async with trio.open_nursery() as nursery:
        listeners = await nursery.start(partial(trio.serve_tcp, refuse, 0, host="127.0.0.1"))
        port = listeners[0].socket.getsockname()[1]
        with trio.fail_after(10), pytest.raises(ControlRefusedError) as info:
            await open_control_websocket(nursery, "127.0.0.1", port, context, limit_s=30)
        assert "refusing this worker's certificate" in str(info.value)
        nursery.cancel_scope.cancel()
