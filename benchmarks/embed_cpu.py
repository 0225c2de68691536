"""Where an embeddings server's CPU goes: inputs per second and each thread's CPU
milliseconds a request, for ``llmtrio serve`` alone (no llama-server), at the points of
``embed_compare.py``.

    .venv/bin/python benchmarks/embed_cpu.py --threads 2
    .venv/bin/python benchmarks/embed_cpu.py --points 1x1:40 8x1:24 1x32:6

One ``llmtrio serve`` of the embedding model (``embed_compare.py``'s flags); at each point
(``CxK:R``: C concurrent clients, K inputs a request, R requests each, back to back; its
client, sentences and warm-up are ``embed_compare.py``'s), each thread's user and system CPU
from ``/proc/PID/task/*/stat`` before and after, divided by the requests: the Python thread
(``python``: HTTP, the ring, the worker, tokenizing, the JSON of the vectors) apart from the
decode threads (named after the engine's thread, ``llmtrio embeddi``: the decode thread and
llama.cpp's compute threads, whose spinning at a barrier counts as CPU). Linux only.

To compare two versions in one run, run it from each checkout in turn with the same venv
(``cd ../base && ../wt/.venv/bin/python ../wt/benchmarks/embed_cpu.py``: the server runs
the llmtrio of the working directory, ``python -m llmtrio``).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import HOST, free_port
from embed_compare import MINILM, POINTS, llmtrio_argv, measure, running


def thread_cpu_ms(pid: int) -> dict[str, tuple[str, float]]:
    """Each thread of ``pid``: its name and its user + system CPU milliseconds so far."""
    ticks = os.sysconf("SC_CLK_TCK")
    threads = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with (
                open(f"/proc/{pid}/task/{tid}/stat") as stat,
                open(f"/proc/{pid}/task/{tid}/comm") as comm,
            ):
                fields = stat.read().rsplit(")", 1)[1].split()
                name = comm.read().strip()
        except OSError:  # the thread ended meanwhile
            continue
        threads[tid] = (name, (int(fields[11]) + int(fields[12])) * 1000 / ticks)
    return threads


def parse_point(text: str) -> tuple[int, int, int]:
    shape, _, requests = text.partition(":")
    concurrency, _, inputs = shape.partition("x")
    return int(concurrency), int(inputs), int(requests or 8)


async def main(args: argparse.Namespace) -> int:
    port = free_port()
    base = f"http://{HOST}:{port}"
    logdir = Path(args.logdir or tempfile.mkdtemp(prefix="embed-cpu-"))
    await trio.to_thread.run_sync(lambda: logdir.mkdir(parents=True, exist_ok=True))
    print(f"llmtrio from {os.getcwd()}, {args.threads} threads, load {os.getloadavg()[0]:.2f}")
    async with running(llmtrio_argv(args.model, port, args.threads), base, logdir / "llmtrio.log"):
        pid = await trio.to_thread.run_sync(lambda: server_pid(port))
        for concurrency, inputs, requests in map(parse_point, args.points):
            before = thread_cpu_ms(pid)
            measured = await measure(base, concurrency, inputs, requests)
            after = thread_cpu_ms(pid)
            n = concurrency * requests
            by_name: dict[str, float] = {}
            for tid, (name, ms) in after.items():
                spent = ms - before.get(tid, (name, 0.0))[1]
                by_name[name] = by_name.get(name, 0.0) + spent / n
            shown = ", ".join(f"{name} {ms:.2f}" for name, ms in sorted(by_name.items()) if ms)
            print(
                f"  {concurrency:3} x {inputs:2}: {measured.rate:7.1f} inputs/s; server CPU ms a "
                f"request: {shown}; total {sum(by_name.values()):.2f}; client "
                f"{measured.client_ms:.2f}; load {os.getloadavg()[0]:.2f}",
                flush=True,
            )
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
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--points",
        nargs="+",
        default=[f"{c}x{k}:{8 if k == 1 else 2}" for c, k in POINTS if c * k <= 256],
        help="CxK:R: C concurrent clients of K inputs a request, R requests each",
    )
    parser.add_argument("--logdir", type=Path, help="where the server's log goes")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(trio.run(main, parse_args(None)))
