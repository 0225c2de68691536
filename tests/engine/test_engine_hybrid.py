"""The engine on the qwen35 tiny random model: hybrid attention + recurrent memory.

Its weights are random, so the text is noise: these tests compare token streams, not words.
A recurrent state cannot be cut back part-way, so every slot must be cleared whole between
uses, and batching must not mix the states of different sequences.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

import numpy as np
import pytest
import trio

from llmtrio.engine import Engine, GenerateRequest, StopReason
from llmtrio.engine.llama import Batch, LlamaModel

from .._helpers import collect, collect_logprobs, engine_config, run_together

PROMPTS = ["hello world", "the cat sat", "a b c d e", "zzz", "one two three four five six"]


#: This file's engines: 4 slots of 128 tokens unless a test says otherwise.
config = partial(engine_config, max_inflight=4, ctx_size=128)


def request(engine: Engine, prompt: str, **kwargs: object) -> GenerateRequest:
    return GenerateRequest(tokens=engine.tokenize(prompt), **kwargs)  # type: ignore[arg-type]


def test_the_model_is_hybrid_and_cannot_be_cut_part_way(qwen35_path: Path) -> None:
    model = LlamaModel(qwen35_path, slots=2, ctx_size=64, threads=2, n_batch=64)
    try:
        assert model.is_hybrid
        assert model.chat_template is None
    finally:
        model.close()


async def test_batched_sequences_keep_their_own_state(qwen35_path: Path) -> None:
    """A sequence's output does not depend on what its neighbours in the batch hold: the
    same batch twice, the other three prompts replaced by others of the same lengths (so
    every step's batch has the same shape, and only then are the runs defined equal), gives
    the first sequence the same tokens and logprobs, bit for bit."""

    def batch(tokens: list[list[int]]) -> list[GenerateRequest]:
        return [
            GenerateRequest(tokens=t, max_tokens=16, ignore_eos=True, logprobs=2) for t in tokens
        ]

    # Without reuse: both runs ingest every prompt whole, in the same batches.
    async with Engine.open(config(qwen35_path, prompt_cache=False)) as engine:
        prompts = [engine.tokenize(p) for p in PROMPTS[:4]]
        others = [[(t * 7 + 3) % engine.n_vocab for t in p] for p in prompts]
        assert all(a != b for a, b in zip(prompts[1:], others[1:], strict=True))
        first = [lp for lp, _ in await run_together(engine, batch(prompts))]
        second = [lp for lp, _ in await run_together(engine, batch([prompts[0], *others[1:]]))]
    assert all(len(entries) == 16 for entries in first + second)
    assert second[0] == first[0]
    # The neighbours did change (their logprobs differ), so the first one's were exposed.
    assert second[1:] != first[1:]


async def test_a_reused_slot_starts_from_a_clean_state(qwen35_path: Path) -> None:
    # One slot: every request reuses sequence 0. Leftover recurrent state would change the
    # output of a repeated request. Without prompt reuse, every request ingests its whole
    # prompt into a cleared slot: the same batches each time, so the same bits.
    async with Engine.open(config(qwen35_path, max_inflight=1, prompt_cache=False)) as engine:
        again_request = request(engine, PROMPTS[0], max_tokens=12, logprobs=2)
        first, _ = await collect_logprobs(engine, again_request)
        await collect(engine, request(engine, PROMPTS[1], max_tokens=30))
        # A cancelled generation leaves its slot clean too.
        async with engine.submit(request(engine, PROMPTS[2])) as gen:
            async for _ in gen:
                break
        again, _ = await collect_logprobs(engine, again_request)
        assert again == first
        assert engine.capacity().inflight == 0


async def test_chunked_prefill_carries_the_recurrent_state(qwen35_path: Path) -> None:
    """A prompt ingested in chunks of 7 gives exactly what llama.cpp gives for the same
    chunks decoded by hand (the state carried across chunks, the positions right), and close
    to one whole ingestion: far closer than the same prompt with its first part lost (what
    a state dropped between chunks would give). Chunked and whole are different batches, so
    only the closeness is compared there."""
    text = " ".join(PROMPTS * 4)
    cfg = config(qwen35_path, prefill_chunk=7)
    async with Engine.open(cfg) as engine:
        tokens = engine.tokenize(text)
        (entry, *_), done = await collect_logprobs(
            engine, GenerateRequest(tokens=tokens, max_tokens=1, logprobs=20)
        )
    assert done.prompt_tokens > 30 and done.prompt_tokens % 7 != 0

    def first_logits(prompt: list[int], chunk: int) -> np.ndarray:
        """The logits after ``prompt`` decoded by hand in chunks of ``chunk``, on a context
        like the engine's."""
        n_batch = max(cfg.prefill_chunk + cfg.max_inflight, 64)
        model = LlamaModel(qwen35_path, slots=4, ctx_size=128, threads=2, n_batch=n_batch)
        try:
            batch = Batch(n_batch)
            index = -1
            for start in range(0, len(prompt), chunk):
                batch.clear()
                part = np.asarray(prompt[start : start + chunk], np.int32)
                last = start + chunk >= len(prompt)
                index = batch.add(part, start, 0, output_last=last)
                assert model.decode(batch) == 0
            return model.logits(index).astype(np.float64)
        finally:
            model.close()

    def log_softmax(logits: np.ndarray) -> np.ndarray:
        shifted = logits - logits.max()
        return shifted - np.log(np.exp(shifted).sum())

    chunked = await trio.to_thread.run_sync(first_logits, tokens, 7)
    by_hand = log_softmax(chunked)
    best = np.argsort(-by_hand)[:20]
    assert [p for _, p, _ in entry.top] == [engine._piece(int(t)) for t in best]
    assert [lp for _, _, lp in entry.top] == pytest.approx(list(by_hand[best]), abs=1e-5)

    whole = log_softmax(await trio.to_thread.run_sync(first_logits, tokens, len(tokens)))
    lost = log_softmax(await trio.to_thread.run_sync(first_logits, tokens[14:], len(tokens)))
    assert np.abs(by_hand - whole).max() < np.abs(lost - whole).max() / 10


async def test_context_end_and_cancel_free_the_slots(qwen35_path: Path) -> None:
    async with Engine.open(config(qwen35_path, ctx_size=32, max_inflight=2)) as engine:
        _, done = await collect(engine, request(engine, PROMPTS[4]))
        assert done.stop is StopReason.CONTEXT_END
        assert done.prompt_tokens + done.completion_tokens == 33
        with trio.fail_after(5):
            await engine.wait_idle()
