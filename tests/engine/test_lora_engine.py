"""LoRA adapters in the engine, with the test adapters (tests/_lora.py): the logits they give
(scale 0: the base's, bit for bit; scale 1: the merged weights'), requests under several
adapter sets decoding at once, the prompt cache keyed by set, speculation and grammars under
adapters, and adapters loaded and unloaded at run time."""

from __future__ import annotations

from pathlib import Path

import attrs
import numpy as np
import numpy.typing as npt
import pytest

from llmtrio.engine import (
    Engine,
    GenerateRequest,
    InvalidRequestError,
    LoraSpec,
    ModelLoadError,
    check_lora,
)
from llmtrio.engine.generate._lora import Adapters, LoraSet, adapter_identity
from llmtrio.engine.llama import Batch, LlamaModel

from .._core_helpers import core_request, draft_all, open_core, run_core
from .._helpers import collect, collect_logprobs, engine_config, run_together
from .._lora import Lora, write_merged
from .test_spec_decode_core import Echo, _split


def _logits(model: LlamaModel, prompt: list[int]) -> npt.NDArray[np.float32]:
    """Every position's logits of ``prompt`` decoded in one batch into sequence 0 (then
    forgotten)."""
    batch = Batch(model.n_batch)
    batch.add(np.asarray(prompt, dtype=np.int32), 0, 0, output_last=True, output_all=True)
    assert model.decode(batch) == 0
    rows = np.stack([model.logits(i).copy() for i in range(len(prompt))])
    model.forget(0)
    return rows


def _prompt(model: LlamaModel) -> list[int]:
    return model.tokenize("The capital of France is Paris, and the capital of", add_special=True)


@pytest.mark.parametrize("which", ["gemma", "qwen35"])
def test_scale_zero_gives_the_base_logits_bit_for_bit(
    which: str,
    gemma_path: Path,
    qwen35_path: Path,
    gemma_loras: tuple[Lora, Lora],
    qwen35_loras: tuple[Lora, Lora],
) -> None:
    path, lora = (
        (gemma_path, gemma_loras[0]) if which == "gemma" else (qwen35_path, qwen35_loras[0])
    )
    model = LlamaModel(path, slots=1, ctx_size=128, threads=2, n_batch=64)
    try:
        prompt = _prompt(model)
        base = _logits(model, prompt)
        adapter = model.load_lora(lora.path)
        model.loras.use([(adapter, 1.0)])
        adapted = _logits(model, prompt)
        model.loras.use([(adapter, 0.0)])
        off = _logits(model, prompt)
        model.loras.use([])
        again = _logits(model, prompt)
    finally:
        model.close()
    assert np.abs(adapted - base).max() > 0.01  # the adapter does something
    assert np.array_equal(off, base)
    assert np.array_equal(again, base)


@pytest.mark.parametrize("scale", [1.0, 0.5])
def test_an_adapter_gives_the_logits_of_its_weights_merged(
    scale: float, qwen35_path: Path, qwen35_loras: tuple[Lora, Lora], tmp_path: Path
) -> None:
    """The qwen35 tiny model (all F32) with an adapter on attention, recurrent and
    feed-forward weights (each with a ``.scale`` tensor) against a copy with ``W + scale *
    (alpha / r) * B @ A`` written into its weights."""
    lora = qwen35_loras[0]
    merged_path = write_merged(tmp_path / "merged.gguf", lora, scale=scale)
    model = LlamaModel(qwen35_path, slots=1, ctx_size=128, threads=2, n_batch=64)
    merged = LlamaModel(merged_path, slots=1, ctx_size=128, threads=2, n_batch=64)
    try:
        prompt = _prompt(model)
        base = _logits(model, prompt)
        model.loras.use([(model.load_lora(lora.path), scale)])
        adapted = _logits(model, prompt)
        reference = _logits(merged, prompt)
    finally:
        model.close()
        merged.close()
    assert np.abs(adapted - base).max() > 1e-3
    assert np.abs(adapted - reference).max() < 1e-5


def test_an_adapter_of_another_architecture_is_refused_naming_both(
    gemma_path: Path, qwen35_loras: tuple[Lora, Lora], tmp_path: Path
) -> None:
    with pytest.raises(ModelLoadError, match=r"'qwen35'.*'gemma3'"):
        check_lora(qwen35_loras[0].path, "gemma3")
    with pytest.raises(ModelLoadError, match="not a LoRA adapter"):
        check_lora(gemma_path, "gemma3")


async def test_the_engine_refuses_at_open_an_adapter_of_another_architecture(
    gemma_path: Path, qwen35_loras: tuple[Lora, Lora]
) -> None:
    config = engine_config(gemma_path, lora=(LoraSpec("q", qwen35_loras[0].path),))
    with pytest.raises(ModelLoadError, match="'qwen35', but the base model is 'gemma3'"):
        async with Engine.open(config):
            pass


def _gemma(gemma_path: Path, loras: tuple[Lora, Lora], **changes: object) -> object:
    return engine_config(
        gemma_path,
        lora=(LoraSpec("a", loras[0].path), LoraSpec("b", loras[1].path)),
        **changes,
    )


def _ask(model_name: str | None = None, **fields: object) -> GenerateRequest:
    settings: dict[str, object] = {"max_tokens": TOKENS, "cache_prompt": False, **fields}
    return GenerateRequest.user(
        "Write a short poem about the sea.",
        ignore_eos=True,
        logprobs=2,
        model_name=model_name,
        **settings,
    )


#: Tokens each request generates.
TOKENS = 12


async def test_two_adapters_and_the_base_decoding_at_once_each_get_what_they_get_alone(
    gemma_path: Path, gemma_loras: tuple[Lora, Lora]
) -> None:
    """One step serves one adapter set, so each request's steps hold its own sequence only,
    alone or beside the others: the runs are shaped alike and agree token for token."""
    async with Engine.open(_gemma(gemma_path, gemma_loras)) as engine:  # type: ignore[arg-type]
        assert [(a.id, a.name) for a in engine.adapters] == [(0, "a"), (1, "b")]
        alone = [(await collect_logprobs(engine, _ask(name)))[0] for name in ("a", "b", None)]
        before = engine.stats.lora_switches
        together = await run_together(engine, [_ask("a"), _ask("b"), _ask()])
        switches = engine.stats.lora_switches - before
    texts = ["".join(lp.token for lp in run) for run in alone]
    assert len(set(texts)) == 3, texts  # each adapter moves the model's choices its own way
    for mine, (theirs, done) in zip(alone, together, strict=True):
        assert [lp.token for lp in theirs] == [lp.token for lp in mine]
        assert [lp.logprob for lp in theirs] == [lp.logprob for lp in mine]
        assert done.completion_tokens == TOKENS
    # The sets took turns step by step (three sets: a switch before nearly every step).
    assert switches >= 3 * TOKENS - 3


async def test_the_lora_field_chooses_adapters_by_id_and_scale(
    gemma_path: Path, gemma_loras: tuple[Lora, Lora]
) -> None:
    async with Engine.open(_gemma(gemma_path, gemma_loras)) as engine:  # type: ignore[arg-type]
        by_name = (await collect_logprobs(engine, _ask("a")))[0]
        by_id = (await collect_logprobs(engine, _ask(lora=[(0, 1.0)])))[0]
        base = (await collect_logprobs(engine, _ask()))[0]
        turned_off = (await collect_logprobs(engine, _ask("a", lora=[(0, 0.0)])))[0]
        with pytest.raises(InvalidRequestError, match="no LoRA adapter has the id 7") as caught:
            async with engine.submit(_ask(lora=[(7, 1.0)])):
                pass
    assert caught.value.param == "lora"
    assert [lp.token for lp in by_id] == [lp.token for lp in by_name]
    assert [lp.token for lp in turned_off] == [lp.token for lp in base]
    assert [lp.logprob for lp in turned_off] == [lp.logprob for lp in base]


async def test_a_prefix_computed_under_one_adapter_is_never_reused_under_another(
    gemma_path: Path, gemma_loras: tuple[Lora, Lora]
) -> None:
    """The same conversation under adapter a, then b, then a again: b ingests it whole (and
    answers as it does with nothing cached); a finds its own prefix again."""
    async with Engine.open(_gemma(gemma_path, gemma_loras)) as engine:  # type: ignore[arg-type]
        _, first = await collect_logprobs(engine, _ask("a", cache_prompt=True))
        b_run, b_done = await collect_logprobs(engine, _ask("b", cache_prompt=True))
        _, a_again = await collect_logprobs(engine, _ask("a", cache_prompt=True))
        _, base = await collect_logprobs(engine, _ask(cache_prompt=True))
        fresh_b = (await collect_logprobs(engine, _ask("b")))[0]
    assert first.cached_tokens == 0
    assert b_done.cached_tokens == 0  # a's memory of the same prompt is not b's
    assert [lp.token for lp in b_run] == [lp.token for lp in fresh_b]
    assert a_again.cached_tokens > 0
    assert base.cached_tokens == 0


def _lora_set(model: LlamaModel, lora: Lora, name: str, adapters: Adapters) -> LoraSet:
    spec = LoraSpec(name, lora.path)
    adapters.add(spec, model.load_lora(lora.path), adapter_identity(lora.path), 0)
    return adapters.resolve(name, ())


def test_speculation_and_grammars_work_under_adapters(
    qwen35_path: Path, qwen35_loras: tuple[Lora, Lora]
) -> None:
    """Requests under two adapters and the base, one held to a grammar, decode at once with
    every draft verified: each emits what it emits without drafts (the hybrid model's numerics
    do not move with batch shapes)."""
    model = LlamaModel(qwen35_path, slots=4, ctx_size=128, threads=2, n_batch=128, n_rs_seq=4)
    try:
        adapters = Adapters()
        a = _lora_set(model, qwen35_loras[0], "a", adapters)
        b = _lora_set(model, qwen35_loras[1], "b", adapters)
        prompt = model.tokenize("hello world the cat sat on", add_special=False)
        vocab = [model.piece(t).decode("utf-8", "replace") for t in range(model.n_vocab)]
        words = sorted({w for w in vocab if w.strip() and w.isalpha()})[:3]
        grammar = "root ::= (" + " | ".join(f'"{w}"' for w in words) + ")+"
        requests = [
            core_request(0, prompt, 20, lora=a),
            core_request(1, prompt, 20, lora=b),
            core_request(2, prompt, 20),
            core_request(3, prompt, 20, lora=a, grammar=grammar),
        ]
        solo = {}
        for request in requests:  # each alone, without drafts
            core, _ = open_core(model, spec=None)
            solo.update(run_core(core, [request]).tokens)
            for seq in range(4):
                model.forget(seq)
        core, stats = open_core(
            model,
            spec="ngram",
            spec_draft_max=4,
            drafter=lambda history: Echo(solo, history[len(prompt) :]),
            plan=draft_all,
        )
        together = run_core(core, requests)
    finally:
        model.close()
    assert len({tuple(solo[k]) for k in range(3)}) == 3  # the adapters move the tokens
    assert together.tokens == solo
    assert all(together.ended(k).accepted > 0 for k in range(4))
    assert stats.lora_switches > 0 and stats.lora_steps > 0
    text = "".join(vocab[t] for t in together.tokens[3])
    assert text and all(w in words for w in _split(text, words))


async def test_adapters_load_and_unload_at_run_time(
    qwen35_path: Path, qwen35_loras: tuple[Lora, Lora], gemma_loras: tuple[Lora, Lora]
) -> None:
    config = engine_config(qwen35_path, lora=(LoraSpec("a", qwen35_loras[0].path),))
    request = GenerateRequest(tokens=[1, 2, 3], max_tokens=8, model_name="b")
    async with Engine.open(config) as engine:
        base_tokens = (await collect_logprobs(engine, _tokens(None)))[0]
        served = await engine.load_adapter(LoraSpec("b", qwen35_loras[1].path, 0.5))
        assert (served.id, served.name, served.spec.scale) == (1, "b", 0.5)
        assert [a.name for a in engine.adapters] == ["a", "b"]
        under_b = (await collect_logprobs(engine, _tokens("b")))[0]
        assert [lp.token for lp in under_b] != [lp.token for lp in base_tokens]
        with pytest.raises(InvalidRequestError, match="served already"):
            await engine.load_adapter(LoraSpec("b", qwen35_loras[1].path))
        with pytest.raises(ModelLoadError, match="'gemma3', but the base model is 'qwen35'"):
            await engine.load_adapter(LoraSpec("g", gemma_loras[0].path))
        # An adapter in flight is never unloaded.
        async with engine.submit(attrs.evolve(request, max_tokens=64)) as generation:
            assert engine.adapter_in_flight("b") == 1
            with pytest.raises(InvalidRequestError, match="requests in flight"):
                await engine.unload_adapter("b")
            async for _ in generation:
                pass
        assert engine.adapter_in_flight("b") == 0
        await engine.unload_adapter("b")
        assert [a.name for a in engine.adapters] == ["a"]
        with pytest.raises(InvalidRequestError, match="was unloaded") as caught:
            async with engine.submit(request):
                pass
        assert caught.value.param == "model"
        with pytest.raises(InvalidRequestError, match="no LoRA adapter named 'b'"):
            await engine.unload_adapter("b")
        # Loaded again, under a new id; the base model still answers as it did.
        again = await engine.load_adapter(LoraSpec("b", qwen35_loras[1].path, 0.5))
        assert again.id == 2
        assert [lp.token for lp in (await collect_logprobs(engine, _tokens("b")))[0]] == [
            lp.token for lp in under_b
        ]
        assert (await collect_logprobs(engine, _tokens(None)))[0] == base_tokens


def _tokens(model_name: str | None) -> GenerateRequest:
    return GenerateRequest(
        tokens=[5, 6, 7, 8], max_tokens=12, logprobs=1, cache_prompt=False, model_name=model_name
    )


async def test_the_prompt_cache_on_disk_keeps_the_base_models_prefixes_only(
    qwen35_path: Path, qwen35_loras: tuple[Lora, Lora], tmp_path: Path
) -> None:
    """The disk's files name no adapter set: memory computed under an adapter is not
    written as the engine closes, and a request under it reads no file the base wrote."""
    from .test_disk_cache import TEXT, config, files, greedy

    cfg = config(qwen35_path, tmp_path, lora=(LoraSpec("a", qwen35_loras[0].path),))
    async with Engine.open(cfg) as engine:
        prompt = engine.tokenize(TEXT)[:200]
        await collect(engine, greedy(prompt, 1, model_name="a"))
    assert files(tmp_path) == []
    async with Engine.open(cfg) as engine:
        await collect(engine, greedy(prompt, 1))
    assert len(files(tmp_path)) == 1
    async with Engine.open(cfg) as engine:
        await collect(engine, greedy([*prompt, 7], 1, model_name="a"))
        assert engine.stats.disk_hits == 0
        await collect(engine, greedy([*prompt, 7], 1))
        assert engine.stats.disk_hits == 1
