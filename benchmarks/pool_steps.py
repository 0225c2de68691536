"""What the shared KV pool costs a decode step (issue 18), side by side in one process: two
copies of the model, one with per-slot memory and one with ``kv_unified``, decode the same
sequences one token each a step, their ``llama_decode`` calls alternating (which goes first
alternates too), so a machine whose load swings slows both alike. Prints each layout's
median step and the ratio.

    .venv/bin/python benchmarks/pool_steps.py [--slots 16] [--prompt 20] [--steps 64]
        [--ctx 2048] [--threads 2]

llama.cpp attends, for every sequence in a step, over the pool's used range (masked), so
with one pool each sequence's attention grows with the others' contexts; per slot it spans
its own cells. With short contexts the difference is small beside the weights.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from llmtrio.engine import demo_model_path
from llmtrio.engine.llama import Batch, LlamaModel


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a GGUF (default: the demo gemma-3-270m)")
    parser.add_argument("--slots", type=int, default=16)
    parser.add_argument("--prompt", type=int, default=20, help="prompt tokens a sequence")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--ctx", type=int, default=2048)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    path = args.model or demo_model_path()
    models = {
        name: LlamaModel(
            path,
            slots=args.slots,
            ctx_size=args.ctx,
            threads=args.threads,
            n_batch=max(512, args.prompt, args.slots),
            kv_unified=unified,
        )
        for name, unified in (("per slot", False), ("one pool", True))
    }
    batch = Batch(max(512, args.prompt, args.slots))
    times: dict[str, list[float]] = {name: [] for name in models}
    try:
        for model in models.values():
            for seq in range(args.slots):
                batch.clear()
                prompt = (np.arange(args.prompt, dtype=np.int32) + 100 + seq) % 5000 + 10
                batch.add(prompt, 0, seq, output_last=True)
                if model.decode(batch) != 0:
                    raise SystemExit("prompt decode failed")
        for step in range(args.steps):
            order = list(models) if step % 2 == 0 else list(models)[::-1]
            for name in order:
                model = models[name]
                batch.clear()
                for seq in range(args.slots):
                    batch.add_one(200 + (step * 7 + seq) % 3000, args.prompt + step, seq)
                t0 = time.perf_counter()
                if model.decode(batch) != 0:
                    raise SystemExit("decode failed")
                times[name].append((time.perf_counter() - t0) * 1000)
    finally:
        for model in models.values():
            model.close()
    print(
        f"{path.name}: {args.slots} sequences x {args.prompt}+{args.steps} tokens, "
        f"{args.slots} x {args.ctx} cells, {args.threads} threads"
    )
    for name, values in times.items():
        print(f"  {name:9} median step {statistics.median(values):7.1f} ms")
    ratio = statistics.median(times["per slot"]) / statistics.median(times["one pool"])
    print(f"  one pool / per slot throughput: x{ratio:.2f}")


if __name__ == "__main__":
    main()
