"""Embedding throughput side by side: ``llmtrio serve`` and llama.cpp's ``llama-server
--embeddings -np 8`` on the same GGUF, one after the other in one run.

    ./benchmarks/build_llama_server.sh       # once: builds and caches llama-server
    .venv/bin/python benchmarks/embed_compare.py --threads 2

For each server, for each point (concurrent requests x inputs per request: 1, 8 and 64
concurrent requests of 1 and of 32 inputs each), ``--requests`` requests per client are sent
back to back by each of the concurrent clients (a closed loop), after one warm-up request (and
``--warmup`` single-input requests to each server before the first point); the figure is
inputs embedded per second over the point's wall time. Both servers run at once (an idle one
costs no CPU) and take turns at each point, ``--rounds`` times; the median is the figure, so
a load that drifts during the run weighs on both alike. Inputs are distinct short sentences
(8-16 words, as retrieval queries and chunks' titles are), so no cache helps either
server. The table prints each server's inputs/s and llmtrio's ratio to llama-server.

llama-server runs with ``--embeddings --pooling mean -np 8 -c 8*512 -b 2048 -ub 2048``
(``-ub`` at least one whole input, as a non-causal model needs; it decodes at most its 8
slots' inputs at once); llmtrio with its defaults for an embedding model (up to 64 sequences and 256
tokens a decode) and ``--idle-timeout 60`` (llama-server keeps an idle connection 600 s). Both on
``--threads`` threads.

The client is a few lines of HTTP/1.1 over one kept-alive socket per concurrent client
(``Connection``), not httpx: on 2 cores the client shares the CPU with the server it
measures, and httpx cost about 9 ms of CPU a request at 64 concurrent connections (2 ms at
1); this one costs 0.2-0.4 ms a single-input request (printed at each point). A request that
a server answers by closing its kept-alive connection before a byte of the reply is sent once
more on a new connection (the idle-close race every HTTP client has; counted and printed at
each point); any other failure ends the run.

Resource handling: each server is a child process stopped (SIGINT, then SIGTERM, SIGKILL)
at the end, also on errors and Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _servers import HOST, find_llama_server, free_port, stop_process, tail

MINILM = Path(__file__).resolve().parents[1] / "tests/data/all-MiniLM-L6-v2-Q8_0.gguf"
POINTS = ((1, 1), (8, 1), (64, 1), (1, 32), (8, 32), (64, 32))
WORDS = (
    "river", "lamp", "quiet", "orange", "engine", "market", "winter", "letter", "garden",
    "silver", "window", "travel", "paper", "forest", "music", "harbour", "bright", "stone",
    "careful", "yellow", "morning", "castle", "simple", "broken", "ocean", "number",
)  # fmt: skip


def sentence(i: int) -> str:
    """A distinct sentence of 8 to 16 words for each ``i``."""
    n = 8 + i % 9
    words = [WORDS[(i * 7 + k * (i % 5 + 1)) % len(WORDS)] for k in range(n)]
    return f"{i} " + " ".join(words) + "."


def llmtrio_argv(model: Path, port: int, threads: int) -> list[str]:
    return [
        sys.executable, "-m", "llmtrio", "serve", "--model", str(model), "--host", HOST,
        "--port", str(port), "--threads", str(threads), "--ring-streams", "1024",
        "--idle-timeout", "60",
    ]  # fmt: skip


def llama_server_argv(binary: Path, model: Path, port: int, threads: int) -> list[str]:
    return [
        str(binary), "-m", str(model), "--host", HOST, "--port", str(port), "--embeddings",
        "--pooling", "mean", "-np", "8", "-c", str(8 * 512), "-b", "2048", "-ub", "2048",
        "--threads", str(threads), "--threads-batch", str(threads), "--no-webui",
    ]  # fmt: skip


@asynccontextmanager
async def running(
    argv: list[str],
    base: str,
    log: Path,
    *,
    model: str | None = None,
    warm_path: str = "/v1/embeddings",
    warm_body: dict[str, Any] | None = None,
) -> AsyncIterator[None]:
    """The server ``argv`` runs while the block does, up once it has answered an embeddings
    request (for ``model``, when given), or ``warm_body`` at ``warm_path``."""
    warm: dict[str, Any] = {"input": "warm up"} | ({"model": model} if model else {})
    warm = warm_body if warm_body is not None else warm
    with log.open("wb") as out:
        process = await trio.lowlevel.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT
        )
        try:
            async with httpx.AsyncClient(timeout=5) as client:
                with trio.move_on_after(120):
                    while process.returncode is None:
                        try:
                            response = await client.post(base + warm_path, json=warm)
                            if response.status_code == 200:
                                break
                        except httpx.HTTPError:
                            pass
                        await trio.sleep(0.2)
                if process.returncode is not None or response.status_code != 200:
                    raise RuntimeError(f"{argv[0]} did not start:\n{tail(log)}")
            yield
        finally:
            with trio.move_on_after(35, shield=True):
                await stop_process(process)


class Connection:
    """One kept-alive HTTP/1.1 connection that POSTs JSON and reads the reply: a few lines
    of socket code instead of httpx, whose per-request cost (about 9 ms of CPU a request at
    64 concurrent connections on this 2-core machine, against 2 ms at 1) would compete with
    the server it measures. It speaks only what both servers answer here: a ``content-length``
    body.

    A request sent on a kept-alive connection that the server closes before a byte of the
    reply (the race every HTTP client has with a server closing an idle connection: RFC 9112
    9.3.1) is sent once more on a new connection, and counted in ``retries``; anything else
    (a reply cut short, another status) fails the run.
    """

    def __init__(self, host: str, port: int) -> None:
        self._host, self._port = host, port
        self._stream: trio.SocketStream | None = None
        self._buffer = bytearray()
        self.retries = 0

    async def post(self, path: str, body: bytes) -> bytes:
        request = (
            f"POST {path} HTTP/1.1\r\nhost: {self._host}:{self._port}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode() + body
        reused = self._stream is not None
        try:
            return await self._exchange(request)
        except _ClosedBeforeReply:
            if not reused:
                raise
            self.retries += 1
            return await self._exchange(request)

    async def _exchange(self, request: bytes) -> bytes:
        if self._stream is None:
            self._stream = await trio.open_tcp_stream(self._host, self._port)
            self._buffer.clear()
        stream = self._stream
        try:
            await stream.send_all(request)
            head = await self._read_until(b"\r\n\r\n", replied=False)
        except (trio.BrokenResourceError, _ClosedBeforeReply) as exc:
            await self.aclose()
            raise _ClosedBeforeReply from exc
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = dict(line.lower().split(": ", 1) for line in lines if line)
        body = await self._read_exactly(int(headers["content-length"]))
        if not status_line.startswith("HTTP/1.1 200"):
            raise RuntimeError(f"{status_line}: {body[:300]!r}")
        if headers.get("connection", "").lower() == "close":
            await self.aclose()
        return body

    async def _read_until(self, end: bytes, *, replied: bool) -> bytes:
        assert self._stream is not None
        while (at := self._buffer.find(end)) < 0:
            data = await self._stream.receive_some(65536)
            if not data:
                if replied or self._buffer:
                    raise RuntimeError("the server closed the connection mid-reply")
                raise _ClosedBeforeReply
            self._buffer += data
        head = bytes(self._buffer[:at])
        del self._buffer[: at + len(end)]
        return head

    async def _read_exactly(self, n: int) -> bytes:
        assert self._stream is not None
        while len(self._buffer) < n:
            data = await self._stream.receive_some(max(65536, n - len(self._buffer)))
            if not data:
                raise RuntimeError("the server closed the connection mid-body")
            self._buffer += data
        body = bytes(self._buffer[:n])
        del self._buffer[:n]
        return body

    async def aclose(self) -> None:
        if self._stream is not None:
            stream, self._stream = self._stream, None
            await stream.aclose()


class _ClosedBeforeReply(Exception):
    """The server closed the connection before a byte of the reply."""


async def closed_loop(
    base: str,
    concurrency: int,
    requests: int,
    path: str,
    warm: bytes,
    ask: Callable[[int], bytes],
    check: Callable[[bytes], None],
) -> tuple[float, float, int]:
    """``concurrency`` clients (one kept-alive connection each, first warmed with ``warm``)
    each posting ``requests`` bodies ``ask(i)`` to ``path`` back to back, each reply passed
    to ``check``: the seconds they took, the client's CPU ms a request, and the requests
    resent after a kept-alive close."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    counter = iter(range(10**9))
    connections = [Connection(host, int(port)) for _ in range(concurrency)]
    try:
        async with trio.open_nursery() as nursery:
            for connection in connections:
                nursery.start_soon(connection.post, path, warm)

        async def one_client(connection: Connection) -> None:
            for _ in range(requests):
                check(await connection.post(path, ask(next(counter))))

        cpu = time.process_time()
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for connection in connections:
                nursery.start_soon(one_client, connection)
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu
    finally:
        for connection in connections:
            await connection.aclose()
    return elapsed, 1000 * cpu / (concurrency * requests), sum(c.retries for c in connections)


async def measure(base: str, concurrency: int, per_request: int, requests: int) -> Measured:
    """Inputs per second with ``concurrency`` clients (one kept-alive connection each) each
    sending ``requests`` requests of ``per_request`` inputs, back to back."""

    def ask(i: int) -> bytes:
        inputs = [sentence(i * per_request + k) for k in range(per_request)]
        return json.dumps({"input": inputs, "model": "m", "encoding_format": "float"}).encode()

    def check(reply: bytes) -> None:
        # the reply is checked by its shape, not parsed: parsing 384 floats an input costs
        # the client more CPU than it costs either server to write them
        assert reply.count(b'"index":') == per_request, reply[:300]

    # warm-up: one request of the point's shape on each connection
    warm = json.dumps({"input": ["warm"] * per_request}).encode()
    elapsed, cpu_ms, retries = await closed_loop(
        base, concurrency, requests, "/v1/embeddings", warm, ask, check
    )
    return Measured(concurrency * requests * per_request / elapsed, cpu_ms, retries)


@attrs.frozen
class Measured:
    """One turn at one point: inputs per second, the client's CPU milliseconds a request,
    and how many requests were sent again after a kept-alive connection closed."""

    rate: float
    client_ms: float
    retries: int


async def main(args: argparse.Namespace) -> int:
    binary = find_llama_server(args.llama_server)
    if binary is None:
        print("no llama-server: run benchmarks/build_llama_server.sh first", file=sys.stderr)
        return 2
    logdir = Path(args.logdir or tempfile.mkdtemp(prefix="embed-compare-"))
    await trio.to_thread.run_sync(lambda: logdir.mkdir(parents=True, exist_ok=True))
    print(f"model {args.model.name}, {args.threads} threads, load {os.getloadavg()[0]:.2f}")
    results: dict[str, dict[tuple[int, int], float]] = {"llmtrio": {}, "llama-server": {}}
    ports = {"llmtrio": free_port(), "llama-server": free_port()}
    argvs = {
        "llmtrio": llmtrio_argv(args.model, ports["llmtrio"], args.threads),
        "llama-server": llama_server_argv(binary, args.model, ports["llama-server"], args.threads),
    }
    bases = {name: f"http://{HOST}:{port}" for name, port in ports.items()}
    # Both servers up at once (an idle one takes no CPU), measured in turns at each point, so
    # the machine's load drifts over both alike; the median of the rounds is the figure.
    async with (
        running(argvs["llmtrio"], bases["llmtrio"], logdir / "llmtrio.log"),
        running(argvs["llama-server"], bases["llama-server"], logdir / "llama-server.log"),
    ):
        if args.warmup:
            # A just-started server answers its first requests slower than the rest (llmtrio:
            # its first 10-15 single-input requests take 11-18 ms, then 6-9): the figures are
            # a running server's, so each server gets the same unmeasured requests first.
            for base in bases.values():
                await measure(base, 1, 1, args.warmup)
        for concurrency, per_request in POINTS:
            requests = args.requests if per_request == 1 else max(1, args.requests // 4)
            rates: dict[str, list[Measured]] = {"llmtrio": [], "llama-server": []}
            for _ in range(args.rounds):
                for name in rates:
                    rates[name].append(
                        await measure(bases[name], concurrency, per_request, requests)
                    )
            for name, measured in rates.items():
                rate = statistics.median(m.rate for m in measured)
                results[name][concurrency, per_request] = rate
                shown = ", ".join(f"{m.rate:.1f}" for m in measured)
                client = statistics.median(m.client_ms for m in measured)
                retries = sum(m.retries for m in measured)
                print(
                    f"  {name:12} {concurrency:3} x {per_request:2}: {rate:8.1f} inputs/s "
                    f"({shown}); client {client:.2f} ms CPU a request; {retries} retried "
                    f"after a kept-alive close; load {os.getloadavg()[0]:.2f}"
                )
    print(f"\nload {os.getloadavg()[0]:.2f} at the end")
    print("| concurrent requests x inputs | llmtrio inputs/s | llama-server inputs/s | ratio |")
    print("|---|---|---|---|")
    for point in POINTS:
        ours, theirs = results["llmtrio"][point], results["llama-server"][point]
        print(f"| {point[0]} x {point[1]} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f}x |")
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=MINILM, help="an embedding GGUF")
    parser.add_argument("--llama-server", type=Path, help="the binary (default: the cached one)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--requests",
        type=int,
        default=8,
        help="requests per client at 1 input a request (at 32 inputs: a quarter, at least 1)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="turns per point (median)")
    parser.add_argument(
        "--warmup",
        type=int,
        default=30,
        help="unmeasured single-input requests each server answers before the first point",
    )
    parser.add_argument("--logdir", type=Path, help="where the servers' logs go")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(trio.run(main, parse_args(None)))
