"""Side by side: the same load through the in-process worker (``llmtrio serve``) and through one
remote worker over mutual TLS on loopback (``llmtrio serve --no-local-worker`` +
``llmtrio worker``), same model and engine flags, rounds alternated.

    python benchmarks/ring_bench.py --model ~/.cache/llmtrio/gemma-3-270m-Q4_K_M.gguf

Prints, per setup, aggregate completion tok/s over the whole load and TTFT p50/p90 (time to the
first content chunk of each streamed request), each the median over the rounds, and the ratios
the targets are stated in (remote tok/s >= 0.97x in-process; TTFT p50 at most 10 ms more).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parent.parent


def spawn(log: Path, *args: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as out:
        return subprocess.Popen(
            [sys.executable, "-m", "llmtrio", *args],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )


def wait_for(log: Path, pattern: str, timeout: float = 120) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = re.search(pattern, log.read_text(errors="replace"))
        if found:
            return found.group(1)
        time.sleep(0.05)
    raise SystemExit(f"no {pattern!r} in {log}:\n{log.read_text()[-2000:]}")


def wait_health(url: str, predicate: str) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        health = httpx.get(url + "/health", timeout=10).json()
        if eval(predicate, {}, {"h": health}):
            return
        time.sleep(0.1)
    raise SystemExit(f"{url} never satisfied {predicate}")


async def load(url: str, requests: int, max_tokens: int) -> tuple[float, list[float]]:
    """``requests`` streamed completions at once; (aggregate tok/s, TTFTs in seconds)."""
    ttfts: list[float] = []
    tokens = 0
    body = {
        "messages": [{"role": "user", "content": "Write a story about a lighthouse keeper."}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    async with httpx.AsyncClient(timeout=300) as client:

        async def one() -> None:
            nonlocal tokens
            start = time.perf_counter()
            first = None
            async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                async for line in r.aiter_lines():
                    if first is None and '"content"' in line:
                        first = time.perf_counter() - start
                    if line.startswith("data: {") and '"usage"' in line:
                        usage = json.loads(line[6:]).get("usage")
                        if usage:
                            tokens += usage["completion_tokens"]
            assert first is not None
            ttfts.append(first)

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(requests):
                nursery.start_soon(one)
        wall = time.perf_counter() - start
    return tokens / wall, ttfts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--max-inflight", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    engine = [
        f"--model={args.model}",
        f"--max-inflight={args.max_inflight}",
        "--ctx-size=512",
        f"--threads={args.threads}",
    ]
    tmp = Path(tempfile.mkdtemp(prefix="ring-bench-"))
    subprocess.run(
        [str(ROOT / "examples/ring/make-certs.sh"), str(tmp), "worker-1"],
        check=True,
        stdout=subprocess.DEVNULL,
        env={**os.environ, "INGRESS_NAMES": "DNS:localhost,IP:127.0.0.1"},
    )
    procs = []
    try:
        local_log, ingress_log, worker_log = tmp / "local.log", tmp / "ingress.log", tmp / "w.log"
        procs.append(spawn(local_log, "serve", "--port=0", *engine))
        local = wait_for(local_log, r"serving .*? on (http://\S+)")
        procs.append(
            spawn(
                ingress_log,
                "serve",
                "--no-local-worker",
                "--port=0",
                "--control-port=0",
                f"--control-cert={tmp / 'ingress.pem'}",
                f"--control-key={tmp / 'ingress.key'}",
                f"--control-ca={tmp / 'workers-ca.pem'}",
            )
        )
        remote = wait_for(ingress_log, r"serving .*? on (http://\S+)")
        control = wait_for(ingress_log, r"control listener for workers on (wss://\S+)")
        procs.append(
            spawn(
                worker_log,
                "worker",
                f"--ingress-url={control.replace('127.0.0.1', 'localhost')}",
                f"--tls-cert={tmp / 'worker-1.pem'}",
                f"--tls-key={tmp / 'worker-1.key'}",
                f"--ca={tmp / 'ingress-ca.pem'}",
                *engine,
            )
        )
        wait_health(local, "h['workers']")
        wait_health(remote, "h['workers'] and h['workers'][0]['capacity']")
        # Warm both once.
        for url in (local, remote):
            trio.run(load, url, 2, 8)
        results: dict[str, list[tuple[float, float, float]]] = {"in-process": [], "remote": []}
        for _ in range(args.rounds):
            for name, url in (("in-process", local), ("remote", remote)):
                rate, ttfts = trio.run(load, url, args.requests, args.max_tokens)
                ttfts.sort()
                p50 = statistics.median(ttfts)
                p90 = ttfts[min(len(ttfts) - 1, int(0.9 * len(ttfts)))]
                results[name].append((rate, p50, p90))
                print(
                    f"  {name:10s} {rate:7.1f} tok/s  TTFT p50 {p50 * 1e3:7.1f} ms"
                    f"  p90 {p90 * 1e3:7.1f} ms",
                    flush=True,
                )
        print(
            f"\n{args.requests} streamed requests at once, {args.max_tokens} tokens each, "
            f"--max-inflight {args.max_inflight}, {args.rounds} rounds (median):"
        )
        med = {
            name: tuple(statistics.median(r[i] for r in rows) for i in range(3))
            for name, rows in results.items()
        }
        for name, (rate, p50, p90) in med.items():
            print(
                f"  {name:10s} {rate:7.1f} tok/s  TTFT p50 {p50 * 1e3:7.1f} ms"
                f"  p90 {p90 * 1e3:7.1f} ms"
            )
        ratio = med["remote"][0] / med["in-process"][0]
        extra = (med["remote"][1] - med["in-process"][1]) * 1e3
        print(
            f"  remote/in-process tok/s {ratio:.3f} (target >= 0.97); "
            f"TTFT p50 {extra:+.1f} ms (target <= +10 ms)"
        )
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
