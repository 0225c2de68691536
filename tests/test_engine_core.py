"""The decode-step core without Trio: requests in, step outputs out, on this thread."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from llmtrio.engine import EngineStats, GenerateRequest, StopReason
from llmtrio.engine.generate._core import EngineCore
from llmtrio.engine.generate._step import CoreRequest, StepOutput
from llmtrio.engine.llama import LlamaModel

from ._helpers import engine_config


def run(core: EngineCore, keys: set[int]) -> dict[int, list[StepOutput]]:
    """Step until every key in ``keys`` is released; each key's outputs."""
    outputs: dict[int, list[StepOutput]] = {key: [] for key in keys}
    left = set(keys)
    for _ in range(200):
        for output in core.release_cancelled() + core.step():
            outputs[output.key].append(output)
            if output.released:
                left.discard(output.key)
        if not left:
            return outputs
    raise AssertionError(f"not finished: {left}")


def test_the_core_batches_reuses_and_cancels_without_trio(qwen35_path: Path) -> None:
    config = engine_config(qwen35_path, max_inflight=2, ctx_size=256)
    model = LlamaModel(qwen35_path, slots=2, ctx_size=256, threads=2, n_batch=258)
    try:
        stats = EngineStats()
        core = EngineCore(model, config, stats)
        prompt = np.asarray(model.tokenize("one two three four five six seven", add_special=False))

        def request(key: int, tokens: np.ndarray, max_tokens: int = 5) -> CoreRequest:
            generate = GenerateRequest(tokens=tokens.tolist(), max_tokens=max_tokens)
            return CoreRequest(key, tokens.astype(np.int32), generate, max_tokens)

        core.add(request(0, prompt, max_tokens=1))
        core.add(request(1, prompt[::-1].copy()))
        first = run(core, {0, 1})
        assert [o.stop for o in first[0] if o.released] == [StopReason.MAX_TOKENS]
        assert sum(len(o.tokens) for o in first[1]) == 5
        assert not core.busy and stats.steps >= 5

        # Key 0 held the prompt alone (its one token was never decoded): the next request
        # extends it, so its recurrent state is reused whole.
        longer = np.concatenate([prompt, prompt[:3]])
        core.add(request(2, longer))
        (done,) = [o for o in run(core, {2})[2] if o.released]
        assert done.cached == len(prompt)
        assert stats.prompt_cache_hits == 1

        core.add(request(3, prompt))
        core.cancel(3)
        (cancelled,) = core.release_cancelled()
        assert (cancelled.key, cancelled.stop, cancelled.released) == (
            3,
            StopReason.CANCELLED,
            True,
        )
        assert not core.busy
    finally:
        model.close()
