"""Min-of-N cost of the per-token hot path that every request takes, for before/after checks
across source trees (robust to a busy machine, unlike wall-clock throughput):

- ``SlotSampler`` construction (once per request) and ``sample()`` for a plain greedy slot
  with end-of-generation banned (what benchmarks/compare.py's requests take);
- ``Generation._apply`` for one token (the Trio side: piece, UTF-8, stop strings, think).

    for tree in /path/to/base /path/to/this; do
        PYTHONPATH=$tree .venv/bin/python benchmarks/hot_path.py
    done
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from functools import partial

import numpy as np
import trio

import llmtrio
from llmtrio.engine import Engine, EngineConfig, GenerateRequest, demo_model_path
from llmtrio.engine.generate._step import StepOutput
from llmtrio.engine.llama import Batch, LlamaModel, SlotSampler


def best(f: Callable[[], object], n: int, rounds: int = 7) -> float:
    """Microseconds per call, the best of ``rounds`` runs of ``n`` calls."""
    result = float("inf")
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            f()
        result = min(result, (time.perf_counter() - start) / n)
    return result * 1e6


def sampler_costs() -> tuple[float, float]:
    model = LlamaModel(demo_model_path(), slots=1, ctx_size=64, threads=2, n_batch=64)
    try:
        batch = Batch(64)
        tokens = model.tokenize("Hello there", add_special=True)
        index = batch.add(np.asarray(tokens, np.int32), 0, 0, output_last=True)
        assert model.decode(batch) == 0
        kwargs: dict[str, object] = {
            "temperature": 0.0, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "seed": 1,
            "bias": dict.fromkeys(model.eog, float("-inf")),
        }  # fmt: skip
        sampler = SlotSampler(model, **kwargs)  # type: ignore[arg-type]
        construct = best(lambda: SlotSampler(model, **kwargs).close(), 200)  # type: ignore[arg-type]
        sample = best(lambda: sampler.sample(index), 2000)
        sampler.close()
        return construct, sample
    finally:
        model.close()


async def apply_cost() -> float:
    config = EngineConfig(model=demo_model_path(), max_inflight=1, ctx_size=256, threads=2)
    async with Engine.open(config) as engine:
        token = engine.tokenize(" hello")[0]
        result = float("inf")
        for _ in range(7):
            async with engine.submit(GenerateRequest.user("x", max_tokens=5)) as generation:
                # No checkpoint until the block ends: nothing the decode thread posts is
                # delivered meanwhile, so these calls are the only ones.
                step = StepOutput(0, [token])  # what one decode step hands this generation
                result = min(result, best(partial(generation._apply, step), 5000, rounds=1))
                generation.cancel()
        return result


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    construct, sample = sampler_costs()
    apply = trio.run(apply_cost)
    tree = llmtrio.__file__.rsplit("/llmtrio/", 1)[0]
    print(
        f"{tree}: SlotSampler() {construct:.1f} us, sample() {sample:.1f} us, "
        f"Generation._apply {apply:.2f} us per token"
    )


if __name__ == "__main__":
    main()
