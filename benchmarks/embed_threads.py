"""Embedding decodes on a fixed thread count, and with the engine's choice: what llama.cpp's
thread barriers cost a small BERT when the machine is busy.

    .venv/bin/python benchmarks/embed_threads.py               # 3 s a figure
    .venv/bin/python benchmarks/embed_threads.py --sizes 1 8 16 32 64 --no-engine

For 1 and ``--threads`` threads fixed (``LlamaModel.set_threads``, no chooser), and for the
``EmbeddingEngine`` (its ``ThreadChooser`` picks per decode), inputs embedded per second at
``--sizes`` inputs a decode (default 1, 8 and 64; distinct 8-16-word sentences, about 16
tokens each; no HTTP), with the tokens of the last decode and the load average beside each:
on a quiet machine more threads are faster; with other work on the cores a multi-threaded
decode waits at its barriers for descheduled threads. The fixed figures at several sizes
also show what a decode's size costs per input (``EMBEDDING_DECODE_TOKENS``). The engine
packs a call's inputs at most ``EMBEDDING_DECODE_TOKENS`` tokens a decode, so its figure at
64 inputs a call is several decodes a call.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))
from embed_compare import MINILM, sentence

from llmtrio.engine import EmbeddingEngine, EngineConfig
from llmtrio.engine.llama import Batch, LlamaModel

SIZES = (1, 8, 64)


def fixed(model: LlamaModel, threads: int, per: int, seconds: float) -> tuple[float, int]:
    model.set_threads(threads)
    batch = Batch(model.n_batch)
    done, k, started = 0, 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        model.clear_memory()
        batch.clear()
        for seq in range(per):
            tokens = np.asarray(model.tokenize(sentence(k), add_special=True), dtype=np.int32)
            k += 1
            start = batch.n
            batch.add(tokens, 0, seq, output_last=True)
            batch.logits[start : batch.n] = 1
        assert model.decode(batch) == 0
        done += per
    return done / (time.perf_counter() - started), batch.n


async def chosen(threads: int, per: int, seconds: float) -> tuple[float, dict[int, int]]:
    config = EngineConfig(model=MINILM, threads=threads, ctx_size=512)
    async with EmbeddingEngine.open(config) as engine:
        done, k, started = 0, 0, time.perf_counter()
        while time.perf_counter() - started < seconds:
            await engine.embed([sentence(k + i) for i in range(per)])
            done, k = done + per, k + per
        return done / (time.perf_counter() - started), dict(engine.decodes_by_threads)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--sizes", type=int, nargs="+", default=SIZES, help="inputs a decode")
    parser.add_argument("--no-engine", action="store_true", help="fixed thread counts only")
    args = parser.parse_args()
    model = LlamaModel(
        MINILM, slots=64, ctx_size=512, threads=args.threads, n_batch=2048, embeddings=True
    )
    try:
        for threads in sorted({1, args.threads}, reverse=True):
            for per in args.sizes:
                rate, n = fixed(model, threads, per, args.seconds)
                print(
                    f"{threads} thread(s) fixed, {per:2} inputs a decode ({n:4} tokens): "
                    f"{rate:6.1f} inputs/s  (load {os.getloadavg()[0]:.2f})",
                    flush=True,
                )
    finally:
        model.close()
    for per in () if args.no_engine else args.sizes:
        rate, used = trio.run(chosen, args.threads, per, args.seconds)
        print(
            f"engine (chooser, up to {args.threads}), {per:2} inputs a decode: {rate:6.1f} "
            f"inputs/s, decodes by threads {used}  (load {os.getloadavg()[0]:.2f})",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
