"""The control channel's sessions without sockets or TLS: the ingress's session and the worker's
``RemoteLink`` over trio-websocket on ``trio.testing.memory_stream_pair()``, on a fake clock
(``autojump_clock``), so that timeouts are exact and nothing here depends on the machine."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing
from trio_websocket import WebSocketConnection, wrap_client_stream, wrap_server_stream

from llmtrio.api import CHAT_PATH
from llmtrio.ring import (
    Attach,
    Claim,
    ClaimedStream,
    ControlConfig,
    ControlRefusedError,
    Detach,
    DialConfig,
    FrameDecoder,
    RemoteLink,
    RequestHead,
    Ring,
    RingStream,
    encode,
)
from llmtrio.ring._control import _serve_worker

from .._helpers import eventually

HEAD = RequestHead("POST", CHAT_PATH, [])
CONTEXT = ssl.create_default_context()


async def ingress_session(
    nursery: trio.Nursery, ring: Ring, config: ControlConfig, name: str
) -> WebSocketConnection:
    """Serve one worker connection on ``ring``; returns the worker's end of the WebSocket."""
    server_stream, client_stream = trio.testing.memory_stream_pair()
    client_ready: list[WebSocketConnection] = []

    async def client_side() -> None:
        client_ready.append(
            await wrap_client_stream(nursery, client_stream, "ingress", "/ring")  # type: ignore[arg-type]
        )

    async with trio.open_nursery() as both:
        both.start_soon(client_side)
        request = await wrap_server_stream(nursery, server_stream)
        server = await request.accept()
    nursery.start_soon(_serve_worker, ring, config, server, name, "memory")
    return client_ready[0]


def config(**changes: float) -> ControlConfig:
    return ControlConfig(CONTEXT, **changes)  # type: ignore[arg-type]


@asynccontextmanager
async def remote_worker(
    rings: list[Ring],
    handler: Callable[[ClaimedStream], Awaitable[None]],
    *,
    max_inflight: int,
    control: ControlConfig | None = None,
) -> AsyncIterator[RemoteLink]:
    link = RemoteLink("w", max_inflight, ("fake",), CONTEXT)
    async with trio.open_nursery() as nursery:
        for i, ring in enumerate(rings):
            ws = await ingress_session(nursery, ring, control or config(), f"w{i}")
            nursery.start_soon(link._serve, ws, f"ingress-{i}")

        async def slot() -> None:
            while True:
                claimed = await link.claim()
                with claimed:
                    await handler(claimed)

        for _ in range(max_inflight):
            nursery.start_soon(slot)
        yield link
        nursery.cancel_scope.cancel()


async def answer(claimed: ClaimedStream) -> None:
    await claimed.send_head(200, [])
    await claimed.send(claimed.body)
    await claimed.end()


async def body_of(stream: RingStream) -> bytes:
    await stream.response_head()
    return b"".join([chunk async for chunk in stream.body()])


async def test_one_worker_over_two_ingresses_holds_at_most_its_slots(
    autojump_clock: trio.abc.Clock,
) -> None:
    rings = [Ring(max_streams=16), Ring(max_streams=16)]
    holding = most = 0

    async def slow(claimed: ClaimedStream) -> None:
        nonlocal holding, most
        holding += 1
        most = max(most, holding)
        await trio.sleep(1)
        holding -= 1
        await answer(claimed)

    async with remote_worker(rings, slow, max_inflight=2) as link:
        await eventually(lambda: len(rings[0].stats().workers) + len(rings[1].stats().workers) == 2)
        await trio.sleep(1)
        # Idle, the worker offers both free slots to each ingress.
        assert [ring.stats().workers[0].waiting_claims for ring in rings] == [2, 2]
        streams = [ring.park(HEAD, b"%d" % i) for i in range(5) for ring in rings]
        bodies = [await body_of(stream) for stream in streams]
        assert bodies == [b"%d" % i for i in range(5) for _ in rings]
        assert link.held == 0
    assert most == 2


async def test_a_silent_worker_is_declared_dead_after_the_worker_timeout(
    autojump_clock: trio.abc.Clock,
) -> None:
    ring = Ring(max_streams=4)
    async with trio.open_nursery() as nursery:
        ws = await ingress_session(nursery, ring, config(worker_timeout=7), "mute")
        await ws.send_message(encode(Attach("mute", 1)))
        await eventually(lambda: ring.stats().workers)
        attached = trio.current_time()
        await eventually(lambda: not ring.stats().workers)
        assert trio.current_time() - attached == pytest.approx(7, abs=0.05)
        nursery.cancel_scope.cancel()


async def test_a_cancel_not_acknowledged_is_dropped_after_its_timeout(
    autojump_clock: trio.abc.Clock,
) -> None:
    ring = Ring(max_streams=4)

    async def deaf(claimed: ClaimedStream) -> None:
        if claimed.body == b"deaf":
            await claimed.send_head(200, [])
            await trio.sleep(1000)  # never looks at claimed.cancelled
        await answer(claimed)

    control = config(cancel_ack_timeout=3)
    async with remote_worker([ring], deaf, max_inflight=2, control=control):
        stuck = ring.park(HEAD, b"deaf")
        await stuck.response_head()
        stuck.cancel()
        cancelled = trio.current_time()
        await eventually(lambda: not ring.stats().tracked)
        assert trio.current_time() - cancelled == pytest.approx(3, abs=0.05)
        # The worker's other slot still serves.
        assert await body_of(ring.park(HEAD, b"ok")) == b"ok"
        assert len(ring.stats().workers) == 1


async def test_credits_hold_back_a_slow_stream_only(autojump_clock: trio.abc.Clock) -> None:
    ring = Ring(max_streams=4, response_buffer=1)
    sent: dict[bytes, int] = {b"slow": 0, b"fast": 0}

    async def chatty(claimed: ClaimedStream) -> None:
        await claimed.send_head(200, [])
        for _ in range(50):
            await claimed.send(b"x")
            sent[claimed.body] += 1
        await claimed.end()

    async with remote_worker([ring], chatty, max_inflight=2, control=config(credits=3)):
        slow = ring.park(HEAD, b"slow")
        await slow.response_head()
        assert await body_of(ring.park(HEAD, b"fast")) == b"x" * 50
        await trio.sleep(5)
        # The unread stream stopped at its client's buffer plus its credits.
        assert sent[b"slow"] <= 1 + 3 + 1
        assert await body_of(slow) == b"x" * 50


async def test_a_worker_claiming_again_while_its_last_client_still_reads(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The worker ends a stream and claims its slot again at once, while the ring still counts
    the stream (its client has not read it all): the claim waits for room, it does not break
    the protocol (which would detach the worker and fail the stream)."""
    ring = Ring(max_streams=4, response_buffer=1)

    async def three(claimed: ClaimedStream) -> None:
        await claimed.send_head(200, [])
        for chunk in (b"a", b"b", b"c"):
            await claimed.send(chunk)
        await claimed.end()

    async with remote_worker([ring], three, max_inflight=1):
        first = ring.park(HEAD)
        await first.response_head()
        await trio.sleep(5)  # the client reads nothing for a while
        second = ring.park(HEAD)
        assert await body_of(first) == b"abc"
        assert await body_of(second) == b"abc"
        assert len(ring.stats().workers) == 1


@pytest.mark.parametrize("quiet_first", [False, True])
async def test_a_busy_ingress_does_not_starve_a_quiet_one(
    autojump_clock: trio.abc.Clock, quiet_first: bool
) -> None:
    """One slot, offered to two ingresses: the quiet one's single request is served while the
    busy one still has a long queue, not after it."""
    busy, quiet = Ring(max_streams=64), Ring(max_streams=64)
    rings = [quiet, busy] if quiet_first else [busy, quiet]
    order: list[bytes] = []

    async def one_second(claimed: ClaimedStream) -> None:
        order.append(claimed.body)
        await trio.sleep(1)
        await answer(claimed)

    async with remote_worker(rings, one_second, max_inflight=1):
        await eventually(lambda: len(busy.stats().workers) + len(quiet.stats().workers) == 2)
        queue = [busy.park(HEAD, b"busy-%d" % i) for i in range(20)]
        await trio.sleep(2.5)
        lone = quiet.park(HEAD, b"quiet")
        assert await body_of(lone) == b"quiet"
        for stream in queue:
            await body_of(stream)
    assert order.index(b"quiet") == 3, order  # the slot that frees next


async def test_a_worker_claiming_beyond_its_bound_is_sent_away(
    autojump_clock: trio.abc.Clock,
) -> None:
    ring = Ring(max_streams=4)
    async with trio.open_nursery() as nursery:
        ws = await ingress_session(nursery, ring, config(), "greedy")
        await ws.send_message(encode(Attach("greedy", 2)))
        await ws.send_message(encode(Claim(2)) + encode(Claim(1)))
        decoder = FrameDecoder()
        decoder.receive_data(bytes(await ws.get_message()))
        reply = decoder.next_message()
        assert isinstance(reply, Detach)
        assert "beyond its max_inflight of 2" in reply.reason
        await eventually(lambda: not ring.stats().workers)
        nursery.cancel_scope.cancel()


async def test_an_ingress_that_answers_no_ping_is_given_up(autojump_clock: trio.abc.Clock) -> None:
    """A silent partition breaks no connection: the worker pings, and gives up an ingress that
    answers nothing for its ingress timeout (then reconnects, in connect_ring)."""
    timeout = 4.0
    link = RemoteLink("w", 1, (), CONTEXT, DialConfig(ingress_timeout=timeout))
    server_stream, client_stream = trio.testing.memory_stream_pair()
    async with trio.open_nursery() as nursery:
        ingress = trio.CancelScope()

        async def server() -> None:
            with ingress:
                async with trio.open_nursery() as reader:
                    await (await wrap_server_stream(reader, server_stream)).accept()
                    await trio.sleep_forever()

        nursery.start_soon(server)
        ws = await wrap_client_stream(nursery, client_stream, "ingress", "/ring")  # type: ignore[arg-type]
        ingress.cancel()  # the ingress falls silent, its connection still open
        start = trio.current_time()
        given_up = []
        try:
            await link._serve(ws, "silent")
        except* ControlRefusedError as group:
            given_up = [str(exc) for exc in group.exceptions]
        assert given_up == [f"ingress silent answered no ping for {timeout:g}s"]
        # Given up one timeout after a ping that went unanswered (pings go out every second).
        assert timeout < trio.current_time() - start <= timeout + 2.5
        assert link.attached == 0
        nursery.cancel_scope.cancel()


async def test_a_response_ended_just_before_its_worker_leaves_reaches_its_client(
    autojump_clock: trio.abc.Clock,
) -> None:
    """The worker ends a stream and detaches at once (SIGTERM after its last stream): its
    client, still reading, gets the whole response, not a failure."""
    ring = Ring(max_streams=4, response_buffer=1)
    done = trio.Event()

    async def three(claimed: ClaimedStream) -> None:
        await claimed.send_head(200, [])
        for chunk in (b"a", b"b", b"c"):
            await claimed.send(chunk)
        await claimed.end()
        done.set()

    async with remote_worker([ring], three, max_inflight=1) as link:
        stream = ring.park(HEAD)
        await stream.response_head()
        await done.wait()
        link._close("the worker is shutting down")  # its End and its Detach leave together
        await trio.sleep(1)  # the client reads late
        assert await body_of(stream) == b"abc"
