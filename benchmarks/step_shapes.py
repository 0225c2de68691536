"""What a decode step costs by its shape (issue 18's draft budget): ``llama_decode`` of
batches of one or eight sequences carrying drafts of equal or mixed lengths, every position
with logits, medians of a few repetitions. Per-slot memory splits a batch whose sequences
carry unequal tokens into several micro-batches (llama.cpp's ``split_equal`` with
consecutive ids), each reading all the weights again; ``--kv-unified`` does not.

    .venv/bin/python benchmarks/step_shapes.py [--threads 2] [--kv-unified] [--repeat 7] [--scan N]
        [--context 600]

Each line: the tokens per sequence, the positions with logits, the micro-batches
``llmtrio.engine.spec_decode._batches.micro_batches`` predicts, and the median ms.
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
from llmtrio.engine.spec_decode._batches import micro_batches

SHAPES: dict[str, list[int]] = {
    "1 x 1": [1],
    "1 x 2": [2],
    "1 x 3": [3],
    "1 x 4": [4],
    "1 x 6": [6],
    "1 x 9": [9],
    "1 x 13": [13],
    "1 x 17": [17],
    "1 x 25": [25],
    "1 x 33": [33],
    "1 x 49": [49],
    "1 x 65": [65],
    "2 x 1": [1] * 2,
    "2 x 9": [9] * 2,
    "4 x 1": [1] * 4,
    "4 x 5": [5] * 4,
    "8 x 1": [1] * 8,
    "8 x 2": [2] * 8,
    "8 x 3": [3] * 8,
    "8 x 4": [4] * 8,
    "8 x 9": [9] * 8,
    "8 x 17": [17] * 8,
    "8 x (1, 2)": [1, 2] * 4,
    "8 x (1..4)": [1, 2, 3, 4] * 2,
    "8 x (1, 5)": [1, 5] * 4,
    "7 x 1 + 9": [1] * 7 + [9],
}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, help="a GGUF (default: the demo gemma-3-270m)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kv-unified", action="store_true")
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument(
        "--context",
        type=int,
        default=0,
        help="tokens each sequence holds before the measured steps (default: a 10-token "
        "prompt; a server's sequences hold their prompts, whose attention each step pays)",
    )
    parser.add_argument(
        "--scan",
        type=int,
        metavar="N",
        help="instead of the shapes above, one sequence at every length from 1 to N (what a "
        "draft one token longer or shorter costs)",
    )
    args = parser.parse_args(argv)
    shapes = {f"1 x {n}": [n] for n in range(1, args.scan + 1)} if args.scan else SHAPES
    if args.scan and not 1 <= args.scan <= 65:
        parser.error("--scan: 1 to 65")
    if args.context > 1024 - 65:
        parser.error("--context: at most 959 (1024 cells a slot, 65 for the longest shape)")
    path = args.model or demo_model_path()
    n_batch = 600  # 8 x 17 = 136 tokens, 1 x 65: one micro-batch each
    model = LlamaModel(
        path,
        slots=8,
        ctx_size=1024,
        threads=args.threads,
        n_batch=n_batch,
        kv_unified=args.kv_unified,
    )
    batch = Batch(n_batch)
    times: dict[str, list[float]] = {name: [] for name in shapes}
    try:
        text = "Question: what is the sea?\nAnswer:"
        prompt = np.asarray(model.tokenize(text, add_special=True), np.int32)
        if args.context > len(prompt):
            sentence = " The sea is salt water over most of the earth."
            more = model.tokenize(sentence, add_special=False)
            tail = np.resize(np.asarray(more, np.int32), args.context - len(prompt))
            prompt = np.concatenate([prompt, tail])
        for seq in range(8):
            for at in range(0, len(prompt), n_batch):
                batch.clear()
                batch.add(prompt[at : at + n_batch], at, seq, output_last=True)
                if model.decode(batch) != 0:
                    raise SystemExit("prompt decode failed")
        for _ in range(args.repeat):
            for name, shape in shapes.items():
                batch.clear()
                for seq, n in enumerate(shape):
                    tokens = np.full(n, 100 + seq, np.int32)
                    batch.add(tokens, len(prompt), seq, output_last=True, output_all=True)
                t0 = time.perf_counter()
                if model.decode(batch) != 0:
                    raise SystemExit("decode failed")
                times[name].append((time.perf_counter() - t0) * 1000)
                for seq in range(len(shape)):
                    model.forget(seq, len(prompt))
    finally:
        model.close()
    layout = "one pool" if args.kv_unified else "per slot"
    print(
        f"{path.name}, {layout}, {args.threads} threads, {len(prompt)} tokens held a "
        f"sequence, median of {args.repeat}"
    )
    for name, shape in shapes.items():
        split = micro_batches(list(enumerate(shape)), split=not args.kv_unified, n_ubatch=n_batch)
        print(
            f"  {name:12} positions {sum(shape):3d}  micro-batches {split}  "
            f"{statistics.median(times[name]):7.1f} ms"
        )


if __name__ == "__main__":
    main()
