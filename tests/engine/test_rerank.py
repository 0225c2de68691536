"""Reranking in the engine room and its pure parts: a pair's format and truncation, the kind a
GGUF with rank pooling is, the three request shapes and their answers, and the
``RerankEngine`` on both test cross-encoders (an encoder, MiniLM with a random head, and a tiny
random Qwen3 reranker), whose scores must be the NumPy head over the model's own pooled
state, whatever shares their decode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from llmtrio.api import ApiError, RequestLimits
from llmtrio.cli._catalog import scan_models_dir
from llmtrio.engine import (
    EMBEDDING_SEQUENCES,
    EmbeddingEngine,
    EngineConfig,
    InvalidRequestError,
    ModelLoadError,
    RerankEngine,
    model_kind_of,
    open_engine,
)
from llmtrio.engine.embed._engine import EMBEDDING_BATCH_TOKENS, EMBEDDING_DECODE_TOKENS
from llmtrio.engine.embed._pack import EmbedPacker
from llmtrio.engine.embed._pairs import PairFormat, pair_tokens
from llmtrio.engine.embed._rerank import FLASH_ATTN_TILE_ROWS
from llmtrio.engine.llama import Batch, LlamaModel
from llmtrio.worker import HostedModel
from llmtrio.worker._encoding import ResponseMeta
from llmtrio.worker._rerank import CohereRerankBody, JinaRerankBody, Ranked, ScoreBody, ranking
from llmtrio.worker._rerank_request import (
    parse_cohere_rerank_request,
    parse_rerank_request,
    parse_score_request,
)

from .._helpers import engine_config
from .._rerankers import QWEN3_RERANK_TEMPLATE, head_weights

QUERY = "What do giant pandas eat?"
DOCUMENTS = [
    "The giant panda's diet is almost all bamboo.",
    "Paris is the capital of France.",
    "Pandas also eat small animals and carrion now and then.",
    "hi",
    "A red panda is not a bear; it eats bamboo too, and fruit, eggs and insects.",
]

# -- a pair's format (pure) --------------------------------------------------------------------


def words(text: str, special: bool) -> list[int]:
    """A tokenizer for the pure tests: one id a word (its length), "<S>" a special token
    (99) only when specials are parsed."""
    return [99 if special and w == "<S>" else len(w) for w in text.split()]


def unwords(ids: list[int]) -> str:
    return " ".join("x" * i for i in ids)


ENCODER = PairFormat(bos=1, eos=2, sep=3, add_eos=True, add_sep=True)


def test_an_encoder_pair_is_bos_query_eos_sep_document_eos() -> None:
    pair = pair_tokens(ENCODER, words, unwords, "aa bbb", "c dddd e")
    assert pair.tokens == [1, 2, 3, 2, 3, 1, 4, 1, 2] and not pair.truncated
    bert = PairFormat(bos=101, eos=102, sep=102, add_eos=True, add_sep=False)
    assert pair_tokens(bert, words, unwords, "aa", "bbb").tokens == [101, 2, 102, 3, 102]
    bare = PairFormat()  # no BOS, EOS or SEP: the two texts, back to back
    assert pair_tokens(bare, words, unwords, "aa", "bbb").tokens == [2, 3]


def test_an_encoder_pair_is_cut_at_the_documents_end() -> None:
    pair = pair_tokens(ENCODER, words, unwords, "aa", "b cc ddd eeee", limit=7)
    assert pair.tokens == [1, 2, 2, 3, 1, 2, 2] and pair.truncated
    capped = pair_tokens(ENCODER, words, unwords, "aa", "b cc ddd", max_document_tokens=1)
    assert capped.tokens == [1, 2, 2, 3, 1, 2] and capped.truncated
    # the query alone over the limit: nothing of the document is left, still over
    over = pair_tokens(ENCODER, words, unwords, "a b c d e f", "gg", limit=5)
    assert over.tokens == [1, 1, 1, 1, 1, 1, 1, 2, 3, 2] and over.truncated


def test_a_templated_pair_fills_the_query_then_the_document() -> None:
    form = PairFormat(template="<S> q: {query} d: {document} <S>")
    pair = pair_tokens(form, words, unwords, "aa b", "cccc")
    assert pair.tokens == [99, 2, 2, 1, 2, 4, 99]
    # llama.cpp's order: a query that holds "{document}" gets the document there too
    assert pair_tokens(form, words, unwords, "{document}", "ee").tokens == [99, 2, 2, 2, 2, 99]
    # special-token text in a text is read as the special token, as llama.cpp reads it
    assert pair_tokens(form, words, unwords, "<S>", "x").tokens[2] == 99


def test_a_templated_pair_is_cut_at_the_documents_end_until_it_fits() -> None:
    form = PairFormat(template="q {query} d {document} end")
    pair = pair_tokens(form, words, unwords, "aa", "b cc ddd eeee", limit=6)
    assert pair.tokens == [1, 2, 1, 1, 2, 3] and pair.truncated
    capped = pair_tokens(form, words, unwords, "aa", "b cc ddd", max_document_tokens=2)
    assert capped.tokens == [1, 2, 1, 1, 2, 3] and capped.truncated
    fits = pair_tokens(form, words, unwords, "aa", "b", limit=6)
    assert fits.tokens == [1, 2, 1, 1, 3] and not fits.truncated


@given(
    query=st.lists(st.integers(1, 5), max_size=6),
    document=st.lists(st.integers(1, 5), max_size=30),
    limit=st.integers(1, 40),
    templated=st.booleans(),
)
def test_a_cut_pair_fits_whenever_its_query_does_and_keeps_the_documents_start(
    query: list[int], document: list[int], limit: int, templated: bool
) -> None:
    form = PairFormat(template="{query} | {document} .") if templated else ENCODER
    q, d = unwords(query), unwords(document)
    whole = pair_tokens(form, words, unwords, q, d)
    bare = pair_tokens(form, words, unwords, q, "")
    cut = pair_tokens(form, words, unwords, q, d, limit=limit)
    if len(whole.tokens) <= limit:
        assert cut == whole
    elif len(bare.tokens) <= limit:
        assert len(cut.tokens) <= limit and cut.truncated
        # what is left of the document is its start, as long as the limit lets it be
        kept = len(cut.tokens) - len(bare.tokens)
        assert kept == limit - len(bare.tokens)
        assert unwords(document[:kept]) in unwords(words(unwords(cut.tokens), False))
    else:
        assert cut.tokens == bare.tokens


def test_a_gguf_with_rank_pooling_is_a_reranking_model(
    minilm_rerank_path: Path, qwen3_rerank_path: Path, minilm_path: Path, qwen35_path: Path
) -> None:
    assert model_kind_of(minilm_rerank_path) == "rerank"
    assert model_kind_of(qwen3_rerank_path) == "rerank"
    assert model_kind_of(minilm_path) == "embedding"
    assert model_kind_of(qwen35_path) == "chat"
    # the head the oracle computes with is the one in the GGUF (MiniLM's vocabulary is read
    # in seconds; Qwen3's is written by the same code)
    saved, written = (
        head_weights(minilm_rerank_path),
        head_weights(minilm_rerank_path, from_gguf=True),
    )
    assert (
        saved.keys()
        == written.keys()
        == {"cls.weight", "cls.bias", "cls.output.weight", "cls.output.bias"}
    )
    for name, array in saved.items():
        assert array.shape == written[name].shape and np.array_equal(array, written[name])


# -- the requests and answers (pure) -----------------------------------------------------------


def body(**fields: Any) -> bytes:
    return json.dumps(fields).encode()


def test_the_three_shapes_make_the_same_pairs() -> None:
    jina = parse_rerank_request(body(model="m", query="q", documents=["a", {"text": "b"}], top_n=1))
    assert (jina.queries, jina.documents, jina.top_n) == (("q",), ("a", "b"), 1)
    assert jina.return_documents and not jina.truncate
    assert parse_rerank_request(body(query="q", documents=["a"], return_documents=False,
                                     truncation=True, top_n=None)).truncate  # fmt: skip
    cohere = parse_cohere_rerank_request(body(model="m", query="q", documents=["a", "b"]))
    assert (cohere.documents, cohere.truncate, cohere.max_document_tokens) == (
        ("a", "b"),
        True,
        4096,
    )
    assert (
        parse_cohere_rerank_request(
            body(query="q", documents=["a"], max_tokens_per_doc=7)
        ).max_document_tokens
        == 7
    )
    one_to_many = parse_score_request(body(text_1="q", text_2=["a", "b"]))
    assert [one_to_many.query(i) for i in range(2)] == ["q", "q"]
    pairs = parse_score_request(body(text_1=["q", "r"], text_2=["a", "b"]))
    assert [pairs.query(i) for i in range(2)] == ["q", "r"]
    assert parse_score_request(body(text_1=["q"], text_2="a")).documents == ("a",)


@pytest.mark.parametrize(
    ("parse", "fields", "param", "code"),
    [
        (parse_rerank_request, {"documents": ["a"]}, "query", "missing_required_parameter"),
        (parse_rerank_request, {"query": "q"}, "documents", "missing_required_parameter"),
        (parse_rerank_request, {"query": "q", "documents": []}, "documents", "empty_array"),
        (parse_rerank_request, {"query": "q", "documents": "a"}, "documents", "invalid_type"),
        (parse_rerank_request, {"query": "q", "documents": ["a"] * 4}, "documents",
         "array_above_max_length"),
        (parse_rerank_request, {"query": "q", "documents": ["a", 3]}, "documents[1]",
         "invalid_type"),
        (parse_rerank_request, {"query": "q", "documents": ["a", {"txt": "b"}]},
         "documents[1].text", "missing_required_parameter"),
        (parse_rerank_request, {"query": 3, "documents": ["a"]}, "query", "invalid_type"),
        (parse_rerank_request, {"query": "q", "documents": ["a"], "top_n": 0}, "top_n",
         "integer_below_min_value"),
        (parse_rerank_request, {"query": "q", "documents": ["\ud800"]}, "documents[0]",
         "invalid_value"),
        (parse_cohere_rerank_request, {"query": "q", "documents": ["a"],
                                       "max_tokens_per_doc": 0}, "max_tokens_per_doc",
         "integer_below_min_value"),
        (parse_score_request, {"text_2": ["a"]}, "text_1", "missing_required_parameter"),
        (parse_score_request, {"text_1": "q", "text_2": []}, "text_2", "empty_array"),
        (parse_score_request, {"text_1": ["q", "r"], "text_2": ["a"] * 3}, "text_2",
         "invalid_value"),
        (parse_score_request, {"text_1": "q", "text_2": ["a", None]}, "text_2[1]",
         "invalid_type"),
    ],
)  # fmt: skip
def test_each_bad_request_is_a_400_naming_the_field(
    parse: Any, fields: dict[str, Any], param: str, code: str
) -> None:
    with pytest.raises(ApiError) as caught:
        parse(json.dumps(fields).encode(), RequestLimits(max_rerank_documents=3))
    assert caught.value.status == 400
    assert (caught.value.param, caught.value.code) == (param, code)


def test_results_are_best_first_with_the_original_index() -> None:
    scores = np.asarray([0.1, 0.7, -2.0, 0.7, 0.3], dtype=np.float32)
    assert ranking(scores, None) == [1, 3, 4, 0, 2]  # a tie: the lower index first
    assert ranking(scores, 2) == [1, 3]
    assert ranking(scores, 99) == [1, 3, 4, 0, 2]
    answer = Ranked(scores=scores, prompt_tokens=42)
    meta = ResponseMeta("rerank-1", 1700000000, "m")
    request = parse_rerank_request(body(query="q", documents=list("abcde"), top_n=3))
    jina = json.loads(JinaRerankBody(request, meta).finish(answer))
    assert [r["index"] for r in jina["results"]] == [1, 3, 4]
    assert jina["results"][0] == {"index": 1, "relevance_score": float(scores[1]),
                                  "document": {"text": "b"}}  # fmt: skip
    assert jina["usage"] == {"prompt_tokens": 42, "total_tokens": 42}
    assert (jina["model"], jina["object"]) == ("m", "list")
    cohere_request = parse_cohere_rerank_request(body(query="q", documents=list("abcde")))
    cohere = json.loads(CohereRerankBody(cohere_request, meta).finish(answer))
    assert [r["index"] for r in cohere["results"]] == [1, 3, 4, 0, 2]
    assert set(cohere["results"][0]) == {"index", "relevance_score"}
    assert cohere["meta"]["tokens"] == {"input_tokens": 42, "output_tokens": 0}
    score_request = parse_score_request(body(text_1="q", text_2=list("abcde")))
    score = json.loads(ScoreBody(score_request, meta).finish(answer))
    assert [d["index"] for d in score["data"]] == [0, 1, 2, 3, 4]  # the pairs' order
    assert [d["score"] for d in score["data"]] == [float(s) for s in scores]
    assert score["usage"]["prompt_tokens"] == 42 and score["created"] == 1700000000


# -- the engine on both test cross-encoders ----------------------------------------------------


def pooled_states(
    path: Path, requests: list[list[list[int]]]
) -> list[list[np.ndarray[Any, np.dtype[Any]]]]:
    """The model's own pooled hidden state of each pair of each request (a copy of the
    cross-encoder with CLS or last pooling: what its head reads), each request's pairs decoded
    in the batches the engine makes of them (its packer's, in the order given, topped up to
    ``FLASH_ATTN_TILE_ROWS`` tokens as the engine tops them up); one model load for all."""
    model = LlamaModel(path, slots=EMBEDDING_SEQUENCES, ctx_size=512, threads=1,
                       n_batch=EMBEDDING_BATCH_TOKENS, embeddings=True)  # fmt: skip
    answers: list[list[np.ndarray[Any, np.dtype[Any]]]] = []
    try:
        for pairs in requests:
            packer = EmbedPacker(
                max_tokens=model.n_batch, max_seqs=model.slots, budget=EMBEDDING_DECODE_TOKENS
            )
            packer.add(0, [np.asarray(pair, dtype=np.int32) for pair in pairs])
            states: list[np.ndarray[Any, np.dtype[Any]]] = []
            while items := packer.next_batch():
                model.clear_memory()
                batch = Batch(model.n_batch)
                for seq, item in enumerate(items):
                    batch.add(item.tokens, 0, seq, output_last=True, output_all=True)
                if batch.n < FLASH_ATTN_TILE_ROWS:
                    filler = np.full(FLASH_ATTN_TILE_ROWS - batch.n, items[0].tokens[0], np.int32)
                    batch.add(filler, 0, len(items), output_last=True, output_all=True)
                assert model.decode(batch) == 0
                for seq in range(len(items)):
                    state = model.pooled(seq)
                    assert state is not None
                    states.append(state.astype(np.float64))
            answers.append(states)
        return answers
    finally:
        model.close()


def head(kind: str, weights: dict[str, Any], state: np.ndarray[Any, Any]) -> float:
    """The cross-encoder's score in NumPy: the encoder's ``Wo·tanh(Wc·h + bc) + bo``, the
    decoder's softmax over its two labels' rows (the first's probability)."""
    if kind == "encoder":
        hidden = np.tanh(weights["cls.weight"] @ state + weights["cls.bias"])
        return float((weights["cls.output.weight"] @ hidden + weights["cls.output.bias"])[0])
    logits = weights["cls.output.weight"] @ state
    odds = np.exp(logits - logits.max())
    return float(odds[0] / odds.sum())


@pytest.fixture(params=["encoder", "decoder"])
def reranker(
    request: pytest.FixtureRequest,
    minilm_rerank_path: Path,
    minilm_cls_path: Path,
    qwen3_rerank_path: Path,
    qwen3_last_path: Path,
) -> tuple[str, Path, Path]:
    """(which, the cross-encoder, the same weights pooled as the state its head reads)."""
    if request.param == "encoder":
        return "encoder", minilm_rerank_path, minilm_cls_path
    return "decoder", qwen3_rerank_path, qwen3_last_path


async def test_scores_are_the_heads_over_the_models_own_state(
    reranker: tuple[str, Path, Path],
) -> None:
    """Within 1e-5 of the NumPy head over the state the model pools for the pair, decoded as
    the engine decodes it: all pairs of one request (packed several to a decode), and each
    alone."""
    kind, path, state_path = reranker
    async with open_engine(engine_config(path)) as engine:
        assert isinstance(engine, RerankEngine) and engine.kind == "rerank"
        assert engine.dimensions == (1 if kind == "encoder" else 2)
        pairs = [engine.pair(QUERY, document).tokens for document in DOCUMENTS]
        together = await engine.score_tokens(pairs)
        assert together.values.shape == (len(DOCUMENTS), engine.dimensions)
        assert together.token_counts == tuple(map(len, pairs))
        steps = engine.stats.steps
        alone = [(await engine.score_tokens([pair])).scores[0] for pair in pairs]
        assert engine.stats.steps == steps + len(pairs)
        if kind == "decoder":  # the softmax's two probabilities
            assert np.allclose(together.values.sum(axis=1), 1, atol=1e-6)
    weights = head_weights(path)
    states, *each = await trio.to_thread.run_sync(
        pooled_states, state_path, [pairs, *([pair] for pair in pairs)]
    )
    for i, state in enumerate(states):
        assert abs(float(together.scores[i]) - head(kind, weights, state)) < 1e-5
    for i, (state,) in enumerate(each):
        assert abs(float(alone[i]) - head(kind, weights, state)) < 1e-5
    # the scores tell the documents apart (a random head, but not a constant one)
    assert len({round(float(s), 4) for s in together.scores}) == len(DOCUMENTS)
    # alone or beside others, the same document's score; llama.cpp's CPU kernels differ by a
    # sequence's row in the batch, on the Q8_0 encoder by up to 1e-2 (PERFORMANCE.md,
    # "Reranking"): never more, where a pair leaking into another would move it far more
    close = 1e-5 if kind == "decoder" else 5e-2
    assert np.abs(together.scores - np.asarray(alone)).max() < close


async def test_a_documents_score_does_not_depend_on_what_shares_its_decode(
    reranker: tuple[str, Path, Path],
) -> None:
    """The same pair at the same place in a decode scores the same whatever the others are:
    other documents of its request, other requests' pairs, a filler, or nothing (a decode of
    fewer than 64 tokens gets a filler, so it runs through the same attention kernel)."""
    kind, path, _ = reranker
    async with RerankEngine.open(engine_config(path)) as engine:
        pairs = [engine.pair(QUERY, document).tokens for document in DOCUMENTS]
        first = {float((await engine.score_tokens([pairs[0], other])).scores[0])
                 for other in pairs[1:]}  # fmt: skip
        first.add(float((await engine.score_tokens([pairs[0]])).scores[0]))
        # two requests at once: their pairs share decodes
        shared: list[float] = []

        async def request(other: list[int]) -> None:
            shared.append(float((await engine.score_tokens([pairs[0], other])).scores[0]))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(request, pairs[3])
            nursery.start_soon(request, pairs[4])
    assert max(first) - min(first) < 1e-6
    # the second request's first pair sits after the first request's pairs: llama.cpp's row
    # effects aside (see above), the same score
    assert all(abs(score - min(first)) < (1e-5 if kind == "decoder" else 5e-2)
               for score in shared)  # fmt: skip


async def test_a_pair_is_written_as_llama_cpps_server_writes_it(
    minilm_rerank_path: Path, qwen3_rerank_path: Path
) -> None:
    async with RerankEngine.open(engine_config(minilm_rerank_path)) as encoder:
        assert not encoder.template
        query = encoder.tokenize_text(QUERY, add_special=False, parse_special=False)
        document = encoder.tokenize_text("hi", add_special=False, parse_special=False)
        # BERT: [CLS] query [SEP] document [SEP]
        assert encoder.pair(QUERY, "hi").tokens == [101, *query, 102, *document, 102]
    async with RerankEngine.open(engine_config(qwen3_rerank_path)) as decoder:
        assert decoder.template
        filled = QWEN3_RERANK_TEMPLATE.replace("{query}", QUERY).replace("{document}", "hi")
        tokens = decoder.tokenize_text(filled, add_special=False, parse_special=True)
        assert decoder.pair(QUERY, "hi").tokens == tokens
        im_start = decoder.tokenize_text("<|im_start|>", add_special=False, parse_special=True)
        assert len(im_start) == 1 and tokens[0] == im_start[0]


async def test_a_long_pair_is_cut_to_the_context_or_refused(
    reranker: tuple[str, Path, Path],
) -> None:
    _, path, _ = reranker
    async with RerankEngine.open(engine_config(path, ctx_size=128)) as engine:
        assert engine.ctx_size == 128
        long = "bamboo shoots and leaves " * 100
        whole = engine.pair(QUERY, long)
        assert len(whole.tokens) > 128 and not whole.truncated
        cut = engine.pair(QUERY, long, truncate=True)
        assert cut.truncated and 120 <= len(cut.tokens) <= 128
        # the document's end is what went: the cut pair starts as the whole one does
        assert whole.tokens[:100] == cut.tokens[:100]
        capped = engine.pair(QUERY, long, max_document_tokens=5)
        assert capped.truncated and len(capped.tokens) < len(engine.pair(QUERY, "a b c").tokens) + 8
        with pytest.raises(InvalidRequestError, match="context") as caught:
            await engine.score_tokens([cut.tokens, whole.tokens])
        assert caught.value.param == "pair[1]"
        scored = await engine.score_tokens([cut.tokens])
        assert scored.token_counts == (len(cut.tokens),)


async def test_each_engine_takes_its_own_kind_only(
    minilm_rerank_path: Path, minilm_path: Path
) -> None:
    with pytest.raises(ModelLoadError, match="not an embedding model"):
        async with EmbeddingEngine.open(engine_config(minilm_rerank_path)):
            pass
    with pytest.raises(ModelLoadError, match="not a reranking model"):
        async with RerankEngine.open(engine_config(minilm_path)):
            pass


def test_the_catalog_knows_a_reranking_model_from_its_gguf(
    tmp_path: Path, minilm_rerank_path: Path, minilm_path: Path
) -> None:
    """``--models-dir`` finds it as any model; its kind (and so the ring's routing) comes
    from its GGUF, and it is costed as a pooled context is (no slots of KV cache, no prompt
    cache), as an embedding model is."""
    (tmp_path / "ranker.gguf").symlink_to(minilm_rerank_path)
    (tmp_path / "minilm.gguf").symlink_to(minilm_path)
    found = {m.name: m for m in scan_models_dir(tmp_path, EngineConfig(model=None, threads=1))}
    hosted = {name: HostedModel.of(name, m.config) for name, m in found.items()}
    assert {name: h.kind for name, h in hosted.items()} == {
        "ranker": "rerank",
        "minilm": "embedding",
    }
    assert hosted["ranker"].cost.prompt_cache == 0
    assert hosted["ranker"].cost.kv_cache == hosted["minilm"].cost.kv_cache
