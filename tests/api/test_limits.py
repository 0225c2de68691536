"""Limits, each a flag with a safe default and a clear 4xx in OpenAI's shape naming it:
messages, max_tokens, stop strings (in the worker's parser), the per-request deadline, the
body and idle timeouts, and requests per key per minute (at the ingress)."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from llmtrio.api import CHAT_PATH, COMPLETIONS_PATH, OPENAI_ERRORS, ApiError
from llmtrio.cli._configs import request_limits, serve_config
from llmtrio.cli._main import _parser
from llmtrio.ring import Ring
from llmtrio.web import RateLimiter, ServeConfig
from llmtrio.worker import RequestLimits
from llmtrio.worker._chat_request import parse_chat_request
from llmtrio.worker._completions import parse_completion_request

from .._helpers import engine_config, open_ingress
from .._stack import open_stack

HI = [{"role": "user", "content": "Count from one to ten."}]


# -- the rate limiter, on a clock the test turns -------------------------------------------


def test_a_bucket_allows_a_burst_then_one_request_per_interval() -> None:
    limiter = RateLimiter(per_minute=3)
    assert [limiter.take("a", 0.0) for _ in range(3)] == [None, None, None]
    wait = limiter.take("a", 0.0)
    assert wait == pytest.approx(20.0)  # one token every 60/3 s
    assert limiter.take("a", 10.0) == pytest.approx(10.0)  # a refused try spends nothing
    assert limiter.take("a", 20.0) is None
    assert limiter.take("a", 20.0) == pytest.approx(20.0)
    assert limiter.take("b", 20.0) is None  # every key has its own bucket
    assert limiter.take("a", 1000.0) is None  # refilled, never past the burst
    assert [limiter.take("a", 1000.0) for _ in range(3)] == [None, None, pytest.approx(20.0)]


def test_the_limiter_forgets_full_buckets_first_and_stays_bounded() -> None:
    limiter = RateLimiter(per_minute=1, max_keys=3)
    for i, key in enumerate("abc"):
        assert limiter.take(key, float(i)) is None
    assert limiter.take("d", 3.0) is None  # a, b, c are all spent: the oldest (a) goes
    assert len(limiter._buckets) == 3 and "a" not in limiter._buckets
    assert limiter.take("b", 3.0) is not None  # b was kept, still spent
    assert limiter.take("e", 200.0) is None  # by now all are full again: all forgotten
    assert list(limiter._buckets) == ["e"]
    with pytest.raises(ValueError, match="per_minute must be at least 1"):
        RateLimiter(per_minute=0)


# -- request limits, in the worker's parser ------------------------------------------------


def refusal(call: Callable[[], object]) -> dict[str, Any]:
    with pytest.raises(ApiError) as caught:
        call()
    assert caught.value.status == 400
    error: dict[str, Any] = OPENAI_ERRORS.to_dict(caught.value)["error"]
    return error


def test_each_limit_is_a_400_naming_its_parameter() -> None:
    limits = RequestLimits(max_messages=2, max_tokens=8, max_stop=1, max_stop_chars=5)

    def chat(**fields: Any) -> bytes:
        return json.dumps({"messages": HI, **fields}).encode()

    assert parse_chat_request(chat(max_tokens=8, stop="abcde"), limits).generate.max_tokens == 8
    error = refusal(lambda: parse_chat_request(chat(messages=HI * 3), limits))
    assert (error["param"], error["code"]) == ("messages", "array_above_max_length")
    assert "maximum length 2" in error["message"]
    for field in ("max_tokens", "max_completion_tokens"):
        error = refusal(lambda field=field: parse_chat_request(chat(**{field: 9}), limits))
        assert (error["param"], error["code"]) == (field, "integer_above_max_value")
        assert "<= 8 (this server's limit), but got 9" in error["message"]
    error = refusal(lambda: parse_chat_request(chat(stop=["a", "b"]), limits))
    assert (error["param"], error["code"]) == ("stop", "array_above_max_length")
    error = refusal(lambda: parse_chat_request(chat(stop="abcdef"), limits))
    assert (error["param"], error["code"]) == ("stop", "string_above_max_length")
    # Text completions: the same max_tokens and stop limits; no max_tokens asks for 16 or the cap.
    text = json.dumps({"prompt": "Once"}).encode()
    assert parse_completion_request(text, limits).options["max_tokens"] == 8
    assert parse_completion_request(text).options["max_tokens"] == 16
    error = refusal(
        lambda: parse_completion_request(
            json.dumps({"prompt": "x", "max_tokens": 9}).encode(), limits
        )
    )
    assert error["param"] == "max_tokens"
    error = refusal(
        lambda: parse_completion_request(
            json.dumps({"prompt": "x", "stop": "abcdef"}).encode(), limits
        )
    )
    assert error["param"] == "stop"


def test_limits_have_safe_defaults_and_flags() -> None:
    defaults = RequestLimits()
    assert (defaults.max_messages, defaults.max_tokens, defaults.max_stop) == (2048, None, 4)
    worker = ["worker", "--ingress-url", "wss://h:1", "--tls-cert", "c", "--ca", "a"]
    limits = ["--max-messages", "10", "--max-tokens-limit", "100", "--max-stop", "2"]
    args = _parser().parse_args(
        [*worker, *limits, "--max-stop-chars", "50", "--metrics-port", "9100"]
    )
    assert request_limits(args) == RequestLimits(10, 100, 2, 50)
    assert (args.metrics_port, args.metrics_host) == (9100, "127.0.0.1")
    serve = serve_config(_parser().parse_args(["serve"]))
    assert (serve.request_timeout, serve.body_timeout, serve.idle_timeout) == (600, 60, 5)
    assert serve.rate_limit is None and request_limits(_parser().parse_args(["serve"])) == (
        RequestLimits()
    )
    assert (
        serve_config(_parser().parse_args(["serve", "--request-timeout=0"])).request_timeout is None
    )
    with pytest.raises(ValueError, match="max_messages"):
        RequestLimits(max_messages=0)
    with pytest.raises(ValueError, match="rate_limit must be at least 1"):
        ServeConfig(rate_limit=0)
    with pytest.raises(ValueError, match="request_timeout must be more than 0"):
        ServeConfig(request_timeout=-1)


async def test_limits_reach_the_worker_on_the_real_stack(gemma_path: Path) -> None:
    engine = engine_config(gemma_path, max_inflight=1, ctx_size=256)
    config = ServeConfig(host="127.0.0.1", port=0, graceful_timeout=1)
    limits = RequestLimits(max_messages=1, max_tokens=4, max_stop=1, max_stop_chars=3)
    async with open_stack(engine, config, limits) as stack, httpx.AsyncClient(timeout=60) as http:
        for fields, param in (
            ({"messages": HI * 2}, "messages"),
            ({"max_tokens": 5}, "max_tokens"),
            ({"stop": ["a", "b"]}, "stop"),
            ({"stop": "abcd"}, "stop"),
        ):
            response = await http.post(stack.url + CHAT_PATH, json={"messages": HI, **fields})
            assert response.status_code == 400, fields
            assert response.json()["error"]["param"] == param
        response = await http.post(
            stack.url + COMPLETIONS_PATH, json={"prompt": "One", "max_tokens": 5}
        )
        assert response.status_code == 400
        assert response.json()["error"]["param"] == "max_tokens"
        ok = await http.post(stack.url + CHAT_PATH, json={"messages": HI, "max_tokens": 4})
        assert ok.status_code == 200
        await stack.wait_idle()


# -- the per-request deadline ---------------------------------------------------------------


async def test_a_request_past_its_deadline_is_ended_streamed_or_not(gemma_path: Path) -> None:
    # 2000 tokens take far longer than the 6 s deadline, however fast the machine.
    engine = engine_config(gemma_path, max_inflight=2, ctx_size=2048)
    config = ServeConfig(host="127.0.0.1", port=0, graceful_timeout=1, request_timeout=6.0)
    long = {"messages": HI, "max_tokens": 2000, "ignore_eos": True}
    async with open_stack(engine, config) as stack, httpx.AsyncClient(timeout=60) as http:
        # Streamed first, on an idle engine, so its head is out well within the deadline.
        streamed = await http.post(stack.url + CHAT_PATH, json={**long, "stream": True})
        assert streamed.status_code == 200
        events = [
            json.loads(block[6:])
            for block in streamed.content.split(b"\n\n")
            if block.startswith(b"data: {")
        ]
        error = events[-1]["error"]
        assert (error["code"], error["param"]) == ("timeout", "request_timeout")
        tokens = sum(1 for e in events[:-1] if e.get("choices") and e["choices"][0]["delta"])
        assert 0 < tokens < 2000  # it streamed, then was cut
        plain = await http.post(stack.url + CHAT_PATH, json=long)
        assert plain.status_code == 504
        error = plain.json()["error"]
        assert (error["code"], error["param"], error["type"]) == (
            "timeout",
            "request_timeout",
            "server_error",
        )
        # Both generations were ended, not left to run to 2000 tokens each.
        await stack.wait_idle()
        assert stack.engine.stats.tokens_predicted < 2 * 2000


# -- ingress-only limits: rate, body and idle timeouts -------------------------------------


@asynccontextmanager
async def ingress(**config: Any) -> AsyncIterator[str]:
    """An ingress with no worker (requests end in a quick 503); ``config``, more of its
    ``ServeConfig``."""
    ring = Ring(max_streams=8, park_timeout=0.05)
    serve = ServeConfig(host="127.0.0.1", port=0, graceful_timeout=1, **config)
    async with open_ingress(ring, serve) as server:
        yield server.url


async def test_over_the_rate_limit_is_a_429_with_retry_after_per_key() -> None:
    async with ingress(rate_limit=2, api_keys=["k1", "k2"]) as url, httpx.AsyncClient() as http:

        async def post(key: str) -> httpx.Response:
            return await http.post(
                url + CHAT_PATH, json={"messages": HI}, headers={"X-Api-Key": key}
            )

        assert [(await post("k1")).status_code for _ in range(2)] == [503, 503]
        limited = await post("k1")
        assert limited.status_code == 429
        error = limited.json()["error"]
        assert (error["code"], error["type"]) == ("rate_limit_exceeded", "requests")
        assert 1 <= int(limited.headers["retry-after"]) <= 30
        assert (await post("k2")).status_code == 503  # another key, its own bucket
        # Health and the model list are not API requests: never limited.
        assert (await http.get(url + "/v1/models")).status_code == 200


async def test_without_keys_the_rate_limit_is_per_client_address() -> None:
    async with ingress(rate_limit=1) as url, httpx.AsyncClient() as http:
        assert (await http.post(url + CHAT_PATH, json={"messages": HI})).status_code == 503
        assert (await http.post(url + CHAT_PATH, json={"messages": HI})).status_code == 429


async def raw(url: str) -> trio.SocketStream:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port))


async def read_until_closed(stream: trio.SocketStream) -> bytes:
    data = b""
    with trio.fail_after(10):
        while chunk := await stream.receive_some():
            data += chunk
    return data


async def test_a_body_that_does_not_arrive_in_time_is_a_408() -> None:
    async with ingress(body_timeout=0.3, idle_timeout=30) as url:
        stream = await raw(url)
        await stream.send_all(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b'Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{"messages"'
        )
        answer = b""
        with trio.fail_after(10):
            while b"}}" not in answer:
                answer += await stream.receive_some()
        assert answer.startswith(b"HTTP/1.1 408 ")
        assert b'"code":"request_timeout"' in answer
        await stream.aclose()


async def test_idle_connections_and_slow_headers_are_closed() -> None:
    async with ingress(idle_timeout=0.3) as url:
        slow = await raw(url)
        await slow.send_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")  # never finished
        assert await read_until_closed(slow) == b""
        idle = await raw(url)
        await idle.send_all(b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = await read_until_closed(idle)  # answered, then closed once idle
        assert answer.startswith(b"HTTP/1.1 200 ")


async def test_a_connection_close_request_is_closed_once_answered() -> None:
    async with ingress(idle_timeout=60) as url:  # longer than read_until_closed waits
        stream = await raw(url)
        await stream.send_all(
            b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n"
        )
        answer = await read_until_closed(stream)
        assert answer.startswith(b"HTTP/1.1 200 ") and answer.endswith(b"]}")
