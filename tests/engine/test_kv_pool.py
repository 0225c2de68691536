"""The unified KV pool in the decode-step core (no Trio), on the qwen35 test model: one
request may use the whole pool, admission waits for free cells, idle slots give their
reusable cells up first, and only then is the youngest running sequence swapped out, to
come back later with its sampler state and produce what it would have without preemption.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from llmtrio.engine import (
    Engine,
    EngineConfig,
    GenerateRequest,
    PromptTooLongError,
    Sampling,
    StopReason,
)
from llmtrio.engine.llama import LlamaModel

from .._core_helpers import core_request, open_core, run_core

WORDS = [
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
]


def prompt_of(model: LlamaModel, n: int, salt: int = 0) -> list[int]:
    """A prompt of exactly ``n`` tokens."""
    words = [WORDS[(i * 7 + salt) % len(WORDS)] for i in range(n)]
    tokens = model.tokenize(" ".join(words), add_special=False)
    assert len(tokens) >= n
    return tokens[:n]


def pool_model(path: Path, slots: int = 4, ctx: int = 64, **kwargs: object) -> LlamaModel:
    return LlamaModel(
        path, slots=slots, ctx_size=ctx, threads=2, n_batch=128, kv_unified=True, **kwargs
    )


def test_one_request_uses_more_than_a_slot(qwen35_path: Path) -> None:
    pool = pool_model(qwen35_path)
    try:
        prompt = prompt_of(pool, 150)
        core, stats = open_core(pool, spec=None)
        assert core.request_ctx == 256 and stats.kv_pool_cells == 256
        got = run_core(core, [core_request(0, prompt, 40)])
    finally:
        pool.close()
    alone = LlamaModel(qwen35_path, slots=1, ctx_size=256, threads=2, n_batch=128)
    try:
        core, _ = open_core(alone, spec=None)
        want = run_core(core, [core_request(0, prompt, 40)])
    finally:
        alone.close()
    assert got.stop(0) is StopReason.MAX_TOKENS
    assert got.tokens[0] == want.tokens[0]


@pytest.mark.parametrize("spec", [None, "ngram"])
def test_a_full_pool_preempts_the_youngest_and_it_comes_back_unchanged(
    qwen35_path: Path, spec: str | None
) -> None:
    sampled = Sampling(temperature=0.7, seed=11)
    requests = [
        core_request(k, prompt_of_n(qwen35_path, 30, k), 100, **extra)
        for k, extra in enumerate([{}, {"sampling": sampled}, {}, {"sampling": sampled}])
    ]
    pool = pool_model(qwen35_path, n_rs_seq=4)
    try:
        alone = {}
        for request in requests:
            core, _ = open_core(pool, spec=spec, prompt_cache=False)
            alone[request.key] = run_core(core, [request]).tokens[request.key]
        core, stats = open_core(pool, spec=spec, prompt_cache=False)
        together = run_core(core, requests)
    finally:
        pool.close()
    # 4 x (30 + 100) cells do not fit 256, nor do the two sampled sequences beside the two
    # greedy ones at their end, however fast drafts carry those (up to 5 tokens a step:
    # 2 x 130 + 2 x (30 + 20)): some sequence had to make room. (With 60 tokens, greedy
    # sequences whose drafts were all right could finish before the pool filled.)
    assert stats.preemptions > 0
    assert stats.swapped == 0 and stats.swapped_bytes == 0  # all came back, all ended
    for request in requests:
        assert together.stop(request.key) is StopReason.MAX_TOKENS
        assert len(together.tokens[request.key]) == len(alone[request.key]) == 100
        if spec is None:
            # Without drafts each sequence's batches have the same shapes alone and together,
            # so its output is defined equal. With drafts they do not (how many drafts a step
            # verifies depends on the neighbours), and this model's top choices lie within
            # 0.005-0.2 nats of each other: a sampled token flipped there once (CI, AVX2).
            assert together.tokens[request.key] == alone[request.key], request.key
    # The oldest was never preempted: it always fits.
    assert all(o.error is None for outputs in together.outputs.values() for o in outputs)


def prompt_of_n(path: Path, n: int, salt: int) -> list[int]:
    model = LlamaModel(path, slots=1, ctx_size=64, threads=1, n_batch=64)
    try:
        return prompt_of(model, n, salt)
    finally:
        model.close()


def test_idle_cells_are_given_up_before_anyone_is_preempted(qwen35_path: Path) -> None:
    pool = pool_model(qwen35_path)
    try:
        core, stats = open_core(pool, spec=None, cache_ram_mib=64)
        # Three requests, one after another: their slots keep ~70 cells each for reuse.
        held = []
        for k in range(3):
            prompt = prompt_of(pool, 60, k)
            run = run_core(core, [core_request(k, prompt, 10)])
            held.append([*prompt, *run.tokens[k][:-1]])  # the last token is not decoded
        assert stats.kv_cells_used == sum(len(h) for h in held)
        # One that needs most of the pool: the idle cells go, nobody is preempted.
        big = run_core(core, [core_request(9, prompt_of(pool, 200, 5), 20)])
        assert big.stop(9) is StopReason.MAX_TOKENS
        assert stats.idle_evictions > 0
        assert stats.preemptions == 0
        # What the evicted slots held was snapshotted: the next turn of that conversation
        # reuses it (a recurrent state: exactly what was held).
        again = run_core(core, [core_request(10, [*held[0], 3, 4], 4)])
        assert again.ended(10).cached == len(held[0])
    finally:
        pool.close()


def test_admission_waits_for_free_cells(qwen35_path: Path) -> None:
    pool = pool_model(qwen35_path)
    try:
        core, stats = open_core(pool, spec=None, prompt_cache=False)
        core.add(core_request(0, prompt_of(pool, 200, 1), 30))
        for _ in range(3):
            core.step()
        # Slots are free, but the first prompt, the second and a token each are more than
        # 256 cells: the second waits (it is not admitted and then preempted).
        core.add(core_request(1, prompt_of(pool, 60, 2), 5))
        first_done, second_started = -1, -1
        for step in range(200):
            for output in core.step():
                if output.key == 0 and output.released:
                    first_done = step
                if output.key == 1 and second_started < 0:
                    second_started = step
            if not core.busy:
                break
        # Admitted once the first was done (its cells free), never admitted and preempted.
        assert 0 <= first_done < second_started
        assert stats.preemptions == 0
    finally:
        pool.close()


async def test_the_engine_takes_prompts_up_to_the_pool(qwen35_path: Path) -> None:
    base = {"model": qwen35_path, "max_inflight": 4, "ctx_size": 64, "threads": 2}
    async with Engine.open(EngineConfig(**base)) as engine:  # type: ignore[arg-type]
        tokens = engine.tokenize(" ".join(WORDS * 12))[:150]
        with pytest.raises(PromptTooLongError):
            async with engine.submit(GenerateRequest(tokens=tokens, max_tokens=4)):
                pass
    config = EngineConfig(**base, kv_unified=True)  # type: ignore[arg-type]
    async with Engine.open(config) as engine:
        text = []
        async with engine.submit(GenerateRequest(tokens=tokens, max_tokens=4)) as generation:
            async for event in generation:
                text.append(event)
        assert generation.result is not None and generation.result.completion_tokens == 4
        with trio.fail_after(1):
            await engine.wait_idle()
        with pytest.raises(PromptTooLongError):
            async with engine.submit(GenerateRequest(tokens=tokens * 2, max_tokens=4)):
                pass
