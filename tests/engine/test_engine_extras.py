"""Grammars, log-probabilities and penalties in the batched engine, on the gemma test model."""

from __future__ import annotations

import json
import warnings
from functools import partial
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest
import trio

from llmtrio.engine import (
    JSON_OBJECT_GRAMMAR,
    Done,
    Engine,
    EngineConfig,
    GenerateRequest,
    GrammarError,
    InvalidRequestError,
    PromptTooLongError,
    Sampling,
    StopReason,
    TokenLogprob,
    json_schema_grammar,
)
from llmtrio.engine._config import MAX_RECURRENT_DRAFT
from llmtrio.engine.llama import Batch, LlamaModel, Penalties
from llmtrio.engine.llama._logits import logprob_of

from .._helpers import assert_greedy_agrees, collect, collect_logprobs, engine_config, run

#: Bounded, so that every reply fits in its tokens: bounded strings, arrays and numbers, and no
#: properties beyond those listed (JSON Schema allows any others unless told).
PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 150},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "address": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 20},
                "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
            },
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "nickname": {"type": "string", "maxLength": 10},
    },
    "required": ["name", "age", "role", "tags", "address"],
    "additionalProperties": False,
}
PROMPTS = [
    "Give me a JSON record of a person.",
    "Describe the user Alice as JSON.",
    "Here is the customer data:",
    "Output the profile of Bob, 42, from Paris.",
]


#: This file's engines: 8 slots of 384 tokens unless a test says otherwise.
config = partial(engine_config, max_inflight=8, ctx_size=384)


@pytest.mark.parametrize("spec", [None, "ngram"], ids=["plain", "spec"])
async def test_grammars_hold_in_batches_mixed_with_free_requests(
    gemma_path: Path, spec: str | None
) -> None:
    schema_grammar = json_schema_grammar(PERSON)
    constrained: list[tuple[GenerateRequest, dict[str, Any] | None]] = []
    for i, prompt in enumerate(PROMPTS):
        seeded = Sampling(temperature=0.8, seed=100 + i)
        constrained.append(
            (GenerateRequest.user(prompt, grammar=schema_grammar, max_tokens=160), PERSON)
        )
        constrained.append(
            (
                GenerateRequest.user(
                    prompt, grammar=schema_grammar, max_tokens=160, sampling=seeded
                ),
                PERSON,
            )
        )
        # Free-form objects with two seeds each: which of them close within their tokens
        # depends on the batches their steps ran in (seen: 1 of 4 with one seed each at 160
        # tokens, and once 0 of 8 with two seeds each; hence 300).
        for seed in (100 + i, 200 + i):
            sampling = Sampling(temperature=0.8, seed=seed)
            constrained.append(
                (
                    GenerateRequest.user(
                        prompt, grammar=JSON_OBJECT_GRAMMAR, max_tokens=300, sampling=sampling
                    ),
                    None,
                )
            )
    # Logprobs (which change nothing else) show where the free requests' greedy choices
    # were close; ignore_eos keeps both runs of each to the same length.
    free = [
        GenerateRequest.user(p, max_tokens=24, ignore_eos=True, logprobs=3) for p in PROMPTS[:2]
    ]
    async with Engine.open(config(gemma_path, spec=spec)) as engine:
        alone = [(await collect_logprobs(engine, r))[0] for r in free]
        results: dict[int, tuple[str, Done]] = {}
        batched: dict[int, list[TokenLogprob]] = {}

        async def one(i: int, request: GenerateRequest) -> None:
            text, done, logprobs = await run(engine, request)
            results[i] = (text, done)
            batched[i] = logprobs

        requests = [r for r, _ in constrained] + free
        async with trio.open_nursery() as nursery:
            for i, request in enumerate(requests):
                nursery.start_soon(one, i, request)

    finished_objects = 0
    for i, (_, schema) in enumerate(constrained):
        text, done = results[i]
        if schema is not None:
            # Bounded by the schema: every reply ends, parses and validates.
            assert done.stop is StopReason.END_OF_GENERATION, (text, done)
            jsonschema.validate(json.loads(text), schema)
        elif done.stop is StopReason.END_OF_GENERATION:
            assert isinstance(json.loads(text), dict), text
            finished_objects += 1
        else:
            # An unbounded object can run out of tokens; what there is must be a JSON prefix.
            assert text.lstrip().startswith("{"), text
    assert finished_objects >= 1
    # The free requests in the same batches decoded as they do alone, as far as batch shape
    # allows (drafts change it too): a batch of many sequences computes logits in another
    # order than a batch of one, so the two runs are not defined equal; they agree until a
    # near tie, if they diverge.
    for i, reference in enumerate(alone):
        assert_greedy_agrees(reference, batched[len(constrained) + i])


async def test_a_grammar_that_does_not_parse_is_refused_at_submit(gemma_path: Path) -> None:
    async with Engine.open(config(gemma_path, max_inflight=1)) as engine:
        with pytest.raises(GrammarError, match="invalid grammar"):
            async with engine.submit(GenerateRequest.user("hi", grammar="root ::= (")):
                pass
        assert engine.capacity().inflight == 0


async def test_a_schema_compiles_once_for_many_requests(gemma_path: Path) -> None:
    """The schema's grammar is made and parsed once (off the event loop); each generation
    gets a copy. A schema the grammar cannot enforce is refused at submit, naming it."""
    schema = {
        "type": "object",
        "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["n"],
        "additionalProperties": False,
    }
    async with Engine.open(config(gemma_path, max_inflight=4)) as engine:
        parses = engine._model.grammars.parses
        results: list[tuple[str, Done]] = []

        async def one(i: int) -> None:
            request = GenerateRequest.user(f"Number {i}:", json_schema=schema, max_tokens=20)
            results.append(await collect(engine, request))

        async with trio.open_nursery() as nursery:
            for i in range(6):
                nursery.start_soon(one, i)
        assert engine._model.grammars.parses == parses + 1
        for text, done in results:
            assert done.stop is StopReason.END_OF_GENERATION
            jsonschema.validate(json.loads(text), schema)
        with pytest.raises(InvalidRequestError, match="'uniqueItems'") as info:
            bad = {"type": "array", "uniqueItems": True}
            strict = GenerateRequest.user("hi", json_schema=bad, json_schema_strict=True)
            async with engine.submit(strict):
                pass
        assert info.value.param == "json_schema"
        assert engine.capacity().inflight == 0


async def test_logprobs_are_the_log_softmax_of_llama_cpp_logits(gemma_path: Path) -> None:
    prompt = "The capital of France is"
    # Without drafts: two runs are compared token for token (drafts change batch shapes).
    async with Engine.open(config(gemma_path, max_inflight=2, spec=None)) as engine:
        tokens = engine.tokenize(prompt, add_special=True)
        request = GenerateRequest(tokens=tokens, max_tokens=4, logprobs=5)
        text, done, logprobs = await run(engine, request)
        # Both ingest the whole prompt (no reuse), the same batch shapes: defined equal.
        plain, done_plain = await collect(
            engine, GenerateRequest(tokens=tokens, max_tokens=4, cache_prompt=False)
        )
    assert done_plain.cached_tokens == 0
    assert text == plain  # asking for logprobs changes nothing else
    assert len(logprobs) == done.completion_tokens == 4
    assert "".join(e.token for e in logprobs) == text
    for entry in logprobs:
        assert len(entry.top) == 5
        values = [lp for _, _, lp in entry.top]
        assert values == sorted(values, reverse=True)
        assert entry.top[0][2] == pytest.approx(entry.logprob)  # greedy took the best

    # One step straight on llama.cpp: the first token's logprobs are its log-softmax.
    # The engine's own context (2 slots of 384 tokens, its batch size) and the same batch (the
    # whole prompt at once): the same computation, so the same logits.
    n_batch = max(EngineConfig(model=gemma_path).prefill_chunk + 2, 64)
    model = LlamaModel(gemma_path, slots=2, ctx_size=384, threads=2, n_batch=n_batch)
    try:
        batch = Batch(n_batch)
        index = batch.add(np.asarray(tokens, np.int32), 0, 0, output_last=True)
        assert model.decode(batch) == 0
        logits = model.logits(index).astype(np.float64)
        log_softmax = logits - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        chosen = int(np.argmax(logits))
        assert model.piece(chosen).decode() == logprobs[0].token
        assert logprobs[0].logprob == pytest.approx(log_softmax[chosen], abs=1e-3)
        best = np.argsort(-log_softmax)[:5]
        assert [model.piece(int(t)) for t in best] == [p for _, p, _ in logprobs[0].top]
        assert [lp for _, _, lp in logprobs[0].top] == pytest.approx(
            list(log_softmax[best]), abs=1e-3
        )
    finally:
        model.close()


async def test_penalties_change_greedy_output_and_curb_repeats(gemma_path: Path) -> None:
    prompt = "My favourite recipe for pancakes:"
    async with Engine.open(config(gemma_path, max_inflight=4)) as engine:
        tokens = engine.tokenize(prompt, add_special=True)

        async def generated(**sampling: float) -> list[int]:
            text, _ = await collect(
                engine,
                GenerateRequest(
                    tokens=tokens, max_tokens=32, sampling=Sampling(temperature=0, **sampling)
                ),
            )
            return engine.tokenize(text)

        plain = await generated()
        frequency = await generated(frequency_penalty=2.0)
        presence = await generated(presence_penalty=2.0)
        repeat = await generated(repeat_penalty=1.8)

    def distinct(ids: list[int]) -> int:
        return len(set(ids))

    assert plain != frequency and plain != presence and plain != repeat
    assert distinct(frequency) > distinct(plain)
    assert distinct(presence) > distinct(plain)


def test_penalties_follow_openai_and_llama_cpp_formulas() -> None:
    logits = np.array([2.0, -1.0, 0.5, 3.0], dtype=np.float32)
    penalties = Penalties(presence=0.5, frequency=0.25, repeat=2.0, repeat_last_n=2)
    for token in (0, 0, 1, 3):
        penalties.accept(token)
    out = logits.copy()
    penalties.apply(out)
    # Token 0: twice, outside the repeat window (last 2: 1, 3).
    assert out[0] == pytest.approx(2.0 - 0.5 - 0.25 * 2)
    # Token 1: in the window, negative: multiplied; then once.
    assert out[1] == pytest.approx(-1.0 * 2.0 - 0.5 - 0.25)
    assert out[2] == pytest.approx(0.5)
    assert out[3] == pytest.approx(3.0 / 2.0 - 0.5 - 0.25)


def test_logprob_of_sorts_ties_by_id() -> None:
    logits = np.array([1.0, 3.0, 3.0, 0.0], dtype=np.float32)
    raw = logprob_of(logits, 2, 3)
    assert [t for t, _ in raw.top] == [1, 2, 0]
    assert sum(np.exp(lp) for lp in (raw.logprob, raw.top[0][1])) == pytest.approx(
        2 * np.exp(3) / np.exp(logits).sum()
    )


async def test_hybrid_model_with_tools_logprobs_penalties_and_a_grammar(qwen35_path: Path) -> None:
    """The qwen35 test model (no template: tools described in a system message, built-in
    ChatML; no end-of-generation token)."""
    from llmtrio.engine import Tool

    tool = Tool("lookup", "Look a word up", {"type": "object", "properties": {}})
    async with Engine.open(config(qwen35_path, max_inflight=2, ctx_size=512)) as engine:
        request = GenerateRequest.user(
            "hello",
            tools=[tool],
            max_tokens=6,
            logprobs=3,
            sampling=Sampling(temperature=0, presence_penalty=1.0, repeat_penalty=1.3),
        )
        text, done, logprobs = await run(engine, request)
        assert done.stop is StopReason.MAX_TOKENS and done.completion_tokens == 6
        assert len(logprobs) == 6 and "".join(e.token for e in logprobs) == text
        assert all(len(e.top) == 3 for e in logprobs)
        # The prompt carries the tool description (it is longer than without tools).
        _, plain = await collect(engine, GenerateRequest.user("hello", max_tokens=1))
        assert done.prompt_tokens > plain.prompt_tokens + 20

        # A grammar on a model without end-of-generation tokens: it ends when complete.
        grammar = 'root ::= "ab" "12"'
        text, done, _ = await run(engine, GenerateRequest.user("hello", grammar=grammar))
        assert text == "ab12" and done.stop is StopReason.END_OF_GENERATION


def test_greedy_under_a_grammar_takes_the_best_token_it_allows(gemma_path: Path) -> None:
    """The shortlist (the 64 most likely tokens) and the whole vocabulary agree."""
    from llmtrio.engine.llama import SlotSampler

    model = LlamaModel(gemma_path, slots=1, ctx_size=64, threads=2, n_batch=64)
    try:
        batch = Batch(64)
        tokens = model.tokenize("The weather today is", add_special=True)
        index = batch.add(np.asarray(tokens, np.int32), 0, 0, output_last=True)
        assert model.decode(batch) == 0
        logits = model.logits(index).copy()
        order = [int(t) for t in np.argsort(-logits)]
        greedy: dict[str, Any] = {
            "temperature": 0.0, "top_k": 0, "top_p": 1.0, "min_p": 0.0, "seed": 0, "bias": {}
        }  # fmt: skip
        for rank in (0, 1, 5, 63):
            piece = model.piece(order[rank])
            grammar = f"root ::= {json.dumps(piece.decode())}"
            sampler = SlotSampler(model, **greedy, grammar=grammar)
            model.logits(index)[:] = logits
            chosen = sampler.sample(index)
            sampler.close()
            # Several tokens may spell a prefix of the piece; the best of them wins.
            allowed = [t for t in order if model.piece(t) and piece.startswith(model.piece(t))]
            assert chosen == allowed[0], (rank, piece)
        # Nothing among the 64 best: the whole vocabulary is searched.
        sampler = SlotSampler(model, **greedy, grammar=JSON_OBJECT_GRAMMAR)
        model.logits(index)[:] = logits
        chosen = sampler.sample(index)
        sampler.close()
        assert order.index(chosen) >= 64
        assert model.piece(chosen).decode().lstrip().startswith("{")
    finally:
        model.close()


@pytest.mark.parametrize("repeat", [1e-300, 5e-324])
def test_a_tiny_repeat_penalty_keeps_logits_finite(repeat: float) -> None:
    penalties = Penalties(presence=0, frequency=0, repeat=repeat, repeat_last_n=4)
    penalties.accept(1)
    penalties.accept(2)
    logits = np.array([0.5, 3.0, -2.0, 1.0], dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning either
        penalties.apply(logits)
    assert np.isfinite(logits).all()
    assert int(np.argmax(logits)) == 1  # the penalized positive logit, as large as it gets
    assert logits[2] == 0.0  # a negative one multiplied towards 0
    assert logprob_of(logits, 1, 2).logprob == 0.0


async def test_recurrent_snapshots_stay_at_eight_whatever_the_draft_max(
    qwen35_path: Path, gemma_path: Path
) -> None:
    """A model with recurrent state keeps ``MAX_RECURRENT_DRAFT`` snapshots of each
    sequence's state at most (their memory), so it drafts at most that many tokens even at
    the default ``spec_draft_max`` of 16; an attention-only model drafts the configured
    most."""
    assert EngineConfig(model=gemma_path).spec_draft_max == 16
    async with Engine.open(config(qwen35_path, spec="ngram", spec_draft_max=16)) as engine:
        assert engine._model.is_hybrid and engine._model.n_rs_seq == MAX_RECURRENT_DRAFT == 8
        request = GenerateRequest.user("a b a b a b a b", max_tokens=8)
        _, done = await collect(engine, request)
        assert done.stop in (StopReason.MAX_TOKENS, StopReason.END_OF_GENERATION)


async def test_count_prompt_tokens_is_the_generations_prompt_tokens(gemma_path: Path) -> None:
    """Counting a request's prompt templates and tokenizes it exactly as generating does:
    the count is the generation's own ``prompt_tokens``, short prompts and long ones (which
    are prepared in a worker thread) alike."""
    async with Engine.open(engine_config(gemma_path, max_inflight=1, ctx_size=2048)) as engine:
        for text in ("Hello there", "A longer prompt. " * 100):
            request = GenerateRequest.user(text, system="Be brief.", max_tokens=1)
            counted = await engine.count_prompt_tokens(request)
            async with engine.submit(request) as generation:
                events = [event async for event in generation]
            assert isinstance(events[-1], Done)
            assert counted == events[-1].prompt_tokens
            assert counted > len(text) // 8
        with pytest.raises(PromptTooLongError) as info:
            await engine.count_prompt_tokens(GenerateRequest.user("word " * 3000))
        assert info.value.prompt_tokens >= 2048
