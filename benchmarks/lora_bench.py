"""LoRA adapters: what a switch of adapter set costs between steps, what a step under an
adapter costs against one without, and the throughput of 8 streams spread over 1, 2 and 4
adapters against 8 on the base model. Prints tables; not a test.

The adapters are written with ``gguf`` as the tests write theirs (tests/_lora.py): rank
``--rank`` on q, v, output, up and down of 4 of gemma-3-270m's 18 layers (``--all-layers``:
every layer).

``raw``: 8 sequences decoding one token each per ``llama_decode``, straight on llama.cpp: a
step with no adapter, a step always under one adapter, and steps alternating between two
adapters (``llama_set_adapters_lora`` before each: a switch per step). The switch's cost is
the alternating step's time less the steady adapter step's. ``engine``: 8 concurrent greedy
requests through the engine (no speculation), spread evenly over the adapters; one step
serves one adapter set, so with k sets each step decodes 8/k sequences.

    .venv/bin/python benchmarks/lora_bench.py [--model PATH] [--tokens 64] [--steps 64]
        [--rounds 3] [--rank 8] [--all-layers]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import trio

from llmtrio.engine import Done, Engine, EngineConfig, GenerateRequest, LoraSpec, demo_model_path
from llmtrio.engine.llama import Batch, LlamaModel

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
SLOTS = 8


def write_adapters(model: Path, folder: Path, count: int, rank: int, every: bool) -> list[Path]:
    from tests._lora import GEMMA_TARGETS, gemma_shapes, write_lora

    targets = GEMMA_TARGETS
    if every:
        from llmtrio.engine.models import check_gguf

        layers = check_gguf(model).metadata["gemma3.block_count"]
        weights = ("attn_q", "attn_v", "attn_output", "ffn_up", "ffn_down")
        targets = tuple(f"blk.{i}.{w}.weight" for i in range(layers) for w in weights)
    shapes = gemma_shapes(model, targets)
    return [
        write_lora(folder / f"a{i}.gguf", "gemma3", shapes, rank=rank, seed=i + 1).path
        for i in range(count)
    ]


def raw_steps(
    path: Path, adapters: list[Path], steps: int, threads: int
) -> dict[str, tuple[float, float]]:
    """Median ms per decode step of 8 sequences, and median ms of the set call, for: no
    adapter, one adapter throughout, two adapters alternating step by step."""
    model = LlamaModel(path, slots=SLOTS, ctx_size=1024, threads=threads, n_batch=512)
    try:
        loaded = [model.load_lora(p) for p in adapters[:2]]
        batch = Batch(512)
        prompts = [model.tokenize(PROMPTS[i], add_special=True) for i in range(SLOTS)]
        out: dict[str, tuple[float, float]] = {}
        plans: dict[str, list[list[tuple[object, float]]]] = {
            "base": [[]],
            "adapter": [[(loaded[0], 1.0)]],
            "alternating": [[(loaded[0], 1.0)], [(loaded[1], 1.0)]],
        }
        for name, plan in plans.items():
            model.loras.use(plan[0])  # type: ignore[arg-type]
            model.clear_memory()
            batch.clear()
            last = [
                batch.add(np.asarray(p, np.int32), 0, seq, output_last=True)
                for seq, p in enumerate(prompts)
            ]
            assert model.decode(batch) == 0
            nxt = [int(np.argmax(model.logits(i))) for i in last]
            pos = [len(p) for p in prompts]
            step_ms, set_ms = [], []
            for step in range(steps):
                t0 = time.perf_counter()
                model.loras.use(plan[step % len(plan)])  # type: ignore[arg-type]
                t1 = time.perf_counter()
                batch.clear()
                for seq in range(SLOTS):
                    batch.add_one(nxt[seq], pos[seq], seq)
                    pos[seq] += 1
                assert model.decode(batch) == 0
                nxt = [int(np.argmax(model.logits(i))) for i in range(SLOTS)]
                step_ms.append((time.perf_counter() - t0) * 1000)
                set_ms.append((t1 - t0) * 1000)
            out[name] = (statistics.median(step_ms), statistics.median(set_ms))
        return out
    finally:
        model.close()


async def engine_rate(
    path: Path, adapters: list[Path], sets: int, tokens: int, threads: int
) -> tuple[float, int]:
    """8 concurrent greedy requests spread evenly over ``sets`` adapters (0: the base);
    decode tok/s from the moment all have their first token, and the switches made."""
    config = EngineConfig(
        model=path,
        max_inflight=SLOTS,
        ctx_size=1024,
        threads=threads,
        spec=None,
        lora=tuple(LoraSpec(f"a{i}", p) for i, p in enumerate(adapters)),
    )
    async with Engine.open(config) as engine:
        requests = [
            GenerateRequest(
                tokens=engine.tokenize(PROMPTS[i], add_special=True),
                max_tokens=tokens + 1,
                ignore_eos=True,
                cache_prompt=False,
                model_name=f"a{i % sets}" if sets else None,
            )
            for i in range(SLOTS)
        ]
        started = 0
        ends: list[float] = []
        marks: dict[str, float] = {}

        async def one(request: GenerateRequest) -> None:
            nonlocal started
            first = True
            async with engine.submit(request) as gen:
                async for event in gen:
                    if isinstance(event, Done):
                        ends.append(time.perf_counter())
                    elif first:
                        first = False
                        started += 1
                        if started == SLOTS:
                            marks["start"] = time.perf_counter()
                            marks["switches"] = engine.stats.lora_switches

        async with trio.open_nursery() as nursery:
            for request in requests:
                nursery.start_soon(one, request)
        switches = engine.stats.lora_switches - int(marks["switches"])
        return SLOTS * tokens / (max(ends) - marks["start"]), switches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rank", type=int, default=8)
    parser.add_argument("--all-layers", action="store_true")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    path = args.model or demo_model_path()
    with tempfile.TemporaryDirectory() as folder:
        adapters = write_adapters(path, Path(folder), 4, args.rank, args.all_layers)
        size = sum(p.stat().st_size for p in adapters) / len(adapters) / 2**20
        print(
            f"model {path.name}, {args.threads} threads, adapters of rank {args.rank} "
            f"({size:.1f} MiB each), {args.rounds} rounds alternated, best of each"
        )
        raws = [raw_steps(path, adapters, args.steps, args.threads) for _ in range(args.rounds)]
        best = {name: min(r[name] for r in raws) for name in raws[0]}
        base, steady, alternating = best["base"][0], best["adapter"][0], best["alternating"][0]
        print(f"raw, {SLOTS} sequences a step, median ms per step ({args.steps} steps):")
        print(f"  no adapter {base:.2f}, one adapter {steady:.2f} ({steady / base:.2f}x)")
        print(
            f"  alternating two adapters {alternating:.2f}: a switch costs "
            f"{alternating - steady:.2f} ms (the set call itself "
            f"{best['alternating'][1]:.3f} ms)"
        )
        print(f"engine, {SLOTS} streams of {args.tokens} tokens, no speculation:")
        print(f"  {'spread over':>12} {'tok/s':>8} {'vs base':>8} {'switches':>9}")
        rates: dict[int, list[tuple[float, int]]] = {k: [] for k in (0, 1, 2, 4)}
        for _ in range(args.rounds):
            for sets in rates:
                rates[sets].append(
                    trio.run(engine_rate, path, adapters, sets, args.tokens, args.threads)
                )
        on_base = max(rates[0])[0]
        for sets, runs in rates.items():
            rate, switches = max(runs)
            label = "the base" if sets == 0 else f"{sets} adapter{'s' if sets > 1 else ''}"
            print(f"  {label:>12} {rate:>8.1f} {rate / on_base:>8.2f} {switches:>9}")


if __name__ == "__main__":
    main()
