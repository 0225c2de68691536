"""Chat and embeddings in one ``llmtrio serve`` process: each under the other's load, against
each alone (issue 17's figure), for each ``--threads`` setting given.

    .venv/bin/python benchmarks/chat_embed.py                  # --threads 1 and 2, 15 s phases

One server (``llmtrio serve --model gemma=... --model minilm=...``) per ``--threads`` value
(the flag sets each engine's threads; without it the cores are split evenly between the
engines, 1 each on 2 cores). Three phases of ``--seconds`` each: chat alone, embeddings
alone, both at once.

- chat: ``--chat-clients`` closed-loop clients streaming ``/v1/completions`` from gemma
  (``--max-tokens`` tokens each, ``ignore_eos``, greedy); the figures are the tokens a
  second over the phase, summed over the clients, and the median time to first token;
- embeddings: ``--embed-clients`` closed-loop clients sending single-input requests to
  MiniLM over kept-alive connections (``embed_compare.Connection``); the figure is inputs a
  second;
- progress: during the phase with both, the fewest chat tokens and the fewest embedding
  inputs finished in any one second (both above 0: neither starves).

Resource handling: each server is a child process stopped (SIGINT, then SIGTERM, SIGKILL)
at the end, also on errors and Ctrl-C.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import attrs
import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _servers import HOST, free_port
from embed_compare import MINILM, Connection, running, sentence

from llmtrio.engine import demo_model_path

PROMPT = "Write a long story about a lighthouse keeper and the sea."


@attrs.define
class Record:
    """What one phase saw: chat token and embedding input completion times, and TTFTs."""

    chat_tokens: list[float] = attrs.Factory(list)
    ttft: list[float] = attrs.Factory(list)
    inputs: list[float] = attrs.Factory(list)


async def chat_client(base: str, until: float, max_tokens: int, record: Record) -> None:
    body = {
        "model": "gemma",
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": 0,
        "ignore_eos": True,
    }
    async with httpx.AsyncClient(base_url=base, timeout=120) as http:
        while time.perf_counter() < until:
            sent = time.perf_counter()
            first = True
            async with http.stream("POST", "/v1/completions", json=body) as response:
                response.raise_for_status()
                async for line in response.aiter_lines():
                    if not line.startswith("data: {"):
                        continue
                    choices = json.loads(line[6:]).get("choices") or [{}]
                    if choices[0].get("text"):
                        now = time.perf_counter()
                        if first:
                            record.ttft.append(now - sent)
                            first = False
                        record.chat_tokens.append(now)


async def embed_client(base: str, until: float, record: Record, counter: list[int]) -> None:
    host, port = base.removeprefix("http://").rsplit(":", 1)
    connection = Connection(host, int(port))
    try:
        while time.perf_counter() < until:
            counter[0] += 1
            body = {"model": "minilm", "input": [sentence(counter[0])]}
            reply = await connection.post("/v1/embeddings", json.dumps(body).encode())
            assert reply.count(b'"index":') == 1, reply[:300]
            record.inputs.append(time.perf_counter())
    finally:
        await connection.aclose()


async def phase(
    base: str, args: argparse.Namespace, *, chat: bool, embed: bool, counter: list[int]
) -> tuple[Record, float, float]:
    record = Record()
    started = time.perf_counter()
    until = started + args.seconds
    # the clients are cut at the phase's end (their requests cancelled mid-way), so only
    # what finished within the phase counts
    with trio.move_on_after(args.seconds):
        async with trio.open_nursery() as nursery:
            for _ in range(args.chat_clients if chat else 0):
                nursery.start_soon(chat_client, base, until, args.max_tokens, record)
            for _ in range(args.embed_clients if embed else 0):
                nursery.start_soon(embed_client, base, until, record, counter)
    record.chat_tokens = [t for t in record.chat_tokens if t <= until]
    record.inputs = [t for t in record.inputs if t <= until]
    await trio.sleep(1)  # the server frees the cut requests' slots
    return record, started, until


def per_second(times: list[float], started: float, until: float) -> list[int]:
    counts = [0] * max(1, int(until - started))
    for t in times:
        second = int(t - started)
        if 0 <= second < len(counts):
            counts[second] += 1
    return counts


async def measure(args: argparse.Namespace, threads: int | None, logdir: Path) -> None:
    port = free_port()
    base = f"http://{HOST}:{port}"
    argv = [
        sys.executable, "-m", "llmtrio", "serve", "--model", f"gemma={args.chat_model}",
        "--model", f"minilm={args.embed_model}", "--host", HOST, "--port", str(port),
        "--max-inflight", str(args.chat_clients), "--ctx-size", "1024", "--ring-streams", "1024",
        "--idle-timeout", "60", *(["--threads", str(threads)] if threads is not None else []),
    ]  # fmt: skip
    label = f"--threads {threads}" if threads is not None else "default threads"
    async with running(argv, base, logdir / f"llmtrio-{threads}.log", model="minilm"):
        counter = [0]
        warm = argparse.Namespace(**{**vars(args), "seconds": 3.0})
        await phase(base, warm, chat=True, embed=True, counter=counter)
        chat, c0, c1 = await phase(base, args, chat=True, embed=False, counter=counter)
        embed, e0, e1 = await phase(base, args, chat=False, embed=True, counter=counter)
        both, b0, b1 = await phase(base, args, chat=True, embed=True, counter=counter)
    chat_alone = len(chat.chat_tokens) / (c1 - c0)
    chat_with = len(both.chat_tokens) / (b1 - b0)
    embed_alone = len(embed.inputs) / (e1 - e0)
    embed_with = len(both.inputs) / (b1 - b0)
    ttft_alone = statistics.median(chat.ttft) if chat.ttft else float("nan")
    ttft_with = statistics.median(both.ttft) if both.ttft else float("nan")
    tokens_each = per_second(both.chat_tokens, b0, b1)
    inputs_each = per_second(both.inputs, b0, b1)
    print(
        f"{label} (load {os.getloadavg()[0]:.2f})\n"
        f"  chat tok/s         alone {chat_alone:7.1f}   with embeddings {chat_with:7.1f}"
        f"   ({chat_with / chat_alone:.2f}x)\n"
        f"  chat TTFT p50      alone {1000 * ttft_alone:6.0f}ms   with embeddings "
        f"{1000 * ttft_with:6.0f}ms\n"
        f"  embedding inputs/s alone {embed_alone:7.1f}   with chat       {embed_with:7.1f}"
        f"   ({embed_with / embed_alone:.2f}x)\n"
        f"  with both, fewest in any second: {min(tokens_each)} chat tokens, "
        f"{min(inputs_each)} embedding inputs (per second: {tokens_each} / {inputs_each})",
        flush=True,
    )


async def main(args: argparse.Namespace) -> int:
    logdir = Path(args.logdir or tempfile.mkdtemp(prefix="chat-embed-"))
    print(
        f"gemma + MiniLM in one llmtrio serve, {os.cpu_count()} cores; {args.chat_clients} chat "
        f"streams of {args.max_tokens} tokens, {args.embed_clients} embedding clients of 1 "
        f"input; {args.seconds:g} s a phase; logs in {logdir}"
    )
    for threads in args.threads:
        await measure(args, None if threads == 0 else threads, logdir)
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chat-model", type=Path, default=None, help="default: gemma-3-270m")
    parser.add_argument("--embed-model", type=Path, default=MINILM)
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[0, 2],
        help="--threads values to run (0: the default split, 1 each on 2 cores)",
    )
    parser.add_argument("--seconds", type=float, default=15.0, help="length of each phase")
    parser.add_argument("--chat-clients", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--embed-clients", type=int, default=16)
    parser.add_argument("--logdir", type=Path)
    args = parser.parse_args(argv)
    if args.chat_model is None:
        args.chat_model = demo_model_path()
    return args


if __name__ == "__main__":
    sys.exit(trio.run(main, parse_args(None)))
