"""Picking tokens under a grammar without the whole vocabulary (``_constrained``): the
tokens found most likely first are the ones the whole-vocabulary pass keeps, on both test
models' vocabularies, and a sampled slot draws what llama.cpp's chain draws after that pass."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import llama_cpp
import numpy as np
import pytest

from llmtrio.engine import Tool, json_schema_grammar, tool_call_grammar
from llmtrio.engine.llama import Batch, LlamaModel, SlotSampler
from llmtrio.engine.llama._constrained import Candidates, GrammarSearch, VocabIndex

from .._grammar_probe import GrammarProbe

# Bounds, formats, a pattern and free strings (any byte, UTF-8 split over tokens).
SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "title": {"type": "string", "maxLength": 12},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5},
        "share": {"type": "number", "exclusiveMinimum": 0, "maximum": 1},
        "day": {"type": "string", "format": "date"},
        "mail": {"type": "string", "format": "email"},
        "zip": {"type": "string", "pattern": "^[0-9]{5}$"},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 2},
    },
    "required": ["title", "rating", "share", "day", "mail", "zip", "tags"],
    "additionalProperties": False,
}
NOTE = Tool(
    "save_note",
    "Save a note",
    {
        "type": "object",
        "properties": {"title": {"type": "string", "maxLength": 12}, "n": {"type": "integer"}},
        "required": ["title", "n"],
    },
)


def whole_vocabulary(sampler: Any, n_vocab: int) -> np.ndarray[Any, np.dtype[np.bool_]]:
    """Which tokens the grammar allows next, asked of every token at once."""
    candidates = Candidates(n_vocab)
    candidates.fill(np.zeros(n_vocab, dtype=np.float32))
    llama_cpp.llama_sampler_apply(sampler, candidates.ref)
    return np.isfinite(candidates.data["logit"])


@pytest.fixture(scope="module", params=["gemma", "qwen35"])
def probe(request: pytest.FixtureRequest) -> Iterator[tuple[GrammarProbe, VocabIndex]]:
    path: Path = request.getfixturevalue(f"{request.param}_path")
    probe = GrammarProbe(path, all_bytes=False)  # qwen35's 128 tokens spell hex digits
    try:
        yield probe, VocabIndex(probe.pieces(), probe.eog_tokens())
    finally:
        probe.close()


# What each test model's vocabulary can write: gemma's anything, qwen35's hex digits.
GRAMMARS = {
    "gemma": [json_schema_grammar(SCHEMA), tool_call_grammar([NOTE], xml=True)],
    "qwen35": [
        json_schema_grammar({"type": "integer", "minimum": 7, "maximum": 123456}),
        'root ::= [0-9a-f]{2,3} ("0" [a-c] | [5-9]+ "ff")* [d-f]',
    ],
}


@pytest.mark.parametrize("which", [0, 1])
def test_the_search_keeps_what_the_whole_vocabulary_pass_keeps(
    probe: tuple[GrammarProbe, VocabIndex], which: int, request: pytest.FixtureRequest
) -> None:
    """Along a random text the grammar accepts, with random logits (some tied, some -inf):
    the tokens the first bytes leave in hold every allowed token, and the best 1 and 40
    allowed tokens are the whole-vocabulary pass's, ties by id."""
    gbnf = GRAMMARS[request.node.callspec.params["probe"]][which]
    grammar_probe, index = probe
    n_vocab = len(index)
    search = GrammarSearch(index)
    rnd = random.Random(7)
    text = grammar_probe.walk(
        gbnf,
        lambda n, end: -1 if end and rnd.random() < 0.3 else rnd.randrange(n),
        300,
        prefix=True,
    )
    assert text is not None
    data = text.encode()
    rng = np.random.default_rng(0)
    checked = 0
    every = 7 if n_vocab > 1000 else 1  # the whole-vocabulary pass: ~50 ms on gemma's
    with grammar_probe.grammar(gbnf) as sampler:
        for at in range(len(data) + 1):
            if at % every == 0 or at == len(data):
                allowed = whole_vocabulary(sampler, n_vocab)
                assert not (allowed & ~search.possible(sampler)).any(), data[:at]
                logits = rng.normal(size=n_vocab).astype(np.float32)
                if at % 2:
                    logits = np.round(logits, 1)  # many ties
                logits[rng.choice(n_vocab, n_vocab // 500 + 2)] = -np.inf
                ids = np.flatnonzero(allowed & np.isfinite(logits))
                expect = ids[np.lexsort((ids, -logits[ids]))]
                for want in (1, 40):
                    got = search.best_allowed(sampler, logits, want)
                    assert got.tolist() == expect[:want].tolist(), (data[:at], want)
                checked += 1
            if at < len(data):
                assert grammar_probe.feed(sampler, data[at : at + 1])
    assert checked >= 4


def test_the_search_finds_a_token_outside_the_best_blocks(
    probe: tuple[GrammarProbe, VocabIndex],
) -> None:
    """The only allowed tokens ranked last: found, in order, past every block."""
    grammar_probe, index = probe
    search = GrammarSearch(index)
    with grammar_probe.grammar('root ::= "7" [a-z]*') as sampler:
        allowed = np.flatnonzero(whole_vocabulary(sampler, len(index)))
        logits = np.linspace(10, 0, len(index), dtype=np.float32)
        logits[allowed] = -5.0 - np.arange(len(allowed), dtype=np.float32)
        assert search.best_allowed(sampler, logits, 3).tolist() == allowed[:3].tolist()
        logits[allowed] = -np.inf  # allowed, but banned by a bias
        assert not len(search.best_allowed(sampler, logits, 1))


@pytest.fixture(scope="module")
def gemma(gemma_path: Path) -> Iterator[LlamaModel]:
    model = LlamaModel(gemma_path, slots=1, ctx_size=64, threads=2, n_batch=64)
    yield model
    model.close()


@pytest.mark.parametrize("top_k", [40, 0])
def test_a_sampled_slot_draws_what_the_chain_draws_after_the_whole_vocabulary_pass(
    gemma: LlamaModel, top_k: int
) -> None:
    """Real logits, a grammar that refuses most likely tokens: per seed, the slot's token is
    the one llama.cpp's chain (same samplers, same seed) draws over the whole vocabulary once
    the grammar has refused what it refuses, and never a refused token."""
    gemma.forget(0)
    batch = Batch(64)
    index = batch.add(
        gemma.tokenize("The weather today is", add_special=True), 0, 0, output_last=True
    )
    assert gemma.decode(batch) == 0
    base = gemma.logits(index).copy()
    gbnf = "root ::= [0-9] [a-z]*"
    settings: dict[str, Any] = {"temperature": 1.5, "top_k": top_k, "top_p": 0.95, "min_p": 0.01}
    refusals = 0
    for seed in range(12):
        sampler = SlotSampler(gemma, **settings, seed=seed, bias={}, grammar=gbnf)
        gemma.logits(index)[:] = base
        token = sampler.sample(index)
        sampler.close()
        # The reference: llama.cpp's common sampler with the same chain and seed.
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
        if top_k:
            llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(top_k))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_p(0.95, 1))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_min_p(0.01, 1))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(1.5))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(seed))
        grammar = gemma.grammars.new(gbnf)
        try:
            candidates = Candidates(gemma.n_vocab)
            candidates.fill(base)
            llama_cpp.llama_sampler_apply(chain, candidates.ref)
            first = candidates.selected
            allowed = whole_vocabulary(grammar, gemma.n_vocab)
            expect = first
            if not allowed[first]:
                refusals += 1
                candidates.fill(base)
                llama_cpp.llama_sampler_apply(grammar, candidates.ref)
                llama_cpp.llama_sampler_apply(chain, candidates.ref)
                expect = candidates.selected
        finally:
            llama_cpp.llama_sampler_free(grammar)
            llama_cpp.llama_sampler_free(chain)
        assert token == expect, seed
        assert allowed[token] and gemma.piece(token)[:1].isdigit(), gemma.piece(token)
    assert refusals >= 10  # the refusal path is what was compared


def test_a_draft_is_allowed_up_to_the_first_token_its_grammar_refuses(gemma: LlamaModel) -> None:
    """``SlotSampler.allowed``: the draft tokens a grammar would take in turn from the
    sampler's state, without moving that state; all of them with no grammar."""
    gbnf = 'root ::= "{\\"name\\": \\"" [a-z ]+ "\\"}"'
    sampler = SlotSampler(
        gemma, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, bias={}, grammar=gbnf
    )
    plain = SlotSampler(gemma, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, seed=0, bias={})
    try:
        good = gemma.tokenize('{"name": "ada lovelace"}', add_special=False)
        assert sampler.allowed(good) == len(good)
        # A digit is not in the name's [a-z ]: the draft stops before it.
        bad = gemma.tokenize('{"name": "ada 1', add_special=False)
        assert gemma.piece(bad[-1]) == b"1"
        assert sampler.allowed(bad) == len(bad) - 1
        # Asking moved nothing: the grammar still expects the object from its start.
        assert sampler.allowed(good) == len(good)
        assert sampler.allowed(gemma.tokenize("name", add_special=False)) == 0
        assert plain.allowed(bad) == len(bad)
        # An end-of-generation token the grammar takes (the object is complete) is the last
        # one counted; one it refuses (the object is not) ends the draft before it.
        eos = gemma.eos
        assert sampler.allowed([*good, eos, *good]) == len(good) + 1
        assert sampler.allowed([*good[:-1], eos]) == len(good) - 1
    finally:
        sampler.close()
        plain.close()
