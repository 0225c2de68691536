"""Reranking side by side: ``llmtrio serve`` and llama.cpp's ``llama-server --reranking -np 8``
on the same cross-encoder GGUF, one after the other in one run, and their scores compared.

    ./benchmarks/build_llama_server.sh       # once: builds and caches llama-server
    .venv/bin/python benchmarks/rerank_compare.py --threads 2

The model is the MiniLM cross-encoder the tests write (``tests/_rerankers.py``: all-MiniLM-L6-v2
Q8_0 with rank pooling and a random ``cls``/``cls.output`` head, the layout of the ms-marco
MiniLM cross-encoders), written to the log folder, unless ``--model`` names another reranking
GGUF. Each request is one query and ``--documents`` documents (distinct passages of 40 to 60
words: retrieval's candidates), ``POST /v1/rerank`` to both.

First the scores: one request to each server, and the largest difference between the two
servers' scores of a document. Then, for each point (8 and 64 concurrent clients), each client
sends ``--requests`` requests back to back (a closed loop) over one kept-alive connection; the
figure is documents scored per second over the point's wall time. Both servers run at once
(an idle one costs no CPU) and take turns at each point, ``--rounds`` times; the median is
the figure. The table prints each server's documents/s and llmtrio's ratio to llama-server.

llama-server runs with ``--reranking -np 8 -c 8*512 -b 2048 -ub 2048`` (``-ub`` at least one
whole pair, as a non-causal model needs); llmtrio with its defaults for a reranking model (up
to 64 pairs and 256 tokens a decode) and ``--idle-timeout 60``. Both on ``--threads`` threads,
with an hour's request timeout (64 requests of 100 documents on 2 busy cores take minutes).
The client is ``embed_compare.py``'s (a few lines of HTTP/1.1 a connection, not httpx).

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
from collections.abc import Sequence
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' model writer
from _servers import HOST, find_llama_server, free_port
from embed_compare import WORDS, closed_loop, running

CONCURRENCY = (8, 64)
QUERY = "which quiet river town has an old stone castle and a market in winter?"


def passage(i: int) -> str:
    """A distinct passage of 40 to 60 words for each ``i``."""
    n = 40 + i % 21
    words = [WORDS[(i * 11 + k * (i % 7 + 1)) % len(WORDS)] for k in range(n)]
    return f"Passage {i}: " + " ".join(words) + "."


def llmtrio_argv(model: Path, port: int, threads: int) -> list[str]:
    return [
        sys.executable, "-m", "llmtrio", "serve", "--model", str(model), "--host", HOST,
        "--port", str(port), "--threads", str(threads), "--ring-streams", "1024",
        "--idle-timeout", "60", "--request-timeout", "3600",
    ]  # fmt: skip


def llama_server_argv(binary: Path, model: Path, port: int, threads: int) -> list[str]:
    return [
        str(binary), "-m", str(model), "--host", HOST, "--port", str(port), "--reranking",
        "-np", "8", "-c", str(8 * 512), "-b", "2048", "-ub", "2048",
        "--threads", str(threads), "--threads-batch", str(threads), "--no-webui",
        "--timeout", "3600",
    ]  # fmt: skip


def request(i: int, documents: int) -> dict[str, object]:
    """Request ``i``: the query and ``documents`` passages no other request has."""
    return {
        "model": "m",
        "query": QUERY,
        "documents": [passage(i * documents + k) for k in range(documents)],
        "top_n": documents,
    }


async def scores(base: str, body: dict[str, object]) -> dict[int, float]:
    async with httpx.AsyncClient(timeout=300) as client:
        answer = await client.post(base + "/v1/rerank", json=body)
    answer.raise_for_status()
    return {r["index"]: r["relevance_score"] for r in answer.json()["results"]}


async def measure(base: str, concurrency: int, requests: int, documents: int) -> float:
    """Documents scored per second with ``concurrency`` clients each sending ``requests``
    requests of ``documents`` documents, back to back."""

    def ask(i: int) -> bytes:
        return json.dumps(request(i, documents)).encode()

    def check(reply: bytes) -> None:
        assert reply.count(b'"index":') == documents, reply[:300]

    warm = json.dumps(request(10**6, 1)).encode()  # opens the connection: one document
    elapsed, _cpu_ms, _retries = await closed_loop(
        base, concurrency, requests, "/v1/rerank", warm, ask, check
    )
    return concurrency * requests * documents / elapsed


async def main(args: argparse.Namespace) -> int:
    binary = find_llama_server(args.llama_server)
    if binary is None:
        print("no llama-server: run benchmarks/build_llama_server.sh first", file=sys.stderr)
        return 2
    logdir = Path(args.logdir or tempfile.mkdtemp(prefix="rerank-compare-"))
    await trio.to_thread.run_sync(lambda: logdir.mkdir(parents=True, exist_ok=True))
    model = args.model
    if model is None:
        from tests._rerankers import write_minilm_reranker

        model = await trio.to_thread.run_sync(
            write_minilm_reranker, logdir / "minilm-cross-encoder.gguf"
        )
    print(f"model {model.name}, {args.threads} threads, load {os.getloadavg()[0]:.2f}")
    ports = {"llmtrio": free_port(), "llama-server": free_port()}
    argvs = {
        "llmtrio": llmtrio_argv(model, ports["llmtrio"], args.threads),
        "llama-server": llama_server_argv(binary, model, ports["llama-server"], args.threads),
    }
    bases = {name: f"http://{HOST}:{port}" for name, port in ports.items()}
    warm = {"query": "warm", "documents": ["up"]}
    results: dict[str, dict[int, float]] = {"llmtrio": {}, "llama-server": {}}
    async with (
        running(argvs["llmtrio"], bases["llmtrio"], logdir / "llmtrio.log",
                warm_path="/v1/rerank", warm_body=warm),
        running(argvs["llama-server"], bases["llama-server"], logdir / "llama-server.log",
                warm_path="/v1/rerank", warm_body=warm),
    ):  # fmt: skip
        body = request(0, args.documents)
        ours, theirs = (
            await scores(bases["llmtrio"], body),
            await scores(bases["llama-server"], body),
        )
        diff = max(abs(ours[i] - theirs[i]) for i in range(args.documents))
        same_order = sorted(ours, key=lambda i: -ours[i]) == sorted(
            theirs, key=lambda i: -theirs[i]
        )
        print(f"scores: largest difference {diff:.2e} over {args.documents} documents; "
              f"the same order: {same_order}")  # fmt: skip
        for base in bases.values():  # unmeasured: a just-started server is slower at first
            await measure(base, 2, 1, args.documents)
        for concurrency in args.concurrency:
            rates: dict[str, list[float]] = {"llmtrio": [], "llama-server": []}
            for _ in range(args.rounds):
                for name in rates:
                    rate = await measure(bases[name], concurrency, args.requests, args.documents)
                    rates[name].append(rate)
            for name, measured in rates.items():
                results[name][concurrency] = statistics.median(measured)
                shown = ", ".join(f"{rate:.1f}" for rate in measured)
                print(f"  {name:12} {concurrency:3} x 1 query x {args.documents} documents: "
                      f"{results[name][concurrency]:8.1f} documents/s ({shown}); load "
                      f"{os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"\nload {os.getloadavg()[0]:.2f} at the end")
    print("| concurrent requests | llmtrio documents/s | llama-server documents/s | ratio |")
    print("|---|---|---|---|")
    for concurrency in CONCURRENCY:
        ours_rate, theirs_rate = (
            results["llmtrio"][concurrency],
            results["llama-server"][concurrency],
        )
        print(f"| {concurrency} | {ours_rate:.1f} | {theirs_rate:.1f} | "
              f"{ours_rate / theirs_rate:.2f}x |")  # fmt: skip
    return 0


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a reranking GGUF (default: the tests' MiniLM)")
    parser.add_argument("--llama-server", type=Path, help="the binary (default: the cached one)")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--documents", type=int, default=100, help="documents a request")
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        default=list(CONCURRENCY),
        help="the points: concurrent clients (default: %(default)s)",
    )
    parser.add_argument("--requests", type=int, default=1, help="requests per client and turn")
    parser.add_argument("--rounds", type=int, default=3, help="turns per point (median)")
    parser.add_argument("--logdir", type=Path, help="where the servers' logs and model go")
    return parser.parse_args(argv)


if __name__ == "__main__":
    sys.exit(trio.run(main, parse_args(None)))
