"""Routing cost: what routing by model costs the ring, side by side in one run.

    python benchmarks/routing.py                      # both parts
    python benchmarks/routing.py --part dispatch      # the pure core only (a few seconds)
    python benchmarks/routing.py --part isolation     # the simulation only

1. **dispatch**: ``RingCore`` time per request (park, assign to a waiting claim, head, end,
   claim again: the whole of a request's life in the core) with 1, 2 and 20 models, ``--workers``
   workers spread over the models, each claiming for its own; requests name the models in turn.
   Pure: no I/O, no trio.
2. **isolation**: over the real control channel (mutual TLS on loopback, ``serve_link`` over
   ``ring_sim``'s fake engines, so the figure measures routing, not CPU contention), the TTFT of
   model B's requests (one every ``--interval-ms``) while model A's queue is long
   (``--backlog`` requests parked for A's worker, whose slots are held by slow generations),
   against B alone; rounds alternate. Target:
   B's TTFT with A's queue long within 10% of B alone.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from ring_sim import FakeEngine, Stats, client, make_pki

from llmtrio.ring import (
    Attach,
    Claim,
    ControlConfig,
    RequestHead,
    ResponseEnd,
    ResponseHead,
    Ring,
    RingCore,
    connect_ring,
    serve_control,
)
from llmtrio.worker import serve_link

HEAD = RequestHead("POST", "/v1/chat/completions", [("content-type", "application/json")])


def dispatch_us(models: int, workers: int, requests: int) -> float:
    """Microseconds of core time per request's life with ``models`` routing keys (0: none,
    as before routing: workers list no model, claims name none, requests park unrouted)."""
    core = RingCore(max_streams=requests + 1)
    names = [f"m{k}" for k in range(models)] or [""]
    owner: dict[str, str | None] = {}
    for w in range(workers):
        model = names[w % len(names)]
        core.attach(Attach(f"w{w}", 4, models=(model,) if model else ()))
        core.claim(f"w{w}", Claim(4, model=model or None))
        owner[f"w{w}"] = model or None
    started = time.perf_counter()
    for n in range(requests):
        _, effects = core.park(HEAD, b"{}", key=names[n % len(names)])
        for effect in effects:  # one Assign
            worker = effect.worker_id  # type: ignore[union-attr]
            stream_id = effect.message.stream_id
            core.respond(worker, ResponseHead(stream_id, 200))
            core.respond(worker, ResponseEnd(stream_id))
            core.claim(worker, Claim(1, model=owner[worker]))
    return (time.perf_counter() - started) / requests * 1e6


async def isolation_round(args: argparse.Namespace, backlog: int) -> list[float]:
    """B's TTFTs (seconds) with ``backlog`` requests for A parked meanwhile."""
    pki = make_pki()
    ring = Ring(max_streams=backlog + 1024, park_timeout=600)
    stats = Stats()
    runs: Counter[str] = Counter()
    async with trio.open_nursery() as nursery:
        url = await nursery.start(serve_control, ring, ControlConfig(pki.server, port=0))
        for name, model, token_ms in (
            ("worker-a", "A", args.a_token_ms),
            ("worker-b", "B", args.token_ms),
        ):
            engine = FakeEngine(
                args.slots, token_ms / 1000, runs, models=(model,), misrouted=stats.misrouted
            )

            async def work(
                name: str = name, model: str = model, engine: FakeEngine = engine
            ) -> None:
                async with connect_ring(
                    [url], pki.worker(name), worker_id=name, max_inflight=args.slots, models=[model]
                ) as link:
                    await serve_link(engine, link)  # type: ignore[arg-type]

            nursery.start_soon(work)
        while {m.name for m in ring.models().values()} != {"A", "B"}:  # noqa: ASYNC110
            await trio.sleep(0.01)
        async with trio.open_nursery() as load:
            for n in range(backlog):
                load.start_soon(
                    lambda n=n: client(ring, 0, n, stats, slow=False, leave=False, model="A")
                )
            # A's queue is in place (its slots taken, the rest parked) before B's first request.
            while ring.stats().parked < backlog - args.slots:  # noqa: ASYNC110
                await trio.sleep(0.01)
            async with trio.open_nursery() as bees:
                for n in range(args.requests):
                    bees.start_soon(
                        lambda n=n: client(
                            ring, 1, n, stats, slow=False, leave=False, model="B", max_tokens=4
                        )
                    )
                    await trio.sleep(args.interval_ms / 1000)
            parked_a = ring.stats().parked
            load.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    if backlog:
        assert parked_a > 0, "A's queue drained before B's requests ended: raise --backlog"
    assert not stats.misrouted and not stats.lost, (stats.misrouted, stats.lost)
    return stats.by_model["B"]


def summary(ttfts: list[float]) -> tuple[float, float, float]:
    ttfts = sorted(ttfts)
    p90 = ttfts[int(0.9 * (len(ttfts) - 1))]
    return statistics.median(ttfts) * 1e3, statistics.fmean(ttfts) * 1e3, p90 * 1e3


async def isolation(args: argparse.Namespace) -> None:
    alone: list[float] = []
    behind: list[float] = []
    for _ in range(args.rounds):
        alone += await isolation_round(args, 0)
        behind += await isolation_round(args, args.backlog)
    a, b = summary(alone), summary(behind)
    print(
        f"isolation: B's TTFT, {args.requests} requests x {args.rounds} rounds, one every "
        f"{args.interval_ms:g} ms; fake engines of {args.slots} slots, a token every "
        f"{args.token_ms:g} ms (A's: {args.a_token_ms:g} ms)"
    )
    print(
        f"  B alone                         p50 {a[0]:6.1f} ms  mean {a[1]:6.1f}  p90 {a[2]:6.1f}"
    )
    print(
        f"  B, A's queue {args.backlog:4d} long          p50 {b[0]:6.1f} ms  mean {b[1]:6.1f}  "
        f"p90 {b[2]:6.1f}"
    )
    print(f"  ratio (A's queue long / alone)  p50 {b[0] / a[0]:.3f}  mean {b[1] / a[1]:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--part", choices=["dispatch", "isolation", "both"], default="both")
    parser.add_argument("--workers", type=int, default=40, help="dispatch: workers in all")
    parser.add_argument("--dispatch-requests", type=int, default=50_000)
    parser.add_argument("--requests", type=int, default=40, help="isolation: B's per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backlog", type=int, default=400, help="A's requests parked")
    parser.add_argument("--interval-ms", type=float, default=50)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--token-ms", type=float, default=10, help="B's engine")
    parser.add_argument(
        "--a-token-ms",
        type=float,
        default=500,
        help="A's engine: slow, so that A's queue stays long and A's own streaming adds little "
        "work to this one process (the figure is routing, not A's traffic)",
    )
    args = parser.parse_args()
    if args.part in ("dispatch", "both"):
        print(f"dispatch: RingCore time per request, {args.workers} workers")
        for models in (0, 1, 2, 20):
            best = min(dispatch_us(models, args.workers, args.dispatch_requests) for _ in range(3))
            label = f"{models:2d} model(s)" if models else "unrouted   "
            print(f"  {label}  {best:6.2f} us/request (best of 3)")
    if args.part in ("isolation", "both"):
        trio.run(isolation, args)


if __name__ == "__main__":
    main()
