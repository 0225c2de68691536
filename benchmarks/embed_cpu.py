"""Where an embeddings server's CPU goes: inputs per second and each thread's CPU
milliseconds a request, for ``llmtrio serve`` alone (no llama-server), at the points of
``embed_compare.py``; for one source tree, or for several side by side.

    .venv/bin/python benchmarks/embed_cpu.py --threads 2
    .venv/bin/python benchmarks/embed_cpu.py --points 1x1:40 8x1:24 1x32:6
    .venv/bin/python benchmarks/embed_cpu.py --trees ../base . --rounds 6 \
        --points 1x1:80 8x1:30 64x1:4 1x32:6

One ``llmtrio serve`` of the embedding model (``embed_compare.py``'s flags) per tree; at each
point (``CxK:R``: C concurrent clients, K inputs a request, R requests each, back to back;
its client, sentences and warm-up are ``embed_compare.py``'s), each thread's CPU time from
``/proc/PID/task/*/schedstat`` (nanoseconds; ``stat``'s clock ticks are 10 ms, 0.17 ms a
request over 60 requests) before and after, divided by the requests: the Python thread
(``python``: HTTP, the ring, the worker, tokenizing, the JSON of the vectors) apart from the
decode threads (named after the engine's thread, ``llmtrio embeddi``: the decode thread and
llama.cpp's compute threads, whose spinning at a barrier counts as CPU). Linux only.

``--trees``: one server per source tree (``PYTHONPATH``; the same venv), all up at once,
measured in turns at each point, ``--rounds`` times; the table gives each tree's median
inputs/s over the rounds (each round's in brackets) and the least and the median Python
milliseconds a request: on a shared machine the rounds move by tens of percent, the turns
spread that over the trees alike. Without ``--trees``: the llmtrio of the working directory,
one round.

``--chat MODEL``: the same for one-token chat completions (``max_tokens: 1``, a short user
message) to a generating model instead (the points' K is ignored; the rate is requests/s):

    .venv/bin/python benchmarks/embed_cpu.py --trees ../base . --threads 1 \
        --chat tests/data/qwen35-tiny-random.gguf --points 1x1:100
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import attrs
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _servers import HOST, free_port
from embed_compare import (
    MINILM,
    POINTS,
    Measured,
    closed_loop,
    llmtrio_argv,
    measure,
    running,
    sentence,
)

CHAT = "/v1/chat/completions"


def chat_body(i: int) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": sentence(i)}], "max_tokens": 1}


async def measure_chat(base: str, concurrency: int, requests: int) -> Measured:
    """Requests per second with ``concurrency`` clients (one kept-alive connection each)
    each sending ``requests`` one-token chat requests, back to back."""

    def ask(i: int) -> bytes:
        return json.dumps(chat_body(i)).encode()

    def check(reply: bytes) -> None:
        assert b'"chat.completion"' in reply, reply[:300]

    elapsed, cpu_ms, retries = await closed_loop(
        base, concurrency, requests, CHAT, ask(0), ask, check
    )
    return Measured(concurrency * requests / elapsed, cpu_ms, retries)


def thread_cpu_ms(pid: int) -> dict[str, tuple[str, float]]:
    """Each thread of ``pid``: its name and its CPU milliseconds so far."""
    threads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with (
                open(f"/proc/{pid}/task/{tid}/schedstat") as stat,
                open(f"/proc/{pid}/task/{tid}/comm") as comm,
            ):
                ns = int(stat.read().split()[0])
                name = comm.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        threads[tid] = (name, ns / 1e6)
    return threads


def parse_point(text: str) -> tuple[int, int, int]:
    shape, _, requests = text.partition(":")
    concurrency, _, inputs = shape.partition("x")
    return int(concurrency), int(inputs), int(requests or 8)


@attrs.frozen
class Turn:
    """One turn at one point: inputs/s and CPU ms a request, by thread name."""

    rate: float
    by_name: dict[str, float]
    client_ms: float


async def turn(base: str, pid: int, point: tuple[int, int, int], *, chat: bool) -> Turn:
    concurrency, inputs, requests = point
    before = thread_cpu_ms(pid)
    if chat:
        measured = await measure_chat(base, concurrency, requests)
    else:
        measured = await measure(base, concurrency, inputs, requests)
    after = thread_cpu_ms(pid)
    n = concurrency * requests
    by_name: dict[str, float] = {}
    for tid, (name, ms) in after.items():
        spent = ms - before.get(tid, (name, 0.0))[1]
        by_name[name] = by_name.get(name, 0.0) + spent / n
    return Turn(measured.rate, by_name, measured.client_ms)


async def main(args: argparse.Namespace) -> int:
    trees = args.trees or [os.getcwd()]
    ports = [free_port() for _ in trees]
    bases = [f"http://{HOST}:{port}" for port in ports]
    logdir = Path(args.logdir or tempfile.mkdtemp(prefix="embed-cpu-"))
    await trio.to_thread.run_sync(lambda: logdir.mkdir(parents=True, exist_ok=True))
    model = args.chat or args.model
    unit = "requests" if args.chat else "inputs"
    warm = {"warm_path": CHAT, "warm_body": chat_body(0)} if args.chat else {}
    print(
        f"llmtrio from {', '.join(trees)}; {model.name}; {args.threads} threads, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    points = [parse_point(point) for point in args.points]
    turns: dict[tuple[int, int], list[Turn]] = {}
    async with AsyncExitStack() as servers:
        for i, (tree, port, base) in enumerate(zip(trees, ports, bases, strict=True)):
            argv = ["env", f"PYTHONPATH={tree}", *llmtrio_argv(model, port, args.threads)]
            log = logdir / f"llmtrio-{i}.log"
            await servers.enter_async_context(running(argv, base, log, **warm))
        pids = [await trio.to_thread.run_sync(server_pid, port) for port in ports]
        for _ in range(args.rounds):
            for p, point in enumerate(points):
                for i, (base, pid) in enumerate(zip(bases, pids, strict=True)):
                    done = await turn(base, pid, point, chat=args.chat is not None)
                    turns.setdefault((p, i), []).append(done)
                    if len(trees) == 1 and args.rounds == 1:
                        shown = ", ".join(
                            f"{name} {ms:.2f}" for name, ms in sorted(done.by_name.items()) if ms
                        )
                        print(
                            f"  {point[0]:3} x {point[1]:2}: {done.rate:7.1f} {unit}/s; server "
                            f"CPU ms a request: {shown}; total {sum(done.by_name.values()):.2f}; "
                            f"client {done.client_ms:.2f}; load {os.getloadavg()[0]:.2f}",
                            flush=True,
                        )
    if len(trees) > 1 or args.rounds > 1:
        for p, (concurrency, inputs, _) in enumerate(points):
            for i, tree in enumerate(trees):
                taken = turns[p, i]
                python = [t.by_name.get("python", 0.0) for t in taken]
                decode = [sum(ms for n, ms in t.by_name.items() if n != "python") for t in taken]
                print(
                    f"  {concurrency:3} x {inputs:2}  {tree}: "
                    f"{statistics.median(t.rate for t in taken):7.1f} {unit}/s "
                    f"({', '.join(f'{t.rate:.0f}' for t in taken)}); python ms a request "
                    f"least {min(python):.2f}, median {statistics.median(python):.2f}; other "
                    f"threads median {statistics.median(decode):.2f}"
                )
        print(f"load {os.getloadavg()[0]:.2f} at the end")
    return 0


def server_pid(port: int) -> int:
    """The ``llmtrio serve`` listening on ``port`` (the benchmark's own child)."""
    flag = f"--port\0{port}\0"
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline") as cmdline:
                    if flag in cmdline.read() and int(entry) != os.getpid():
                        return int(entry)
            except OSError:
                continue
    raise RuntimeError(f"no llmtrio serve on port {port}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, default=MINILM, help="an embedding GGUF")
    parser.add_argument(
        "--chat", type=Path, help="a generating GGUF: one-token chat requests instead"
    )
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--points",
        nargs="+",
        default=[f"{c}x{k}:{8 if k == 1 else 2}" for c, k in POINTS if c * k <= 256],
        help="CxK:R: C concurrent clients of K inputs a request, R requests each",
    )
    parser.add_argument("--logdir", type=Path, help="where the servers' logs go")
    parser.add_argument(
        "--trees",
        nargs="+",
        type=os.path.abspath,
        default=[],
        help="source trees side by side (default: the cwd)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="turns per point")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(trio.run(main, parse_args(None)))
