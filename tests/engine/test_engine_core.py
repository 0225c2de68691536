"""The decode-step core without Trio: requests in, step outputs out, on this thread."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from llmtrio.engine import EngineStats, GenerateRequest, StopReason
from llmtrio.engine.generate._core import EngineCore
from llmtrio.engine.generate._engine import context_params
from llmtrio.engine.generate._step import CoreRequest, StepOutput
from llmtrio.engine.llama import Batch, LlamaModel
from llmtrio.engine.spec_decode import Candidate

from .._core_helpers import RandomDrafter, core_request, open_core, run_core
from .._helpers import engine_config


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


class BatchRecorder(LlamaModel):
    """A model that keeps every batch it decodes: (token, position, sequence, logits flag)
    rows."""

    def __init__(self, path: Path, **kwargs: Any) -> None:
        super().__init__(path, **kwargs)
        self.batches: list[list[tuple[int, int, int, int]]] = []

    def decode(self, batch: Batch) -> int:
        n = batch.n
        columns = (batch.token[:n], batch.pos[:n], batch.seq[:n], batch.logits[:n])
        self.batches.append([tuple(int(v) for v in row) for row in zip(*columns, strict=True)])
        return super().decode(batch)


def test_a_step_without_drafts_decodes_the_batch_no_spec_decodes(qwen35_path: Path) -> None:
    """Speculation that drafts nothing costs nothing in the batch: with drafts offered every
    step and the budget verifying none, each ``llama_decode`` gets exactly the batch (tokens,
    positions, sequences, which rows give logits) that the core without speculation builds
    for the same requests, so the outputs agree too. Only the context differs (its
    ``n_batch``, and on this hybrid model the recurrent snapshots; what they cost a step:
    ``benchmarks/spec_context.py``)."""
    offered: list[int] = []

    def never(candidates: Sequence[Candidate], *_: object, **__: object) -> list[int]:
        offered.append(len(candidates))
        return [0] * len(candidates)

    seen: dict[str | None, tuple[list[list[tuple[int, int, int, int]]], dict[int, list[int]]]]
    seen = {}
    params = {}
    for spec in ("ngram", None):
        config = engine_config(
            qwen35_path, max_inflight=3, ctx_size=256, threads=1, spec=spec, prefill_chunk=16
        )
        n_batch, n_rs_seq = params[spec] = context_params(config)
        model = BatchRecorder(
            qwen35_path, slots=3, ctx_size=256, threads=1, n_batch=n_batch, n_rs_seq=n_rs_seq
        )
        try:
            core = EngineCore(model, config, EngineStats(), plan=never)
            words = "one two three one two three one two three four"
            prompts = [model.tokenize(words * n, add_special=False) for n in (1, 3, 5)]
            requests = [
                core_request(key, prompt, 12, ignore_eos=True) for key, prompt in enumerate(prompts)
            ]
            tokens = run_core(core, requests).tokens
            seen[spec] = (model.batches, tokens)
        finally:
            model.close()
    assert params["ngram"] != params[None]  # the contexts differ...
    spec_batches, spec_tokens = seen["ngram"]
    plain_batches, plain_tokens = seen[None]
    assert sum(offered) > 0  # ...drafts were offered and none verified...
    assert len(spec_batches) == len(plain_batches) > 10
    assert spec_batches == plain_batches  # ...and every batch is the same
    assert any(len({row[2] for row in batch}) == 3 for batch in plain_batches)
    assert spec_tokens == plain_tokens
    assert all(len(tokens) == 12 for tokens in plain_tokens.values())


def test_a_step_the_draft_gate_holds_proposes_nothing(qwen35_path: Path) -> None:
    """With the default budget, the draft gate (issue 36) holds a count of sequences' first
    steps, to measure the rate speculation must beat: those steps propose nothing (they
    cost what ``--no-spec``'s do) and are counted; once that many held steps are measured,
    the next step is open and proposes."""
    proposed: list[int] = []

    class Spy(RandomDrafter):
        def propose(self, limit: int) -> tuple[list[int], int]:
            proposed.append(steps)
            return super().propose(limit)

    model = LlamaModel(qwen35_path, slots=2, ctx_size=128, threads=1, n_batch=64, n_rs_seq=3)
    try:
        core, stats = open_core(
            model, spec="ngram", spec_draft_max=3, drafter=lambda _: Spy(model.n_vocab)
        )
        gate = core._drafts.gate
        assert gate is not None
        core.add(core_request(1, model.tokenize("one two three", add_special=False), 30))
        steps = 0
        while not proposed and steps < 20:
            steps += 1
            core.step()
        # Step 1 ingests the prompt (no sequence decoding yet); steps 2 to 1 + least are
        # held and propose nothing; the step after proposes.
        assert proposed == [2 + gate.least]
        assert stats.spec_held_steps == gate.least
        held, opened = gate.rates(1, time.perf_counter())
        assert held is not None and opened is not None
    finally:
        model.close()
