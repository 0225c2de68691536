"""The access log: one ``llmtrio.access`` line per request at the ingress, and the request id
(the client's own when sane) sent back and logged."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from llmtrio.engine import EngineConfig
from llmtrio.web import ServeConfig
from llmtrio.web._access import ResponseObserver, request_id

from ._stack import open_stack

CHAT = "/v1/chat/completions"
HI = [{"role": "user", "content": "Count from one to ten."}]
JSON = [(b"content-type", b"application/json")]
SSE = [(b"content-type", b"text/event-stream")]


def test_a_sane_client_request_id_is_kept_and_any_other_replaced() -> None:
    for sane in ("abc", "0b7c2d1e-5f9a-4c1b-8e2f-9d3a4b5c6d7e", "trace:1/2+3=4@x", "a" * 128):
        assert request_id({"x-request-id": sane}) == sane
    for wild in ("", "a" * 129, "with space", "new\nline", "-leading", "ünï", '"quoted"'):
        made = request_id({"x-request-id": wild})
        assert made.startswith("req-") and made != wild
    assert request_id({}).startswith("req-")
    assert request_id({}) != request_id({})


def test_the_observer_reads_a_json_completion_and_an_error() -> None:
    seen = ResponseObserver()
    seen.start(200, JSON)
    seen.body(b'{"choices":[{"index":0,"finish_reason":"length"}],', True)
    seen.body(b'"usage":{"prompt_tokens":7,"completion_tokens":3}}', False)
    assert (seen.status, seen.finish_reason, seen.prompt_tokens, seen.completion_tokens) == (
        200,
        "length",
        7,
        3,
    )
    assert seen.complete and seen.error_code is None
    error = ResponseObserver()
    error.start(503, JSON)
    error.body(b'{"error":{"message":"m","type":"server_error","param":null,"code":null}}', False)
    assert error.error_code == "server_error"  # its type when it has no code


def test_the_observer_reads_events_split_anywhere() -> None:
    events = (
        b'data: {"choices":[{"delta":{"content":"a"},"finish_reason":null}]}\n\n'
        b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n'
        b'data: {"choices":[],"usage":{"prompt_tokens":5,"completion_tokens":2}}\n\n'
        b'data: {"error":{"message":"m","type":"server_error","code":"worker_failed"}}\n\n'
        b"data: [DONE]\n\n"
    )
    for cut in range(1, len(events), 7):
        seen = ResponseObserver()
        seen.start(200, SSE)
        seen.body(events[:cut], True)
        assert not seen.complete
        seen.body(events[cut:], True)
        seen.body(b"", False)
        assert seen.complete
        assert (seen.finish_reason, seen.prompt_tokens, seen.completion_tokens) == ("stop", 5, 2)
        assert seen.error_code == "worker_failed"


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.access for r in caplog.records if r.name == "llmtrio.access"]  # type: ignore[attr-defined]


async def test_one_access_line_per_request_with_what_it_was_answered(
    gemma_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmtrio.access")
    engine = EngineConfig(model=gemma_path, max_inflight=2, ctx_size=512, threads=2)
    config = ServeConfig(host="127.0.0.1", port=0, ring_streams=8, graceful_timeout=1)
    async with open_stack(engine, config) as stack, httpx.AsyncClient(timeout=60) as http:
        plain = await http.post(
            stack.url + CHAT,
            json={"messages": HI, "max_tokens": 4, "ignore_eos": True},
            headers={"X-Request-Id": "client-id-1"},
        )
        assert plain.status_code == 200
        assert plain.headers["x-request-id"] == "client-id-1"
        streamed = await http.post(
            stack.url + CHAT,
            json={"messages": HI, "max_tokens": 3, "ignore_eos": True, "stream": True},
            headers={"X-Request-Id": "not a sane id"},
        )
        assert streamed.status_code == 200
        made = streamed.headers["x-request-id"]
        assert made.startswith("req-")
        refused = await http.post(stack.url + CHAT, json={"messages": "hi"})
        assert refused.status_code == 400
        health = await http.get(stack.url + "/health")
        assert health.headers["x-request-id"].startswith("req-")
        await stack.wait_idle()
    lines = access_lines(caplog)
    assert [(line["method"], line["path"], line["status"]) for line in lines] == [
        ("POST", CHAT, 200),
        ("POST", CHAT, 200),
        ("POST", CHAT, 400),
        ("GET", "/health", 200),
    ]
    first, second, third, fourth = lines
    usage = plain.json()["usage"]
    assert first["request_id"] == "client-id-1"
    assert first["worker"] == "local"
    assert first["finish_reason"] == "length"
    assert (first["prompt_tokens"], first["completion_tokens"]) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    assert first["complete"] is True
    assert 0 <= first["ttfb_s"] <= first["total_s"]
    assert second["request_id"] == made
    assert second["finish_reason"] == "length"
    assert second["completion_tokens"] is None  # streamed without include_usage: not told
    assert third["error"] == "invalid_type" and third["finish_reason"] is None
    assert fourth["worker"] is None and fourth["request_id"] == health.headers["x-request-id"]
    # The line itself, for a log reader: key=value pairs.
    message = next(r.getMessage() for r in caplog.records if r.name == "llmtrio.access")
    assert "request_id=client-id-1 worker=local" in message
    assert "status=200" in message and "finish_reason=length" in message
