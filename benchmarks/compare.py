"""Side by side: llmtrio, llama.cpp's ``llama-server`` and llama-cpp-python's server, on one
GGUF and one llama.cpp build (the llama.cpp that llama-cpp-python 0.3.36 vendors, built with
the same CPU flags). Prints tables; not a test, never part of CI.

    ./benchmarks/build_llama_server.sh       # once (about 10 minutes): builds and caches it
    .venv/bin/python benchmarks/compare.py [--model PATH] [--concurrency 1 4 8 16]
        [--max-tokens 48] [--rounds 2] [--arrive MS] [--skip-cancel] [--skip-prefill]

Needs the ``bench`` extra (psutil, numpy) and llama-cpp-python's ``server`` extra (uvicorn,
fastapi, sse-starlette, starlette-context, pydantic-settings, PyYAML) in the same venv.

What it does, in order:

1. Load: each server in turn (llmtrio, llama-server, llama-cpp-python with its defaults, and
   llama-cpp-python with ``--interrupt_requests False``), started fresh per round on a free
   127.0.0.1 port with 8 slots x 512 tokens of context (llama-cpp-python: one sequence of
   512), 2 threads, warmed with one short request, then driven with N concurrent streaming chat
   completions for each N: greedy, 8 short prompts cycled (each led by a unique request
   number, so no server reuses an earlier prompt's KV), each asked for exactly
   ``--max-tokens`` tokens (``ignore_eos`` where the server takes it, and a -100 logit bias on
   every end-of-generation token for all of them). Rounds alternate the servers (A B C D A B C
   D) so drift on a shared machine spreads over all; each figure printed is the MEDIAN over
   rounds (with 2 rounds: their mean), except "full", which sums the rounds.
2. The bandwidth limit: this machine's memory bandwidth (numpy copy, read + write bytes
   counted) over the bytes one decode step reads (the GGUF's tensor data: Gemma ties the
   output layer to the token embedding, which is read whole every step) is the single-stream
   decode ceiling; each server's N=1 decode tok/s is shown as a fraction of it.
3. Cancellation under load (llmtrio, llama-server): 7 streams decoding, an 8th is read for a
   random 1-16 tokens and its connection closed; the time until the server reports 7 busy
   slots (llmtrio ``/health`` capacity.inflight, llama-server ``/slots``), polled every 10 ms,
   and, in other trials, until a 9th request queued behind the 8th gets its first token.
4. Chunked prefill (llmtrio, llama-server; 4096 tokens per slot): 4 streams decoding, then one
   request with a ~2000-token prompt; the streams' inter-token gaps in the 2 s before it and
   while it is ingested (until its first token).
5. Prompt reuse (llmtrio with and without ``--no-prompt-cache``, llama-server with its own
   defaults: ``cache_prompt`` on, context checkpoints, ``--cache-ram`` 8192 MiB; 4 slots x
   4096 tokens, issue 9's setup): a ~900-word system prompt (unique per trial) and a
   question, 16 greedy tokens: turn 1's TTFT (cold), turn 2's (the same conversation, the
   answer and one new question re-sent, as the chat page does); then, with another system
   prompt, one warm request and 4 concurrent requests sharing it: their TTFT p50. Median of
   ``--reuse-trials`` trials.

Resource handling: every server runs as a child process that is stopped (SIGINT, then SIGTERM,
then SIGKILL, each after a timeout) before the next starts, also on errors and Ctrl-C; its
log goes to a temporary folder (or ``--logdir``), its tail printed when it fails to start.

Differences left between the servers: llama-server runs with ``--swa-full`` and
``--cache-ram 0`` to match the others' KV layout and memory (see :func:`llama_server_argv`);
llama-cpp-python keeps its defaults (flash attention off where llmtrio and llama-server use
llama.cpp's "auto", which turns it on on CPU; ``logits_all``; one sequence, no batching) and
sends no usage chunk, so its tokens are its content chunks counted. llama-server ingests a
long prompt in batches of ``-b 2048`` (its default); llmtrio in ``--prefill-chunk 256``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import random
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import trio
from _servers import (
    BUILD_SCRIPT,
    GRAMMAR_SCHEMA,
    HOST,
    PROMPTS,
    REPO,
    REQUEST_TIMEOUT_S,
    SLOTS,
    SPECS,
    Kind,
    RequestResult,
    Running,
    ServerSpec,
    Setup,
    find_llama_server,
    llmtrio_argv,
    running_server,
    sample_rss,
    stream_chat,
)

from llmtrio.engine import demo_model_path
from llmtrio.engine.llama import LlamaModel
from llmtrio.engine.models._gguf import check_gguf

# A text to repeat for the long prompt; varied enough that it tokenizes like prose.
LONG_TEXT = (
    "The harbour town woke slowly, its fishing boats knocking against the pier while gulls "
    "argued over scraps. Merchants rolled barrels of salted cod up the cobbled street, and "
    "the baker's ovens breathed warm clouds into the cold air. Children chased a loose goat "
    "past the chapel, where the old bell ringer counted the hours by the tide. "
)


LOAD_CTX = 512  # tokens per slot for the load and cancellation parts


PREFILL_CTX = 4096  # tokens per slot for the chunked-prefill part


MIB = 1024 * 1024


async def busy_slots(client: httpx.AsyncClient, base: str, kind: Kind) -> int:
    """Slots the server reports in use: llmtrio ``/health`` capacity.inflight, llama-server
    the ``/slots`` entries that are processing."""
    if kind is Kind.LLMTRIO:
        response = await client.get(f"{base}/health")
        return int(response.json()["capacity"]["inflight"])
    if kind is Kind.LLAMA_SERVER:
        response = await client.get(f"{base}/slots")
        return sum(1 for slot in response.json() if slot.get("is_processing"))
    raise ValueError(f"no busy-slot probe for {kind.value}")


@dataclass(frozen=True)
class LoadMetrics:
    """One server at one N (one round, or the median over rounds)."""

    agg_tps: float
    ttft_p50: float
    ttft_p95: float
    req_tps_p50: float
    lat_p50: float
    lat_p95: float
    peak_rss_mib: float
    full: int
    total: int
    notes: tuple[str, ...] = ()


def pct(values: Sequence[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else math.nan


def load_metrics(
    results: Sequence[RequestResult], wall: float, rss: Sequence[int], max_tokens: int
) -> LoadMetrics:
    ttfts = [r.ttft for r in results if r.ttft is not None]
    rates = [r.decode_rate for r in results if r.decode_rate is not None]
    lats = [r.latency for r in results if r.error is None]
    full = sum(1 for r in results if r.error is None and r.tokens == max_tokens)
    notes: list[str] = []
    short = sorted(r.tokens for r in results if r.error is None and r.tokens != max_tokens)
    if short:
        notes.append(f"{len(short)} ended at {short} tokens, not {max_tokens}")
    errors = [r.error for r in results if r.error is not None]
    if errors:
        notes.append(f"{len(errors)} failed, e.g. {errors[0]}")
    return LoadMetrics(
        agg_tps=sum(r.tokens for r in results) / wall if wall > 0 else math.nan,
        ttft_p50=pct(ttfts, 50),
        ttft_p95=pct(ttfts, 95),
        req_tps_p50=pct(rates, 50),
        lat_p50=pct(lats, 50),
        lat_p95=pct(lats, 95),
        peak_rss_mib=max(rss, default=0) / MIB,
        full=full,
        total=len(results),
        notes=tuple(notes),
    )


def median_of_rounds(rounds: Sequence[LoadMetrics]) -> LoadMetrics:
    """The median of each figure over rounds; ``full``/``total`` summed; notes joined."""

    def med(get: Callable[[LoadMetrics], float]) -> float:
        values = [get(m) for m in rounds if not math.isnan(get(m))]
        return statistics.median(values) if values else math.nan

    return LoadMetrics(
        agg_tps=med(lambda m: m.agg_tps),
        ttft_p50=med(lambda m: m.ttft_p50),
        ttft_p95=med(lambda m: m.ttft_p95),
        req_tps_p50=med(lambda m: m.req_tps_p50),
        lat_p50=med(lambda m: m.lat_p50),
        lat_p95=med(lambda m: m.lat_p95),
        peak_rss_mib=med(lambda m: m.peak_rss_mib),
        full=sum(m.full for m in rounds),
        total=sum(m.total for m in rounds),
        notes=tuple(f"round {i + 1}: {n}" for i, m in enumerate(rounds) for n in m.notes),
    )


async def run_batch(
    server: Running, setup: Setup, n: int, arrive_ms: float, rng: random.Random
) -> LoadMetrics:
    """N concurrent streaming requests (prompts cycled), each started after a random offset
    in [0, arrive_ms] ms; RSS sampled meanwhile. The batch's wall time runs from the first
    send to the last request's end."""
    offsets = sorted(rng.uniform(0, arrive_ms / 1000) for _ in range(n)) if arrive_ms else [0.0] * n
    results: list[RequestResult] = []
    rss: list[int] = []
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:

        async def one(i: int) -> None:
            await trio.sleep(offsets[i])
            results.append(
                await stream_chat(
                    server,
                    setup,
                    PROMPTS[i % len(PROMPTS)],
                    max_tokens=setup.max_tokens,
                    ignore_eos=server.spec.takes_ignore_eos,
                    client=client,
                )
            )

        start = time.perf_counter()
        async with trio.open_nursery() as outer:
            outer.start_soon(sample_rss, server.process.pid, rss)
            async with trio.open_nursery() as requests:
                for i in range(n):
                    requests.start_soon(one, i)
            outer.cancel_scope.cancel()
        wall = max((r.end for r in results), default=start) - start
    return load_metrics(results, wall, rss, setup.max_tokens)


GRAMMAR_FORMAT: dict[str, object] = {
    "type": "json_schema",
    "json_schema": {"name": "summary", "strict": True, "schema": GRAMMAR_SCHEMA},
}


@dataclass(frozen=True)
class GrammarResult:
    agg_tps: float
    req_tps_p50: float
    ttft_p50: float
    tokens: int
    stopped: int  # replies that ended with finish_reason "stop"
    valid: int  # ... and that jsonschema validates
    total: int
    errors: tuple[str, ...]
    load: float  # the 1-minute load average when the batch ended


def valid_reply(text: str) -> bool:
    """Parses as JSON and follows GRAMMAR_SCHEMA, formats included (jsonschema, when
    installed; the test extra has the format checkers' extras)."""
    try:
        value = json.loads(text)
    except ValueError:
        return False
    try:
        import jsonschema
    except ImportError:
        return isinstance(value, dict)
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    return jsonschema.Draft202012Validator(GRAMMAR_SCHEMA, format_checker=checker).is_valid(value)


async def grammar_batch(server: Running, setup: Setup, n: int, max_tokens: int) -> GrammarResult:
    """N concurrent streaming chat completions, all with GRAMMAR_FORMAT, greedy; the replies
    end where the grammar does (no end-of-generation bias, no ignore_eos)."""
    results: list[RequestResult] = []
    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:

        async def one(i: int) -> None:
            prompt = "Summarise as JSON: " + PROMPTS[i % len(PROMPTS)]
            results.append(
                await stream_chat(
                    server,
                    setup,
                    prompt,
                    max_tokens=max_tokens,
                    ignore_eos=False,
                    client=client,
                    response_format=GRAMMAR_FORMAT,
                )
            )

        start = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, i)
        wall = max((r.end for r in results), default=start) - start
    ok = [r for r in results if r.error is None]
    tokens = sum(r.tokens for r in ok)
    return GrammarResult(
        agg_tps=tokens / wall if wall > 0 else math.nan,
        req_tps_p50=pct([r.decode_rate for r in ok if r.decode_rate is not None], 50),
        ttft_p50=pct([r.ttft for r in ok if r.ttft is not None], 50),
        tokens=tokens,
        stopped=sum(1 for r in ok if r.finish_reason == "stop"),
        valid=sum(1 for r in ok if r.finish_reason == "stop" and valid_reply(r.text)),
        total=len(results),
        errors=tuple(r.error for r in results if r.error is not None),
        load=os.getloadavg()[0],
    )


def memory_bandwidth(threads: int, mib: int = 512, repeats: int = 5) -> float:
    """Bytes/s of a numpy copy of ``mib`` MiB (read + write both counted), best of
    ``repeats``, on one thread and split over ``threads``; the larger of the two."""
    src = np.ones(mib * MIB // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # fault the pages in
    moved = 2 * src.nbytes
    best = 0.0
    for t in sorted({1, max(1, threads)}):
        parts = np.array_split(np.arange(src.size), t)
        bounds = [(int(p[0]), int(p[-1]) + 1) for p in parts]
        with ThreadPoolExecutor(t) as pool:
            for _ in range(repeats):
                start = time.perf_counter()
                list(pool.map(lambda b: np.copyto(dst[b[0] : b[1]], src[b[0] : b[1]]), bounds))
                best = max(best, moved / (time.perf_counter() - start))
    return best


@dataclass(frozen=True)
class CancelResult:
    """Seconds from closing the 8th stream's connection to the server showing 7 busy slots
    (``status``), and to a queued 9th request's first token (``handoff``)."""

    label: str
    status: tuple[float, ...]
    handoff: tuple[float, ...]
    discarded: int
    timeouts: int
    failures: tuple[str, ...]


class TrialFailed(Exception):
    """A cancellation trial's own stream failed; the trial is discarded."""


async def cancel_latency(
    server: Running, setup: Setup, trials: int, rng: random.Random
) -> CancelResult:
    """7 streams decode (restarted when one ends). Then, ``trials`` times each:

    - status: an 8th stream is read for 1-16 tokens and its connection closed; ``/health``
      (llmtrio) or ``/slots`` (llama-server) is polled every 10 ms until it shows 7 busy;
    - handoff: as above, but once the 8th has its first token a 9th request (2 tokens) is
      sent and waits for a slot; the time from the close to the 9th's first token (its slot
      freed, its short prompt ingested, one decode step) does not depend on a status endpoint.

    A trial during which a background stream ended is discarded and retried (at most
    ``trials`` extra per kind); one where nothing happened within 10 s counts as a timeout.
    """
    kind = server.spec.kind
    ended = 0
    status: list[float] = []
    handoff: list[float] = []
    failures: list[str] = []
    discarded = timeouts = 0
    background_tokens = LOAD_CTX - 64
    limits = httpx.Limits(max_connections=16, max_keepalive_connections=16)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:

        async def background(i: int) -> None:
            nonlocal ended
            for _ in range(1000):
                await stream_chat(
                    server,
                    setup,
                    PROMPTS[i],
                    max_tokens=background_tokens,
                    ignore_eos=True,
                    client=client,
                )
                ended += 1

        async def wait_busy(target: int) -> float:
            """Polls every 10 ms until the server shows ``target`` busy slots; returns when.
            Callers bound it with a cancel scope (and it gives up after 10 minutes)."""
            for _ in range(60_000):
                if await busy_slots(client, server.base, kind) == target:
                    return time.perf_counter()
                await trio.sleep(0.01)
            raise RuntimeError(f"{server.spec.label} never showed {target} busy slots")

        async def settle() -> None:
            with trio.move_on_after(10.0):
                await wait_busy(SLOTS - 1)
            await trio.sleep(0.2)

        async def status_trial() -> float | None:
            got = await stream_chat(
                server,
                setup,
                PROMPTS[7],
                max_tokens=background_tokens,
                ignore_eos=True,
                abort_after=rng.randint(1, 16),
                client=client,
            )
            freed_at = None
            with trio.move_on_after(10.0):
                freed_at = await wait_busy(SLOTS - 1)
            if got.error is not None or not got.aborted:
                raise TrialFailed(got.error or "the 8th stream ended before it was closed")
            return None if freed_at is None else freed_at - got.end

        async def handoff_trial() -> float | None:
            eighth: list[RequestResult] = []
            ninth: list[RequestResult] = []
            first_token = trio.Event()

            async def run_eighth() -> None:
                eighth.append(
                    await stream_chat(
                        server,
                        setup,
                        PROMPTS[7],
                        max_tokens=background_tokens,
                        ignore_eos=True,
                        abort_after=rng.randint(4, 16),
                        on_token=lambda _: first_token.set(),
                        client=client,
                    )
                )

            async def run_ninth() -> None:
                ninth.append(
                    await stream_chat(
                        server, setup, PROMPTS[6], max_tokens=2, ignore_eos=True, client=client
                    )
                )

            with trio.move_on_after(30.0):
                async with trio.open_nursery() as trial:
                    trial.start_soon(run_eighth)
                    await first_token.wait()
                    trial.start_soon(run_ninth)
            if not eighth or not eighth[0].aborted or eighth[0].error is not None:
                raise TrialFailed(eighth[0].error if eighth else "the 8th stream did not start")
            if not ninth or ninth[0].ttft is None:
                return None
            return ninth[0].token_times[0] - eighth[0].end

        async with trio.open_nursery() as nursery:
            for i in range(SLOTS - 1):
                nursery.start_soon(background, i)
            with trio.fail_after(60.0):
                await wait_busy(SLOTS - 1)
            for trial_fn, out in ((status_trial, status), (handoff_trial, handoff)):
                for _ in range(2 * trials):
                    if len(out) >= trials:
                        break
                    ended_before = ended
                    try:
                        latency = await trial_fn()
                    except TrialFailed as exc:
                        failures.append(str(exc))
                        discarded += 1
                        await settle()
                        continue
                    if ended != ended_before or (latency is not None and latency < 0):
                        discarded += 1
                    elif latency is None:
                        timeouts += 1
                        out.append(math.inf)
                    else:
                        out.append(latency)
                    await settle()
            nursery.cancel_scope.cancel()
    return CancelResult(
        server.spec.label, tuple(status), tuple(handoff), discarded, timeouts, tuple(failures)
    )


@dataclass(frozen=True)
class PrefillResult:
    label: str
    prompt_tokens: int
    long_ttft: float
    before_max: float
    before_p95: float
    during_max: float
    during_p95: float
    during_gaps: int


def long_prompt(setup: Setup, target_tokens: int) -> tuple[str, int]:
    """A prose prompt of about ``target_tokens`` tokens (counted with the model's tokenizer)."""
    model = LlamaModel(setup.model, slots=1, ctx_size=64, threads=1, n_batch=64)
    try:
        per = len(model.tokenize(LONG_TEXT, add_special=False))
        copies = max(1, target_tokens // per)
        text = "Read this and say what the goat did.\n\n" + LONG_TEXT * copies
        return text, len(model.tokenize(text, add_special=True))
    finally:
        model.close()


async def prefill_stall(
    server: Running, setup: Setup, prompt: str, prompt_tokens: int
) -> PrefillResult:
    """4 streams decode; after 2 s of steady decoding one long-prompt request is sent; the
    streams' inter-token gaps before it (2 s) and until its first token are compared."""
    baseline_s = 2.0
    times: list[list[float]] = [[] for _ in range(4)]
    limits = httpx.Limits(max_connections=8, max_keepalive_connections=8)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        all_going = trio.Event()

        def recorder(i: int) -> Callable[[float], None]:
            def record(now: float) -> None:
                times[i].append(now)
                if min(len(t) for t in times) >= 8:
                    all_going.set()

            return record

        async def stream(i: int) -> None:
            await stream_chat(
                server,
                setup,
                PROMPTS[i],
                max_tokens=PREFILL_CTX - 64,
                ignore_eos=True,
                on_token=recorder(i),
                client=client,
            )

        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(stream, i)
            with trio.fail_after(120):
                await all_going.wait()
            await trio.sleep(baseline_s)
            sent = time.perf_counter()
            long = await stream_chat(
                server, setup, prompt, max_tokens=4, ignore_eos=True, client=client
            )
            nursery.cancel_scope.cancel()
    if long.ttft is None:
        raise RuntimeError(f"{server.spec.label}: the long prompt failed: {long.error}")
    first = long.token_times[0]
    before: list[float] = []
    during: list[float] = []
    for stamps in times:
        for a, b in itertools.pairwise(stamps):
            if a >= sent - baseline_s and b <= sent:
                before.append(b - a)
            elif b > sent and a < first:
                during.append(b - a)
    return PrefillResult(
        server.spec.label,
        prompt_tokens,
        first - sent,
        max(before, default=math.nan),
        pct(before, 95),
        max(during, default=math.nan),
        pct(during, 95),
        len(during),
    )


REUSE_SLOTS = 4


REUSE_CTX = 4096  # tokens per slot


REUSE_TOKENS = 16


@dataclass(frozen=True)
class ReuseVariant:
    label: str
    kind: Kind
    argv: list[str]


def reuse_variants(setup: Setup, specs: Sequence[ServerSpec]) -> list[ReuseVariant]:
    """llmtrio with and without its prompt cache, llama-server with its own defaults (the
    port is appended by running_server)."""
    variants = []
    if any(s.key == "llmtrio" for s in specs):
        argv = _drop_options(
            llmtrio_argv(setup, 0, REUSE_CTX), ("--port", "--max-inflight", "--ctx-size")
        )
        argv += ["--max-inflight", str(REUSE_SLOTS), "--ctx-size", str(REUSE_CTX)]
        argv += list(setup.extra_args.get(Kind.LLMTRIO, ()))
        variants.append(ReuseVariant("llmtrio", Kind.LLMTRIO, argv))
        variants.append(
            ReuseVariant("llmtrio --no-prompt-cache", Kind.LLMTRIO, [*argv, "--no-prompt-cache"])
        )
    if setup.llama_server is not None and any(s.kind is Kind.LLAMA_SERVER for s in specs):
        argv = [
            str(setup.llama_server),
            "-m",
            str(setup.model),
            "--host",
            HOST,
            "-np",
            str(REUSE_SLOTS),
            "-c",
            str(REUSE_CTX * REUSE_SLOTS),
            "--threads",
            str(setup.threads),
            "--threads-batch",
            str(setup.threads),
            "--slots",
            "--no-webui",
            *setup.extra_args.get(Kind.LLAMA_SERVER, ()),
        ]
        variants.append(ReuseVariant("llama-server", Kind.LLAMA_SERVER, argv))
    return variants


def _drop_options(argv: list[str], names: Sequence[str]) -> list[str]:
    """``argv`` without the options ``names`` and their values."""
    out: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg in names:
            skip = True
        else:
            out.append(arg)
    return out


@dataclass(frozen=True)
class ReuseResult:
    turn1_ttft: float
    turn2_ttft: float
    shared_ttft_p50: float
    #: The replies: turn 1, turn 2, then the four sharing a system prompt.
    texts: tuple[str, ...]


def system_prompt(tag: str, words: int = 900) -> str:
    per = len(LONG_TEXT.split())
    text = (LONG_TEXT * (words // per + 1)).split()[:words]
    return f"Session {tag}. You are a harbour guide; use this background:\n" + " ".join(text)


async def prompt_reuse(server: Running, setup: Setup, tag: str) -> ReuseResult:
    """One trial: turn 1 and turn 2 of a conversation, then one warm request and 4
    concurrent ones sharing a system prompt; TTFTs as the client sees them."""

    async def ask(messages: list[dict[str, str]], client: httpx.AsyncClient) -> RequestResult:
        result = await stream_chat(
            server,
            setup,
            "",
            max_tokens=REUSE_TOKENS,
            ignore_eos=True,
            client=client,
            messages=messages,
        )
        if result.ttft is None:
            raise RuntimeError(f"{server.spec.label}: a reuse request failed: {result.error}")
        return result

    limits = httpx.Limits(max_connections=8, max_keepalive_connections=8)
    async with httpx.AsyncClient(timeout=REQUEST_TIMEOUT_S, limits=limits) as client:
        system = {"role": "system", "content": system_prompt(f"{tag}-chat")}
        turn1 = [system, {"role": "user", "content": "What does the baker do in the morning?"}]
        first = await ask(turn1, client)
        turn2 = [
            *turn1,
            {"role": "assistant", "content": first.text},
            {"role": "user", "content": "And what about the children?"},
        ]
        second = await ask(turn2, client)

        shared = {"role": "system", "content": system_prompt(f"{tag}-shared")}
        await ask([shared, {"role": "user", "content": "Say hello."}], client)
        ttfts: list[float] = []
        texts = [first.text, second.text, "", "", "", ""]

        async def one(i: int) -> None:
            question = f"Question {i}: name {i + 2} things the town is known for."
            result = await ask([shared, {"role": "user", "content": question}], client)
            assert result.ttft is not None
            ttfts.append(result.ttft)
            texts[2 + i] = result.text

        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(one, i)
    assert first.ttft is not None and second.ttft is not None
    return ReuseResult(first.ttft, second.ttft, statistics.median(ttfts), tuple(texts))


def fmt(value: float, digits: int = 1) -> str:
    return "-" if math.isnan(value) else f"{value:.{digits}f}"


def print_load_table(
    n: int, rows: dict[str, LoadMetrics], labels: dict[str, str], args: argparse.Namespace
) -> None:
    print(
        f"\nN={n} concurrent streams, {args.max_tokens} tokens each"
        + (f", arrivals spread over {args.arrive:g} ms" if args.arrive else "")
        + f"; median of {args.rounds} round(s)"
    )
    head = (
        f"{'server':<32} {'agg tok/s':>9} {'TTFT p50':>9} {'TTFT p95':>9} {'req tok/s':>9} "
        f"{'lat p50':>8} {'lat p95':>8} {'peak RSS':>9} {'full':>7}"
    )
    print(head)
    print("-" * len(head))
    for key, m in rows.items():
        print(
            f"{labels[key]:<32} {fmt(m.agg_tps):>9} {fmt(m.ttft_p50 * 1000, 0):>7}ms "
            f"{fmt(m.ttft_p95 * 1000, 0):>7}ms {fmt(m.req_tps_p50):>9} "
            f"{fmt(m.lat_p50, 2):>7}s {fmt(m.lat_p95, 2):>7}s {fmt(m.peak_rss_mib, 0):>5} MiB "
            f"{m.full:>3}/{m.total:<3}"
        )
    if "llmtrio" in rows:
        ours = rows["llmtrio"]
        for key, m in rows.items():
            if key == "llmtrio":
                continue
            print(
                f"  llmtrio / {labels[key]}: agg tok/s x{fmt(ours.agg_tps / m.agg_tps, 2)}, "
                f"TTFT p95 x{fmt(ours.ttft_p95 / m.ttft_p95, 2)}"
            )
    for key, m in rows.items():
        for note in m.notes:
            print(f"  note, {labels[key]}: {note}")


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a GGUF (default: the demo gemma-3-270m)")
    parser.add_argument("--llama-server", type=Path, help="the binary (default: the cached one)")
    parser.add_argument(
        "--servers",
        nargs="+",
        choices=[s.key for s in SPECS],
        default=[s.key for s in SPECS if s.key != "llmtrio-base"],
        help="which servers to run (default: all but llmtrio-base)",
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 8, 16])
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--arrive", type=float, default=0.0, help="spread arrivals over [0, MS] ms")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cancel-trials", type=int, default=10)
    parser.add_argument("--prefill-tokens", type=int, default=2000)
    parser.add_argument(
        "--base-tree",
        type=Path,
        help="a source tree whose llmtrio runs as 'llmtrio-base' (e.g. an export of main)",
    )
    parser.add_argument(
        "--grammar", type=int, default=8, help="streams in the json_schema batch (0: skip)"
    )
    parser.add_argument("--grammar-max-tokens", type=int, default=400)
    for kind in Kind:
        parser.add_argument(
            f"--{kind.value}-args",
            default="",
            metavar="ARGS",
            help=f"extra arguments for {kind.value} (one string, split like a shell)",
        )
    parser.add_argument(
        "--logdir", type=Path, help="keep the servers' logs here (default: a temporary folder)"
    )
    parser.add_argument("--skip-load", action="store_true")
    parser.add_argument("--skip-bandwidth", action="store_true")
    parser.add_argument("--skip-cancel", action="store_true")
    parser.add_argument("--skip-prefill", action="store_true")
    parser.add_argument("--skip-reuse", action="store_true")
    parser.add_argument("--reuse-trials", type=int, default=2)
    args = parser.parse_args(argv)
    args.concurrency = list(dict.fromkeys(args.concurrency))  # each N once, in order
    return args


async def run(args: argparse.Namespace, setup: Setup, specs: list[ServerSpec]) -> None:
    rng = random.Random(args.seed)
    labels = {s.key: s.label for s in specs}
    per_round: dict[tuple[str, int], list[LoadMetrics]] = {}
    if not args.skip_load:
        for rnd in range(args.rounds):
            for spec in specs:
                tag = f"{spec.key}-load-r{rnd + 1}"
                print(f"round {rnd + 1}/{args.rounds}: {spec.label} ...", flush=True)
                async with running_server(spec, setup, LOAD_CTX, tag) as server:
                    for n in args.concurrency:
                        metrics = await run_batch(server, setup, n, args.arrive, rng)
                        per_round.setdefault((spec.key, n), []).append(metrics)
        medians: dict[tuple[str, int], LoadMetrics] = {
            k: median_of_rounds(v) for k, v in per_round.items()
        }
        for n in args.concurrency:
            print_load_table(n, {s.key: medians[(s.key, n)] for s in specs}, labels, args)

        if not args.skip_bandwidth and 1 in args.concurrency:
            bandwidth = await trio.to_thread.run_sync(memory_bandwidth, setup.threads)
            info = check_gguf(setup.model)
            step_bytes = info.data_end - info.data_offset
            ceiling = bandwidth / step_bytes
            print(
                f"\nBandwidth limit: memory copy {bandwidth / 1e9:.1f} GB/s (read+write, best "
                f"of 5, 1 or {setup.threads} threads) / {step_bytes / 1e6:.0f} MB read per "
                f"decode step (all tensor data; the tied embedding is the output layer) "
                f"= {ceiling:.0f} tok/s single-stream ceiling"
            )
            for spec in specs:
                m = medians[(spec.key, 1)]
                print(
                    f"  {spec.label:<32} N=1 decode {fmt(m.req_tps_p50)} tok/s = "
                    f"{fmt(100 * m.req_tps_p50 / ceiling, 0)}% of the ceiling"
                )

    cancel_specs = [s for s in specs if s.kind in (Kind.LLMTRIO, Kind.LLAMA_SERVER)]
    if not args.skip_cancel and cancel_specs:
        print(
            f"\nCancellation under load: 7 streams decoding, an 8th closed after 1-16 tokens; "
            f"times from the close ({args.cancel_trials} trials each)"
        )
        for spec in cancel_specs:
            async with running_server(spec, setup, LOAD_CTX, f"{spec.key}-cancel") as server:
                result = await cancel_latency(server, setup, args.cancel_trials, rng)
            for what, values in (
                ("status shows the slot free", result.status),
                ("queued request's first token", result.handoff),
            ):
                ms = [x * 1000 for x in values]
                print(
                    f"  {result.label:<16} {what:<30} median "
                    f"{fmt(statistics.median(ms) if ms else math.nan)} ms, "
                    f"max {fmt(max(ms, default=math.nan))} ms ({len(ms)} trials)"
                )
            print(
                f"  {result.label:<16} {result.timeouts} trials over 10 s (counted as inf), "
                f"{result.discarded} discarded (a background stream ended meanwhile, or the "
                f"trial's stream failed)"
            )
            for failure in result.failures[:3]:
                print(f"  {result.label:<16} a trial's stream failed: {failure}")

    grammar_specs = [
        s for s in specs if s.kind in (Kind.LLMTRIO, Kind.LLAMA_SERVER) and s.key != "llmtrio-base"
    ]
    if args.grammar and grammar_specs:
        print(
            f"\nStructured output: {args.grammar} concurrent streams, each with a json_schema "
            f"response_format (integer and number bounds, date and email formats, a pattern, "
            f"an enum, capped strings and array, a nested object), greedy, up to "
            f"{args.grammar_max_tokens} tokens, ending where the grammar ends; "
            f"median of {args.rounds} round(s)"
        )
        # Rounds interleave the servers (A B, A B, ...): a load that changes meanwhile
        # falls on both alike.
        by_spec: dict[str, list[GrammarResult]] = {spec.key: [] for spec in grammar_specs}
        for rnd in range(args.rounds):
            for spec in grammar_specs:
                tag = f"{spec.key}-grammar-r{rnd + 1}"
                async with running_server(spec, setup, LOAD_CTX, tag) as server:
                    by_spec[spec.key].append(
                        await grammar_batch(server, setup, args.grammar, args.grammar_max_tokens)
                    )
        for spec in grammar_specs:
            rounds = by_spec[spec.key]
            print(
                f"  {spec.label:<32} agg {fmt(statistics.median(r.agg_tps for r in rounds))} "
                f"tok/s, req {fmt(statistics.median(r.req_tps_p50 for r in rounds))} tok/s p50, "
                f"TTFT p50 {fmt(statistics.median(r.ttft_p50 for r in rounds) * 1000, 0)} ms, "
                f"{sum(r.tokens for r in rounds)} tokens; stopped "
                f"{sum(r.stopped for r in rounds)}/{sum(r.total for r in rounds)}, valid JSON "
                f"following the schema: {sum(r.valid for r in rounds)}/"
                f"{sum(r.total for r in rounds)} (load average "
                f"{', '.join(f'{r.load:.1f}' for r in rounds)})"
            )
            for r in rounds:
                for error in r.errors[:2]:
                    print(f"  note, {spec.label}: {error}")
        keys = [spec.key for spec in grammar_specs]
        if "llmtrio" in keys and "llama-server" in keys:
            ours, theirs = (
                statistics.median(r.agg_tps for r in by_spec[key])
                for key in ("llmtrio", "llama-server")
            )
            print(f"  llmtrio / llama-server: agg tok/s x{ours / theirs:.2f}")

    if not args.skip_prefill and cancel_specs:
        prompt, prompt_tokens = long_prompt(setup, args.prefill_tokens)
        print(
            f"\nChunked prefill: 4 streams decoding, then one {prompt_tokens}-token prompt "
            f"({PREFILL_CTX} tokens per slot); the 4 streams' inter-token gaps"
        )
        for spec in cancel_specs:
            async with running_server(spec, setup, PREFILL_CTX, f"{spec.key}-prefill") as server:
                p = await prefill_stall(server, setup, prompt, prompt_tokens)
            print(
                f"  {p.label:<32} before: max {fmt(p.before_max * 1000, 0)} ms, p95 "
                f"{fmt(p.before_p95 * 1000, 0)} ms | during ingestion: max "
                f"{fmt(p.during_max * 1000, 0)} ms, p95 {fmt(p.during_p95 * 1000, 0)} ms "
                f"({p.during_gaps} gaps) | long prompt TTFT {p.long_ttft * 1000:.0f} ms"
            )

    if not args.skip_reuse:
        await run_reuse(args, setup, specs)


async def run_reuse(args: argparse.Namespace, setup: Setup, specs: list[ServerSpec]) -> None:
    variants = reuse_variants(setup, specs)
    if not variants:
        return
    print(
        f"\nPrompt reuse: {REUSE_SLOTS} slots x {REUSE_CTX} tokens, a ~900-word system prompt, "
        f"{REUSE_TOKENS} greedy tokens; TTFT, median of {args.reuse_trials} trials "
        f"(seconds)"
    )
    print(f"  {'':<28} {'turn 1 (cold)':>14} {'turn 2':>10} {'4 sharing, p50':>16}")
    nonce = time.time_ns()
    replies: dict[str, list[tuple[str, ...]]] = {}
    for variant in variants:
        spec = ServerSpec(variant.label, variant.label, variant.kind)
        trials = []
        tag = variant.label.replace(" ", "").replace("-", "")
        async with running_server(spec, setup, REUSE_CTX, f"{tag}-reuse", variant.argv) as server:
            for trial in range(args.reuse_trials):
                # The same system prompts for every server, new ones for every trial.
                trials.append(await prompt_reuse(server, setup, f"{nonce}-{trial}"))
        replies[variant.label] = [t.texts for t in trials]
        print(
            f"  {variant.label:<28} "
            f"{statistics.median(t.turn1_ttft for t in trials):>14.3f} "
            f"{statistics.median(t.turn2_ttft for t in trials):>10.3f} "
            f"{statistics.median(t.shared_ttft_p50 for t in trials):>16.3f}",
            flush=True,
        )
    cached, cold = replies.get("llmtrio"), replies.get("llmtrio --no-prompt-cache")
    if cached and cold:
        pairs = zip(cached, cold, strict=True)
        same = [a == b for x, y in pairs for a, b in zip(x, y, strict=True)]
        print(
            f"  llmtrio's greedy replies identical with and without the prompt cache: "
            f"{sum(same)}/{len(same)}"
        )


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    model = args.model or demo_model_path()
    # In the order given: each round runs them in this order.
    specs = [next(s for s in SPECS if s.key == key) for key in dict.fromkeys(args.servers)]
    llama_server = None
    if any(s.kind is Kind.LLAMA_SERVER for s in specs):
        llama_server = find_llama_server(args.llama_server)
        if llama_server is None:
            print(
                f"no llama-server: run {BUILD_SCRIPT.relative_to(REPO)} first (or pass "
                "--llama-server PATH, or leave it out with --servers)",
                file=sys.stderr,
            )
            return 2
    probe = LlamaModel(model, slots=1, ctx_size=64, threads=1, n_batch=64)
    try:
        eog = tuple(sorted(probe.eog))
    finally:
        probe.close()
    with tempfile.TemporaryDirectory(prefix="llmtrio-compare-") as tmp:
        logdir = args.logdir or Path(tmp)
        logdir.mkdir(parents=True, exist_ok=True)
        extra = {
            kind: tuple(shlex.split(getattr(args, f"{kind.value.replace('-', '_')}_args")))
            for kind in Kind
        }
        setup = Setup(
            model, llama_server, args.threads, args.max_tokens, eog, logdir, extra, args.base_tree
        )
        print(
            f"model {model} ({model.stat().st_size / 1e6:.0f} MB), end-of-generation tokens "
            f"{list(eog)} biased -100; {os.cpu_count()} cores, {args.threads} threads; "
            f"llama-server {llama_server}"
        )
        trio.run(run, args, setup, specs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
