"""A simulated ring: many ingresses and workers on loopback over the real control channel
(mutual TLS, trustme certificates), workers running the real ``serve_link`` over fake engines
(a token every few milliseconds, slots like the real engine's), with churn and bursts.

    python benchmarks/ring_sim.py --seconds 20

- ingresses: ``--ingresses`` rings behind ``serve_control``; the first is busy (bursts of
  requests all the time), the others quiet (one request now and then);
- workers: ``--workers`` at a time, each attached to every ingress; every ``--churn`` seconds
  one is cancelled mid-work (its connections close at once; its streams are requeued or fail)
  and a new one joins; every ``--restart`` seconds one ingress's control listener restarts
  (its ring, and its waiting clients, stay);
- clients: a third are slow readers (a pause after each chunk), a few leave mid-stream;
- models: ``--models N`` routing keys; with ``--layout disjoint`` each worker serves one
  (claims naming it), with ``--layout overlap`` each serves two (claims naming none, as a
  worker of the previous version: any model it listed); every request names one at random.

Prints: requests sent, completed, failed with an error event after their first token (allowed:
their worker died mid-stream), failed after their response head but before any token (the
worker sends the head of a stream before its first token today; issue 7 holds it back, and
then these are requeued instead), *lost* (no answer, or an error before the response head:
must be 0), cancelled by their client, generations run more than once (a worker died before its
response head and the request was served again), generations run by a worker that does not
serve the request's model (*misrouted*: must be 0), and per-ingress TTFT p50/p90 (fairness: the
quiet ingresses' requests must not wait behind the busy one's).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import random
import re
import ssl
import statistics
import tempfile
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace

import attrs
import trio
import trustme

from llmtrio.engine import Capacity, Done, GenerateRequest, StopReason, Timings, Token
from llmtrio.ring import (
    ControlConfig,
    RequestHead,
    Ring,
    RingFullError,
    WorkerFailedError,
    client_ssl_context,
    connect_ring,
    serve_control,
    server_ssl_context,
)
from llmtrio.worker import serve_link

HEAD = RequestHead("POST", "/v1/chat/completions", [("content-type", "application/json")])


@attrs.define(eq=False)
class FakeGeneration:
    """What the worker reads of a generation (as ``llmtrio.engine.Generation``): its events
    as it produces them, ``ended`` once the last is out, ``drain()`` for what is unread."""

    ended: trio.Event = attrs.field(factory=trio.Event)
    prompt_tokens: int | None = None  # the worker's encoders read it once the work starts
    _send: trio.MemorySendChannel[object] = attrs.field(init=False)
    _receive: trio.MemoryReceiveChannel[object] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self._send, self._receive = trio.open_memory_channel[object](float("inf"))

    async def run(self, events: AsyncIterator[object]) -> None:
        async for event in events:
            self._send.send_nowait(event)
        self.ended.set()
        self._send.close()

    def __aiter__(self) -> FakeGeneration:
        return self

    async def __anext__(self) -> object:
        try:
            return await self._receive.receive()
        except trio.EndOfChannel:
            raise StopAsyncIteration from None

    def drain(self) -> list[object]:
        events = []
        with contextlib.suppress(trio.WouldBlock, trio.EndOfChannel):
            while True:
                events.append(self._receive.receive_nowait())
        return events


@attrs.define(eq=False)
class FakeEngine:
    """What ``serve_link`` needs of an engine: slots, capacity, and generations of
    ``max_tokens`` tokens, one every ``token_s`` seconds, cancelled at a token boundary."""

    max_inflight: int
    token_s: float
    runs: Counter[str]
    model_name: str = "fake"
    kind: str = "chat"
    models: tuple[str, ...] = ()
    """The models the worker serves; a request for another is counted in ``misrouted``."""
    misrouted: list[str] = attrs.field(factory=list)
    #: What the link reads of an engine's config: the LoRA adapters it serves (none).
    config: SimpleNamespace = attrs.field(factory=lambda: SimpleNamespace(lora=()))
    _inflight: int = 0
    _slots: trio.Semaphore = attrs.field(init=False)
    _lot: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot)

    def __attrs_post_init__(self) -> None:
        self._slots = trio.Semaphore(self.max_inflight)

    def capacity(self) -> Capacity:
        decoding = self.max_inflight - self._slots.value
        return Capacity(
            inflight=self._inflight,
            decoding=decoding,
            max_inflight=self.max_inflight,
            available_slots=self._slots.value,
        )

    async def wait_failed(self) -> BaseException:
        """A fake engine never fails."""
        await trio.sleep_forever()

    async def capacity_changed(self) -> None:
        await self._lot.park()

    @asynccontextmanager
    async def submit(self, request: GenerateRequest) -> AsyncIterator[FakeGeneration]:
        self._inflight += 1
        self._lot.unpark_all()
        try:
            async with trio.open_nursery() as nursery:
                generation = FakeGeneration()
                nursery.start_soon(generation.run, self._generate(request))
                yield generation
                nursery.cancel_scope.cancel()
        finally:
            self._inflight -= 1
            self._lot.unpark_all()

    async def _generate(self, request: GenerateRequest) -> AsyncIterator[object]:
        found = re.search(r"req-\d+-\d+(?:@(\S+?)')?", repr(request.messages))
        self.runs[found.group(0) if found else "?"] += 1
        model = found.group(1) if found else None
        if self.models and model not in self.models:
            self.misrouted.append(f"{found.group(0) if found else '?'} on {self.models}")
        tokens = request.max_tokens or 16
        async with self._slots:
            for i in range(tokens):
                await trio.sleep(self.token_s)
                yield Token(f" t{i}")
            yield Done(StopReason.MAX_TOKENS, 4, tokens, Timings(0.0, 0.0, tokens * self.token_s))


@attrs.define
class Stats:
    sent: int = 0
    completed: int = 0
    failed_after_first_token: int = 0
    failed_after_head: list[str] = attrs.field(factory=list)  # before any token
    lost: list[str] = attrs.field(factory=list)
    cancelled: int = 0
    full: int = 0
    ttft: dict[int, list[float]] = attrs.field(factory=dict)
    by_model: dict[str, list[float]] = attrs.field(factory=dict)  # TTFT per model
    misrouted: list[str] = attrs.field(factory=list)


async def client(
    ring: Ring,
    index: int,
    n: int,
    stats: Stats,
    *,
    slow: bool,
    leave: bool,
    model: str = "",
    max_tokens: int = 12,
) -> None:
    rid = f"req-{index}-{n}" + (f"@{model}" if model else "")
    body = json.dumps(
        {
            "messages": [{"role": "user", "content": rid}],
            "max_tokens": max_tokens,
            "stream": True,
            **({"model": model} if model else {}),
        }
    ).encode()
    stats.sent += 1
    start = trio.current_time()
    try:
        stream = ring.park(HEAD, body, key=model)
    except RingFullError:
        stats.full += 1
        return
    first = head = False
    with stream:
        try:
            with trio.fail_after(60):
                await stream.response_head()
                head = True
                async for chunk in stream.body():
                    if b'"content"' in chunk and not first:
                        first = True
                        took = trio.current_time() - start
                        stats.ttft.setdefault(index, []).append(took)
                        stats.by_model.setdefault(model, []).append(took)
                        if leave:
                            stats.cancelled += 1
                            return
                    if b'"error"' in chunk:
                        raise WorkerFailedError(chunk.decode())
                    if slow:
                        await trio.sleep(0.02)
            stats.completed += 1
        except WorkerFailedError as exc:
            if first:
                stats.failed_after_first_token += 1
            elif head:
                stats.failed_after_head.append(f"{rid}: {exc}")
            else:
                stats.lost.append(f"{rid}: {exc}")
        except trio.TooSlowError:
            stats.lost.append(f"{rid}: no answer in 60 s")


@attrs.define
class Pki:
    server: ssl.SSLContext
    ca: trustme.CA
    tmp: Path

    def worker(self, name: str) -> ssl.SSLContext:
        path = self.tmp / f"{name}.pem"
        self.ca.issue_cert(name).private_key_and_cert_chain_pem.write_to_path(str(path))
        return client_ssl_context(path, None, self.tmp / "ingress-ca.pem")


def make_pki() -> Pki:
    tmp = Path(tempfile.mkdtemp(prefix="ring-sim-"))
    ingress_ca, worker_ca = trustme.CA(), trustme.CA()
    ingress_ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(tmp / "ingress.pem")
    )
    ingress_ca.cert_pem.write_to_path(str(tmp / "ingress-ca.pem"))
    worker_ca.cert_pem.write_to_path(str(tmp / "worker-ca.pem"))
    server = server_ssl_context(tmp / "ingress.pem", tmp / "ingress.pem", tmp / "worker-ca.pem")
    return Pki(server, worker_ca, tmp)


def model_names(args: argparse.Namespace) -> list[str]:
    """The routing keys of the run (none: every request and worker unrouted, as before)."""
    return [f"m{k}" for k in range(getattr(args, "models", 0))]


def worker_models(n: int, args: argparse.Namespace) -> tuple[str, ...]:
    """The models the ``n``-th worker serves: one (disjoint sets) or two (overlapping sets)."""
    models = model_names(args)
    if not models:
        return ()
    first = n % len(models)
    if getattr(args, "layout", "disjoint") == "disjoint" or len(models) == 1:
        return (models[first],)
    return (models[first], models[(first + 1) % len(models)])


async def simulate(args: argparse.Namespace) -> tuple[Stats, Counter[str]]:
    rng = random.Random(args.seed)
    pki = make_pki()
    stats = Stats()
    runs: Counter[str] = Counter()
    rings = [Ring(max_streams=256) for _ in range(args.ingresses)]
    config = {"worker_timeout": 2.0, "cancel_ack_timeout": 2.0}

    async with trio.open_nursery() as nursery:
        scopes: list[trio.CancelScope] = []
        ports: list[int] = []

        async def control(i: int, port: int, task_status: trio.TaskStatus[str]) -> None:
            with trio.CancelScope() as scope:
                scopes[i] = scope
                await serve_control(
                    rings[i],
                    ControlConfig(pki.server, port=port, **config),
                    task_status=task_status,
                )

        for i in range(args.ingresses):
            scopes.append(trio.CancelScope())
            url = await nursery.start(control, i, 0)
            ports.append(int(url.rsplit(":", 1)[1]))
        urls = [f"wss://127.0.0.1:{port}" for port in ports]

        workers: list[tuple[trio.CancelScope, tuple[str, ...]]] = []
        serial = 0

        async def worker(
            served: tuple[str, ...], task_status: trio.TaskStatus[trio.CancelScope]
        ) -> None:
            nonlocal serial
            serial += 1
            name = f"worker-{serial}"
            engine = FakeEngine(
                args.slots, args.token_ms / 1000, runs, models=served, misrouted=stats.misrouted
            )
            with trio.CancelScope() as scope:
                task_status.started(scope)
                async with connect_ring(
                    urls, pki.worker(name), worker_id=name, max_inflight=args.slots, models=served
                ) as link:
                    await serve_link(engine, link)  # type: ignore[arg-type]

        for n in range(args.workers):
            served = worker_models(n, args)
            workers.append((await nursery.start(worker, served), served))

        async def churn() -> None:
            while True:
                await trio.sleep(args.churn)
                # The one that joins serves what the one that left served.
                scope, served = workers.pop(rng.randrange(len(workers)))
                scope.cancel()
                workers.append((await nursery.start(worker, served), served))

        async def restarts() -> None:
            while True:
                await trio.sleep(args.restart)
                i = rng.randrange(args.ingresses)
                scopes[i].cancel()
                await trio.sleep(0.2)
                await nursery.start(control, i, ports[i])

        async def traffic(i: int) -> None:
            n = 0
            async with trio.open_nursery() as clients:
                while trio.current_time() < end:
                    burst = rng.randint(4, 12) if i == 0 else 1
                    for _ in range(burst):
                        n += 1
                        slow = rng.random() < 0.33
                        leave = rng.random() < 0.05
                        clients.start_soon(partial_client, i, n, slow, leave)
                    await trio.sleep(rng.uniform(0.05, 0.3) if i == 0 else rng.uniform(0.2, 1))

        async def partial_client(i: int, n: int, slow: bool, leave: bool) -> None:
            models = model_names(args)
            model = models[rng.randrange(len(models))] if models else ""
            await client(rings[i], i, n, stats, slow=slow, leave=leave, model=model)

        end = trio.current_time() + args.seconds
        background = trio.CancelScope()

        async def run_background() -> None:
            with background:
                async with trio.open_nursery() as bg:
                    bg.start_soon(churn)
                    bg.start_soon(restarts)
                    await trio.sleep_forever()

        nursery.start_soon(run_background)
        async with trio.open_nursery() as load:
            for i in range(args.ingresses):
                load.start_soon(traffic, i)
        background.cancel()
        nursery.cancel_scope.cancel()
    return stats, runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--ingresses", type=int, default=3)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--token-ms", type=float, default=10)
    parser.add_argument("--churn", type=float, default=2.0)
    parser.add_argument("--restart", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--models", type=int, default=0, help="routing keys (0: unrouted)")
    parser.add_argument("--layout", choices=["disjoint", "overlap"], default="disjoint")
    args = parser.parse_args()
    stats, runs = trio.run(simulate, args)
    twice = sum(1 for count in runs.values() if count > 1)
    print(
        f"{args.seconds:g}s, {args.ingresses} ingresses x {args.workers} workers of "
        f"{args.slots} slots, churn every {args.churn:g}s, an ingress restart every "
        f"{args.restart:g}s, seed {args.seed}"
    )
    print(f"  requests sent                   {stats.sent}")
    print(f"  completed                       {stats.completed}")
    print(f"  error after the first token     {stats.failed_after_first_token}")
    print(f"  error after the head, no token  {len(stats.failed_after_head)}")
    print(f"  left by their client            {stats.cancelled}")
    print(f"  refused (ring full, 503)        {stats.full}")
    print(f"  LOST                            {len(stats.lost)}")
    for line in stats.lost[:10]:
        print(f"    {line}")
    print(f"  generations run more than once  {twice} (of {len(runs)})")
    if args.models:
        print(f"  models                          {args.models} ({args.layout} worker sets)")
        print(f"  MISROUTED                       {len(stats.misrouted)}")
        for line in stats.misrouted[:10]:
            print(f"    {line}")
    for i, ttfts in sorted(stats.ttft.items()):
        ttfts.sort()
        kind = "busy" if i == 0 else "quiet"
        p90 = ttfts[int(0.9 * (len(ttfts) - 1))]
        print(
            f"  ingress {i} ({kind:5s}) TTFT p50 {statistics.median(ttfts) * 1e3:6.0f} ms  "
            f"p90 {p90 * 1e3:6.0f} ms  ({len(ttfts)} requests)"
        )


if __name__ == "__main__":
    main()
