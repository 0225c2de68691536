"""Every refusal in its route family's shape (issue 42): each of the ingress's own refusals,
and those of the worker a client meets first, on an OpenAI route (chat completions: its
``{"error": {...}}``, its statuses) and on Anthropic's (``/v1/messages``: ``{"type":
"error", "error": {"type", "message"}}``, every 503 a 529 ``overloaded_error``), one test per
refusal and family. The ingress's run with no worker behind it (nothing to load); the
worker's on gemma and MiniLM."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from llmtrio.api import (
    ANTHROPIC_ERRORS,
    ANTHROPIC_TYPES,
    CHAT_PATH,
    EMBEDDINGS_PATH,
    MESSAGES_PATH,
    OPENAI_ERRORS,
    ErrorFamily,
)
from llmtrio.ring import Ring, RingConfig
from llmtrio.web import ServeConfig

from .._helpers import engine_config, eventually, open_ingress
from .._server import LiveServer, start_server

#: Each family: a route of it, a path under it no route serves, and its error family.
FAMILIES = {
    "openai": (CHAT_PATH, "/v1/chat/completionsx", OPENAI_ERRORS),
    "anthropic": (MESSAGES_PATH, "/v1/messages/batches", ANTHROPIC_ERRORS),
}
BODY = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
KEY = "sekret"


@pytest.fixture(params=sorted(FAMILIES))
def family(request: pytest.FixtureRequest) -> tuple[str, str, ErrorFamily]:
    path, unknown, errors = FAMILIES[request.param]
    return path, unknown, errors


def check(response: httpx.Response, errors: ErrorFamily, status: int, code: str | None) -> None:
    """``response`` is the refusal of ``status`` (OpenAI's; Anthropic's 529 for a 503) in
    ``errors``' shape: OpenAI's with its ``code``, Anthropic's with the type its status has."""
    body = response.json()
    if errors is OPENAI_ERRORS:
        assert response.status_code == status, body
        assert set(body) == {"error"} and body["error"]["code"] == code, body
        assert {"message", "type", "param", "code"} <= set(body["error"])
        return
    anthropic_status = 529 if status == 503 else status
    assert response.status_code == anthropic_status, body
    assert set(body) == {"type", "error"} and body["type"] == "error", body
    assert set(body["error"]) == {"type", "message"}
    assert body["error"]["type"] == ANTHROPIC_TYPES[anthropic_status]


@asynccontextmanager
async def ingress(
    *, park_timeout: float = 0.05, max_streams: int = 8, **config: Any
) -> AsyncIterator[Any]:
    """An ingress with no worker behind it; ``config``, more of its ``ServeConfig``."""
    ring = Ring(max_streams=max_streams, park_timeout=park_timeout)
    serve = ServeConfig(host="127.0.0.1", port=0, graceful_timeout=2, **config)
    async with open_ingress(ring, serve, model_name="") as server:
        yield server


async def parked(server: Any) -> None:
    """Once a request is parked in the ring."""

    async def one() -> bool:
        return bool((await server.client.get("/health")).json()["ring"]["parked"])

    await eventually(one, "a request parked")


# -- the ingress's own --------------------------------------------------------------------------


async def test_a_missing_key(family: tuple[str, str, ErrorFamily]) -> None:
    path, _, errors = family
    async with ingress(api_keys=[KEY]) as server:
        check(await server.client.post(path, json=BODY), errors, 401, "invalid_api_key")


async def test_a_host_not_served(family: tuple[str, str, ErrorFamily]) -> None:
    path, _, errors = family
    async with ingress() as server:
        answer = await server.client.post(path, json=BODY, headers={"host": "evil.example"})
        check(answer, errors, 403, "host_not_allowed")


async def test_an_origin_not_allowed(family: tuple[str, str, ErrorFamily]) -> None:
    path, _, errors = family
    async with ingress() as server:
        answer = await server.client.post(
            path, json=BODY, headers={"origin": "http://evil.example"}
        )
        check(answer, errors, 403, "origin_not_allowed")


async def test_an_unknown_path(family: tuple[str, str, ErrorFamily]) -> None:
    _, unknown, errors = family
    async with ingress() as server:
        check(await server.client.post(unknown, json=BODY), errors, 404, "unknown_url")


async def test_a_wrong_method(family: tuple[str, str, ErrorFamily]) -> None:
    path, _, errors = family
    async with ingress() as server:
        check(await server.client.get(path), errors, 405, "method_not_allowed")


async def test_a_body_too_large(family: tuple[str, str, ErrorFamily]) -> None:
    path, _, errors = family
    async with ingress(max_body_bytes=100) as server:
        answer = await server.client.post(path, content=b"x" * 1000)
        check(answer, errors, 413, "request_too_large")


async def test_a_body_that_does_not_arrive(family: tuple[str, str, ErrorFamily]) -> None:
    path, _, errors = family
    async with ingress(body_timeout=0.3, idle_timeout=30) as server:
        host, port = server.url.removeprefix("http://").rsplit(":", 1)
        stream = await trio.open_tcp_stream(host, int(port))
        await stream.send_all(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            'Content-Length: 100\r\n\r\n{"messages"'.encode()
        )
        answer = b""
        with trio.fail_after(10):
            while b"\r\n\r\n" not in answer or not answer.endswith(b"}"):
                answer += await stream.receive_some()
        await stream.aclose()
        head, body = answer.split(b"\r\n\r\n", 1)
        status = int(head.split(b" ")[1])
        check(httpx.Response(status, content=body), errors, 408, "request_timeout")


async def test_over_the_rate_limit(family: tuple[str, str, ErrorFamily]) -> None:
    path, _, errors = family
    async with ingress(rate_limit=1) as server:
        await server.client.post(path, json=BODY)  # no worker: a quick 503
        limited = await server.client.post(path, json=BODY)
        check(limited, errors, 429, "rate_limit_exceeded")
        assert "retry-after" in limited.headers


async def test_no_worker_takes_it(family: tuple[str, str, ErrorFamily]) -> None:
    path, _, errors = family
    async with ingress() as server:
        check(await server.client.post(path, json=BODY), errors, 503, "no_worker")


async def test_a_full_ring(family: tuple[str, str, ErrorFamily]) -> None:
    path, _, errors = family
    async with ingress(park_timeout=3, max_streams=1) as server, trio.open_nursery() as nursery:
        nursery.start_soon(partial(server.client.post, path, json=BODY))  # parked
        await parked(server)
        full = await server.client.post(path, json=BODY)
        check(full, errors, 503, "ring_full")
        assert "retry-after" in full.headers
        nursery.cancel_scope.cancel()


async def test_a_draining_server(family: tuple[str, str, ErrorFamily]) -> None:
    path, _, errors = family
    async with ingress(park_timeout=3) as server, trio.open_nursery() as nursery:
        nursery.start_soon(partial(server.client.post, path, json=BODY))  # holds it open
        await parked(server)
        server.shutdown.set()

        async def draining() -> bool:
            return (await server.client.get("/health")).json()["status"] == "draining"

        await eventually(draining, "/health saying draining")
        check(await server.client.post(path, json=BODY), errors, 503, "shutting_down")
        nursery.cancel_scope.cancel()


async def test_a_model_no_worker_serves(family: tuple[str, str, ErrorFamily]) -> None:
    path, _, errors = family
    async with ingress() as server:
        answer = await server.client.post(path, json={**BODY, "model": "nope"})
        check(answer, errors, 404, "model_not_found")


# -- the worker's, on real models -------------------------------------------------------------


@pytest.fixture(scope="module")
def served(gemma_path: Path, minilm_path: Path) -> Iterator[LiveServer]:
    server = start_server(
        [
            engine_config(gemma_path, max_inflight=1, ctx_size=256, threads=1),
            engine_config(minilm_path, max_inflight=1, ctx_size=256, threads=1),
        ],
        ServeConfig(host="127.0.0.1", port=0, ring=RingConfig(max_streams=4), graceful_timeout=1),
    )
    yield server
    server.stop()


def test_a_body_that_is_not_json(served: LiveServer, family: tuple[str, str, ErrorFamily]) -> None:
    path, _, errors = family
    answer = httpx.post(served.url + path, content=b"{not json", timeout=30)
    check(answer, errors, 400, None)


def test_a_model_of_the_other_kind(
    served: LiveServer, family: tuple[str, str, ErrorFamily]
) -> None:
    path, _, errors = family
    models = [m["id"] for m in httpx.get(served.url + "/v1/models").json()["data"]]
    embedding = next(m for m in models if "MiniLM" in m or "minilm" in m.lower())
    answer = httpx.post(served.url + path, json={**BODY, "model": embedding}, timeout=30)
    check(answer, errors, 400, "model_not_supported")
    chat = next(m for m in models if m != embedding)
    refused = httpx.post(served.url + EMBEDDINGS_PATH, json={"model": chat, "input": "x"})
    check(refused, OPENAI_ERRORS, 400, "model_not_supported")


def test_a_prompt_over_the_context(
    served: LiveServer, family: tuple[str, str, ErrorFamily]
) -> None:
    path, _, errors = family
    long = {**BODY, "messages": [{"role": "user", "content": "word " * 400}]}
    answer = httpx.post(served.url + path, json=long, timeout=30)
    check(answer, errors, 400, "context_length_exceeded")
    if errors is ANTHROPIC_ERRORS:  # the wording Claude Code compacts on
        assert json.loads(answer.text)["error"]["message"].startswith("prompt is too long")
