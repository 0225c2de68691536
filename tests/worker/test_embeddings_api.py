"""``POST /v1/embeddings`` through the official ``openai`` client: against ``llmtrio serve``
(an in-process worker behind the ring) and against a remote worker attached over TLS; every
400 the endpoint gives, and a request for the other kind of model."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import openai
import pytest
import trio

from llmtrio.api import CHAT_PATH, COMPLETIONS_PATH, EMBEDDINGS_PATH
from llmtrio.cli import run_worker
from llmtrio.ring import Ring, client_ssl_context
from llmtrio.web import ServeConfig, serve_ingress
from llmtrio.worker import RequestLimits

from .._helpers import engine_config, wait_until
from .._server import LiveServer, start_server
from ..engine.test_embeddings import assert_matches
from ..ring.test_ring_remote import Pki, pki, start_ingress, wait_attached

__all__ = ["pki"]  # the fixture, used by name

MAX_INPUTS = 8


@pytest.fixture(scope="module")
def server(minilm_path: Path) -> Iterator[LiveServer]:
    """``llmtrio serve --model all-MiniLM-L6-v2-Q8_0.gguf --max-embedding-inputs 8``."""
    live = start_server(
        engine_config(minilm_path),
        ServeConfig(host="127.0.0.1", port=0, graceful_timeout=2),
        RequestLimits(max_embedding_inputs=MAX_INPUTS),
    )
    yield live
    live.stop()


@pytest.fixture
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="none", max_retries=0)


def test_the_openai_client_gets_sentence_transformers_vectors(
    client: openai.OpenAI, minilm_reference: dict[str, Any]
) -> None:
    inputs = minilm_reference["inputs"]
    response = client.embeddings.create(
        model="all-MiniLM-L6-v2-Q8_0", input=inputs, encoding_format="float"
    )
    assert response.object == "list"
    assert response.model == "all-MiniLM-L6-v2-Q8_0"
    assert [item.index for item in response.data] == list(range(len(inputs)))
    assert all(item.object == "embedding" for item in response.data)
    assert_matches(
        np.array([item.embedding for item in response.data]), minilm_reference["embeddings"]
    )
    assert response.usage.prompt_tokens == response.usage.total_tokens
    assert response.usage.prompt_tokens > len(inputs) * 2  # [CLS] and [SEP] each, and words


def test_base64_decodes_to_the_float_vectors(client: openai.OpenAI) -> None:
    texts = ["The cat sits on the mat.", "Ein Hund läuft im Park."]
    floats = client.embeddings.create(model="m", input=texts, encoding_format="float")
    # the raw base64 strings, as the server sent them
    raw = client.embeddings.with_raw_response.create(
        model="m", input=texts, encoding_format="base64"
    )
    body = raw.http_response.json()
    for item, want in zip(body["data"], floats.data, strict=True):
        decoded = np.frombuffer(base64.b64decode(item["embedding"]), dtype="<f4")
        # the same float32 numbers (the JSON numbers are written with float32's 9 digits)
        assert decoded.tolist() == np.asarray(want.embedding, dtype=np.float32).tolist()
    # the client's default asks for base64 and decodes it itself
    default = client.embeddings.create(model="m", input=texts)
    assert np.array_equal(
        np.asarray([d.embedding for d in default.data], dtype=np.float32),
        np.asarray([d.embedding for d in floats.data], dtype=np.float32),
    )


def test_token_ids_embed_as_their_text_does(client: openai.OpenAI, server: LiveServer) -> None:
    text = "A quick brown fox."
    by_text = client.embeddings.create(model="m", input=text, encoding_format="float")
    tokens = [101, 1037, 4248, 2829, 4419, 1012, 102]  # [CLS] a quick brown fox . [SEP]
    one = client.embeddings.create(model="m", input=tokens, encoding_format="float")
    many = client.embeddings.create(model="m", input=[tokens, tokens[:3]], encoding_format="float")
    assert one.usage.prompt_tokens == len(tokens) == by_text.usage.prompt_tokens
    assert len(many.data) == 2
    assert many.usage.prompt_tokens == len(tokens) + 3
    cosine = float(np.dot(by_text.data[0].embedding, one.data[0].embedding))
    assert cosine > 0.999


@pytest.mark.parametrize(
    ("kwargs", "param", "code"),
    [
        ({"input": "a", "dimensions": 8}, "dimensions", "unsupported_parameter"),
        ({"input": ""}, "input", "invalid_value"),
        ({"input": []}, "input", "invalid_value"),
        ({"input": ["fine", ""]}, "input[1]", "invalid_value"),
        ({"input": ["a"] * (MAX_INPUTS + 1)}, f"input[{MAX_INPUTS}]", "array_above_max_length"),
        ({"input": ["short", "word " * 600]}, "input[1]", "context_length_exceeded"),
        ({"input": [[101, 10**9, 102]]}, "input[0]", "invalid_value"),
    ],
)
def test_each_bad_request_is_a_400_naming_the_input(
    client: openai.OpenAI, kwargs: dict[str, Any], param: str, code: str
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.embeddings.create(model="m", encoding_format="float", **kwargs)
    assert caught.value.status_code == 400
    body = caught.value.body
    assert isinstance(body, dict)
    assert (body.get("param"), body.get("code")) == (param, code)


def test_chat_and_completions_on_an_embedding_model_are_a_400_naming_it(
    client: openai.OpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError, match=r"all-MiniLM-L6-v2-Q8_0.*embedding model"):
        client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=2
        )
    with pytest.raises(openai.BadRequestError, match="serves /v1/embeddings"):
        client.completions.create(model="m", prompt="hi", max_tokens=2)


def test_metrics_count_embedding_requests_inputs_and_tokens(
    client: openai.OpenAI, server: LiveServer
) -> None:
    def scrape() -> dict[str, float]:
        text = httpx.get(server.url + "/metrics", timeout=10).text
        found: dict[str, float] = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, value = line.rpartition(" ")
                found[name] = float(value)
        return found

    http = 'llmtrio_http_requests_total{path="/v1/embeddings",status="200",status_class="2xx"}'
    before = scrape()
    response = client.embeddings.create(model="m", input=["one", "two", "three"])
    # the ingress counts a request as it ends, which may be just after the client has it

    def counted() -> dict[str, float] | None:
        now = scrape()
        return now if now.get(http, 0.0) > before.get(http, 0.0) else None

    after = wait_until(counted, f"{http} counted", within=5)

    def moved(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    model = '{model_name="all-MiniLM-L6-v2-Q8_0"}'  # the engine's figures name their model
    assert moved("llmtrio_embedding_requests_total" + model) == 1
    assert moved("llmtrio_embedding_inputs_total" + model) == 3
    assert moved("vllm:prompt_tokens_total" + model) == response.usage.prompt_tokens
    assert moved(http) == 1


async def test_a_remote_worker_serves_embeddings_over_the_ring(
    minilm_path: Path, qwen35_path: Path, minilm_reference: dict[str, Any], pki: Pki
) -> None:
    """Two ingresses' worth of set-up in one: an embedding worker behind one ring, a chat
    worker behind another; each answers its own kind and refuses the other with a 400."""
    config = ServeConfig(host="127.0.0.1", port=0, graceful_timeout=1)
    async with trio.open_nursery() as nursery, httpx.AsyncClient(timeout=60) as http:
        shutdown = trio.Event()
        urls = []
        for name, model in (("embed", minilm_path), ("chat", qwen35_path)):
            ring = Ring(max_streams=64, park_timeout=30)
            control = await start_ingress(nursery, pki, ring)
            binds = await nursery.start(
                partial(serve_ingress, ring, config, model_name=name, shutdown=shutdown)
            )
            context = client_ssl_context(pki.worker(name), None, pki.ingress_ca)
            await nursery.start(
                partial(
                    run_worker,
                    engine_config(model),
                    [control],
                    context,
                    shutdown=shutdown,
                    name=name,
                )
            )
            await wait_attached(ring, 1)
            urls.append(binds[0])
        embed_url, chat_url = urls
        inputs = minilm_reference["inputs"]

        async def post(url: str, path: str, body: dict[str, Any]) -> httpx.Response:
            return await http.post(url + path, json=body)

        # 16 concurrent requests over the ring, each matching the reference
        results: dict[int, list[float]] = {}

        async def one(i: int) -> None:
            response = await post(embed_url, EMBEDDINGS_PATH, {"input": inputs[i % 7]})
            assert response.status_code == 200, response.text
            results[i] = response.json()["data"][0]["embedding"]

        async with trio.open_nursery() as requests:
            for i in range(16):
                requests.start_soon(one, i)
        assert_matches(
            np.array([results[i] for i in range(16)]),
            [minilm_reference["embeddings"][i % 7] for i in range(16)],
        )
        # no model named, and no default: the one model attached serves the other kind
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        wrong = await post(embed_url, CHAT_PATH, chat)
        assert wrong.status_code == 400
        error = wrong.json()["error"]
        assert error["code"] == "missing_required_parameter"
        assert "'all-MiniLM-L6-v2-Q8_0' serves embedding only" in error["message"]
        wrong = await post(embed_url, CHAT_PATH, chat | {"model": "all-MiniLM-L6-v2-Q8_0"})
        assert wrong.status_code == 400
        assert "embedding model" in wrong.json()["error"]["message"]
        wrong = await post(chat_url, EMBEDDINGS_PATH, {"input": "hi"})
        assert wrong.status_code == 400
        error = wrong.json()["error"]
        assert error["param"] == "model"
        assert "'qwen35-tiny-random' serves chat and completion only" in error["message"]
        ok = await post(chat_url, COMPLETIONS_PATH, {"prompt": "hi", "max_tokens": 2})
        assert ok.status_code == 200
        shutdown.set()
        nursery.cancel_scope.cancel()
