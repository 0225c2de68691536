"""Prompt reuse on both test models: gemma-3 (sliding-window attention, full-size window
cache) and qwen35 (hybrid attention + recurrent memory, reused through snapshots), with each
slot's own memory and with one shared pool.

What reuse promises is numerical, and two claims are tested apart:

- where the batches match, reuse is bit-exact: a prompt that extends what a slot (or a
  snapshot) holds by one token ingests that token alone, as a decode step does, and gets
  exactly the logits the decode step got (``test_reuse_is_bit_exact_where_the_batches_match``);
- elsewhere a reused prompt computes its last logits from other batches than a whole
  ingestion (a cached prefix plus the rest, instead of one batch), and llama.cpp's logits
  depend on batch shape in their last bits: greedy replies with and without reuse agree up
  to a near tie, where they may diverge (as llama.cpp's server says of ``cache_prompt``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio

from llmtrio.engine import (
    ChatMessage,
    Done,
    Engine,
    EngineConfig,
    EngineStats,
    GenerateRequest,
    StopReason,
    Token,
    TokenLogprob,
)
from llmtrio.engine.generate._core import EngineCore
from llmtrio.engine.generate._step import CoreRequest, StepOutput
from llmtrio.engine.llama import LlamaModel

from .._helpers import assert_greedy_agrees, collect, collect_logprobs, engine_config, run_together

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


def config(path: Path, kv_unified: bool, **changes: Any) -> EngineConfig:
    """This file's engines: 4 slots of 2048 tokens, in the given layout, without drafts,
    unless a test says otherwise. Runs are compared bit for bit where the batches match,
    and drafts (whose number follows measured step times) change batch shapes; reuse
    after speculation is tested in tests/engine/test_spec_decode_core.py."""
    values: dict[str, Any] = {"max_inflight": 4, "ctx_size": 2048, "spec": None}
    return engine_config(path, kv_unified=kv_unified, **(values | changes))


def chat(*messages: tuple[str, str]) -> GenerateRequest:
    return GenerateRequest(
        messages=[ChatMessage(role, text) for role, text in messages],
        max_tokens=10,
        ignore_eos=True,
        logprobs=3,
    )


def raw(tokens: list[int], max_tokens: int = 10) -> GenerateRequest:
    return GenerateRequest(tokens=tokens, max_tokens=max_tokens, ignore_eos=True, logprobs=3)


def text_of(logprobs: list[TokenLogprob]) -> str:
    return b"".join(e.piece for e in logprobs).decode("utf-8", "replace")


async def test_reuse_reuses_only_what_is_shared(model_path: Path, kv_unified: bool) -> None:
    """Turn 2 of a conversation, a prompt differing from a previous one in one token, and
    four concurrent prompts sharing a system prompt with a finished one: each reuses only
    what it shares, and generates what an engine that reuses nothing generates, up to a near
    tie (its logits come from other batches; on the random qwen35 model every choice is a
    near tie, so there the bit-exact test below carries the weight)."""
    turn1 = chat(("system", SYSTEM), ("user", "Tell me about cats."))
    shared = [
        chat(("system", SYSTEM), ("user", f"Question {i}: what is {i} + {i}?")) for i in range(4)
    ]

    answer: list[str] = []

    async def scenario(engine: Engine) -> list[tuple[list[TokenLogprob], Done]]:
        out = [await collect_logprobs(engine, turn1)]
        # Turn 2 holds the first engine's answer for both engines: the same prompt.
        answer.append(text_of(out[0][0]))
        turn2 = chat(
            ("system", SYSTEM),
            ("user", "Tell me about cats."),
            ("assistant", answer[0]),
            ("user", "And dogs?"),
        )
        out.append(await collect_logprobs(engine, turn2))
        prompt = engine.tokenize(TEXT, add_special=True)
        changed = list(prompt)
        changed[100] = engine.tokenize(" zebra")[0]
        out.append(await collect_logprobs(engine, raw(prompt)))
        out.append(await collect_logprobs(engine, raw(changed)))
        out += await run_together(engine, shared)
        return out

    async with Engine.open(config(model_path, kv_unified, prompt_cache=False)) as engine:
        cold = await scenario(engine)
    async with Engine.open(config(model_path, kv_unified)) as engine:
        warm = await scenario(engine)
        stats = engine.stats

    for (reference, _), (reused, _) in zip(cold, warm, strict=True):
        assert_greedy_agrees(reference, reused)
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
    those of an engine that reuses nothing (bit for bit on qwen35, whose reuse here keeps the
    chunk boundaries of a whole ingestion; up to a near tie on gemma, whose does not)."""
    async with Engine.open(
        config(model_path, kv_unified, prompt_cache=False, prefill_chunk=16)
    ) as engine:
        words = TEXT.split()
        base = engine.tokenize(" ".join(words[:40]), add_special=True)
        longer = engine.tokenize(" ".join(words[:130]), add_special=True)
        assert longer[: len(base) - 1] == base[:-1]
        expected, _ = await collect_logprobs(engine, raw(longer))

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

        logprobs, done = await collect_logprobs(engine, raw(longer))
        # What the cancelled one ingested stays and is reused.
        if "gemma" in model_path.name:
            assert done.cached_tokens >= len(base) - 1 + part
            # Reuse moved the chunk boundaries (they start at the end of ``base``): the
            # batches differ from a whole ingestion's, so the two agree up to a near tie.
            assert_greedy_agrees(expected, logprobs)
        else:  # base's answer is not in ``longer``: the recurrent state of base is no use
            assert done.cached_tokens == part
            # ``longer`` was ingested from its start in chunks of 16, cut at a chunk
            # boundary and resumed there: the batches of a whole ingestion, the same bits.
            assert part % 16 == 0
            assert logprobs == expected


def test_reuse_is_bit_exact_where_the_batches_match(model_path: Path) -> None:
    """Reuse itself changes no bit: a prompt that extends what a slot holds, or what a
    snapshot restored into it holds, by one token ingests that token alone, exactly as the
    decode step that first followed it did, and gets that step's logits exactly.

    Driven on the core (no Trio), with token ids: A generates ``m + 1`` tokens after P; B
    repeats P ingested whole (the same batches as A: the same bits) and stops after ``m``,
    so its slot holds P and its first ``m - 1`` tokens; C asks for P and A's first ``m``
    tokens: it reuses all that B left (resident in the slot, or saved as a snapshot when
    another prompt took the slot, then restored) and ingests A's ``m``-th token alone, as A's
    last decode step did, so its first token and logprobs are A's last, bit for bit.
    """
    m = 4
    # Without drafts: they would change the batches the exactness rests on; every step on the
    # same threads (engine_config's choose_threads=False: the bits follow the thread count).
    config = engine_config(model_path, max_inflight=1, ctx_size=1024, spec=None)
    assert not config.choose_threads
    n_batch = max(config.prefill_chunk + config.max_inflight, 64)
    model = LlamaModel(model_path, slots=1, ctx_size=1024, threads=2, n_batch=n_batch)
    try:
        stats = EngineStats()
        core = EngineCore(model, config, stats)
        prompt = model.tokenize(TEXT, add_special=True)
        other = model.tokenize(SYSTEM, add_special=True)
        keys = iter(range(100))

        def run(tokens: list[int], max_tokens: int, *, reuse: bool = True) -> StepOutput:
            """One request to its end: every token it generated, with logprobs, in one
            output whose ``cached`` says how much of its prompt was reused."""
            request = GenerateRequest(
                tokens=tokens, max_tokens=max_tokens, ignore_eos=True, logprobs=5,
                cache_prompt=reuse,
            )  # fmt: skip
            key = next(keys)
            core.add(CoreRequest(key, np.asarray(tokens, np.int32), request, max_tokens))
            outputs: list[StepOutput] = []
            while not (outputs and outputs[-1].released):
                outputs += [o for o in core.step() if o.key == key]
            assert outputs[-1].error is None and outputs[-1].stop is StopReason.MAX_TOKENS
            return StepOutput(
                key,
                [t for o in outputs for t in o.tokens],
                logprobs=[lp for o in outputs for lp in o.logprobs or []],
                cached=outputs[-1].cached,
            )

        a = run(prompt, m + 1, reuse=False)
        assert a.logprobs is not None and len(a.tokens) == len(a.logprobs) == m + 1
        continued = [*prompt, *a.tokens[:m]]
        for displaced in (True, False):
            b = run(prompt, m, reuse=False)
            assert (b.tokens, b.logprobs) == (a.tokens[:m], a.logprobs[:m])
            if displaced:
                # Another prompt takes the one slot. B's memory is saved first, unless a
                # snapshot already serves it (on gemma, A's: its cells hold B's and more);
                # C then restores a snapshot into the slot.
                run(other, 1, reuse=False)
                assert stats.prompt_cache_entries >= 1
            c = run(continued, 1)
            assert c.cached == len(prompt) + m - 1
            assert c.tokens == a.tokens[m:]
            assert c.logprobs == a.logprobs[m:]
    finally:
        model.close()
