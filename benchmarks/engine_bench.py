"""Engine benchmark: aggregate decode tok/s at 1, 2, 4, 8 slots beside raw batched
``llama_decode`` from Python, Python time per step beside llama_decode's, and cancellation
latency. Prints a table; not a test.

``raw`` decodes one token a sequence a step, as the engine does without speculation: it is
the ceiling for the engine with ``--no-spec`` (``no-spec/raw``: how close the engine comes to
the machine's limit), not for the engine with its defaults, whose drafts verify several
tokens a step (``spec/no-spec``: speculation's gain, or loss, beside it).

    .venv/bin/python benchmarks/engine_bench.py [--model PATH] [--tokens 64] [--slots 1 2 4 8]
        [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import numpy as np
import trio
import trio.lowlevel

from llmtrio.engine import Done, Engine, EngineConfig, GenerateRequest, Token, demo_model_path
from llmtrio.engine.llama import Batch, LlamaModel

#: The engine's default speculation (``--spec``).
SPEC_DEFAULT = EngineConfig.__attrs_attrs__.spec.default

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village,",
    "def fibonacci(n):",
    "The three primary colors are",
    "Water boils at",
    "My favourite recipe for pancakes:",
    "In 1969, the first humans",
    "A haiku about the sea:",
]


def raw_decode(path: Path, slots: int, tokens: int, threads: int) -> float:
    """Greedy batched decode straight on llama.cpp: ``slots`` sequences, one token each per
    ``llama_decode``; returns decode tok/s (prefill excluded)."""
    model = LlamaModel(path, slots=slots, ctx_size=512, threads=threads, n_batch=512)
    try:
        batch = Batch(512)
        prompts = [model.tokenize(PROMPTS[i % 8], add_special=True) for i in range(slots)]
        batch.clear()
        last_index = []
        for seq, prompt in enumerate(prompts):
            last_index.append(batch.add(np.asarray(prompt, np.int32), 0, seq, output_last=True))
        assert model.decode(batch) == 0
        nxt = [int(np.argmax(model.logits(i))) for i in last_index]
        pos = [len(p) for p in prompts]
        start = time.perf_counter()
        for _ in range(tokens):
            batch.clear()
            for seq in range(slots):
                batch.add_one(nxt[seq], pos[seq], seq)
                pos[seq] += 1
            assert model.decode(batch) == 0
            nxt = [int(np.argmax(model.logits(i))) for i in range(slots)]
        return slots * tokens / (time.perf_counter() - start)
    finally:
        model.close()


async def engine_decode(
    path: Path, slots: int, tokens: int, threads: int, spec: str | None
) -> tuple[float, float, float]:
    """``slots`` concurrent greedy requests through the engine (speculation ``spec``);
    returns decode tok/s (from the moment all have their first token), and mean
    llama_decode and Python ms per step."""
    config = EngineConfig(model=path, max_inflight=slots, ctx_size=512, threads=threads, spec=spec)
    async with Engine.open(config) as engine:
        requests = [
            GenerateRequest(
                tokens=engine.tokenize(PROMPTS[i % 8], add_special=True),
                max_tokens=tokens + 1,
                ignore_eos=True,
            )
            for i in range(slots)
        ]
        first = trio.Event()
        started = 0
        ends: list[float] = []
        marks: dict[str, float] = {}

        async def one(request: GenerateRequest) -> None:
            nonlocal started
            got_first = False
            async with engine.submit(request) as gen:
                async for event in gen:
                    if isinstance(event, Token) and not got_first:
                        got_first = True
                        started += 1
                        if started == slots:
                            marks["start"] = time.perf_counter()
                            marks["steps"] = engine.stats.steps
                            marks["decode_s"] = engine.stats.decode_s
                            marks["python_s"] = engine.stats.python_s
                            first.set()
                    elif isinstance(event, Done):
                        ends.append(time.perf_counter())

        async with trio.open_nursery() as nursery:
            for request in requests:
                nursery.start_soon(one, request)
        stats = engine.stats
        steps = stats.steps - marks["steps"]
        # Each request produced `tokens` more tokens after every request had its first.
        rate = slots * tokens / (max(ends) - marks["start"])
        decode_ms = (stats.decode_s - marks["decode_s"]) / steps * 1000
        python_ms = (stats.python_s - marks["python_s"]) / steps * 1000
        return rate, decode_ms, python_ms


async def cancel_latency(path: Path, threads: int, slots: int, trials: int) -> list[float]:
    """With ``slots`` sequences decoding, cancel one after a few tokens; time until its slot
    is free (capacity shows it)."""
    config = EngineConfig(model=path, max_inflight=slots, ctx_size=512, threads=threads)
    latencies = []
    async with Engine.open(config) as engine:
        background = [
            GenerateRequest(tokens=engine.tokenize(p, add_special=True), ignore_eos=True)
            for p in PROMPTS[: slots - 1]
        ]
        async with trio.open_nursery() as nursery:
            for request in background:
                nursery.start_soon(_drain, engine, request)
            for i in range(trials):
                request = GenerateRequest(
                    tokens=engine.tokenize(PROMPTS[i % 8], add_special=True), ignore_eos=True
                )
                async with engine.submit(request) as gen:
                    seen = 0
                    async for _ in gen:
                        seen += 1
                        if seen == 4 + i % 3:
                            break
                    before = engine.capacity().inflight
                    t0 = time.perf_counter()
                gen.cancel()
                while engine.capacity().inflight >= before:
                    await engine.capacity_changed()
                latencies.append((time.perf_counter() - t0) * 1000)
            nursery.cancel_scope.cancel()
    return latencies


async def _drain(engine: Engine, request: GenerateRequest) -> None:
    async with engine.submit(request) as gen:
        async for _ in gen:
            pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--slots", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cancel-trials", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3, help="alternations per slot count")
    args = parser.parse_args()
    path = args.model or demo_model_path()
    print(f"model {path.name}, {args.tokens} tokens per sequence, {args.threads} threads")
    print(
        f"{'slots':>5} {'raw tok/s':>10} {'no-spec tok/s':>14} {'no-spec/raw':>11} "
        f"{'decode ms/step':>15} {'python ms/step':>15} {'python %':>9} "
        f"{'spec tok/s':>11} {'spec/no-spec':>12}"
    )
    for slots in args.slots:
        # Alternate raw and the two engines and keep the best of each: on a shared machine,
        # other tenants only ever slow a run down.
        raws, plain, spec = [], [], []
        for _ in range(args.rounds):
            raws.append(raw_decode(path, slots, args.tokens, args.threads))
            plain.append(trio.run(engine_decode, path, slots, args.tokens, args.threads, None))
            spec.append(
                trio.run(engine_decode, path, slots, args.tokens, args.threads, SPEC_DEFAULT)
            )
        raw = max(raws)
        rate, decode_ms, python_ms = max(plain)
        spec_rate = max(spec)[0]
        share = 100 * python_ms / (decode_ms + python_ms)
        print(
            f"{slots:>5} {raw:>10.1f} {rate:>14.1f} {rate / raw:>11.2f} "
            f"{decode_ms:>15.1f} {python_ms:>15.2f} {share:>8.1f}% "
            f"{spec_rate:>11.1f} {spec_rate / rate:>12.2f}"
        )
    slots = max(args.slots)
    latencies = trio.run(cancel_latency, path, args.threads, slots, args.cancel_trials)
    print(
        f"cancellation latency with {slots} slots busy: median "
        f"{statistics.median(latencies):.0f} ms, max {max(latencies):.0f} ms "
        f"({len(latencies)} trials; one decode step is the bound)"
    )


if __name__ == "__main__":
    main()
