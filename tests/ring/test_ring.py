"""The in-process Trio ring: clients park requests, workers claim and answer them."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio
import trio.lowlevel
import trio.testing

import llmtrio.ring
from llmtrio.ring import (
    Claimed,
    Heartbeat,
    ParkTimeoutError,
    ProtocolError,
    Ring,
    RingFullError,
    RingStream,
    StreamCancelledError,
    StreamState,
    WorkerFailedError,
    WorkerLink,
    _config,
    _control,
    _core,
    _dial,
    _effects,
    _errors,
    _framing,
    _link,
    _messages,
    _remote,
    _ring,
    _router,
    _session,
    _states,
    _stats,
    _stream,
    _tls,
)

from .._helpers import HEAD, SSE, read_all


def assert_idle(ring: Ring) -> None:
    """Nothing is left in the ring: no stream tracked, no worker holding one."""
    stats = ring.stats()
    assert stats.tracked == 0
    assert (stats.parked, stats.serving, stats.cancelling) == (0, 0, 0)
    for worker in stats.workers:
        assert worker.held == ()


def state_of(stream: RingStream) -> StreamState:
    return stream.state  # read through a call, so that mypy does not pin it between awaits


async def echo(claimed: Claimed) -> None:
    """Answer a stream with its own request body, in two chunks."""
    with claimed:
        await claimed.send_head(200, SSE)
        await claimed.send(b"echo: ")
        await claimed.send(claimed.body)
        await claimed.end()


async def serve(
    link: WorkerLink, handler: Callable[[Claimed], Awaitable[None]] = echo, slots: int = 1
) -> None:
    """A worker: ``slots`` tasks, each claiming a stream only when it is free."""

    async def slot() -> None:
        while True:
            await handler(await link.claim())

    async with trio.open_nursery() as nursery:
        for _ in range(slots):
            nursery.start_soon(slot)


def test_every_public_name_is_exported_once() -> None:
    exported = {name for name in vars(llmtrio.ring) if not name.startswith("_")}
    modules = (
        _config,
        _control,
        _core,
        _dial,
        _effects,
        _errors,
        _framing,
        _link,
        _messages,
        _remote,
        _ring,
        _router,
        _session,
        _states,
        _stats,
        _stream,
        _tls,
    )
    defined = [name for module in modules for name in module.__all__]
    assert len(defined) == len(set(defined))
    assert exported == set(defined)
    for module in modules:
        for name in module.__all__:
            assert getattr(llmtrio.ring, name) is getattr(module, name)


async def test_park_claim_head_data_end_round_trip() -> None:
    ring = Ring(max_streams=4)
    async with ring.attach("worker-1", max_inflight=2) as link:
        stream = ring.park(HEAD, b"hello")
        assert ring.stats().parked == 1

        claimed = await link.claim()
        assert (claimed.stream_id, claimed.head, claimed.body) == (stream.stream_id, HEAD, b"hello")
        assert state_of(stream) is StreamState.ASSIGNED
        assert ring.stats().workers[0].held == (stream.stream_id,)

        await claimed.send_head(200, SSE)
        head = await stream.response_head()
        assert (head.status, head.headers) == (200, tuple(SSE))
        assert state_of(stream) is StreamState.RESPONDING
        await claimed.send(b"data: a\n\n")
        await claimed.send(b"data: b\n\n")
        await claimed.end()
        assert state_of(stream) is StreamState.ENDED
        assert await stream.response_head() == head  # again, at once
        assert [chunk async for chunk in stream.body()] == [b"data: a\n\n", b"data: b\n\n"]
        assert [chunk async for chunk in stream.body()] == []
        assert not claimed.cancelled.is_set()
        assert_idle(ring)


async def test_a_worker_and_clients_run_concurrently() -> None:
    ring = Ring(max_streams=8)
    async with ring.attach("w", max_inflight=3) as link, trio.open_nursery() as nursery:
        nursery.start_soon(serve, link, echo, 3)
        results: dict[int, bytes] = {}

        async def client(i: int) -> None:
            with ring.park(HEAD, str(i).encode()) as stream:
                results[i] = (await read_all(stream))[1]

        async with trio.open_nursery() as clients:
            for i in range(8):
                clients.start_soon(client, i)
        assert results == {i: b"echo: " + str(i).encode() for i in range(8)}
        await trio.testing.wait_all_tasks_blocked()
        assert_idle(ring)
        assert ring.stats().workers[0].waiting_claims == 3  # every slot free and claiming
        nursery.cancel_scope.cancel()
    assert ring.stats().workers == ()


async def test_streams_are_claimed_in_arrival_order() -> None:
    ring = Ring(max_streams=8)
    streams = [ring.park(HEAD, bytes([i])) for i in range(5)]
    streams[1].cancel()
    async with ring.attach("w", max_inflight=4) as link:
        claimed = [await link.claim() for _ in range(4)]
    assert [c.stream_id for c in claimed] == [s.stream_id for s in streams if s is not streams[1]]
    assert [c.body for c in claimed] == [b"\x00", b"\x02", b"\x03", b"\x04"]


async def test_a_full_ring_refuses_with_retry_after() -> None:
    ring = Ring(max_streams=2, retry_after=7)
    first = ring.park(HEAD)
    ring.park(HEAD)
    with pytest.raises(RingFullError) as info:
        ring.park(HEAD)
    assert info.value.retry_after == 7
    assert "retry after 7s" in str(info.value)
    assert ring.stats().open == 2

    async with ring.attach("w", max_inflight=1) as link:
        claimed = await link.claim()  # being served still takes a spot
        with pytest.raises(RingFullError):
            ring.park(HEAD)
        await claimed.send_head(200)
        await claimed.end()
        assert (await read_all(first))[0].status == 200
        ring.park(HEAD)  # the finished stream's spot is free again


async def test_a_parked_stream_cancelled_by_its_client_frees_its_spot() -> None:
    ring = Ring(max_streams=1)
    with ring.park(HEAD, b"never served") as stream, pytest.raises(RingFullError):
        ring.park(HEAD)
    assert stream.state is StreamState.CANCELLED
    assert_idle(ring)
    with pytest.raises(StreamCancelledError):
        await stream.response_head()

    second = ring.park(HEAD, b"served")
    async with ring.attach("w", max_inflight=1) as link:
        claimed = await link.claim()
    assert claimed.stream_id == second.stream_id
    assert claimed.body == b"served"


async def test_a_client_cancelling_mid_stream_stops_the_worker() -> None:
    ring = Ring(max_streams=4)
    async with ring.attach("w", max_inflight=1) as link:
        stream = ring.park(HEAD)
        claimed = await link.claim()
        await claimed.send_head(200, SSE)
        await claimed.send(b"data: 1\n\n")
        assert await stream.response_head()

        stream.cancel()
        stream.cancel()  # idempotent
        assert claimed.cancelled.is_set()
        assert stream.state is StreamState.CANCELLED
        stats = ring.stats()
        assert (stats.open, stats.cancelling) == (0, 1)  # the spot is free; the slot is not
        with pytest.raises(StreamCancelledError):
            await claimed.send(b"data: 2\n\n")
        with pytest.raises(StreamCancelledError):
            async for _ in stream.body():
                pass
        await claimed.end()  # acknowledges; raises nothing
        assert_idle(ring)


async def test_cancelling_a_stream_whose_worker_waits_on_back_pressure() -> None:
    ring = Ring(max_streams=4, response_buffer=1)
    async with ring.attach("w", max_inflight=1) as link:
        stream = ring.park(HEAD)
        claimed = await link.claim()
        outcome: list[BaseException] = []

        async def worker() -> None:
            with claimed:
                await claimed.send_head(200)
                try:
                    while True:
                        await claimed.send(b"x")
                except StreamCancelledError as exc:
                    outcome.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker)
            await trio.testing.wait_all_tasks_blocked()
            assert stream.state is StreamState.RESPONDING
            stream.cancel()
        assert len(outcome) == 1
        assert_idle(ring)


async def test_leaving_the_stream_block_cancels_an_unfinished_stream() -> None:
    ring = Ring(max_streams=4)
    async with ring.attach("w", max_inflight=1) as link:
        with ring.park(HEAD) as stream:
            claimed = await link.claim()
            await claimed.send_head(200)
        assert claimed.cancelled.is_set()
        with claimed:  # exiting acknowledges the cancellation
            pass
        assert_idle(ring)

        with ring.park(HEAD) as stream:
            claimed = await link.claim()
            await claimed.send_head(200)
            await claimed.end()
        assert not claimed.cancelled.is_set()  # ended: nothing to cancel
        assert stream.state is StreamState.ENDED


async def test_a_worker_failing_before_the_head() -> None:
    ring = Ring(max_streams=4)
    async with ring.attach("w", max_inflight=1) as link:
        stream = ring.park(HEAD)
        claimed = await link.claim()
        claimed.fail("the prompt is too long")
        claimed.fail("ignored: already finished")
        with pytest.raises(WorkerFailedError, match="the prompt is too long"):
            await stream.response_head()
        with pytest.raises(WorkerFailedError, match="the prompt is too long"):
            await read_all(stream)
        assert stream.state is StreamState.FAILED
        assert_idle(ring)


async def test_a_worker_failing_mid_body_after_the_chunks_it_sent() -> None:
    ring = Ring(max_streams=4)
    async with ring.attach("w", max_inflight=1) as link:
        stream = ring.park(HEAD)
        claimed = await link.claim()
        with pytest.raises(ValueError), claimed:
            await claimed.send_head(200)
            await claimed.send(b"data: 1\n\n")
            raise ValueError("decode failed")
        assert (await stream.response_head()).status == 200
        chunks = []
        with pytest.raises(WorkerFailedError, match="decode failed"):
            async for chunk in stream.body():
                chunks.append(chunk)
        assert chunks == [b"data: 1\n\n"]
        assert_idle(ring)


async def test_a_handler_returning_without_end_fails_the_stream() -> None:
    ring = Ring(max_streams=4)
    async with ring.attach("w", max_inflight=1) as link:
        stream = ring.park(HEAD)
        with await link.claim() as claimed:
            await claimed.send_head(200)
        with pytest.raises(WorkerFailedError, match="without ending"):
            await read_all(stream)


async def test_worker_misuse_raises_protocol_errors() -> None:
    ring = Ring(max_streams=4)
    async with ring.attach("w", max_inflight=1) as link:
        ring.park(HEAD)
        claimed = await link.claim()
        with pytest.raises(ProtocolError, match="illegal"):
            await claimed.send(b"before the head")
        with pytest.raises(ProtocolError, match="illegal"):
            await claimed.end()
        await claimed.send_head(200)
        with pytest.raises(ProtocolError, match="ResponseHead is illegal"):
            await claimed.send_head(200)
        await claimed.end()
        with pytest.raises(ProtocolError, match="already finished"):
            await claimed.send(b"after the end")
        with pytest.raises(ProtocolError, match="already finished"):
            await claimed.end()
        ring.park(HEAD)
        held = await link.claim()
        with pytest.raises(ProtocolError, match="beyond its max_inflight"):
            await link.claim()  # its one slot is taken
        held.fail("done")
    with pytest.raises(ProtocolError, match="already attached"):
        async with ring.attach("x", max_inflight=1), ring.attach("x", max_inflight=1):
            pass


async def test_a_worker_detaching_fails_responding_streams_and_requeues_the_rest() -> None:
    ring = Ring(max_streams=8)
    responding, assigned, waiting = (ring.park(HEAD, bytes([i])) for i in range(3))

    with pytest.raises(RuntimeError, match="engine died"):
        async with ring.attach("doomed", max_inflight=2) as link:
            first, second = await link.claim(), await link.claim()
            assert (first.stream_id, second.stream_id) == (
                responding.stream_id,
                assigned.stream_id,
            )
            await first.send_head(200)
            await first.send(b"partial")
            raise RuntimeError("engine died")

    with pytest.raises(WorkerFailedError, match="'doomed' detached mid-response"):
        await read_all(responding)
    # The stream without a head is parked again, ahead of the one that came after it.
    assert assigned.state is StreamState.PARKED
    assert ring.stats().parked == 2
    assert ring.stats().workers == ()
    with pytest.raises(ProtocolError, match="already finished, or its worker detached"):
        await second.send_head(200)

    async with ring.attach("healthy", max_inflight=2) as link, trio.open_nursery() as nursery:
        nursery.start_soon(serve, link, echo, 2)
        assert (await read_all(assigned))[1] == b"echo: \x01"
        assert (await read_all(waiting))[1] == b"echo: \x02"
        nursery.cancel_scope.cancel()
    assert_idle(ring)


async def test_no_client_hangs_when_workers_keep_dying() -> None:
    ring = Ring(max_streams=8, max_assignments=2)
    stream = ring.park(HEAD, b"poison")
    errors: list[WorkerFailedError] = []

    async def client() -> None:
        with pytest.raises(WorkerFailedError) as info:
            await stream.response_head()
        errors.append(info.value)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(client)
        for name in ("a", "b"):  # each worker dies on the request it claims
            with pytest.raises(RuntimeError):
                async with ring.attach(name, max_inflight=1) as link:
                    assert (await link.claim()).body == b"poison"
                    raise RuntimeError("poisoned")
    assert "'b' detached before responding" in str(errors[0])
    assert "assigned 2 times" in str(errors[0])
    assert_idle(ring)


async def test_a_cancelled_worker_fails_the_stream_it_was_answering(
    autojump_clock: trio.abc.Clock,
) -> None:
    ring = Ring(max_streams=8)
    stream = ring.park(HEAD)
    with trio.move_on_after(5):
        async with ring.attach("w", max_inflight=1) as link:
            claimed = await link.claim()
            await claimed.send_head(200)
            await trio.sleep_forever()
    with pytest.raises(WorkerFailedError, match="mid-response: the worker was cancelled"):
        await read_all(stream)
    assert_idle(ring)


async def test_without_requeueing_a_detach_fails_every_held_stream() -> None:
    ring = Ring(max_streams=8, max_assignments=1)
    stream = ring.park(HEAD)
    async with ring.attach("w", max_inflight=1) as link:
        await link.claim()
    with pytest.raises(WorkerFailedError, match="'w' detached before responding: the worker left"):
        await stream.response_head()
    assert_idle(ring)


async def test_two_workers_claiming_concurrently_never_share_a_stream() -> None:
    ring = Ring(max_streams=100)
    served: dict[int, list[str]] = {}

    def tagging(name: str) -> Callable[[Claimed], Awaitable[None]]:
        async def handler(claimed: Claimed) -> None:
            served.setdefault(claimed.stream_id, []).append(name)
            await trio.lowlevel.checkpoint()
            await echo(claimed)

        return handler

    async with trio.open_nursery() as nursery:
        for name in ("a", "b"):
            link = await nursery.start(attached_worker, ring, name, tagging(name))
            assert link.worker_id == name
        streams = [ring.park(HEAD, str(i).encode()) for i in range(100)]
        bodies = [(await read_all(stream))[1] for stream in streams]
        nursery.cancel_scope.cancel()

    assert bodies == [b"echo: " + str(i).encode() for i in range(100)]
    assert sorted(served) == [stream.stream_id for stream in streams]
    assert all(len(names) == 1 for names in served.values())
    assert {names[0] for names in served.values()} == {"a", "b"}
    assert_idle(ring)


async def attached_worker(
    ring: Ring,
    name: str,
    handler: Callable[[Claimed], Awaitable[None]],
    *,
    task_status: trio.TaskStatus[WorkerLink] = trio.TASK_STATUS_IGNORED,
) -> None:
    async with ring.attach(name, max_inflight=4) as link:
        task_status.started(link)
        await serve(link, handler, 4)


async def test_back_pressure_bounds_what_a_worker_buffers(autojump_clock: trio.abc.Clock) -> None:
    ring = Ring(max_streams=4, response_buffer=2)
    sent = 0
    async with ring.attach("w", max_inflight=1) as link:
        stream = ring.park(HEAD)
        claimed = await link.claim()

        async def worker() -> None:
            nonlocal sent
            with claimed:
                await claimed.send_head(200)
                for i in range(10):
                    await claimed.send(bytes([i]))
                    sent += 1
                await claimed.end()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(worker)
            await trio.sleep(60)  # a client that reads nothing for a minute
            assert sent == 2
            chunks = []
            async for chunk in stream.body():
                chunks.append(chunk)
                await trio.sleep(1)  # a slow reader: the worker keeps at most 2 ahead
                assert sent - len(chunks) <= 2
        assert chunks == [bytes([i]) for i in range(10)]
        assert_idle(ring)


async def test_a_claim_cancelled_while_waiting_is_taken_back() -> None:
    ring = Ring(max_streams=4)
    async with ring.attach("w", max_inflight=1) as link:
        with trio.move_on_after(0.01):
            await link.claim()
        assert ring.stats().workers[0].waiting_claims == 0
        stream = ring.park(HEAD)
        assert stream.state is StreamState.PARKED  # not sent to a claim nobody waits on


async def test_a_claim_cancelled_after_its_stream_arrived_requeues_the_stream() -> None:
    ring = Ring(max_streams=4)
    async with ring.attach("w", max_inflight=1) as link, trio.open_nursery() as nursery:
        scope = trio.CancelScope()

        async def claimer() -> None:
            with scope:
                await link.claim()

        nursery.start_soon(claimer)
        await trio.testing.wait_all_tasks_blocked()
        # The claimer is woken by the cancel, then the stream lands in its inbox before it
        # runs again: it must park the stream again rather than lose it.
        scope.cancel()
        stream = ring.park(HEAD)
        assert ring.stats().assigned == 1
    assert stream.state is StreamState.PARKED
    assert ring.stats().parked == 1

    async with ring.attach("w2", max_inflight=1) as link:
        assert (await link.claim()).stream_id == stream.stream_id


async def test_a_claim_skips_a_stream_whose_client_left_before_the_worker_saw_it() -> None:
    ring = Ring(max_streams=4)
    async with ring.attach("w", max_inflight=1) as link, trio.open_nursery() as nursery:
        got: list[Claimed] = []

        async def claimer() -> None:
            got.append(await link.claim())

        nursery.start_soon(claimer)
        await trio.testing.wait_all_tasks_blocked()
        gone = ring.park(HEAD, b"gone")  # handed to the waiting claimer...
        gone.cancel()  # ...but its client leaves before the claimer runs
        kept = ring.park(HEAD, b"kept")
    assert [c.stream_id for c in got] == [kept.stream_id]
    assert ring.stats().tracked == 1  # kept, requeued after the worker left


async def test_stats_follow_streams_and_workers() -> None:
    ring = Ring(max_streams=10)
    streams = [ring.park(HEAD) for _ in range(4)]
    stats = ring.stats()
    assert (stats.max_streams, stats.parked, stats.serving, stats.workers) == (10, 4, 0, ())

    async with ring.attach("w", max_inflight=3) as link:
        link.heartbeat(Heartbeat(inflight=0, max_inflight=3, available_slots=3))
        a, b = await link.claim(), await link.claim()
        await a.send_head(200)
        link.heartbeat(Heartbeat(inflight=2, max_inflight=3, available_slots=1))
        streams[3].cancel()
        stats = ring.stats()
        assert (stats.parked, stats.assigned, stats.responding) == (1, 1, 1)
        assert (stats.serving, stats.open, stats.cancelling) == (2, 3, 0)
        (worker,) = stats.workers
        assert worker.worker_id == "w"
        assert worker.max_inflight == 3
        assert worker.held == (a.stream_id, b.stream_id)
        assert worker.capacity is not None
        assert (worker.capacity.inflight, worker.capacity.available_slots) == (2, 1)

        streams[0].cancel()
        assert ring.stats().cancelling == 1
        await a.end()
        await b.send_head(200)
        await b.end()
        assert ring.stats().parked == 1
        assert ring.stats().serving == 0
        streams[2].cancel()
        assert_idle(ring)


async def test_a_stream_no_worker_claims_times_out_and_is_cancelled(
    autojump_clock: trio.abc.Clock,
) -> None:
    ring = Ring(max_streams=4, park_timeout=5.0, retry_after=2.0)
    stream = ring.park(HEAD)
    start = trio.current_time()
    with pytest.raises(ParkTimeoutError) as info:
        await stream.response_head()
    assert trio.current_time() - start == pytest.approx(5.0)
    assert (info.value.park_timeout, info.value.retry_after) == (5.0, 2.0)
    assert stream.state is StreamState.CANCELLED
    assert_idle(ring)


async def test_the_park_timeout_counts_only_while_parked(autojump_clock: trio.abc.Clock) -> None:
    """A claimed stream may take longer than the park timeout to answer (a long prefill); a
    stream requeued by a dying worker gets a new park timeout."""
    ring = Ring(max_streams=4, park_timeout=5.0)
    stream = ring.park(HEAD, b"x")

    async def slow_then_die(task_status: trio.TaskStatus[None]) -> None:
        async with ring.attach("dies", 1) as link:
            task_status.started()
            await link.claim()
            await trio.sleep(20)  # longer than the park timeout, holding the stream
        # leaving the block detaches the worker: the stream is parked again

    async with trio.open_nursery() as nursery:
        await nursery.start(slow_then_die)
        start = trio.current_time()
        with pytest.raises(ParkTimeoutError):
            await stream.response_head()
        assert trio.current_time() - start == pytest.approx(25.0)
    assert_idle(ring)


def test_the_rings_defaults_live_in_ring_config_alone() -> None:
    """``Ring`` and ``RingCore`` take their defaults from ``RingConfig`` (not copies), and
    ``Ring.from_config`` carries every setting."""
    from llmtrio.ring import RingConfig, RingCore

    defaults = RingConfig()
    ring = Ring()
    for name in ("max_streams", "retry_after", "response_buffer", "max_assignments"):
        assert getattr(ring, name) == getattr(defaults, name), name
    core = RingCore(max_streams=1)
    assert (core.retry_after, core.max_assignments) == (
        defaults.retry_after,
        defaults.max_assignments,
    )
    assert ring.park_timeout is None  # a ring built directly waits as long as its client
    config = RingConfig(
        max_streams=5, park_timeout=2.5, retry_after=4.0, response_buffer=3, max_assignments=1
    )
    built = Ring.from_config(config)
    assert (
        built.max_streams,
        built.park_timeout,
        built.retry_after,
        built.response_buffer,
        built.max_assignments,
    ) == (5, 2.5, 4.0, 3, 1)
    for field, bad in (("response_buffer", 0), ("max_assignments", 0), ("retry_after", -1.0)):
        with pytest.raises(ValueError, match=f"^{field} must be"):
            RingConfig(**{field: bad})
