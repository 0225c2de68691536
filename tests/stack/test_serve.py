"""``llmtrio serve`` end to end: the official openai client, raw HTTP, errors, aborts."""

from __future__ import annotations

import asyncio
import json
import re
import ssl
from pathlib import Path

import httpx
import openai
import pytest
import trio
import trustme

from llmtrio.api import CHAT_PATH, CONTEXT_LENGTH_NAMES
from llmtrio.ring import RingConfig
from llmtrio.web import ServeConfig

from .._helpers import engine_config
from .._server import LiveServer, start_server

MESSAGES = [{"role": "user", "content": "Write a short poem about the sea."}]


def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)


def model_id(server: LiveServer) -> str:
    return str(httpx.get(server.url + "/v1/models").json()["data"][0]["id"])


def sse_events(raw: bytes) -> list[str]:
    text = raw.decode()
    assert text.endswith("\n\n"), text[-50:]
    events = text[:-2].split("\n\n")
    assert all(e.startswith("data: ") for e in events), events
    return [e[len("data: ") :] for e in events]


# -- the official client ------------------------------------------------------------------


def test_openai_client_non_streaming(live_server: LiveServer) -> None:
    completion = client(live_server).chat.completions.create(
        model=model_id(live_server),
        messages=MESSAGES,
        max_tokens=8,
        temperature=0,  # type: ignore[arg-type]
    )
    choice = completion.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason in ("stop", "length")
    assert completion.usage is not None
    assert 1 <= completion.usage.completion_tokens <= 8
    assert completion.usage.prompt_tokens > 5
    assert completion.model == model_id(live_server)


def test_openai_client_streaming_with_usage(live_server: LiveServer) -> None:
    # Both requests below ingest the whole prompt (``cache_prompt: false``), so they run the
    # same batch shapes and their greedy tokens are defined equal; with prompt reuse the
    # second's first logits would come from a different batch and could differ in the last
    # bits (a greedy near-tie can flip on some CPUs).
    stream = client(live_server).chat.completions.create(
        model=model_id(live_server),
        messages=MESSAGES,  # type: ignore[arg-type]
        max_tokens=12,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"cache_prompt": False},
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    finishes = [
        c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason
    ]
    assert finishes == ["length"] or finishes == ["stop"]
    assert chunks[-1].choices == []
    assert chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens <= 12
    # Greedy: the stream says what the non-streaming answer says.
    whole = client(live_server).chat.completions.create(
        model=model_id(live_server),
        messages=MESSAGES,
        max_tokens=12,
        temperature=0,  # type: ignore[arg-type]
        extra_body={"cache_prompt": False},
    )
    assert text == whole.choices[0].message.content


def test_openai_async_client(live_server: LiveServer) -> None:
    async def main() -> tuple[str, str]:
        async with openai.AsyncOpenAI(
            base_url=live_server.url + "/v1", api_key="unused", max_retries=0
        ) as aclient:
            whole = await aclient.chat.completions.create(
                model="any",
                messages=MESSAGES,
                max_tokens=10,
                temperature=0,  # type: ignore[arg-type]
            )
            stream = await aclient.chat.completions.create(
                model="any",
                messages=MESSAGES,
                max_tokens=10,
                temperature=0,
                stream=True,  # type: ignore[arg-type]
            )
            parts = [c.choices[0].delta.content or "" async for c in stream if c.choices]
            return whole.choices[0].message.content or "", "".join(parts)

    whole, streamed = asyncio.run(main())
    assert whole and whole == streamed


def test_openai_client_sees_a_bad_request(live_server: LiveServer) -> None:
    with pytest.raises(openai.BadRequestError) as info:
        client(live_server).chat.completions.create(
            model="any",
            messages=MESSAGES,
            n=2,  # type: ignore[arg-type]
        )
    assert info.value.status_code == 400
    assert info.value.param == "n"


# -- raw HTTP ---------------------------------------------------------------------------


def test_sse_framing_done_and_usage(live_server: LiveServer) -> None:
    body = {
        "messages": MESSAGES,
        "max_tokens": 6,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = httpx.post(live_server.url + CHAT_PATH, json=body, timeout=60)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.content)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    assert chunks[-2]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == 6
    assert chunks[-1]["usage"]["total_tokens"] == 6 + chunks[-1]["usage"]["prompt_tokens"]


def test_stop_sequence_and_max_completion_tokens(live_server: LiveServer) -> None:
    url = live_server.url + CHAT_PATH
    base = {"messages": MESSAGES, "temperature": 0, "max_completion_tokens": 20}
    full = httpx.post(url, json=base, timeout=60).json()["choices"][0]["message"]["content"]
    words = full.split()
    assert len(words) >= 3, full
    stopped = httpx.post(url, json={**base, "stop": [words[2]]}, timeout=60).json()
    assert stopped["choices"][0]["finish_reason"] == "stop"
    assert stopped["choices"][0]["message"]["content"] == full[: full.index(words[2])]


ERROR_CASES = [
    (b"{not json", 400, None),
    (b"[]", 400, None),
    (json.dumps({"model": "x"}).encode(), 400, "messages"),
    (json.dumps({"messages": "hi"}).encode(), 400, "messages"),
    (json.dumps({"messages": [{"role": "user"}]}).encode(), 400, "messages[0].content"),
    (json.dumps({"messages": MESSAGES, "temperature": "hot"}).encode(), 400, "temperature"),
    (json.dumps({"messages": MESSAGES, "temperature": 3}).encode(), 400, "temperature"),
    (json.dumps({"messages": MESSAGES, "max_tokens": 0}).encode(), 400, "max_tokens"),
    (json.dumps({"messages": MESSAGES, "n": 3}).encode(), 400, "n"),
    (json.dumps({"messages": MESSAGES, "stream": "yes"}).encode(), 400, "stream"),
]


@pytest.mark.parametrize(("body", "status", "param"), ERROR_CASES)
def test_bad_requests_get_openai_errors(
    live_server: LiveServer, body: bytes, status: int, param: str | None
) -> None:
    response = httpx.post(
        live_server.url + CHAT_PATH,
        content=body,
        headers={"content-type": "application/json"},
    )
    assert response.status_code == status
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["type"] == "invalid_request_error"
    assert error["message"]
    if param is not None:
        assert error["param"] == param


def test_prompt_longer_than_a_slot(live_server: LiveServer) -> None:
    body = {"messages": [{"role": "user", "content": "word " * 2000}]}
    response = httpx.post(live_server.url + CHAT_PATH, json=body, timeout=60)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "context_length_exceeded"
    assert "512" in error["message"]


def test_body_too_large_wrong_method_unknown_path(live_server: LiveServer) -> None:
    url = live_server.url + CHAT_PATH
    response = httpx.post(
        url, content=b"x" * (2 << 20), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413
    assert response.json()["error"]["code"] == "request_too_large"
    response = httpx.get(url)
    assert response.status_code == 405
    assert response.json()["error"]["message"]
    assert "POST" in response.headers["allow"]
    response = httpx.get(live_server.url + "/v1/nothing")
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "invalid_request_error"


def test_health_models_and_page(live_server: LiveServer) -> None:
    health = live_server.health()
    assert health["status"] == "ok"
    assert (
        health["capacity"]
        == {"inflight": 0, "decoding": 0, "max_inflight": 4, "available_slots": 4}
        or health["capacity"]["max_inflight"] == 4
    )  # type: ignore[index]
    ring = health["ring"]
    assert isinstance(ring, dict) and ring["parked"] == 0
    models = httpx.get(live_server.url + "/v1/models").json()
    assert models["object"] == "list"
    assert models["data"][0]["object"] == "model"
    assert models["data"][0]["id"] == health["model"]
    # The context length, under each name clients read (issue 42): a slot's 512 tokens.
    lengths = {k: models["data"][0].get(k) for k in CONTEXT_LENGTH_NAMES}
    assert lengths == {"context_length": 512, "max_model_len": 512, "max_context_length": 512}
    page = httpx.get(live_server.url + "/")
    assert page.status_code == 200
    assert page.headers["content-type"].startswith("text/html")
    assert b"<script" in page.content
    # One file, nothing fetched from elsewhere (it must work offline).
    assert not re.search(rb"""(src|href)\s*=\s*["']?(https?:)?//""", page.content)


def test_health_answers_while_the_engine_is_busy(live_server: LiveServer) -> None:
    """/health is answered between decode steps, not after the generations: every answer
    comes while all four streams are still running (no wall-clock bound)."""
    body = {"messages": MESSAGES, "max_tokens": 400, "ignore_eos": True, "stream": True}

    async def main() -> None:
        async with httpx.AsyncClient(timeout=60) as http, trio.open_nursery() as nursery:
            started = trio.Semaphore(0)
            finished = 0

            async def stream() -> None:
                nonlocal finished
                async with http.stream("POST", live_server.url + CHAT_PATH, json=body) as response:
                    chunks = response.aiter_raw()
                    await anext(chunks)
                    started.release()
                    async for _ in chunks:
                        pass
                finished += 1

            for _ in range(4):
                nursery.start_soon(stream)
            for _ in range(4):
                await started.acquire()
            for _ in range(10):
                response = await http.get(live_server.url + "/health")
                assert response.json()["capacity"]["inflight"] == 4
                assert finished == 0
            nursery.cancel_scope.cancel()

    trio.run(main)
    live_server.wait_idle()


def test_aborted_streams_free_their_slots(live_server: LiveServer) -> None:
    body = {
        "messages": MESSAGES,
        "max_tokens": 400,
        "stream": True,
        "logit_bias": {},
        "ignore_eos": True,
    }

    async def main() -> None:
        async with httpx.AsyncClient(timeout=60) as http:

            async def abort_after(chunks: int) -> None:
                async with http.stream("POST", live_server.url + CHAT_PATH, json=body) as r:
                    assert r.status_code == 200
                    seen = 0
                    async for _ in r.aiter_raw():
                        seen += 1
                        if seen >= chunks:
                            return  # closing the response hangs up mid-stream

            async with trio.open_nursery() as nursery:
                for i in range(6):  # more than the 4 slots: some abort while parked
                    nursery.start_soon(abort_after, 2 + i)

    trio.run(main)
    live_server.wait_idle()
    health = live_server.health()
    assert health["ring"]["parked"] == 0  # type: ignore[index]


def test_ring_full_answers_503_with_retry_after(gemma_path: Path) -> None:
    server = start_server(
        engine_config(gemma_path, max_inflight=1, ctx_size=256),
        ServeConfig(port=0, ring=RingConfig(max_streams=1), graceful_timeout=1),
    )
    try:
        body = {"messages": MESSAGES, "max_tokens": 200, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", server.url + CHAT_PATH, json=body, timeout=60) as first:
            assert first.status_code == 200
            response = httpx.post(server.url + CHAT_PATH, json=body)
            assert response.status_code == 503
            assert int(response.headers["retry-after"]) >= 1
            assert response.json()["error"]["code"] == "ring_full"
    finally:
        server.stop()


def test_https_with_a_certificate(gemma_path: Path, tmp_path: Path) -> None:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    server = start_server(
        engine_config(gemma_path, max_inflight=1, ctx_size=128),
        ServeConfig(port=0, tls_cert=tmp_path / "cert.pem", tls_key=tmp_path / "key.pem"),
    )
    try:
        assert server.url.startswith("https://")
        response = httpx.get(
            server.url + "/v1/models", verify=ssl.create_default_context(cafile=tmp_path / "ca.pem")
        )
        assert response.status_code == 200
    finally:
        server.stop()


def test_plain_http_is_refused_off_loopback() -> None:
    with pytest.raises(ValueError, match="loopback"):
        ServeConfig(host="0.0.0.0")


def test_shutdown_lets_a_running_stream_finish(gemma_path: Path) -> None:
    server = start_server(
        engine_config(gemma_path, max_inflight=1, ctx_size=256),
        ServeConfig(port=0, graceful_timeout=30),
    )
    body = {"messages": MESSAGES, "max_tokens": 24, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", server.url + CHAT_PATH, json=body, timeout=60) as r:
        chunks = r.iter_raw()
        first = next(chunks)
        assert first
        import threading

        stopper = threading.Thread(target=server.stop)
        stopper.start()
        rest = b"".join(chunks)
    stopper.join(timeout=60)
    assert (first + rest).endswith(b"data: [DONE]\n\n")


def test_a_client_giving_up_on_a_non_streaming_request_frees_its_slot(
    live_server: LiveServer,
) -> None:
    body = {"messages": MESSAGES, "max_tokens": 400, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(live_server.url + CHAT_PATH, json=body, timeout=1.5)
    live_server.wait_idle()


def test_the_next_turn_reports_its_reused_prompt_tokens(live_server: LiveServer) -> None:
    """Turn 2 of a conversation reuses turn 1's prompt: ``usage`` says how many tokens were
    cached (OpenAI's ``prompt_tokens_details``), ``timings`` too (llama.cpp's ``cache_n``),
    and ``/health`` counts the hit."""
    messages = [{"role": "user", "content": "Name three rivers of Europe, one line each."}]
    url = live_server.url + CHAT_PATH
    body = {"messages": messages, "max_tokens": 6, "temperature": 0}
    first = httpx.post(url, json=body, timeout=60).json()
    messages += [
        {"role": "assistant", "content": first["choices"][0]["message"]["content"]},
        {"role": "user", "content": "And of Asia?"},
    ]
    second = httpx.post(url, json=body, timeout=60).json()
    cached = second["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert first["usage"]["prompt_tokens"] - 4 <= cached < second["usage"]["prompt_tokens"]
    assert second["timings"]["cache_n"] == cached
    assert second["timings"]["prompt_n"] == second["usage"]["prompt_tokens"] - cached
    health = httpx.get(live_server.url + "/health", timeout=10).json()
    assert health["prompt_cache"]["hits"] >= 1
    assert health["prompt_cache"]["cached_tokens"] >= cached
    assert health["workers"][0]["capacity"]["prompt_cache"]["hits"] >= 1
