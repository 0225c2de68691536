"""The access log: one ``llmtrio.access`` line per request at the ingress, and the request id
(the client's own when sane) sent back and logged. What a request ended with is the outcome
its worker stated, or what the ingress knows happened (its own errors, the client leaving,
the deadline, the worker failing), never read from the response's bytes."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from llmtrio.api import CHAT_PATH
from llmtrio.ring import Claimed, Outcome, Ring, RingConfig, WorkerLink
from llmtrio.web import ServeConfig
from llmtrio.web._access import request_id

from .._helpers import engine_config, eventually
from .._stack import open_stack
from ..worker.test_metrics import moved, scrape
from .test_drain import ingress

HI = [{"role": "user", "content": "Count from one to ten."}]


def test_a_sane_client_request_id_is_kept_and_any_other_replaced() -> None:
    for sane in ("abc", "0b7c2d1e-5f9a-4c1b-8e2f-9d3a4b5c6d7e", "trace:1/2+3=4@x", "a" * 128):
        assert request_id({"x-request-id": sane}) == sane
    for wild in ("", "a" * 129, "with space", "new\nline", "-leading", "ünï", '"quoted"'):
        made = request_id({"x-request-id": wild})
        assert made.startswith("req-") and made != wild
    assert request_id({}).startswith("req-")
    assert request_id({}) != request_id({})


def access_lines(caplog: pytest.LogCaptureFixture) -> list[dict[str, Any]]:
    return [r.access for r in caplog.records if r.name == "llmtrio.access"]  # type: ignore[attr-defined]


async def test_one_access_line_per_request_with_what_it_was_answered(
    gemma_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="llmtrio.access")
    engine = engine_config(gemma_path, max_inflight=2, ctx_size=512)
    config = ServeConfig(port=0, ring=RingConfig(max_streams=8), graceful_timeout=1)
    async with open_stack(engine, config) as stack, httpx.AsyncClient(timeout=60) as http:
        plain = await http.post(
            stack.url + CHAT_PATH,
            json={"messages": HI, "max_tokens": 4, "ignore_eos": True},
            headers={"X-Request-Id": "client-id-1"},
        )
        assert plain.status_code == 200
        assert plain.headers["x-request-id"] == "client-id-1"
        streamed = await http.post(
            stack.url + CHAT_PATH,
            json={"messages": HI, "max_tokens": 3, "ignore_eos": True, "stream": True},
            headers={"X-Request-Id": "not a sane id"},
        )
        assert streamed.status_code == 200
        made = streamed.headers["x-request-id"]
        assert made.startswith("req-")
        refused = await http.post(stack.url + CHAT_PATH, json={"messages": "hi"})
        assert refused.status_code == 400
        health = await http.get(stack.url + "/health")
        assert health.headers["x-request-id"].startswith("req-")
        await stack.wait_idle()
    lines = access_lines(caplog)
    assert [(line["method"], line["path"], line["status"]) for line in lines] == [
        ("POST", CHAT_PATH, 200),
        ("POST", CHAT_PATH, 200),
        ("POST", CHAT_PATH, 400),
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
    assert first["cached_tokens"] == usage["prompt_tokens_details"]["cached_tokens"]
    assert first["complete"] is True
    assert 0 <= first["ttfb_s"] <= first["total_s"]
    assert second["request_id"] == made
    assert second["finish_reason"] == "length"
    # Streamed without include_usage: the body tells no usage, the worker's outcome does.
    assert second["completion_tokens"] == 3
    assert third["error"] == "invalid_type" and third["finish_reason"] is None
    assert fourth["worker"] is None and fourth["request_id"] == health.headers["x-request-id"]
    # The line itself, for a log reader: key=value pairs.
    message = next(r.getMessage() for r in caplog.records if r.name == "llmtrio.access")
    assert "request_id=client-id-1 worker=local" in message
    assert "status=200" in message and "finish_reason=length" in message
    assert "cached_tokens=" in message


# -- what the log and metrics record, with a worker written by hand ---------------------------

STOP = Outcome(finish_reason="stop", prompt_tokens=12, cached_tokens=8, completion_tokens=5)
JSON_HEAD = [("content-type", "application/json")]
SSE_HEAD = [("content-type", "text/event-stream")]
STREAM = {"messages": HI, "stream": True}
# A body that says other things than the outcome its worker states: the log follows the outcome.
MISLEADING = (
    b'{"choices":[{"index":0,"finish_reason":"length"}],'
    b'"usage":{"prompt_tokens":1,"completion_tokens":1},'
    b'"error":{"message":"m","type":"server_error","code":"from_the_body"}}'
)


@asynccontextmanager
async def one_worker(
    caplog: pytest.LogCaptureFixture, **more: Any
) -> AsyncIterator[tuple[WorkerLink, Any, trio.Nursery]]:
    """An ingress (access lines captured) on a ring with one worker, ``w#1``, attached in
    this process, and a nursery for the worker's side that closes before the ingress."""
    caplog.set_level(logging.INFO, logger="llmtrio.access")
    ring = Ring(max_streams=8)
    async with (
        ring.attach("w#1", 2, models=["m"]) as link,
        ingress(ring, 1, **more) as server,
        trio.open_nursery() as nursery,
    ):
        yield link, server, nursery


async def claim(link: WorkerLink) -> Claimed:
    with trio.fail_after(10):
        return await link.claim()


async def line_of(caplog: pytest.LogCaptureFixture, count: int = 1) -> dict[str, Any]:
    """The last access line, once ``count`` requests have been logged."""
    await eventually(lambda: len(access_lines(caplog)) >= count)
    return access_lines(caplog)[-1]


async def test_the_log_and_metrics_follow_the_stated_outcome_not_the_body(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with one_worker(caplog) as (link, server, nursery):
        before = await scrape(server.client, str(server.client.base_url) + "/metrics")

        async def answer(last: bytes, outcome: Outcome | None, head: Any) -> None:
            claimed = await claim(link)
            await claimed.send_head(200, head)
            await claimed.end(last, outcome=outcome)

        nursery.start_soon(answer, MISLEADING, STOP, JSON_HEAD)
        plain = await server.client.post(CHAT_PATH, json={"messages": HI})
        assert plain.content == MISLEADING
        first = await line_of(caplog, 2)  # the scrape, then this
        nursery.start_soon(answer, b"data: " + MISLEADING + b"\n\n", None, SSE_HEAD)
        streamed = await server.client.post(CHAT_PATH, json=STREAM)
        assert streamed.status_code == 200
        second = await line_of(caplog, 3)
        after = await scrape(server.client, str(server.client.base_url) + "/metrics")
        server.shutdown.set()
    assert (first["status"], first["complete"], first["worker"]) == (200, True, "w#1")
    assert (first["finish_reason"], first["error"]) == ("stop", None)
    tokens = (first["prompt_tokens"], first["cached_tokens"], first["completion_tokens"])
    assert tokens == (12, 8, 5)
    # A worker that states nothing (the previous version): nothing is read from its bytes.
    assert (second["status"], second["complete"]) == (200, True)
    assert [second[k] for k in ("finish_reason", "error", "prompt_tokens", "cached_tokens")] == [
        None
    ] * 4
    assert moved(before, after, "llmtrio_request_finish_total", finish_reason="stop") == 1
    assert moved(before, after, "llmtrio_request_finish_total", finish_reason="length") == 0
    assert moved(before, after, "llmtrio_request_errors_total", code="from_the_body") == 0


async def test_a_worker_error_is_logged_with_its_stated_code_and_counts(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stated = Outcome(error_code="context_length_exceeded", prompt_tokens=9000)
    async with one_worker(caplog) as (link, server, nursery):

        async def refuse() -> None:
            claimed = await claim(link)
            await claimed.send_head(400, JSON_HEAD)
            await claimed.end(b"{}", outcome=stated)

        nursery.start_soon(refuse)
        assert (await server.client.post(CHAT_PATH, json={"messages": HI})).status_code == 400
        line = await line_of(caplog)
        server.shutdown.set()
    assert (line["status"], line["error"], line["prompt_tokens"]) == (
        400,
        "context_length_exceeded",
        9000,
    )
    assert line["completion_tokens"] is None


async def test_a_client_that_leaves_before_the_answer_is_a_499_client_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="llmtrio.access")
    ring = Ring(max_streams=8)
    async with ring.attach("w#1", 2, models=["m"]) as link, ingress(ring, 1) as server:
        async with trio.open_nursery() as client:
            client.start_soon(partial(server.client.post, CHAT_PATH, json={"messages": HI}))
            claimed = await claim(link)
            client.cancel_scope.cancel()  # the client hangs up, no answer yet
        with trio.fail_after(10):
            await claimed.cancelled.wait()
        line = await line_of(caplog)
        server.shutdown.set()
    assert line["path"] == CHAT_PATH
    assert (line["status"], line["complete"], line["error"]) == (499, False, "client_closed")
    assert line["prompt_tokens"] is None and line["ttfb_s"] is None


async def test_a_client_that_leaves_mid_stream_keeps_its_status_and_is_client_closed(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with one_worker(caplog) as (link, server, nursery):
        metrics = str(server.client.base_url) + "/metrics"
        before = await scrape(server.client, metrics)
        claimed: list[Claimed] = []
        nursery.start_soon(lambda: start_one(link, claimed))
        async with server.client.stream("POST", CHAT_PATH, json=STREAM) as response:
            chunks = response.aiter_raw()
            assert await anext(chunks) == b"data: one\n\n"
            await chunks.aclose()
        with trio.fail_after(10):
            await claimed[0].cancelled.wait()
        line = await line_of(caplog, 2)
        after = await scrape(server.client, metrics)
        server.shutdown.set()
    assert (line["status"], line["complete"], line["error"]) == (200, False, "client_closed")
    assert line["finish_reason"] is None and line["completion_tokens"] is None
    assert moved(before, after, "llmtrio_client_disconnects_total") == 1
    assert moved(before, after, "llmtrio_request_errors_total", code="client_closed") == 0


async def start_one(link: WorkerLink, claimed: list[Claimed]) -> None:
    """Claim the next stream, start its event stream with one event and keep it open."""
    stream = await claim(link)
    await stream.send_head(200, SSE_HEAD)
    await stream.send(b"data: one\n\n")
    claimed.append(stream)


async def test_past_the_deadline_is_timeout_before_and_after_the_head(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with one_worker(caplog, request_timeout=0.5) as (link, server, nursery):
        claimed: list[Claimed] = []
        nursery.start_soon(lambda: start_one(link, claimed))
        streamed = await server.client.post(CHAT_PATH, json=STREAM)  # ended by the deadline
        cut = await line_of(caplog)
        nursery.start_soon(claim, link)  # claimed, never answered
        plain = await server.client.post(CHAT_PATH, json={"messages": HI})
        refused = await line_of(caplog, 2)
        server.shutdown.set()
    assert streamed.status_code == 200 and b'"code":"timeout"' in streamed.content
    assert (cut["status"], cut["complete"], cut["error"]) == (200, True, "timeout")
    assert plain.status_code == 504
    assert (refused["status"], refused["error"], refused["ttfb_s"] is not None) == (
        504,
        "timeout",
        True,
    )
    assert cut["prompt_tokens"] is None and refused["prompt_tokens"] is None


async def test_a_failed_worker_is_worker_failed_with_the_counts_it_stated(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with one_worker(caplog) as (link, server, nursery):

        async def fail_before_the_head() -> None:
            (await claim(link)).fail("boom")

        nursery.start_soon(fail_before_the_head)
        before = await server.client.post(CHAT_PATH, json={"messages": HI})
        first = await line_of(caplog)

        async def fail_mid_stream() -> None:
            claimed: list[Claimed] = []
            await start_one(link, claimed)
            claimed[0].fail("boom", outcome=Outcome(prompt_tokens=7))

        nursery.start_soon(fail_mid_stream)
        streamed = await server.client.post(CHAT_PATH, json=STREAM)
        second = await line_of(caplog, 2)
        server.shutdown.set()
    assert before.status_code == 502
    assert (first["status"], first["error"], first["prompt_tokens"]) == (502, "worker_failed", None)
    assert streamed.status_code == 200 and b'"code":"worker_failed"' in streamed.content
    assert (second["status"], second["complete"], second["error"]) == (200, True, "worker_failed")
    assert second["prompt_tokens"] == 7


async def test_the_ingress_and_the_pages_app_record_their_own_error_codes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="llmtrio.access")
    ring = Ring(max_streams=8, park_timeout=0.05)
    async with ingress(ring, 1) as server:
        assert (await server.client.post(CHAT_PATH, json={"messages": HI})).status_code == 503
        assert (await server.client.get("/nowhere")).status_code == 404
        lines = [await line_of(caplog, 2)]
        server.shutdown.set()
    no_worker, missing = access_lines(caplog)
    assert lines[0] == missing
    assert (no_worker["status"], no_worker["error"]) == (503, "no_worker")
    assert (missing["status"], missing["error"]) == (404, "unknown_url")
