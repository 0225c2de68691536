"""Greedy sampling cost per slot: llama.cpp's sampler chain (logit bias + greedy, as
``ignore_eos`` needs) against llmtrio's numpy argmax with the biases added in place.

    .venv/bin/python benchmarks/sampler_bench.py [--model PATH]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import llama_cpp
import numpy as np

from llmtrio.engine import demo_model_path
from llmtrio.engine._llama import Batch, LlamaModel, SlotSampler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--repeat", type=int, default=200)
    args = parser.parse_args()
    model = LlamaModel(args.model or demo_model_path(), slots=1, ctx_size=64, threads=2, n_batch=64)
    try:
        batch = Batch(64)
        index = batch.add(np.asarray(model.tokenize("Hello", add_special=True), np.int32), 0, 0,
                          output_last=True)  # fmt: skip
        assert model.decode(batch) == 0
        bias = dict.fromkeys(model.eog, float("-inf"))

        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        entries = (llama_cpp.llama_logit_bias * len(bias))(
            *(llama_cpp.llama_logit_bias(t, b) for t, b in bias.items())
        )
        llama_cpp.llama_sampler_chain_add(
            chain, llama_cpp.llama_sampler_init_logit_bias(model.n_vocab, len(bias), entries)
        )
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        numpy_sampler = SlotSampler(
            model, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, bias=bias
        )

        def chain_sample() -> int:
            return int(llama_cpp.llama_sampler_sample(chain, model.ctx, index))

        results = {}
        for name, sample in (
            ("llama.cpp chain (bias + greedy)", chain_sample),
            ("numpy argmax (bias in place)", lambda: numpy_sampler.sample(index)),
        ):
            best = float("inf")
            for _ in range(5):
                start = time.perf_counter()
                for _ in range(args.repeat):
                    token = sample()
                best = min(best, (time.perf_counter() - start) / args.repeat)
            results[name] = token
            print(f"{name:34} {best * 1e6:8.1f} us per sample (vocabulary {model.n_vocab})")
        assert len(set(results.values())) == 1, results
        llama_cpp.llama_sampler_free(chain)
        numpy_sampler.close()
    finally:
        model.close()


if __name__ == "__main__":
    main()
