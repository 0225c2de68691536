"""What speculation's context costs a step with no drafts (issue 36): two contexts of one
model, one made as the engine makes it with speculation on (``n_batch`` = ``n_ubatch`` room
for every sequence's drafts; on a model with recurrent state, ``n_rs_seq`` snapshots for
rolling drafts back) and one as ``--no-spec`` makes it, decode the same plain steps (every
sequence one token), alternating which goes first; prints each side's median ms (wall, and
CPU of the calling thread, which is llama.cpp's first compute thread) and the median of the
paired ratios.

    .venv/bin/python benchmarks/spec_context.py [--model PATH] [--slots 8] [--steps 60]
        [--context 300] [--threads 1]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from llmtrio.engine import EngineConfig, demo_model_path
from llmtrio.engine.generate._engine import context_params
from llmtrio.engine.llama import Batch, LlamaModel


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a GGUF (default: the demo gemma-3-270m)")
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--context", type=int, default=300, help="tokens a sequence holds")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    path = args.model or demo_model_path()
    ctx = 1024
    sides: dict[str, tuple[LlamaModel, Batch, int, int]] = {}
    for name, spec in (("spec", "ngram"), ("no-spec", None)):
        config = EngineConfig(
            model=path, max_inflight=args.slots, ctx_size=ctx, threads=args.threads, spec=spec
        )
        n_batch, n_rs_seq = context_params(config)
        model = LlamaModel(
            path,
            slots=args.slots,
            ctx_size=ctx,
            threads=args.threads,
            n_batch=n_batch,
            n_rs_seq=n_rs_seq,
        )
        sides[name] = (model, Batch(n_batch), n_batch, model.n_rs_seq)
    wall: dict[str, list[float]] = {name: [] for name in sides}
    cpu: dict[str, list[float]] = {name: [] for name in sides}
    try:
        for model, batch, n_batch, _ in sides.values():
            prompt = np.resize(
                np.asarray(model.tokenize(" The sea is salt water.", add_special=False), np.int32),
                args.context,
            )
            for seq in range(args.slots):
                for at in range(0, len(prompt), n_batch):
                    batch.clear()
                    batch.add(prompt[at : at + n_batch], at, seq, output_last=True)
                    if model.decode(batch) != 0:
                        raise SystemExit("prompt decode failed")
        for step in range(args.steps):
            order = list(sides) if step % 2 == 0 else list(sides)[::-1]
            for name in order:
                model, batch, _, _ = sides[name]
                batch.clear()
                for seq in range(args.slots):
                    batch.add_one(100 + seq, args.context + step, seq)
                w0, c0 = time.perf_counter(), time.thread_time()
                if model.decode(batch) != 0:
                    raise SystemExit("decode failed")
                wall[name].append((time.perf_counter() - w0) * 1000)
                cpu[name].append((time.thread_time() - c0) * 1000)
    finally:
        for model, *_ in sides.values():
            model.close()
    print(
        f"{path.name}, {args.slots} x 1 token a step, {args.context} tokens held, "
        f"{args.threads} thread(s), {args.steps} steps alternating"
    )
    for name, (_, _, n_batch, n_rs_seq) in sides.items():
        w, c = statistics.median(wall[name]), statistics.median(cpu[name])
        print(
            f"  {name:8} n_batch {n_batch:4d} n_rs_seq {n_rs_seq}  "
            f"wall {w:7.2f} ms  cpu {c:7.2f} ms"
        )
    for label, values in (("wall", wall), ("cpu", cpu)):
        ratios = sorted(a / b for a, b in zip(values["spec"], values["no-spec"], strict=True))
        lo, hi = ratios[len(ratios) // 4], ratios[(3 * len(ratios)) // 4]
        print(
            f"  spec / no-spec ({label}, paired): median {statistics.median(ratios):.3f} "
            f"(interquartile {lo:.3f}-{hi:.3f})"
        )


if __name__ == "__main__":
    main()
