"""Speculative decoding and the shared KV pool side by side (issue 18): llmtrio with and
without ``--spec ngram``, llama-server without speculation and with its own n-gram modes,
one GGUF, one llama.cpp build, the same threads. Prints tables; never part of CI.

    ./benchmarks/build_llama_server.sh       # once: builds and caches llama-server
    .venv/bin/python benchmarks/spec_compare.py [--parts spec pool] [--concurrency 1 8]
        [--max-tokens 160] [--rounds 2] [--servers KEY ...]

Part ``spec``, three workloads on the base gemma model through ``/v1/completions`` (a raw
prompt: a base model has no chat template to agree on), greedy, every prompt led by a
request number unique in the run (no server reuses another request's prompt), and the
texts following on from batch to batch, so that no request copies a text any server saw
before in the run while the 16 passages and 16 records last (``--repeat-texts``: every
batch asks the first ones, what n-grams kept across requests gain on documents that come
back; the run says how many requests were asked a text again):

- ``chat``: free text after "Question: ... Answer:" (compare.py's prompts), end of
  generation suppressed, ``--max-tokens`` each: drafts rarely right, the no-regression case;
- ``rewrite``: a 300-650 token passage (prose or code) and a cue to copy it, ``--max-tokens``
  each (end of generation suppressed);
- ``extract``: a record and a json_schema of eight string fields whose values are in the
  record, after two worked examples (the grammar ends each reply; up to 200 tokens). The
  examples, about 430 tokens, lead every request's prompt, before its number: the same
  instructions every time, which each server keeps from the request before (prompt
  caching), so a request ingests its record, about 150-200 tokens.

Each server is started fresh per round (8 slots x 1024 tokens), rounds alternate the
servers; a figure is the median over rounds (with 2 rounds, their mean). Aggregate tok/s is
all completion tokens over the batch's wall time (prefill included); decode tok/s is each
request's ``timings.predicted_n / predicted_ms`` (p50), the rate after its first token;
acceptance is the servers' own ``timings.draft_n_accepted / draft_n``, and the mean
accepted length is the accepted tokens per verification that carried drafts (the batch's
growth of ``vllm:spec_decode_num_drafts_total`` or llama-server's
``llamacpp:spec_decode_num_drafts_total`` on ``/metrics``; llama.cpp's and vLLM's "mean
acceptance length" is 1 + this). ``--servers llmtrio-spec-unified llmtrio-nospec-unified``
add llmtrio on one shared pool (``--kv-unified``) with and without speculation;
``llmtrio-spec-pool`` (and ``llmtrio-spec-pool-48``, with ``--spec-draft-max 48``) with the
pool of n-grams across requests (``--spec-pool 65536``), ``llmtrio-spec-nopool`` without;
``llmtrio-spec-48`` drafts up to 48 tokens without the pool (llama-server's n-gram modes
draft 40-60 on copied text).

Part ``pool``, llmtrio per slot against ``--kv-unified`` on 8 slots x 2048 tokens: one
request with a ~12k-token prompt (a 400 per slot; served from the pool), and the chat
workload at N = 1, 8 and 16 (16 slots for those: what the shared buffer's attention over
every sequence's cells costs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).resolve().parent))

import compare
from _servers import HOST, Kind, Running, ServerSpec, Setup
from _spec_texts import (
    EXTRACT_RECORDS,
    EXTRACT_SCHEMA,
    REWRITE_TEXTS,
    chat_prompt,
    extract_prompt,
    rewrite_prompt,
)

SLOTS = 8
CTX = 1024
POOL_CTX = 2048
WORKLOADS = ("chat", "rewrite", "extract")


@dataclass(frozen=True)
class Server:
    key: str
    label: str
    kind: Kind
    flags: tuple[str, ...] = ()


SERVERS = (
    Server("llmtrio-spec", "llmtrio --spec ngram", Kind.LLMTRIO, ("--spec", "ngram")),
    Server("llmtrio-nospec", "llmtrio --no-spec", Kind.LLMTRIO, ("--no-spec",)),
    # compare.running_server runs the "llmtrio-base" key from --base-tree (PYTHONPATH).
    Server(
        "llmtrio-base",
        "llmtrio --spec ngram (base tree)",
        Kind.LLMTRIO,
        ("--spec", "ngram"),
    ),
    Server(
        "llmtrio-spec-nopool",
        "llmtrio --spec ngram --spec-pool 0",
        Kind.LLMTRIO,
        ("--spec", "ngram", "--spec-pool", "0"),
    ),
    Server(
        "llmtrio-spec-pool",
        "llmtrio --spec ngram --spec-pool 65536",
        Kind.LLMTRIO,
        ("--spec", "ngram", "--spec-pool", "65536"),
    ),
    Server(
        "llmtrio-spec-pool-48",
        "llmtrio --spec-pool 65536 --spec-draft-max 48",
        Kind.LLMTRIO,
        ("--spec", "ngram", "--spec-pool", "65536", "--spec-draft-max", "48"),
    ),
    Server(
        "llmtrio-spec-48",
        "llmtrio --spec ngram --spec-draft-max 48",
        Kind.LLMTRIO,
        ("--spec", "ngram", "--spec-draft-max", "48"),
    ),
    Server(
        "llmtrio-spec-16",
        "llmtrio --spec ngram --spec-draft-max 16",
        Kind.LLMTRIO,
        ("--spec", "ngram", "--spec-draft-max", "16"),
    ),
    Server(
        "llmtrio-spec-unified",
        "llmtrio --spec ngram --kv-unified",
        Kind.LLMTRIO,
        ("--spec", "ngram", "--kv-unified"),
    ),
    Server(
        "llmtrio-nospec-unified",
        "llmtrio --no-spec --kv-unified",
        Kind.LLMTRIO,
        ("--no-spec", "--kv-unified"),
    ),
    Server("ls", "llama-server", Kind.LLAMA_SERVER),
    Server(
        "ls-ngram-simple",
        "llama-server --spec-type ngram-simple",
        Kind.LLAMA_SERVER,
        ("--spec-type", "ngram-simple"),
    ),
    Server(
        "ls-ngram-mod",
        "llama-server --spec-type ngram-mod",
        Kind.LLAMA_SERVER,
        ("--spec-type", "ngram-mod"),
    ),
)


def argv_of(server: Server, setup: Setup, *, slots: int, ctx: int) -> list[str]:
    """The command line without ``--port`` (``compare.running_server`` appends it)."""
    if server.kind is Kind.LLMTRIO:
        return [
            str(Path(sys.executable).parent / "llmtrio"),
            "serve",
            "--model",
            str(setup.model),
            "--host",
            HOST,
            "--max-inflight",
            str(slots),
            "--ctx-size",
            str(ctx),
            "--threads",
            str(setup.threads),
            *server.flags,
        ]
    assert setup.llama_server is not None
    return [
        str(setup.llama_server),
        "-m",
        str(setup.model),
        "--host",
        HOST,
        "--parallel",
        str(slots),
        "-c",
        str(ctx * slots),
        "--threads",
        str(setup.threads),
        "--threads-batch",
        str(setup.threads),
        "--swa-full",
        "--cache-ram",
        "0",
        "--no-webui",
        "--metrics",
        *server.flags,
    ]


# --- one request ----------------------------------------------------------------------------


@dataclass
class Reply:
    start: float
    end: float = 0.0
    tokens: int = 0
    decode_tps: float | None = None
    drafted: int = 0
    accepted: int = 0
    text: str = ""
    finish_reason: str | None = None
    error: str | None = None


def texts_of(workload: str) -> int:
    """How many different texts (questions, passages, records) the workload has."""
    return {"chat": len(compare.PROMPTS), "rewrite": len(REWRITE_TEXTS)}.get(
        workload, len(EXTRACT_RECORDS)
    )


def first_text(args: argparse.Namespace, rnd: int, n: int, warmup: int) -> int:
    """Where in its workload's texts a batch starts: the texts follow on from batch to
    batch through the run (the same for every server, so all answer the same prompts), so
    that no request copies a text any server was asked before in the run, as long as the
    texts last (:func:`reused_texts`). A server that keeps n-grams across requests
    (llama-server's ``ngram-mod``, llmtrio's ``--spec-pool``) then drafts from what the
    request itself holds, as it would serving different documents. ``--repeat-texts``
    starts every batch at the first text instead: what such a pool gains when the same
    documents come back."""
    if args.repeat_texts:
        return 0
    per_round = (args.warmup + 1) * sum(args.concurrency)
    before = sum((args.warmup + 1) * m for m in args.concurrency[: args.concurrency.index(n)])
    return rnd * per_round + before + warmup * n


def reused_texts(args: argparse.Namespace, workload: str) -> int:
    """The requests of a run that are asked a text some server was asked before in it."""
    per_round = (args.warmup + 1) * sum(args.concurrency)
    if args.repeat_texts:
        return per_round * args.rounds - max(args.concurrency)
    return max(0, per_round * args.rounds - texts_of(workload))


def body_of(
    server: Server, setup: Setup, workload: str, i: int, max_tokens: int, tag: str
) -> dict[str, object]:
    """The request body for the workload's text ``i``; ``tag`` leads the prompt: the same
    for every server in a round (so all answer the same prompts), never twice for one
    server (no prompt reuse)."""
    text = i % texts_of(workload)
    tag = f"Request {tag}-{i}.\n"
    body: dict[str, object] = {"model": "bench", "temperature": 0.0, "max_tokens": max_tokens}
    if workload == "chat":
        body["prompt"] = tag + chat_prompt(compare.PROMPTS[text])
    elif workload == "rewrite":
        body["prompt"] = tag + rewrite_prompt(REWRITE_TEXTS[text])
    else:
        body["prompt"] = extract_prompt(EXTRACT_RECORDS[text], tag)
        body["max_tokens"] = 200
        if server.kind is Kind.LLMTRIO:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": "record", "schema": EXTRACT_SCHEMA},
            }
        else:
            body["json_schema"] = EXTRACT_SCHEMA
        return body
    body["ignore_eos"] = True
    body["logit_bias"] = setup.logit_bias()
    return body


async def complete(client: httpx.AsyncClient, base: str, body: dict[str, object]) -> Reply:
    reply = Reply(start=time.perf_counter())
    try:
        response = await client.post(f"{base}/v1/completions", json=body)
        data = response.json()
        if response.status_code != 200:
            reply.error = f"HTTP {response.status_code}: {json.dumps(data)[:200]}"
            return reply
        reply.tokens = int(data["usage"]["completion_tokens"])
        reply.text = data["choices"][0]["text"]
        reply.finish_reason = data["choices"][0].get("finish_reason")
        timings = data.get("timings") or {}
        if timings.get("predicted_ms"):
            reply.decode_tps = timings["predicted_n"] / timings["predicted_ms"] * 1000
        reply.drafted = int(timings.get("draft_n") or 0)
        reply.accepted = int(timings.get("draft_n_accepted") or 0)
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        reply.error = f"{type(exc).__name__}: {exc}"[:200]
    finally:
        reply.end = time.perf_counter()
    return reply


@dataclass
class Batch:
    agg_tps: float
    decode_tps: float
    drafted: int
    accepted: int
    tokens: int
    drafts: int = 0
    errors: list[str] = field(default_factory=list)


#: The verifications that carried drafts: vLLM's counter (llmtrio) and llama.cpp's
#: (``llama-server --metrics``); the same definition (one sequence's drafts verified once).
DRAFTS_METRICS = ("vllm:spec_decode_num_drafts_total", "llamacpp:spec_decode_num_drafts_total")


async def drafts_so_far(client: httpx.AsyncClient, base: str) -> int:
    """The server's verifications that carried drafts since it started (``/metrics``)."""
    response = await client.get(f"{base}/metrics")
    response.raise_for_status()
    return round(
        sum(
            sample.value
            for family in text_string_to_metric_families(response.text)
            for sample in family.samples
            if sample.name in DRAFTS_METRICS
        )
    )


async def batch(
    running: Running,
    server: Server,
    setup: Setup,
    workload: str,
    n: int,
    tag: str,
    first: int = 0,
) -> Batch:
    """``n`` requests at once, asked the workload's texts from ``first`` on."""
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    replies: list[Reply] = []
    async with httpx.AsyncClient(timeout=compare.REQUEST_TIMEOUT_S, limits=limits) as client:

        async def one(i: int) -> None:
            body = body_of(server, setup, workload, first + i, setup.max_tokens, tag)
            replies.append(await complete(client, running.base, body))

        drafts_before = await drafts_so_far(client, running.base)
        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, i)
        drafts = await drafts_so_far(client, running.base) - drafts_before
    wall = max(r.end for r in replies) - start
    rates = [r.decode_tps for r in replies if r.decode_tps]
    if workload == "extract":
        # A reply cut at max_tokens is JSON unfinished, not wrong; one that stopped must parse.
        for r in replies:
            try:
                json.loads(r.text)
            except ValueError:
                if r.finish_reason != "length":
                    r.error = r.error or f"not JSON ({r.finish_reason}): {r.text[-60:]!r}"
    return Batch(
        agg_tps=sum(r.tokens for r in replies) / wall,
        decode_tps=statistics.median(rates) if rates else float("nan"),
        drafted=sum(r.drafted for r in replies),
        accepted=sum(r.accepted for r in replies),
        tokens=sum(r.tokens for r in replies),
        drafts=drafts,
        errors=[r.error for r in replies if r.error],
    )


# --- part spec ----------------------------------------------------------------------------


async def part_spec(args: argparse.Namespace, setup: Setup, servers: list[Server]) -> None:
    results: dict[tuple[str, str, int], list[Batch]] = {}

    def started(server: Server, tag: str) -> AbstractAsyncContextManager[Running]:
        spec = ServerSpec(server.key, server.label, server.kind)
        argv = argv_of(server, setup, slots=SLOTS, ctx=CTX)
        return compare.running_server(spec, setup, CTX, tag, argv=argv)

    async def measure(running: Running, server: Server, rnd: int, workload: str, n: int) -> None:
        for w in range(args.warmup):  # the same shape, not measured
            first = first_text(args, rnd, n, w)
            await batch(running, server, setup, workload, n, f"w{w}{rnd}{n}", first)
        first = first_text(args, rnd, n, args.warmup)
        b = await batch(running, server, setup, workload, n, f"{rnd}{workload}{n}", first)
        results.setdefault((server.key, workload, n), []).append(b)
        print(
            f"  round {rnd + 1} {server.label:40} {workload:8} N={n:<3}"
            f" {b.agg_tps:7.1f} tok/s agg, {b.decode_tps:6.1f} decode,"
            f" drafted {b.drafted} accepted {b.accepted} in {b.drafts} drafts"
            + (f" ERRORS {b.errors[:2]}" if b.errors else ""),
            flush=True,
        )

    if args.interleave:
        # Every server up for the whole run (an idle one takes no CPU), each batch shape
        # measured on each server in turn, the order reversed every round: a load that
        # drifts, and a fresh server's first requests, weigh on all alike.
        async with AsyncExitStack() as stack:
            up = {s.key: await stack.enter_async_context(started(s, s.key)) for s in servers}
            for rnd in range(args.rounds):
                order = servers if rnd % 2 == 0 else servers[::-1]
                for workload in args.workloads:
                    for n in args.concurrency:
                        for server in order:
                            await measure(up[server.key], server, rnd, workload, n)
    else:
        for rnd in range(args.rounds):
            order = servers if rnd % 2 == 0 else servers[::-1]
            for server in order:
                async with started(server, f"{server.key}-r{rnd}") as running:
                    for workload in args.workloads:
                        for n in args.concurrency:
                            await measure(running, server, rnd, workload, n)
    for workload in args.workloads:
        reused = reused_texts(args, workload)
        print(
            f"\n{workload}: {reused} of the run's requests asked a text asked before in it"
            + (" (--repeat-texts)" if args.repeat_texts else f" ({texts_of(workload)} texts)")
        )
        for n in args.concurrency:
            print(f"\n{workload}, N={n}, median of {args.rounds} round(s)")
            print(
                f"{'server':42} {'agg tok/s':>9} {'decode':>8} {'accept':>7} "
                f"{'acc/draft':>9} {'drafted':>8} {'tokens':>7}"
            )
            agg: dict[str, float] = {}
            for server in servers:
                runs = results.get((server.key, workload, n), [])
                if not runs:
                    continue
                a = statistics.median(b.agg_tps for b in runs)
                d = statistics.median(b.decode_tps for b in runs)
                drafted = sum(b.drafted for b in runs)
                accepted = sum(b.accepted for b in runs)
                drafts = sum(b.drafts for b in runs)
                rate = f"{accepted / drafted:7.2f}" if drafted else f"{'-':>7}"
                # Mean accepted length: accepted tokens per verification that carried
                # drafts (llama.cpp's and vLLM's "mean acceptance length" is 1 + this).
                length = f"{accepted / drafts:9.2f}" if drafts else f"{'-':>9}"
                agg[server.key] = a
                print(
                    f"{server.label:42} {a:9.1f} {d:8.1f} {rate} {length} {drafted:8d} "
                    f"{sum(b.tokens for b in runs):7d}"
                )
            if "llmtrio-spec" in agg:
                mine = agg["llmtrio-spec"]
                best = max(
                    (agg[k] for k in ("ls-ngram-simple", "ls-ngram-mod") if k in agg), default=0
                )
                for key, label in (
                    ("llmtrio-nospec", "llmtrio --no-spec"),
                    ("llmtrio-spec-nopool", "llmtrio --spec ngram --spec-pool 0"),
                    ("llmtrio-spec-pool", "llmtrio --spec ngram --spec-pool 65536"),
                    ("llmtrio-spec-pool-48", "llmtrio --spec-pool 65536 --spec-draft-max 48"),
                    ("ls", "llama-server"),
                    ("ls-ngram-mod", "llama-server --spec-type ngram-mod"),
                    ("llmtrio-spec-unified", "llmtrio --spec ngram --kv-unified"),
                ):
                    if key in agg:
                        print(f"  llmtrio --spec / {label}: x{mine / agg[key]:.2f}")
                if best:
                    print(f"  llmtrio --spec / llama-server's best n-gram mode: x{mine / best:.2f}")
            if "llmtrio-spec-unified" in agg and "llmtrio-nospec-unified" in agg:
                ratio = agg["llmtrio-spec-unified"] / agg["llmtrio-nospec-unified"]
                print(f"  --kv-unified: --spec / --no-spec: x{ratio:.2f}")


# --- part pool ----------------------------------------------------------------------------


async def part_pool(args: argparse.Namespace, setup: Setup) -> None:
    layouts = (
        Server("per-slot", "llmtrio (per slot)", Kind.LLMTRIO, ("--no-spec",)),
        Server("unified", "llmtrio --kv-unified", Kind.LLMTRIO, ("--no-spec", "--kv-unified")),
    )
    long_text, tokens = ("", 0)
    if args.long_tokens:
        long_text, tokens = compare.long_prompt(setup, args.long_tokens)
        print(f"\none request of {tokens} prompt tokens, 32 generated, on 8 slots x {POOL_CTX}")
    for server in layouts if args.long_tokens else ():
        spec = ServerSpec(server.key, server.label, server.kind)
        argv = argv_of(server, setup, slots=SLOTS, ctx=POOL_CTX)
        async with (
            compare.running_server(spec, setup, POOL_CTX, f"long-{server.key}", argv=argv) as r,
            httpx.AsyncClient(timeout=compare.REQUEST_TIMEOUT_S) as client,
        ):
            body = {"model": "bench", "prompt": long_text, "max_tokens": 32, "temperature": 0.0}
            t0 = time.perf_counter()
            response = await client.post(f"{r.base}/v1/completions", json=body)
            took = time.perf_counter() - t0
            data = response.json()
            outcome = (
                f"200, {data['usage']['completion_tokens']} tokens in {took:.1f} s"
                if response.status_code == 200
                else f"{response.status_code} {data['error'].get('code')}"
            )
            print(f"  {server.label:28} {outcome}")
    results: dict[tuple[str, int], list[Batch]] = {}
    for rnd in range(args.rounds):
        for server in layouts if rnd % 2 == 0 else layouts[::-1]:
            spec = ServerSpec(server.key, server.label, server.kind)
            argv = argv_of(server, setup, slots=16, ctx=POOL_CTX)
            async with compare.running_server(
                spec, setup, POOL_CTX, f"pool-{server.key}-r{rnd}", argv=argv
            ) as running:
                for n in args.pool_concurrency:
                    b = await batch(running, server, setup, "chat", n, f"pool{rnd}-{n}")
                    results.setdefault((server.key, n), []).append(b)
                    print(f"  round {rnd + 1} {server.label:28} N={n:<3} {b.agg_tps:7.1f} tok/s")
    if not args.rounds:
        return
    print(f"\nchat, 16 slots x {POOL_CTX}, median of {args.rounds} round(s): agg tok/s")
    for n in args.pool_concurrency:
        per = statistics.median(b.agg_tps for b in results[("per-slot", n)])
        uni = statistics.median(b.agg_tps for b in results[("unified", n)])
        print(
            f"  N={n:<3} per slot {per:7.1f}   unified {uni:7.1f}"
            f"   unified/per-slot x{uni / per:.2f}"
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a GGUF (default: the demo gemma-3-270m)")
    parser.add_argument("--llama-server", type=Path, help="the binary (default: the cached one)")
    parser.add_argument("--parts", nargs="+", default=["spec", "pool"], choices=["spec", "pool"])
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument(
        "--servers",
        nargs="+",
        default=["llmtrio-spec", "llmtrio-nospec", "ls", "ls-ngram-simple", "ls-ngram-mod"],
        choices=[s.key for s in SERVERS],
        help="default: the first five (llmtrio with and without spec, llama-server plain and "
        "its two n-gram modes)",
    )
    parser.add_argument(
        "--base-tree",
        type=Path,
        help="a source tree whose llmtrio runs as 'llmtrio-base' (--spec ngram), e.g. "
        "`git archive main | tar -x -C DIR`",
    )
    parser.add_argument(
        "--llmtrio-args", default="", help="extra flags for every llmtrio server (quoted)"
    )
    parser.add_argument(
        "--long-tokens",
        type=int,
        default=12000,
        help="part pool: the long request's prompt tokens (0: skip it)",
    )
    parser.add_argument(
        "--pool-concurrency",
        type=int,
        nargs="+",
        default=[1, 8, 16],
        help="part pool: the chat batches run on 16 slots in both layouts",
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=0,
        help="part spec: unmeasured batches of the same workload and N before each measured "
        "one (a fresh llmtrio's draft budget learns the step costs from its first steps)",
    )
    parser.add_argument(
        "--interleave",
        action="store_true",
        help="part spec: start every server once and measure each batch on each in turn "
        "(default: a fresh server per round, one after another)",
    )
    parser.add_argument(
        "--repeat-texts",
        action="store_true",
        help="part spec: every batch asks the workload's first texts (by default the texts "
        "follow on through the run, each asked once while they last)",
    )
    parser.add_argument("--logdir", type=Path, help="keep server logs here")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    model = args.model or compare.demo_model_path()
    llama_server = compare.find_llama_server(args.llama_server)
    servers = [s for s in SERVERS if s.key in args.servers]
    if "llmtrio-base" in args.servers and args.base_tree is None:
        raise SystemExit("--servers llmtrio-base needs --base-tree")
    if llama_server is None:
        print("llama-server is not built: run benchmarks/build_llama_server.sh; llmtrio only")
        servers = [s for s in servers if s.kind is Kind.LLMTRIO]
    extra = tuple(args.llmtrio_args.split())
    servers = [
        Server(s.key, s.label, s.kind, s.flags + extra) if s.kind is Kind.LLMTRIO else s
        for s in servers
    ]
    with compare.tempfile.TemporaryDirectory() as tmp:
        logdir = args.logdir or Path(tmp)
        logdir.mkdir(parents=True, exist_ok=True)
        probe = compare.LlamaModel(model, slots=1, ctx_size=64, threads=1, n_batch=64)
        eog = tuple(sorted(probe.eog))
        probe.close()
        setup = Setup(
            model=model,
            llama_server=llama_server,
            threads=args.threads,
            max_tokens=args.max_tokens,
            eog=eog,
            logdir=logdir,
            base_tree=args.base_tree,
        )
        print(f"model {model.name}, {args.threads} threads, {args.max_tokens} tokens a request")
        if "spec" in args.parts:
            trio.run(part_spec, args, setup, servers)
        if "pool" in args.parts:
            trio.run(part_pool, args, setup)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
