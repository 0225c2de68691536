"""Where a decode step's time goes while a prompt is ingested beside it (issue 48): the
engine's core with ``--slots`` sequences decoding and one more ingesting a long prompt,
``CHUNK`` prompt tokens a step, for each chunk size in turn (0: decode only), rounds
alternating the sizes so drift on a shared machine spreads over all.

    .venv/bin/python benchmarks/mixed_steps.py [--slots 8] [--chunks 0 16 32 64 128 256 512]
        [--steps 12] [--rounds 3] [--threads 1] [--busy 0] [--no-spec]

Each row: the core's step (wall ms, median over every step of that size; its spread, the
25th-75th percentile), split into ``llama_decode``, sampling (the decoding sequences'
positions), and the rest (scheduling, the batch, stats, Python between the calls); the
thread's CPU time (``time.thread_time``: llama.cpp's first compute thread is the caller's);
the step over a decode-only step; and what each prompt token added (ms). That last figure is
the price one prompt token puts on every running stream's next token: the chunk size beside
decode is the inter-token latency those streams pay while a prompt is ingested.

Requests are sampled with the servers' defaults (temperature 0.8, top-k 40, top-p 0.95,
min-p 0.05), as AIPerf's are; ``--busy N`` runs N busy-looping processes beside the steps
(a competing process on the shared cores).
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from llmtrio.engine import EngineConfig, EngineStats, GenerateRequest, demo_model_path
from llmtrio.engine.generate._core import EngineCore
from llmtrio.engine.generate._engine import context_params
from llmtrio.engine.generate._step import CoreRequest
from llmtrio.engine.llama import LlamaModel

CTX = 4096
PROMPT = 3600  # the ingested prompt's length: it never finishes within a measurement


class Timers:
    """Wall seconds per named phase, per step."""

    def __init__(self) -> None:
        self.wall: dict[str, float] = {}

    def wrap(self, obj: Any, attr: str, name: str) -> None:
        inner: Callable[..., Any] = getattr(obj, attr)

        def timed(*args: Any, **kwargs: Any) -> Any:
            w0 = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.wall[name] = self.wall.get(name, 0.0) + time.perf_counter() - w0

        setattr(obj, attr, timed)

    def take(self) -> dict[str, float]:
        out, self.wall = self.wall, {}
        return out


def q(values: Sequence[float]) -> str:
    """Median and interquartile range, in ms."""
    if not values:
        return "-"
    ms = sorted(v * 1000 for v in values)
    lo, hi = ms[len(ms) // 4], ms[(3 * len(ms)) // 4]
    return f"{statistics.median(ms):7.1f} ({lo:.1f}-{hi:.1f})"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=str)
    parser.add_argument("--slots", type=int, default=8, help="sequences decoding")
    parser.add_argument("--chunks", type=int, nargs="+", default=[0, 16, 32, 64, 128, 256, 512])
    parser.add_argument("--steps", type=int, default=12, help="steps a size, a round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--busy", type=int, default=0, help="busy loops beside the steps")
    parser.add_argument("--no-spec", action="store_true", help="the core as --no-spec builds it")
    args = parser.parse_args(argv)
    path = args.model or demo_model_path()
    slots = args.slots + 1
    config = EngineConfig(
        model=path,
        max_inflight=slots,
        ctx_size=CTX,
        threads=args.threads,
        prefill_chunk=max(512, *args.chunks),
        prompt_cache=False,
        spec=None if args.no_spec else "ngram",
    )
    n_batch, _ = context_params(config)
    model = LlamaModel(path, slots=slots, ctx_size=CTX, threads=args.threads, n_batch=n_batch)
    core = EngineCore(model, config, EngineStats())
    timers = Timers()
    timers.wrap(model, "decode", "llama_decode")
    timers.wrap(core, "_verify", "sampling")
    rng = np.random.default_rng(1)
    vocab = model.n_vocab
    keys = iter(range(1, 1_000_000))

    def request(n: int, max_tokens: int) -> CoreRequest:
        # Random ids: distinct prompts (no reuse), a prompt of exactly n tokens.
        prompt = rng.integers(1000, min(vocab, 200_000), size=n).astype(np.int32)
        body = GenerateRequest(tokens=prompt.tolist(), max_tokens=max_tokens, ignore_eos=True)
        return CoreRequest(next(keys), prompt, body, max_tokens)

    for _ in range(args.slots):
        core.add(request(64, CTX - 200))
    core._scheduler.prefill_chunk = 512
    while any(job.generated == 0 for job in core._jobs.values()):
        core.step()
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    rows: dict[int, dict[str, list[float]]] = {c: {} for c in args.chunks}
    try:
        for _ in range(args.rounds):
            for chunk in args.chunks:
                ingesting = None
                if chunk:
                    ingesting = request(PROMPT, 1)
                    core.add(ingesting)
                    core._scheduler.prefill_chunk = chunk
                    core.step()  # admission (the sampler made): not measured
                timers.take()
                for _ in range(args.steps):
                    w0, c0 = time.perf_counter(), time.thread_time()
                    core.step()
                    wall, cpu = time.perf_counter() - w0, time.thread_time() - c0
                    phases = timers.take()
                    row = rows[chunk]
                    row.setdefault("step", []).append(wall)
                    row.setdefault("cpu", []).append(cpu)
                    for name, value in phases.items():
                        row.setdefault(name, []).append(value)
                    row.setdefault("rest", []).append(wall - sum(phases.values()))
                if ingesting is not None:
                    core.cancel(ingesting.key)
                    core.release_cancelled()
    finally:
        for process in busy:
            process.kill()
    model.close()
    base = statistics.median(rows[args.chunks[0]]["step"]) if 0 in args.chunks else None
    print(
        f"{path}: {args.slots} sequences decoding + one prompt ingested CHUNK tokens a step; "
        f"{args.threads} thread(s), {args.busy} busy loop(s), spec {config.spec}, "
        f"{args.rounds} rounds x {args.steps} steps a size"
    )
    head = ("chunk", "step ms", "llama_decode", "sampling", "rest", "thread CPU", "x decode")
    print(f"{head[0]:>5} " + " ".join(f"{h:>19}" for h in head[1:6]) + f" {head[6]:>9} ms/token")
    for chunk in args.chunks:
        row = rows[chunk]
        step = statistics.median(row["step"])
        ratio = f"{step / base:9.2f}" if base else f"{'-':>9}"
        per = f"{(step - base) * 1000 / chunk:8.2f}" if base and chunk else f"{'-':>8}"
        cells = [q(row.get(k, [])) for k in ("step", "llama_decode", "sampling", "rest", "cpu")]
        print(f"{chunk:>5} " + " ".join(f"{c:>19}" for c in cells) + f" {ratio} {per}")


if __name__ == "__main__":
    main()
