"""Prompt reuse on both test models: gemma-3 (sliding-window attention, full-size window
cache) and qwen35 (hybrid attention + recurrent memory, reused through snapshots), with each
slot's own memory and with one shared pool.

Every reuse is checked against the same request on an engine that reuses nothing: greedy
tokens must be identical.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import pytest
import trio

from llmtrio.engine import (
    ChatMessage,
    Done,
    Engine,
    EngineConfig,
    GenerateRequest,
    StopReason,
    Token,
)

from ._helpers import collect

SYSTEM = " ".join(
    f"Rule {i}: answer in one short sentence, politely, about topic number {i}." for i in range(14)
)
TEXT = " ".join(f"Paragraph {i} tells of a river, a hill and a town." for i in range(24))


@pytest.fixture(params=["gemma", "qwen35"])
def model_path(request: pytest.FixtureRequest) -> Path:
    path: Path = request.getfixturevalue(f"{request.param}_path")
    return path


@pytest.fixture(params=[False, True], ids=["per-slot", "pool"])
def kv_unified(request: pytest.FixtureRequest) -> bool:
    return bool(request.param)


def config(path: Path, kv_unified: bool, **kwargs: object) -> EngineConfig:
    values: dict[str, object] = {
        "model": path,
        "max_inflight": 4,
        "ctx_size": 2048,
        "threads": 2,
        "kv_unified": kv_unified,
        # Runs are compared token for token: on gemma, drafts (whose number follows measured
        # step times) would change batch shapes and with them near-ties; the hybrid model's
        # numerics do not move, so it reuses prompts with speculation on.
        "spec": "ngram" if path.name.startswith("qwen35") else None,
    }
    values.update(kwargs)
    return EngineConfig(**values)  # type: ignore[arg-type]


def chat(*messages: tuple[str, str]) -> GenerateRequest:
    return GenerateRequest(
        messages=[ChatMessage(role, text) for role, text in messages],
        max_tokens=10,
        ignore_eos=True,
    )


def raw(tokens: list[int], max_tokens: int = 10) -> GenerateRequest:
    return GenerateRequest(tokens=tokens, max_tokens=max_tokens, ignore_eos=True)


async def run_all(engine: Engine, requests: list[GenerateRequest]) -> list[tuple[str, Done]]:
    """Run ``requests`` at once, admitted in one step; their texts and Done events."""
    texts = [""] * len(requests)
    async with AsyncExitStack() as stack:
        # Hold the decode thread at its step boundary while all are submitted.
        with engine._cond:
            generations = [await stack.enter_async_context(engine.submit(r)) for r in requests]

        async def drain(i: int) -> None:
            async for event in generations[i]:
                if isinstance(event, Token):
                    texts[i] += event.text

        async with trio.open_nursery() as nursery:
            for i in range(len(requests)):
                nursery.start_soon(drain, i)
    results = []
    for text, generation in zip(texts, generations, strict=True):
        assert isinstance(generation.result, Done)
        results.append((text, generation.result))
    return results


async def test_reuse_gives_the_tokens_of_no_reuse(model_path: Path, kv_unified: bool) -> None:
    """Turn 2 of a conversation, a prompt differing from a previous one in one token, and
    four concurrent prompts sharing a system prompt with a finished one: each reuses only
    what it shares, and generates exactly what an engine that reuses nothing generates."""
    turn1 = chat(("system", SYSTEM), ("user", "Tell me about cats."))
    shared = [
        chat(("system", SYSTEM), ("user", f"Question {i}: what is {i} + {i}?")) for i in range(4)
    ]

    async def scenario(engine: Engine) -> list[tuple[str, Done]]:
        out = [await collect(engine, turn1)]
        turn2 = chat(
            ("system", SYSTEM),
            ("user", "Tell me about cats."),
            ("assistant", out[0][0]),
            ("user", "And dogs?"),
        )
        out.append(await collect(engine, turn2))
        prompt = engine.tokenize(TEXT, add_special=True)
        changed = list(prompt)
        changed[100] = engine.tokenize(" zebra")[0]
        out.append(await collect(engine, raw(prompt)))
        out.append(await collect(engine, raw(changed)))
        out += await run_all(engine, shared)
        return out

    async with Engine.open(config(model_path, kv_unified, prompt_cache=False)) as engine:
        cold = await scenario(engine)
    async with Engine.open(config(model_path, kv_unified)) as engine:
        warm = await scenario(engine)
        stats = engine.stats

    assert [text for text, _ in warm] == [text for text, _ in cold]
    assert all(done.cached_tokens == 0 for _, done in cold)
    cached = [done.cached_tokens for _, done in warm]
    prompt_tokens = [done.prompt_tokens for _, done in warm]
    assert cached[0] == 0
    # Turn 2 reuses turn 1's prompt (and, on attention memory, the answer's tokens too).
    assert prompt_tokens[0] - 12 <= cached[1] < prompt_tokens[1]
    assert cached[2] <= 1  # a new text: at most its BOS
    # One differing token: never past it; attention memory reuses exactly up to it.
    assert cached[3] <= 100
    if "gemma" in model_path.name:
        assert cached[3] == 100
    # The shared system prompt is ingested once, by the first request: the four reuse it.
    system_tokens = len(SYSTEM) // 8
    assert all(system_tokens < c < p for c, p in zip(cached[4:], prompt_tokens[4:], strict=True))
    assert stats.prompt_cache_hits == sum(1 for c in cached if c)
    assert stats.prompt_cache_reused_tokens == sum(cached)


async def test_the_snapshot_budget_holds(model_path: Path, kv_unified: bool) -> None:
    """Distinct prompts through one slot: each one's memory is saved when the next takes the
    slot; the snapshots never take more than ``cache_ram_mib``, the oldest go first."""
    budget = 2
    # Prompts of which one snapshot fits the budget, two do not (gemma's memory takes about
    # 18 KiB a token, qwen35-tiny's about 1.5).
    size = 60 if "gemma" in model_path.name else 900
    async with Engine.open(
        config(model_path, kv_unified, max_inflight=1, cache_ram_mib=budget)
    ) as engine:
        words = (TEXT + " " + SYSTEM).split() * 4
        prompts = [
            engine.tokenize(" ".join(words[i * 7 : i * 7 + size]), add_special=True)
            for i in range(5)
        ]
        for prompt in prompts:
            # One token: it is sampled, never decoded, so the slot holds the prompt alone.
            await collect(engine, raw(prompt, max_tokens=1))
            assert engine.stats.prompt_cache_bytes <= budget * 2**20
        stats = engine.stats
        assert stats.prompt_cache_snapshots >= 2
        assert stats.prompt_cache_evictions >= 1
        assert stats.prompt_cache_entries < stats.prompt_cache_snapshots
        # The last one saved (the fourth prompt) is restored.
        _, done = await collect(engine, raw([*prompts[3], 7], max_tokens=2))
        assert done.cached_tokens == len(prompts[3])


async def test_cancel_while_ingesting_a_partly_reused_prompt(
    model_path: Path, kv_unified: bool
) -> None:
    """A prompt reusing a finished one is cancelled while ingesting the rest; the next
    request finds the memory consistent: it reuses what was ingested, and its tokens are
    those of an engine that reuses nothing."""
    async with Engine.open(config(model_path, kv_unified, prompt_cache=False)) as engine:
        words = TEXT.split()
        base = engine.tokenize(" ".join(words[:40]), add_special=True)
        longer = engine.tokenize(" ".join(words[:130]), add_special=True)
        assert longer[: len(base) - 1] == base[:-1]
        expected, _ = await collect(engine, raw(longer))

    async with Engine.open(config(model_path, kv_unified, prefill_chunk=16)) as engine:
        await collect(engine, raw(base))
        ingested = engine.stats.prompt_tokens_ingested
        model = engine._model
        decode = model.decode
        holder: list[object] = []
        calls = 0

        def cancel_on_third_step(batch: object) -> int:
            nonlocal calls
            calls += 1
            if calls == 3 and holder:
                trio.from_thread.run_sync(holder[0].cancel)  # type: ignore[attr-defined]
            return decode(batch)  # type: ignore[arg-type]

        model.decode = cancel_on_third_step  # type: ignore[method-assign]
        try:
            events = []
            async with engine.submit(raw(longer)) as generation:
                holder.append(generation)
                async for event in generation:
                    events.append(event)
            with trio.fail_after(30):
                await generation.ended.wait()
        finally:
            model.decode = decode  # type: ignore[method-assign]
        assert not any(isinstance(e, Token) for e in events)
        assert isinstance(generation.result, Done)
        assert generation.result.stop is StopReason.CANCELLED
        part = engine.stats.prompt_tokens_ingested - ingested
        assert 0 < part < len(longer) - len(base)

        text, done = await collect(engine, raw(longer))
        assert text == expected
        # What the cancelled one ingested stays and is reused.
        if "gemma" in model_path.name:
            assert done.cached_tokens >= len(base) - 1 + part
        else:  # base's answer is not in ``longer``: the recurrent state of base is no use
            assert done.cached_tokens == part
