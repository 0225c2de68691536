"""Greedy sampling cost per slot: llama.cpp's sampler chain (logit bias + greedy, as
``ignore_eos`` needs) against llmtrio's numpy argmax with the biases added in place; then what
the per-request extras cost the slot that asks for them (penalties, logprobs, a grammar whose
check passes, a grammar applied to the whole vocabulary).

    .venv/bin/python benchmarks/sampler_bench.py [--model PATH]
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import llama_cpp
import numpy as np

from llmtrio.engine import demo_model_path
from llmtrio.engine.llama import Batch, LlamaModel, SlotSampler
from llmtrio.engine.llama._constrained import Candidates


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
        extras(model, index, args.repeat)
    finally:
        model.close()


def extras(model: LlamaModel, index: int, repeat: int) -> None:
    """Per-sample cost of each extra, on the same logits (greedy)."""
    from llmtrio.engine import JSON_OBJECT_GRAMMAR
    from llmtrio.engine.llama import Penalties

    base = dict(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, bias={})
    logits = model.logits(index).copy()

    def penalties() -> Penalties:
        p = Penalties(presence=0.5, frequency=0.5, repeat=1.1, repeat_last_n=64)
        for token in range(0, 2000, 10):  # 200 distinct tokens seen
            p.accept(token)
        return p

    def timed(name: str, make: Callable[[], SlotSampler], n: int) -> None:
        best = float("inf")
        for _ in range(3):
            samplers = [make() for _ in range(n)]
            start = time.perf_counter()
            for sampler in samplers:
                model.logits(index)[:] = logits  # the extras edit the logits in place
                sampler.sample(index)
            best = min(best, (time.perf_counter() - start) / n)
            for sampler in samplers:
                sampler.close()
        print(f"{name:34} {best * 1e6:8.1f} us per sample")

    first, second = (int(t) for t in np.argsort(-logits)[:2])

    def only(token: int) -> str:  # a grammar that allows just this token's text, then letters
        return f"root ::= {json.dumps(model.piece(token).decode())} [a-z]*"

    print("\nper-slot extras (greedy; each row includes restoring the 1 MB of logits):")
    timed("plain greedy (argmax)", lambda: SlotSampler(model, **base), repeat)
    timed(
        "penalties (200 tokens seen)",
        lambda: SlotSampler(model, **base, penalties=penalties()),
        repeat,
    )
    timed("logprobs, top 20", lambda: SlotSampler(model, **base, logprobs=20), repeat)
    timed("grammar, argmax allowed", lambda: SlotSampler(model, **base, grammar=only(first)), 20)
    timed(
        "grammar, 2nd best (among the 64 best)",
        lambda: SlotSampler(model, **base, grammar=only(second)),
        20,
    )
    # "{" is not among this prompt's 64 most likely tokens: the rest is searched, less the
    # tokens whose first two bytes the grammar refuses.
    timed(
        "grammar, '{' (past the 64 best)",
        lambda: SlotSampler(model, **base, grammar=JSON_OBJECT_GRAMMAR),
        20,
    )
    sampled = {**base, "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05}
    timed(
        "grammar, '{', sampled (top-k 40)",
        lambda: SlotSampler(model, **sampled, grammar=JSON_OBJECT_GRAMMAR),
        20,
    )
    # What llama.cpp's common sampler does on a refusal: the grammar over every token.
    grammar = model.grammars.new(JSON_OBJECT_GRAMMAR)
    candidates = Candidates(model.n_vocab)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        candidates.fill(logits)
        llama_cpp.llama_sampler_apply(grammar, candidates.ref)
        best = min(best, time.perf_counter() - start)
    llama_cpp.llama_sampler_free(grammar)
    print(f"{'the grammar over the whole vocabulary':34} {best * 1e6:8.1f} us per pass")


if __name__ == "__main__":
    main()
