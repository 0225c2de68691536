"""What a worker in another zone costs: TTFT and throughput through a remote worker whose
control connection crosses an added round-trip time, against ``llmtrio serve`` with its engine
in process.

    python benchmarks/rtt_bench.py [--model gemma.gguf] [--rtt 0 10 50] [--requests 24]

One run, side by side on loopback: ``llmtrio serve`` with its local worker, then an engine-less
ingress (``serve --no-local-worker``) with one ``llmtrio worker`` (the same engine flags) that
reaches the ingress's control listener through a delay proxy of this script's own (netem is not
in these kernels): every chunk either way is held for half the round trip, in order, with no
bandwidth limit. For each round-trip time the same load: ``--requests`` streamed chat
completions, ``--concurrency`` at a time, ``--max-tokens`` each (``ignore_eos``, greedy),
after a warm-up. It prints, per setup, TTFT (the client's wait for its first token: median and
90th percentile) and throughput (completion tokens over the wall time of the load).
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import attrs
import httpx
import trio
import trustme

ROOT = Path(__file__).resolve().parent.parent
CHAT = "/v1/chat/completions"


# ----------------------------------------------------------------------------------------------
# The delay proxy


@attrs.define
class DelayProxy:
    """TCP on loopback, each chunk held ``rtt_ms / 2`` in each direction (changeable between
    phases); chunks keep their order."""

    target: tuple[str, int]
    rtt_ms: float = 0.0
    port: int = 0

    async def serve(self, *, task_status: trio.TaskStatus[int]) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        async with trio.open_nursery() as nursery:
            await nursery.start(trio.serve_listeners, self._connection, listeners)
            task_status.started(self.port)

    async def _connection(self, client: trio.SocketStream) -> None:
        async with (
            client,
            await trio.open_tcp_stream(*self.target) as server,
            trio.open_nursery() as nursery,
        ):
            nursery.start_soon(self._pump, client, server, nursery.cancel_scope)
            nursery.start_soon(self._pump, server, client, nursery.cancel_scope)

    async def _pump(
        self, source: trio.SocketStream, sink: trio.SocketStream, scope: trio.CancelScope
    ) -> None:
        line: deque[tuple[float, bytes]] = deque()
        arrived = trio.Event()

        async def deliver() -> None:
            nonlocal arrived
            while True:
                while not line:
                    await arrived.wait()
                    arrived = trio.Event()
                due, data = line.popleft()
                await trio.sleep_until(due)
                if not data:
                    await sink.send_eof()
                    return
                await sink.send_all(data)

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(deliver)
                while True:
                    data = await source.receive_some(65536)
                    line.append((trio.current_time() + self.rtt_ms / 2000, bytes(data)))
                    arrived.set()
                    if not data:
                        break
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            scope.cancel()


# ----------------------------------------------------------------------------------------------
# Processes


@attrs.define
class Proc:
    popen: subprocess.Popen[bytes]
    log: Path

    def wait_for(self, pattern: str, limit_s: float = 180) -> re.Match[str]:
        deadline = time.monotonic() + limit_s
        while time.monotonic() < deadline:
            found = re.search(pattern, self.log.read_text(errors="replace"))
            if found:
                return found
            if self.popen.poll() is not None:
                raise RuntimeError(self.log.read_text(errors="replace")[-2000:])
            time.sleep(0.05)
        raise RuntimeError(f"no {pattern!r} in {limit_s}s: {self.log}")

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.popen.kill()
        self.popen.wait(timeout=30)


def spawn(tmp: Path, name: str, *args: str) -> Proc:
    log = tmp / f"{name}.log"
    with log.open("wb") as out:
        popen = subprocess.Popen(
            [sys.executable, "-m", "llmtrio", *args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    return Proc(popen, log)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


# ----------------------------------------------------------------------------------------------
# Load


@attrs.frozen
class Figures:
    setup: str
    ttft: list[float]
    tokens: int
    seconds: float

    def line(self) -> str:
        ttft = sorted(self.ttft)
        p90 = ttft[min(len(ttft) - 1, int(0.9 * len(ttft)))]
        return (
            f"{self.setup:<24} TTFT median {statistics.median(ttft) * 1000:7.1f} ms, "
            f"p90 {p90 * 1000:7.1f} ms; {self.tokens / self.seconds:6.1f} tok/s "
            f"({self.tokens} tokens in {self.seconds:.1f}s)"
        )


async def one(client: httpx.AsyncClient, url: str, max_tokens: int) -> tuple[float, int]:
    body = {
        "messages": [{"role": "user", "content": "Tell me a story about a fox."}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = trio.current_time()
    first = None
    tokens = 0
    async with client.stream("POST", url + CHAT, json=body) as response:
        assert response.status_code == 200, await response.aread()
        async for line in response.aiter_lines():
            if first is None and '"content"' in line:
                first = trio.current_time() - started
            if '"usage"' in line and '"completion_tokens"' in line:
                tokens = int(re.search(r'"completion_tokens": ?(\d+)', line)[1])  # type: ignore[index]
    assert first is not None
    return first, tokens


async def load(setup: str, url: str, requests: int, concurrency: int, max_tokens: int) -> Figures:
    ttft: list[float] = []
    tokens = 0
    limits = httpx.Limits(max_connections=concurrency)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        async with trio.open_nursery() as nursery:  # warm-up
            for _ in range(concurrency):
                nursery.start_soon(one, client, url, 4)
        send, receive = trio.open_memory_channel[None](requests)
        for _ in range(requests):
            send.send_nowait(None)
        send.close()
        started = trio.current_time()

        async def runner() -> None:
            nonlocal tokens
            async for _ in receive:
                first, count = await one(client, url, max_tokens)
                ttft.append(first)
                tokens += count

        async with trio.open_nursery() as nursery:
            for _ in range(concurrency):
                nursery.start_soon(runner)
        seconds = trio.current_time() - started
    return Figures(setup, ttft, tokens, seconds)


# ----------------------------------------------------------------------------------------------


async def bench(args: argparse.Namespace, tmp: Path, report: Callable[[str], None]) -> None:
    engine = [f"--model={args.model}", f"--max-inflight={args.concurrency}",
              f"--ctx-size={args.ctx_size}", f"--threads={args.threads}"]  # fmt: skip
    procs: list[Proc] = []
    try:
        local = spawn(tmp, "serve", "serve", "--port=0", *engine)
        procs.append(local)
        url = local.wait_for(r"serving .*? on (http://\S+)")[1]
        figures = await load("in process", url, args.requests, args.concurrency, args.max_tokens)
        report(figures.line())
        local.stop()

        ingress_ca, worker_ca = trustme.CA(), trustme.CA()
        ingress_ca.cert_pem.write_to_path(str(tmp / "ingress-ca.pem"))
        worker_ca.cert_pem.write_to_path(str(tmp / "worker-ca.pem"))
        cert, worker_cert = tmp / "ingress.pem", tmp / "worker.pem"
        ingress_ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(cert))
        worker_ca.issue_cert("w").private_key_and_cert_chain_pem.write_to_path(str(worker_cert))
        control = free_port()
        ingress = spawn(
            tmp, "ingress", "serve", "--no-local-worker", "--port=0",
            f"--control-port={control}", f"--control-cert={cert}", f"--control-key={cert}",
            f"--control-ca={tmp / 'worker-ca.pem'}",
        )  # fmt: skip
        procs.append(ingress)
        url = ingress.wait_for(r"serving .*? on (http://\S+)")[1]
        proxy = DelayProxy(("127.0.0.1", control))
        async with trio.open_nursery() as nursery:
            port = await nursery.start(proxy.serve)
            worker = spawn(tmp, "worker", "worker", f"--ingress-url=wss://127.0.0.1:{port}",
                           f"--tls-cert={worker_cert}", f"--ca={tmp / 'ingress-ca.pem'}",
                           *engine)  # fmt: skip
            procs.append(worker)
            await trio.to_thread.run_sync(worker.wait_for, "attached to ingress")
            for rtt in args.rtt:
                proxy.rtt_ms = rtt
                await trio.sleep(2 * rtt / 1000 + 1.5)  # heartbeats in flight take the new delay
                figures = await load(
                    f"remote, +{rtt:g} ms RTT", url, args.requests, args.concurrency,
                    args.max_tokens,
                )  # fmt: skip
                report(figures.line())
            nursery.cancel_scope.cancel()
    finally:
        for proc in procs:
            proc.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a GGUF file (default: the gemma test model)")
    parser.add_argument("--rtt", type=float, nargs="+", default=[0, 10, 50], help="ms")
    parser.add_argument("--requests", type=int, default=24)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--ctx-size", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    if args.model is None:
        from llmtrio.engine import demo_model_path

        args.model = demo_model_path()
    tmp = Path(tempfile.mkdtemp(prefix="llmtrio-rtt-"))
    # A SIGTERM (a timeout's) unwinds like Ctrl-C, so that the processes started are stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    print(
        f"{args.requests} streamed chats of {args.max_tokens} tokens, {args.concurrency} at a "
        f"time, {args.threads} threads, on {args.model.name}",
        flush=True,
    )
    trio.run(bench, args, tmp, lambda line: print(line, flush=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
