"""``POST /tokenize`` and ``POST /detokenize``, in llama.cpp server's shapes: in process on the
default model's own tokenizer (``qwen35_real_path``), on an embedding model's, and once over
the ring to a remote worker."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmtrio.api import CHAT_PATH, DETOKENIZE_PATH, TOKENIZE_PATH
from llmtrio.engine import EmbeddingEngine
from llmtrio.ring import RingConfig
from llmtrio.web import ServeConfig
from llmtrio.worker._encoding import ResponseMeta
from llmtrio.worker._shapes import run_tokenizer
from llmtrio.worker._tokenize import (
    DETOKENIZE_ENDPOINT,
    TOKENIZE_ENDPOINT,
    parse_detokenize_request,
    parse_tokenize_request,
)

from .._helpers import engine_config, wait_until
from .._procs import Ring
from .._qwen35_real import ADDED_TOKENS
from .._stack import open_stack

IDS = {text: token for token, text in ADDED_TOKENS.items()}
IM_END = IDS["<|im_end|>"]
#: Texts whose Qwen tokens hold parts of a character (byte-level BPE splits rare ones).
RARE = ("\U0001f9ea\U0001fa90", "\u2c86\u2c87\u2c88", "\U00010330\U00010331")


def test_the_requests_parse_as_llama_cpps() -> None:
    tokenize = parse_tokenize_request(json.dumps({"content": "Hi"}).encode())
    assert (tokenize.content, tokenize.add_special, tokenize.parse_special) == (
        ("Hi",),
        False,
        True,
    )
    assert not tokenize.with_pieces and tokenize.model is None
    mixed = parse_tokenize_request(
        json.dumps({"content": ["a", 5, "b"], "with_pieces": True, "model": "m"}).encode()
    )
    assert mixed.content == ("a", 5, "b") and mixed.with_pieces and mixed.model == "m"
    assert parse_detokenize_request(b'{"tokens": [1, 2]}').tokens == (1, 2)
    assert parse_detokenize_request(b'{"tokens": []}').tokens == ()
    for body, param in [
        ({}, "content"),
        ({"content": {"a": 1}}, "content"),
        ({"content": ["a", None]}, "content[1]"),
        ({"content": [-1]}, "content[0]"),
        ({"content": "a", "with_pieces": "yes"}, "with_pieces"),
    ]:
        with pytest.raises(Exception) as info:
            parse_tokenize_request(json.dumps(body).encode())
        assert getattr(info.value, "param", None) == param, body
    for body, param in [
        ({}, "tokens"),
        ({"tokens": [1, -2]}, "tokens[1]"),
        ({"tokens": "1"}, "tokens"),
    ]:
        with pytest.raises(Exception) as info:
            parse_detokenize_request(json.dumps(body).encode())
        assert getattr(info.value, "param", None) == param, body


async def test_tokenizer_work_runs_on_the_loop_when_small_and_in_a_thread_when_large() -> None:
    """Every endpoint's tokenizer work (``/tokenize``, a completion's prompt, embeddings'
    texts) goes through one threshold: 1024 characters or token ids."""
    loop = threading.get_ident()
    assert await run_tokenizer(1024, threading.get_ident) == loop
    assert await run_tokenizer(1025, threading.get_ident) != loop
    assert await run_tokenizer(1025, pow, 2, 10) == await run_tokenizer(0, pow, 2, 10) == 1024


async def test_tokenize_and_detokenize_through_the_ingress(
    qwen35_real_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmtrio.access")
    engine = engine_config(qwen35_real_path, max_inflight=1, ctx_size=256, threads=1)
    config = ServeConfig(port=0, ring=RingConfig(max_streams=8), graceful_timeout=1)
    async with open_stack(engine, config) as stack, httpx.AsyncClient(timeout=60) as http:

        async def post(path: str, **body: Any) -> httpx.Response:
            return await http.post(stack.url + path, json=body)

        text = "Hello world<|im_end|>"
        answer = await post(TOKENIZE_PATH, content=text)
        assert answer.status_code == 200, answer.text
        tokens = answer.json()["tokens"]
        assert tokens == stack.engine.tokenize_text(text, add_special=False, parse_special=True)
        assert tokens[-1] == IM_END and len(tokens) == 3
        # Not parsed for special tokens, the marker is spelled out.
        plain = (await post(TOKENIZE_PATH, content=text, parse_special=False)).json()["tokens"]
        assert IM_END not in plain and len(plain) > len(tokens)
        # Texts and token ids mixed, the ids kept.
        mixed = await post(TOKENIZE_PATH, content=["Hello", IM_END, " world"])
        assert mixed.json()["tokens"] == [tokens[0], IM_END, tokens[1]]
        # Pieces: text where it is UTF-8, bytes where a token holds part of a character.
        pieces = (await post(TOKENIZE_PATH, content=text, with_pieces=True)).json()["tokens"]
        assert pieces == [
            {"id": tokens[0], "piece": "Hello"},
            {"id": tokens[1], "piece": " world"},
            {"id": IM_END, "piece": "<|im_end|>"},
        ]
        split = []
        for rare in RARE:
            answer = await post(TOKENIZE_PATH, content=rare, with_pieces=True)
            split += [p for p in answer.json()["tokens"] if isinstance(p["piece"], list)]
        assert split, "no token holding part of a character"
        assert all(0 <= b < 256 for p in split for b in p["piece"])
        # Back to text: the pieces joined, special tokens rendered.
        back = await post(DETOKENIZE_PATH, tokens=tokens)
        assert back.status_code == 200 and back.json() == {"content": text}
        rare_tokens = (await post(TOKENIZE_PATH, content=RARE[0])).json()["tokens"]
        rare_back = await post(DETOKENIZE_PATH, tokens=rare_tokens)
        assert rare_back.json() == {"content": RARE[0]}
        assert (await post(DETOKENIZE_PATH, tokens=[])).json() == {"content": ""}
        # A token outside the vocabulary, a bad field: 400 naming it.
        outside = await post(DETOKENIZE_PATH, tokens=[1, 151_936])
        assert outside.status_code == 400 and outside.json()["error"]["param"] == "tokens[1]"
        outside = await post(TOKENIZE_PATH, content=["a", 10**6])
        assert outside.status_code == 400 and outside.json()["error"]["param"] == "content[1]"
        named = await post(TOKENIZE_PATH, content="a", model=qwen35_real_path.stem)
        assert named.status_code == 200
        bad = await post(TOKENIZE_PATH, content="a", add_special=1)
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "add_special"
        metrics = await http.get(stack.url + "/metrics")
        await stack.wait_idle()
    # The access log and the per-route metrics name the routes.
    lines = [r.access for r in caplog.records if r.name == "llmtrio.access"]  # type: ignore[attr-defined]
    paths = [line["path"] for line in lines]
    assert paths.count(TOKENIZE_PATH) >= 10 and paths.count(DETOKENIZE_PATH) == 4
    assert 'path="/tokenize",status="200"' in metrics.text
    assert 'path="/detokenize",status="400"' in metrics.text


async def test_an_embedding_model_tokenizes_too(minilm_path: Path) -> None:
    """The endpoints need no generating model: on an embedding model's engine they answer
    with its tokenizer (BERT's ``[CLS] ... [SEP]`` with ``add_special``)."""
    meta = ResponseMeta("id", 0, "minilm")

    async def answer(endpoint: Any, request: Any) -> Any:
        async with endpoint.run(engine, request) as events:
            [done] = [event async for event in events]
        return json.loads(endpoint.encoder(request, meta).finish(done))

    async with EmbeddingEngine.open(engine_config(minilm_path, threads=1)) as engine:
        assert TOKENIZE_ENDPOINT.model_kind is None and DETOKENIZE_ENDPOINT.model_kind is None
        body = {"content": "hello world", "add_special": True}
        special = await answer(TOKENIZE_ENDPOINT, parse_tokenize_request(json.dumps(body).encode()))
        assert special["tokens"] == engine.tokenize("hello world")
        body = {"content": "hello world"}
        bare = await answer(TOKENIZE_ENDPOINT, parse_tokenize_request(json.dumps(body).encode()))
        assert bare["tokens"] == special["tokens"][1:-1]
        request = parse_detokenize_request(json.dumps({"tokens": bare["tokens"]}).encode())
        assert (await answer(DETOKENIZE_ENDPOINT, request))["content"].strip() == "hello world"


def test_over_the_ring_with_a_remote_worker(
    tmp_path: Path, gemma_path: Path, qwen35_real_path: Path
) -> None:
    """Real processes: an ingress and a worker serving gemma and the Qwen-vocabulary model,
    with ``--default-max-tokens`` (the worker's own limit: limits do not travel over the
    ring). Each tokenizer answers for its model; a chat request without ``max_tokens`` stops
    at the worker's default."""
    qwen = qwen35_real_path.stem
    with Ring.opened(tmp_path, gemma_path) as ring:
        ingress = ring.ingress("ingress")
        ring.worker("w", [ingress], None, f"--model={qwen35_real_path}", "--default-max-tokens=3")
        with httpx.Client(base_url=ingress.url, timeout=120) as client:
            wait_until(
                lambda: len(client.get("/v1/models").json()["data"]) == 2, "both models served"
            )
            qwen_tokens = client.post(TOKENIZE_PATH, json={"model": qwen, "content": "<|im_end|>"})
            assert qwen_tokens.status_code == 200 and qwen_tokens.json() == {"tokens": [IM_END]}
            gemma = client.post(
                TOKENIZE_PATH, json={"model": gemma_path.stem, "content": "Hi", "add_special": True}
            )
            assert gemma.status_code == 200 and gemma.json()["tokens"][0] == 2  # gemma's BOS
            back = client.post(DETOKENIZE_PATH, json={"model": qwen, "tokens": [IM_END]})
            assert back.json() == {"content": "<|im_end|>"}
            messages = [{"role": "user", "content": "Hi"}]
            chat = client.post(
                CHAT_PATH,
                json={"model": gemma_path.stem, "messages": messages, "ignore_eos": True},
            )
            assert chat.status_code == 200, chat.text
            assert chat.json()["usage"]["completion_tokens"] == 3
            assert chat.json()["choices"][0]["finish_reason"] == "length"
            assert client.post(TOKENIZE_PATH, json={"content": "a"}).status_code == 400  # 2 models
            unknown = client.post(TOKENIZE_PATH, json={"content": "a", "model": "nowhere"})
            assert unknown.status_code == 404
            assert unknown.json()["error"]["code"] == "model_not_found"
