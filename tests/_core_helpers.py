"""Driving the decode-step core from a test's own thread: no Trio, no engine."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from llmtrio.engine import EngineConfig, EngineStats, GenerateRequest, StopReason
from llmtrio.engine.generate._core import EngineCore
from llmtrio.engine.generate._jobs import Drafter
from llmtrio.engine.generate._lora import BASE, LoraSet
from llmtrio.engine.generate._step import CoreRequest, StepOutput
from llmtrio.engine.grammar import Grammar
from llmtrio.engine.llama import LlamaModel
from llmtrio.engine.spec_decode import Candidate

__all__ = [
    "RandomDrafter",
    "RecordingModel",
    "Run",
    "core_request",
    "draft_all",
    "open_core",
    "run_core",
]


class RecordingModel(LlamaModel):
    """A model that keeps a copy of every logits row a sampler reads, in order."""

    def __init__(self, path: Path, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.seen: list[npt.NDArray[np.float32]] = []

    def logits(self, index: int) -> npt.NDArray[np.float32]:
        row = super().logits(index)
        self.seen.append(row.copy())
        return row


class RandomDrafter:
    """Drafts random tokens (almost always wrong), claiming a long n-gram match."""

    def __init__(self, vocab: int, seed: int = 0) -> None:
        self._vocab = vocab
        self._random = random.Random(seed)

    def extend(self, tokens: Sequence[int]) -> None:
        pass

    def propose(self, limit: int) -> tuple[list[int], int]:
        return [self._random.randrange(self._vocab) for _ in range(limit)], 4


def draft_all(candidates: Sequence[Candidate], *_: object, **__: object) -> list[int]:
    """A draft budget that verifies every draft offered, whatever it costs."""
    return [c.tokens for c in candidates]


def open_core(
    model: LlamaModel,
    *,
    drafter: Callable[[list[int]], Drafter] | None = None,
    plan: Callable[..., list[int]] | None = None,
    **config: Any,
) -> tuple[EngineCore, EngineStats]:
    values: dict[str, Any] = {
        "model": model.path,
        "max_inflight": model.slots,
        "ctx_size": model.ctx_size,
        "threads": 2,
        "kv_unified": model.kv_unified,
        # The batch holds a chunk and every sequence's token and drafts.
        "prefill_chunk": max(1, model.n_batch // 2),
        # Chunks of a fixed size (a finite share sizes them by measured step times).
        "prefill_share": math.inf,
    }
    values.update(config)
    stats = EngineStats()
    extra: dict[str, Any] = {"drafter": drafter}
    if plan is not None:
        extra["plan"] = plan
    return EngineCore(model, EngineConfig(**values), stats, **extra), stats


def core_request(
    key: int, prompt: Sequence[int], max_tokens: int, *, lora: LoraSet = BASE, **kwargs: Any
) -> CoreRequest:
    tokens = np.asarray(prompt, dtype=np.int32)
    request = GenerateRequest(tokens=list(prompt), max_tokens=max_tokens, **kwargs)
    # The engine compiles a request's grammar before the core sees it; GBNF is compiled as is.
    grammar = Grammar(request.grammar) if request.grammar is not None else None
    return CoreRequest(key, tokens, request, max_tokens, grammar=grammar, lora=lora)


class Run:
    """What :func:`run_core` saw of each request."""

    def __init__(self) -> None:
        self.tokens: dict[int, list[int]] = {}
        self.outputs: dict[int, list[StepOutput]] = {}

    def ended(self, key: int) -> StepOutput:
        (last,) = [o for o in self.outputs[key] if o.released]
        return last

    def stop(self, key: int) -> StopReason | None:
        return self.ended(key).stop


def run_core(core: EngineCore, requests: Sequence[CoreRequest], *, steps: int = 5000) -> Run:
    """Add ``requests`` and step until each is released."""
    run = Run()
    for request in requests:
        core.add(request)
        run.tokens[request.key] = []
        run.outputs[request.key] = []
    left = {request.key for request in requests}
    for _ in range(steps):
        for output in core.release_cancelled() + core.step():
            run.tokens[output.key] += output.tokens
            run.outputs[output.key].append(output)
            if output.released:
                left.discard(output.key)
        if not left:
            return run
    raise AssertionError(f"not finished: {left}")
