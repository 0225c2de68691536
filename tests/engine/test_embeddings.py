"""Embeddings in the engine room: the pure packer, the request parser, the GGUF's kind, and the
``EmbeddingEngine`` on the real MiniLM model (against sentence-transformers' vectors)."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from llmtrio.api import ApiError, RequestLimits
from llmtrio.engine import (
    EmbeddingEngine,
    Engine,
    EngineClosedError,
    InvalidRequestError,
    ModelLoadError,
    model_kind_of,
    open_engine,
)
from llmtrio.engine._cores import ThreadChooser
from llmtrio.engine.embed._pack import EmbedPacker
from llmtrio.worker._embeddings import float_array, parse_embeddings_request

from .._helpers import engine_config, eventually


def tokens(n: int) -> np.ndarray[Any, np.dtype[np.int32]]:
    return np.arange(1, n + 1, dtype=np.int32)


# -- the packer (pure) -----------------------------------------------------------------------


def test_the_packer_fills_a_batch_with_many_callers_inputs_in_arrival_order() -> None:
    packer = EmbedPacker(max_tokens=100, max_seqs=4)
    for key in range(6):
        packer.add(key, [tokens(5)])
    first = packer.next_batch()
    assert [(p.key, p.index) for p in first] == [(0, 0), (1, 0), (2, 0), (3, 0)]
    assert [(p.key, p.index) for p in packer.next_batch()] == [(4, 0), (5, 0)]
    assert packer.next_batch() == []


def test_the_packer_never_overtakes_an_input_that_does_not_fit() -> None:
    packer = EmbedPacker(max_tokens=10, max_seqs=8)
    packer.add(0, [tokens(6), tokens(6), tokens(1)])
    assert [p.index for p in packer.next_batch()] == [0]
    assert [p.index for p in packer.next_batch()] == [1, 2]


def test_the_packer_stops_a_batch_at_its_budget_and_a_longer_input_goes_alone() -> None:
    packer = EmbedPacker(max_tokens=64, max_seqs=8, budget=16)
    packer.add(0, [tokens(6), tokens(6), tokens(6), tokens(40), tokens(2), tokens(16)])
    assert [len(p.tokens) for p in packer.next_batch()] == [6, 6]  # a third would be 18
    assert [len(p.tokens) for p in packer.next_batch()] == [6]  # 40 does not fit beside it
    assert [len(p.tokens) for p in packer.next_batch()] == [40]  # alone, past the budget
    assert [len(p.tokens) for p in packer.next_batch()] == [2]
    assert [len(p.tokens) for p in packer.next_batch()] == [16]
    assert packer.next_batch() == []


def test_a_cancelled_caller_is_dropped_at_the_next_batch_and_no_one_else() -> None:
    packer = EmbedPacker(max_tokens=100, max_seqs=2)
    packer.add(0, [tokens(3)] * 3)
    packer.add(1, [tokens(3)] * 2)
    assert [p.key for p in packer.next_batch()] == [0, 0]
    packer.cancel(0)
    assert packer.pending == 2
    assert [(p.key, p.index) for p in packer.next_batch()] == [(1, 0), (1, 1)]
    assert packer.pending == 0


def test_the_packer_refuses_an_input_it_could_never_pack() -> None:
    packer = EmbedPacker(max_tokens=8, max_seqs=2)
    for bad in (tokens(0), tokens(9)):
        with pytest.raises(ValueError, match="tokens"):
            packer.add(0, [tokens(2), bad])
    assert packer.pending == 0  # nothing of that caller was queued


@given(
    st.lists(st.lists(st.integers(1, 16), min_size=1, max_size=6), min_size=1, max_size=12),
    st.integers(16, 40),
    st.integers(1, 6),
    st.sets(st.integers(0, 11)),
    st.none() | st.integers(1, 40),
)
def test_every_input_not_cancelled_is_packed_once_within_the_limits(
    callers: list[list[int]],
    max_tokens: int,
    max_seqs: int,
    cancelled: set[int],
    budget: int | None,
) -> None:
    packer = EmbedPacker(max_tokens=max_tokens, max_seqs=max_seqs, budget=budget)
    for key, lengths in enumerate(callers):
        packer.add(key, [tokens(n) for n in lengths])
    for key in cancelled:
        packer.cancel(key)
    seen: list[tuple[int, int]] = []
    while batch := packer.next_batch():
        assert len(batch) <= max_seqs
        assert sum(len(p.tokens) for p in batch) <= max_tokens
        if len(batch) > 1 and budget is not None:  # one input alone may pass the budget
            assert sum(len(p.tokens) for p in batch) <= budget
        seen += [(p.key, p.index) for p in batch]
    expected = [
        (key, index)
        for key, lengths in enumerate(callers)
        if key not in cancelled
        for index in range(len(lengths))
    ]
    assert seen == expected  # each once, in arrival order


def run_chooser(chooser: ThreadChooser, cost: dict[int, float], decodes: int) -> list[int]:
    """The thread counts ``chooser`` picks over ``decodes`` decodes of 10 tokens, each count
    costing ``cost[threads]`` seconds a token."""
    picked = []
    for _ in range(decodes):
        threads = chooser.choose(10)
        chooser.observe(threads, 10, 10 * cost[threads])
        picked.append(threads)
    return picked


def test_the_thread_chooser_tries_both_counts_then_keeps_the_faster() -> None:
    chooser = ThreadChooser(2, first_probe=4, longest_probe=32)
    # a loaded machine: 2 threads spin at their barriers
    picked = run_chooser(chooser, {2: 0.05, 1: 0.001}, 300)
    assert picked[:2] == [2, 1]
    assert chooser.best(10) == 1
    probes = [i for i, threads in enumerate(picked) if i >= 2 and threads == 2]
    gaps = [b - a - 1 for a, b in itertools.pairwise(probes)]
    assert gaps[:3] == [8, 16, 32]  # each losing probe doubles the gap, up to 32
    assert set(gaps[3:]) == {32}
    # the load goes away: the next probe finds 2 threads faster and keeps them
    picked = run_chooser(chooser, {2: 0.0005, 1: 0.001}, 40)
    assert picked[-5:] == [2] * 5
    assert chooser.best(10) == 2


def test_the_thread_chooser_compares_thread_counts_on_decodes_of_the_same_size() -> None:
    # 2 threads are 1.5x as fast at every size, and a small decode costs twice as much a
    # token as a big one (its fixed cost): the first 2-thread figure comes from a small
    # decode and the first 1-thread one from a big decode, which per token alone would
    # make 1 thread look faster (10/1.5 > 5 ms a token)
    chooser = ThreadChooser(2, first_probe=4, longest_probe=32)
    per_token = {10: 0.010, 200: 0.005}
    picked: dict[int, list[int]] = {10: [], 200: []}
    for tokens in [10, 200, 200, 200] * 100:
        threads = chooser.choose(tokens)
        chooser.observe(threads, tokens, tokens * per_token[tokens] / (1.5 if threads == 2 else 1))
        picked[tokens].append(threads)
    assert chooser.best(10) == chooser.best(200) == 2
    assert picked[200][:2] == [2, 1]  # each size tries both counts
    assert picked[10][:2] == [2, 1]
    for tokens in (10, 200):  # then 1 thread only as a probe, ever rarer
        assert picked[tokens][2:].count(1) <= len(picked[tokens]) // 8
    assert picked[200][-66:].count(1) <= 2  # one probe in 33 decodes at the longest gap
    # sizes are classed by powers of two
    assert ThreadChooser.size_class(130) == ThreadChooser.size_class(255)
    assert ThreadChooser.size_class(255) != ThreadChooser.size_class(256)


def test_the_thread_chooser_settles_on_a_steady_winner_and_one_thread_is_one() -> None:
    chooser = ThreadChooser(4)
    picked = run_chooser(chooser, {4: 0.0002, 1: 0.001}, 50)
    assert picked[:2] == [4, 1]
    assert picked.count(1) < 10  # 1 thread only when probed
    assert run_chooser(ThreadChooser(1), {1: 0.001}, 5) == [1] * 5
    with pytest.raises(ValueError, match="most"):
        ThreadChooser(0)


def test_the_thread_chooser_is_not_moved_by_one_slow_decode_but_by_a_steady_slowdown() -> None:
    # On a busy machine a 2-thread decode now and then waits at a barrier for a thread that
    # another process holds (15-25 ms against 3): one such decode must not make 1 thread
    # (half as fast) the choice; most decodes slowing down must.
    chooser = ThreadChooser(2, first_probe=4, longest_probe=32)
    picked = []
    for i in range(400):
        threads = chooser.choose(10)
        spike = threads == 2 and i % 10 == 5
        chooser.observe(threads, 10, 10 * (0.005 if spike else {2: 0.0003, 1: 0.0005}[threads]))
        picked.append(threads)
    assert chooser.best(10) == 2
    assert picked[2:].count(1) <= 400 // 32 + 4  # probes only, not a stretch after each spike
    # the load stays: every 2-thread decode is slow now, and 1 thread takes over
    picked = run_chooser(chooser, {2: 0.005, 1: 0.0005}, 40)
    assert chooser.best(10) == 1
    assert picked[-10:].count(1) >= 9


# -- the request (pure) ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "inputs"),
    [
        ("hello", ("hello",)),
        (["a", "b"], ("a", "b")),
        ([1, 2, 3], ((1, 2, 3),)),
        ([[1, 2], [3]], ((1, 2), (3,))),
    ],
)
def test_input_takes_each_of_openais_four_shapes(value: object, inputs: tuple[object]) -> None:
    request = parse_embeddings_request(json.dumps({"input": value, "model": "m"}).encode())
    assert request.inputs == inputs
    assert request.encoding_format == "float"


@pytest.mark.parametrize(
    ("body", "param", "code"),
    [
        ({}, "input", "missing_required_parameter"),
        ({"input": ""}, "input", "invalid_value"),
        ({"input": []}, "input", "invalid_value"),
        ({"input": ["a", ""]}, "input[1]", "invalid_value"),
        ({"input": [[1], []]}, "input[1]", "invalid_value"),
        ({"input": ["a", 3]}, "input[1]", "invalid_type"),
        ({"input": [[1], [-1]]}, "input[1]", "invalid_value"),
        ({"input": ["a"] * 4}, "input[3]", "array_above_max_length"),
        ({"input": "a", "dimensions": 8}, "dimensions", "unsupported_parameter"),
        ({"input": "a", "encoding_format": "int8"}, "encoding_format", "invalid_value"),
        ({"input": 7}, "input", "invalid_type"),
    ],
)
def test_a_bad_request_is_a_400_naming_the_field_or_the_input(
    body: dict[str, object], param: str, code: str
) -> None:
    with pytest.raises(ApiError) as caught:
        parse_embeddings_request(json.dumps(body).encode(), RequestLimits(max_embedding_inputs=3))
    assert caught.value.status == 400
    assert (caught.value.param, caught.value.error_code) == (param, code)


# -- the model's kind, from its GGUF ---------------------------------------------------------


@given(st.lists(st.floats(width=32, allow_nan=False, allow_infinity=False), max_size=400))
def test_a_vector_as_json_reads_back_as_the_same_float32_numbers(values: list[float]) -> None:
    vector = np.asarray(values, dtype=np.float32)
    back = np.asarray(json.loads(float_array(vector)), dtype=np.float64)
    assert np.array_equal(back.astype(np.float32), vector)  # (JSON's -0 reads back as 0)
    with pytest.raises(ValueError, match="NaN"):
        float_array(np.asarray([0.5, np.nan], dtype=np.float32))


def test_the_gguf_says_which_kind_of_model_it_is(minilm_path: Path, qwen35_path: Path) -> None:
    assert model_kind_of(minilm_path) == "embedding"
    assert model_kind_of(qwen35_path) == "chat"


async def test_open_engine_opens_the_engine_the_model_needs(
    minilm_path: Path, qwen35_path: Path
) -> None:
    async with open_engine(engine_config(minilm_path)) as engine:
        assert isinstance(engine, EmbeddingEngine)
        assert (engine.kind, engine.pooling, engine.dimensions) == ("embedding", "mean", 384)
    async with open_engine(engine_config(qwen35_path)) as chat:
        assert isinstance(chat, Engine)
        assert chat.kind == "chat"


async def test_a_generating_model_is_not_an_embedding_model(qwen35_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="not an embedding model"):
        async with EmbeddingEngine.open(engine_config(qwen35_path)):
            pass


# -- the engine on the real model ------------------------------------------------------------


def assert_matches(vectors: np.ndarray[Any, Any], reference: list[list[float]]) -> None:
    """Cosine at least 0.999 with sentence-transformers, and unit length (cosine alone cannot
    see a missing normalization)."""
    assert len(vectors) == len(reference)
    for vector, want in zip(vectors, reference, strict=True):
        want_v = np.asarray(want, dtype=np.float64)
        got = np.asarray(vector, dtype=np.float64)
        cosine = float(got @ want_v / (np.linalg.norm(got) * np.linalg.norm(want_v)))
        assert cosine >= 0.999
        assert abs(float(np.linalg.norm(got)) - 1) < 1e-4


async def test_embed_matches_sentence_transformers(
    minilm_path: Path, minilm_reference: dict[str, Any]
) -> None:
    async with EmbeddingEngine.open(engine_config(minilm_path)) as engine:
        result = await engine.embed(minilm_reference["inputs"])
        assert result.vectors.shape == (7, 384)
        assert result.vectors.dtype == np.float32
        assert_matches(result.vectors, minilm_reference["embeddings"])
        assert result.prompt_tokens == sum(result.token_counts)
        # BERT's [CLS] and [SEP] are part of every input
        assert result.token_counts[0] == len(engine.tokenize(minilm_reference["inputs"][0]))
        assert engine.tokenize("hi")[0] != engine.tokenize("hi")[-1]
        steps = engine.stats.steps
        # the same input alone, or in a batch with others, is the same vector (up to the
        # last bits: llama.cpp's kernels depend on the batch's shape; another sequence
        # leaking in would cost far more than this)
        before = dict(engine.decodes_by_threads)
        alone = await engine.embed([minilm_reference["inputs"][2]])
        assert float(alone.vectors[0] @ result.vectors[2]) > 0.999
        assert engine.stats.steps == steps + 1
        # the first decode of its size ran on the configured threads, the next of the same
        # size on 1 (the chooser measures both; the vectors above do not depend on it)
        assert engine.decodes_by_threads[2] == before[2] + 1
        again = await engine.embed([minilm_reference["inputs"][0]])  # 9 tokens, as [2] is
        assert float(again.vectors[0] @ result.vectors[0]) > 0.999
        assert engine.decodes_by_threads.get(1, 0) == before.get(1, 0) + 1


async def test_concurrent_callers_share_decodes(
    minilm_path: Path, minilm_reference: dict[str, Any]
) -> None:
    inputs = minilm_reference["inputs"]
    results: dict[int, np.ndarray[Any, Any]] = {}
    async with EmbeddingEngine.open(engine_config(minilm_path)) as engine:

        async def one(i: int) -> None:
            results[i] = (await engine.embed([inputs[i % len(inputs)]])).vectors[0]

        async with trio.open_nursery() as nursery:
            for i in range(32):
                nursery.start_soon(one, i)
        # 32 single-input callers in fewer decodes than callers: their inputs were packed
        # side by side (how many per decode depends on how fast they arrived)
        assert engine.stats.steps < 32
        assert engine.stats.busy_slots == 32
        assert_matches(
            np.stack([results[i] for i in range(32)]),
            [minilm_reference["embeddings"][i % len(inputs)] for i in range(32)],
        )


async def test_bad_inputs_fail_their_caller_only_naming_the_input(minilm_path: Path) -> None:
    async with EmbeddingEngine.open(engine_config(minilm_path)) as engine:
        ok = engine.tokenize("a fine sentence")
        cases = [
            ([ok, []], "input[1]", "empty"),
            ([ok, [1] * (engine.ctx_size + 1)], "input[1]", "context"),
            ([[1, engine.n_vocab]], "input[0]", "vocabulary"),
            ([], "input", "no inputs"),
        ]
        for inputs, param, words in cases:
            with pytest.raises(InvalidRequestError, match=words) as caught:
                await engine.embed_tokens(inputs)
            assert caught.value.param == param
        good = await engine.embed_tokens([ok])
        assert abs(float(np.linalg.norm(good.vectors[0])) - 1) < 1e-4
        longest = await engine.embed_tokens([[1] * engine.ctx_size])
        assert longest.token_counts == (engine.ctx_size,)


async def test_a_cancelled_caller_is_dropped_and_the_others_finish(minilm_path: Path) -> None:
    # 8 inputs of 502 tokens: 4 to a decode of 2048 tokens, so each caller needs 2 decodes
    long_inputs = [[101] + [2000 + i] * 500 + [102] for i in range(8)]
    finished: list[str] = []
    async with EmbeddingEngine.open(engine_config(minilm_path)) as engine:
        cancel = trio.CancelScope()

        async def first() -> None:
            result = await engine.embed_tokens(long_inputs)
            assert result.vectors.shape == (8, 384)
            finished.append("first")

        async def cancelled() -> None:
            with cancel:
                await engine.embed_tokens(long_inputs)
                finished.append("never")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            await eventually(lambda: engine.capacity().inflight == 1)
            nursery.start_soon(cancelled)
            await eventually(lambda: engine.capacity().inflight == 2)
            cancel.cancel()  # its inputs wait behind the first caller's
            await eventually(lambda: engine.capacity().inflight == 1)
        assert finished == ["first"]
        # the first caller's 8 inputs, and none of the cancelled caller's queued ones
        # (at most one of its batches had started when it left)
        assert 8 <= engine.stats.busy_slots < 16
        assert engine.capacity().inflight == 0


async def test_closing_the_engine_fails_waiting_callers(minilm_path: Path) -> None:
    errors: list[BaseException] = []

    async def caller(engine: EmbeddingEngine) -> None:
        try:
            await engine.embed_tokens([[101] + [2000] * 500 + [102]] * 32)
        except EngineClosedError as exc:
            errors.append(exc)

    async with (
        trio.open_nursery() as nursery,
        EmbeddingEngine.open(engine_config(minilm_path)) as engine,
    ):
        nursery.start_soon(caller, engine)
        await eventually(lambda: engine.capacity().inflight == 1)
    assert len(errors) == 1
    with pytest.raises(EngineClosedError):
        await engine.embed(["after"])
