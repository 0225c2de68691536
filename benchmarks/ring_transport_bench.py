"""The control channel's own cost, in one process: the time from parking a request to its first
response chunk, through an in-process worker link and through a remote link over mutual TLS on
loopback (``serve_control`` + ``connect_ring``), with an echo worker and no engine.

    python benchmarks/ring_transport_bench.py [--requests 300]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio
import trustme

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import trio.lowlevel

from llmtrio.ring import (
    ControlConfig,
    RequestHead,
    Ring,
    RingLink,
    client_ssl_context,
    connect_ring,
    serve_control,
    server_ssl_context,
)

HEAD = RequestHead("POST", "/v1/chat/completions", [])


async def echo_slots(link: RingLink) -> None:
    async def slot() -> None:
        while True:
            claimed = await link.claim()
            with claimed:
                await claimed.send_head(200, [])
                await claimed.send(b"first")
                await claimed.end()

    async with trio.open_nursery() as nursery:
        for _ in range(link.max_inflight):
            nursery.start_soon(slot)


async def first_chunk_ms(ring: Ring, requests: int) -> list[float]:
    times = []
    for _ in range(requests):
        start = time.perf_counter()
        with ring.park(HEAD) as stream:
            async for _chunk in stream.body():
                break
        times.append((time.perf_counter() - start) * 1e3)
        await trio.lowlevel.checkpoint()
    return times


async def main(requests: int) -> None:
    tmp = Path(tempfile.mkdtemp())
    ingress_ca, worker_ca = trustme.CA(), trustme.CA()
    ingress_ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(
        str(tmp / "ingress.pem")
    )
    ingress_ca.cert_pem.write_to_path(str(tmp / "ingress-ca.pem"))
    worker_ca.cert_pem.write_to_path(str(tmp / "worker-ca.pem"))
    worker_ca.issue_cert("w").private_key_and_cert_chain_pem.write_to_path(str(tmp / "w.pem"))
    server = server_ssl_context(tmp / "ingress.pem", tmp / "ingress.pem", tmp / "worker-ca.pem")
    client = client_ssl_context(tmp / "w.pem", None, tmp / "ingress-ca.pem")
    async with trio.open_nursery() as nursery:
        local = Ring()
        async with local.attach("local", 4) as link, trio.open_nursery() as workers:
            workers.start_soon(echo_slots, link)
            in_process = await first_chunk_ms(local, requests)
            workers.cancel_scope.cancel()
        remote = Ring()
        url = await nursery.start(serve_control, remote, ControlConfig(server, port=0))
        async with (
            connect_ring([url], client, worker_id="w", max_inflight=4) as remote_link,
            trio.open_nursery() as workers,
        ):
            workers.start_soon(echo_slots, remote_link)
            while not remote.stats().workers:  # noqa: ASYNC110
                await trio.sleep(0.01)
            await trio.sleep(0.2)
            over_tls = await first_chunk_ms(remote, requests)
            workers.cancel_scope.cancel()
        nursery.cancel_scope.cancel()
    for name, times in (("in-process link", in_process), ("remote link, TLS", over_tls)):
        times.sort()
        print(
            f"  {name:17s} park -> first chunk p50 {statistics.median(times):6.3f} ms  "
            f"p90 {times[int(0.9 * (len(times) - 1))]:6.3f} ms  ({requests} requests)"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=300)
    trio.run(main, parser.parse_args().requests)
