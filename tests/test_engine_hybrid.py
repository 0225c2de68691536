"""The engine on the qwen35 tiny random model: hybrid attention + recurrent memory.

Its weights are random, so the text is noise: these tests compare token streams, not words.
A recurrent state cannot be cut back part-way, so every slot must be cleared whole between
uses, and batching must not mix the states of different sequences.
"""

from __future__ import annotations

from pathlib import Path

import trio

from llmtrio.engine import Done, Engine, EngineConfig, GenerateRequest, StopReason
from llmtrio.engine._llama import LlamaModel

from ._helpers import collect

PROMPTS = ["hello world", "the cat sat", "a b c d e", "zzz", "one two three four five six"]


def config(path: Path, **kwargs: object) -> EngineConfig:
    values: dict[str, object] = {"model": path, "max_inflight": 4, "ctx_size": 128, "threads": 2}
    values.update(kwargs)
    return EngineConfig(**values)  # type: ignore[arg-type]


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
    async with Engine.open(config(qwen35_path)) as engine:
        requests = [request(engine, p, max_tokens=16) for p in PROMPTS[:4]]
        alone = [await collect(engine, r) for r in requests]
        results: list[tuple[str, Done] | None] = [None] * 4

        async def one(i: int) -> None:
            results[i] = await collect(engine, requests[i])

        async with trio.open_nursery() as nursery:
            for i in range(4):
                nursery.start_soon(one, i)
        assert [r[0] for r in results if r] == [a[0] for a in alone]
        assert all(a[1].stop is StopReason.MAX_TOKENS for a in alone)


async def test_a_reused_slot_starts_from_a_clean_state(qwen35_path: Path) -> None:
    # One slot: every request reuses sequence 0. Leftover recurrent state would change the
    # output of a repeated request.
    async with Engine.open(config(qwen35_path, max_inflight=1)) as engine:
        first = await collect(engine, request(engine, PROMPTS[0], max_tokens=12))
        await collect(engine, request(engine, PROMPTS[1], max_tokens=30))
        # A cancelled generation leaves its slot clean too.
        async with engine.submit(request(engine, PROMPTS[2])) as gen:
            async for _ in gen:
                break
        again = await collect(engine, request(engine, PROMPTS[0], max_tokens=12))
        assert again[0] == first[0]
        assert engine.capacity().inflight == 0


async def test_chunked_prefill_matches_one_shot_prefill(qwen35_path: Path) -> None:
    # A recurrent state carried across prefill chunks must equal one ingested in one go.
    prompt = " ".join(PROMPTS * 4)
    async with Engine.open(config(qwen35_path, prefill_chunk=512)) as engine:
        whole = await collect(engine, request(engine, prompt, max_tokens=10))
    async with Engine.open(config(qwen35_path, prefill_chunk=7)) as engine:
        chunked = await collect(engine, request(engine, prompt, max_tokens=10))
    assert whole[1].prompt_tokens > 30
    assert chunked[0] == whole[0]


async def test_context_end_and_cancel_free_the_slots(qwen35_path: Path) -> None:
    async with Engine.open(config(qwen35_path, ctx_size=32, max_inflight=2)) as engine:
        _, done = await collect(engine, request(engine, PROMPTS[4]))
        assert done.stop is StopReason.CONTEXT_END
        assert done.prompt_tokens + done.completion_tokens == 33
        with trio.fail_after(5):
            await engine.wait_idle()
