"""Prometheus metrics: ``GET /metrics`` scraped before and after real requests on the real
stack, each counter moved by exactly what was sent; the engine-less ingress's 503s; a remote
worker's metrics port."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from llmtrio.api import CHAT_PATH, COMPLETIONS_PATH, TOKENIZE_PATH
from llmtrio.cli import run_worker, serve_metrics
from llmtrio.cli._catalog import CatalogModel
from llmtrio.ring import Heartbeat, RequestHead, Ring, RingConfig, client_ssl_context
from llmtrio.web import IngressMetrics, ServeConfig, serve_ingress

from .._helpers import engine_config, eventually, open_ingress
from .._stack import open_stack
from ..ring.test_ring_remote import Pki, pki, start_ingress, wait_attached

__all__ = ["pki"]  # the fixture, used by name

HI = [{"role": "user", "content": "Count from one to ten."}]
KV = "vllm:kv_cache_usage_perc"

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def parse(text: str) -> Samples:
    """Every sample of a scrape, keyed by name and sorted labels; each appears once."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            assert key not in samples, f"{key} twice in one scrape"
            samples[key] = sample.value
    return samples


async def scrape(http: httpx.AsyncClient, url: str) -> Samples:
    response = await http.get(url)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain")
    return parse(response.text)


def value(samples: Samples, name: str, **labels: str) -> float:
    """The sample ``name`` with exactly ``labels``, but for an engine's ``model_name``
    label, which matches any model unless given (these stacks serve one model)."""
    found = 0.0
    for (sample, have), measured in samples.items():
        rest = {k: v for k, v in have if k != "model_name" or "model_name" in labels}
        if sample == name and rest == labels:
            found += measured
    return found


def moved(before: Samples, after: Samples, name: str, **labels: str) -> float:
    return value(after, name, **labels) - value(before, name, **labels)


def sse_events(data: bytes) -> list[Any]:
    return [
        json.loads(block[6:])
        for block in data.split(b"\n\n")
        if block.startswith(b"data: ") and block != b"data: [DONE]"
    ]


async def test_metrics_move_by_exactly_what_was_sent(gemma_path: Path) -> None:
    engine = engine_config(gemma_path, max_inflight=2, ctx_size=512)
    config = ServeConfig(port=0, ring=RingConfig(max_streams=8), graceful_timeout=1)
    async with open_stack(engine, config) as stack, httpx.AsyncClient(timeout=60) as http:
        metrics = stack.url + "/metrics"
        before = await scrape(http, metrics)
        assert value(before, "llmtrio_workers_attached") == 1
        assert value(before, "vllm:num_requests_running") == 0

        usages = []
        plain = await http.post(
            stack.url + CHAT_PATH, json={"messages": HI, "max_tokens": 5, "ignore_eos": True}
        )
        assert plain.status_code == 200, plain.text
        usages.append(plain.json()["usage"])
        streamed = await http.post(
            stack.url + CHAT_PATH,
            json={
                "messages": HI,
                "max_tokens": 4,
                "ignore_eos": True,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        )
        assert streamed.status_code == 200
        usages.append(sse_events(streamed.content)[-1]["usage"])
        text = await http.post(
            stack.url + COMPLETIONS_PATH,
            json={"prompt": "One, two,", "max_tokens": 3, "ignore_eos": True},
        )
        assert text.status_code == 200, text.text
        usages.append(text.json()["usage"])
        refused = await http.post(stack.url + CHAT_PATH, json={"max_tokens": 3})
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "missing_required_parameter"
        await stack.wait_idle()
        after = await scrape(http, metrics)

        def delta(name: str, **labels: str) -> float:
            return moved(before, after, name, **labels)

        prompt = sum(u["prompt_tokens"] for u in usages)
        cached = sum(u["prompt_tokens_details"]["cached_tokens"] for u in usages)
        completion = sum(u["completion_tokens"] for u in usages)
        assert completion == 5 + 4 + 3
        # Ingress: requests by path and status, errors by code, completions by finish reason.
        ok = {"status": "200", "status_class": "2xx"}
        assert delta("llmtrio_http_requests_total", path=CHAT_PATH, **ok) == 2
        assert delta("llmtrio_http_requests_total", path=COMPLETIONS_PATH, **ok) == 1
        refusals = {"status": "400", "status_class": "4xx"}
        assert delta("llmtrio_http_requests_total", path=CHAT_PATH, **refusals) == 1
        assert delta("llmtrio_request_errors_total", code="missing_required_parameter") == 1
        assert delta("llmtrio_request_finish_total", finish_reason="length") == 3
        assert delta("llmtrio_request_duration_seconds_count") == 4
        assert delta("llmtrio_time_to_first_byte_seconds_count") == 4
        assert delta("llmtrio_client_disconnects_total") == 0
        # Engine (llama.cpp's names): tokens in and out, exactly.
        # Prompt tokens ingested; those reused from the prompt cache are prefix-cache hits.
        assert delta("llamacpp:prompt_tokens_total") == prompt - cached
        assert delta("vllm:prefix_cache_queries_total") == prompt
        assert delta("vllm:prefix_cache_hits_total") == cached
        assert delta("llamacpp:tokens_predicted_total") == completion
        decodes = delta("llamacpp:n_decode_total")
        # At least one step per token of the longest request, but for the draft tokens
        # accepted (several tokens a step).
        accepted = delta("vllm:spec_decode_num_accepted_tokens_total")
        assert accepted <= delta("vllm:spec_decode_num_draft_tokens_total")
        assert decodes + accepted >= 5
        assert 1 <= value(after, "llamacpp:n_busy_slots_per_decode") <= 2
        # Per request (vLLM's names): one observation per finished request.
        for name in (
            "vllm:time_to_first_token_seconds_count",
            "vllm:e2e_request_latency_seconds_count",
            "vllm:request_queue_time_seconds_count",
            "vllm:request_prompt_tokens_count",
            "vllm:request_generation_tokens_count",
            "vllm:request_time_per_output_token_seconds_count",
        ):
            assert delta(name) == 3, name
        assert delta("vllm:request_prompt_tokens_sum") == prompt
        assert delta("vllm:request_generation_tokens_sum") == completion
        assert delta("vllm:request_success_total", finished_reason="length") == 3
        # Idle again: nothing running, waiting, parked or cached.
        for name in (
            "vllm:num_requests_running",
            "vllm:num_requests_waiting",
            "vllm:kv_cache_usage_perc",
            "llamacpp:requests_processing",
            "llamacpp:requests_deferred",
            "llmtrio_ring_parked_streams",
            "llmtrio_ring_serving_streams",
        ):
            assert value(after, name) == 0, name
        assert value(after, "llmtrio_worker_held_streams", worker="local") == 0
        assert 0 <= value(after, "llmtrio_worker_heartbeat_age_seconds", worker="local") < 60


async def test_gauges_show_a_running_request_and_a_client_leaving(gemma_path: Path) -> None:
    engine = engine_config(gemma_path, max_inflight=2, ctx_size=512)
    config = ServeConfig(port=0, ring=RingConfig(max_streams=8), graceful_timeout=1)
    async with open_stack(engine, config) as stack, httpx.AsyncClient(timeout=60) as http:
        before = await scrape(http, stack.url + "/metrics")
        body = {"messages": HI, "max_tokens": 400, "ignore_eos": True, "stream": True}
        async with http.stream("POST", stack.url + CHAT_PATH, json=body) as response:
            chunks = response.aiter_bytes()  # kept: a generator left behind closes the stream
            await anext(chunks)  # the first token is out: the request holds a slot

            # The ring's KV usage is what the worker's heartbeat (every 0.5 s) last said.
            async def kv_reported() -> Samples | None:
                samples = await scrape(http, stack.url + "/metrics")
                return samples if value(samples, KV) else None

            during = await eventually(kv_reported, f"{KV} above 0 in /metrics", within=30)
            await chunks.aclose()
        await stack.wait_idle()
        after = await scrape(http, stack.url + "/metrics")
    assert value(during, "vllm:num_requests_running") == 1
    assert value(during, "llamacpp:requests_processing") == 1
    assert value(during, "llmtrio_ring_serving_streams") == 1
    assert 0 < value(during, "vllm:kv_cache_usage_perc") < 1
    assert value(during, "vllm:cache_config_info", block_size="16", num_gpu_blocks="64") == 1
    assert moved(before, after, "llmtrio_client_disconnects_total") == 1
    assert value(after, "vllm:num_requests_running") == 0
    # A cancelled request is no success; the 200 head went out, so it counts as a 200.
    assert moved(before, after, "vllm:request_success_total", finished_reason="length") == 0


async def test_an_ingress_without_workers_counts_its_503s() -> None:
    ring = Ring(max_streams=1, park_timeout=0.2)
    config = ServeConfig(host="127.0.0.1", port=0, graceful_timeout=1)
    async with open_ingress(ring, config) as server:
        http, url = server.client, server.url
        before = await scrape(http, url + "/metrics")
        response = await http.post(url + CHAT_PATH, json={"messages": HI})
        assert response.status_code == 503
        assert response.json()["error"]["code"] == "no_worker"
        after = await scrape(http, url + "/metrics")
    unavailable = {"path": CHAT_PATH, "status": "503", "status_class": "5xx"}
    assert moved(before, after, "llmtrio_http_requests_total", **unavailable) == 1
    assert moved(before, after, "llmtrio_request_errors_total", code="no_worker") == 1
    assert value(after, "llmtrio_workers_attached") == 0
    assert value(after, "llmtrio_ring_max_streams") == 1
    # An engine-less ingress has no engine figures; it has the picker's gauges for its ring.
    picker = {KV, "vllm:num_requests_running", "vllm:num_requests_waiting"}
    vllm = {name for name, _ in after if name.startswith(("vllm:", "llamacpp:"))}
    assert vllm == {*picker, "vllm:cache_config_info"}
    assert all(value(after, name) == 0 for name in picker)
    # The scrape before this one was counted too.
    ok = {"status": "200", "status_class": "2xx"}
    assert value(after, "llmtrio_http_requests_total", path="/metrics", **ok) == 1


async def test_the_metrics_server_serves_its_registry_only_at_metrics() -> None:
    from prometheus_client import CollectorRegistry, Counter

    registry = CollectorRegistry()
    Counter("things", "Things.", registry=registry).inc(3)
    async with trio.open_nursery() as nursery, httpx.AsyncClient(timeout=30) as http:
        url = await nursery.start(serve_metrics, registry)
        assert url.startswith("http://127.0.0.1:")
        samples = await scrape(http, url)
        assert value(samples, "things_total") == 3
        assert (await http.get(url.replace("/metrics", "/other"))).status_code == 404
        assert (await http.post(url)).status_code == 405
        nursery.cancel_scope.cancel()


async def test_a_remote_worker_serves_its_engine_metrics_on_its_metrics_port(
    gemma_path: Path, pki: Pki
) -> None:
    engine = engine_config(gemma_path, max_inflight=2, ctx_size=512)
    ring = Ring(max_streams=8, park_timeout=30)
    config = ServeConfig(host="127.0.0.1", port=0, graceful_timeout=1)
    async with trio.open_nursery() as nursery, httpx.AsyncClient(timeout=60) as http:
        control = await start_ingress(nursery, pki, ring)
        shutdown = trio.Event()
        binds = await nursery.start(
            partial(serve_ingress, ring, config, model_name="m", shutdown=shutdown)
        )
        context = client_ssl_context(pki.worker("w1"), None, pki.ingress_ca)
        worker_metrics = await nursery.start(
            partial(
                run_worker,
                engine,
                [control],
                context,
                shutdown=shutdown,
                name="w1",
                metrics_address=("127.0.0.1", 0),
            )
        )
        assert worker_metrics.startswith("http://127.0.0.1:")
        await wait_attached(ring, 1)
        before = await scrape(http, worker_metrics)
        response = await http.post(
            binds[0] + CHAT_PATH, json={"messages": HI, "max_tokens": 4, "ignore_eos": True}
        )
        assert response.status_code == 200, response.text
        usage = response.json()["usage"]
        after = await scrape(http, worker_metrics)
        ingress = await scrape(http, binds[0] + "/metrics")
        nursery.cancel_scope.cancel()
    assert moved(before, after, "llamacpp:tokens_predicted_total") == usage["completion_tokens"]
    ingested = usage["prompt_tokens"] - usage["prompt_tokens_details"]["cached_tokens"]
    assert moved(before, after, "llamacpp:prompt_tokens_total") == ingested
    assert moved(before, after, "vllm:request_success_total", finished_reason="length") == 1
    assert value(after, "vllm:num_requests_running") == 0
    # The worker serves no ingress metrics; the ingress shows the worker by its name.
    ingress_only = ("llmtrio_http_", "llmtrio_ring_", "llmtrio_worker", "llmtrio_request")
    assert not any(name.startswith(ingress_only) for name, _ in after)
    assert value(ingress, "llmtrio_workers_attached") == 1
    ages = [dict(labels)["worker"] for name, labels in ingress if name.endswith("age_seconds")]
    assert len(ages) == 1 and ages[0].startswith("w1"), ages  # its attachment, w1#1


async def test_an_ingress_exports_the_pickers_gauges_for_its_own_ring() -> None:
    """What the Inference Extension's endpoint picker reads from an ingress: its parked and
    served requests, and the KV-cache usage over its workers (cells in use over cells; a
    worker that reports no KV cache is left out)."""
    ring = Ring(max_streams=8)
    registry = IngressMetrics(ring).registry
    head = RequestHead("POST", CHAT_PATH)
    async with (
        ring.attach("a", 2) as a,
        ring.attach("b", 4) as b,
        ring.attach("old", 1) as old,
    ):
        a.heartbeat(Heartbeat(1, 2, 1, 1, kv_used=1000, kv_total=4096))
        b.heartbeat(Heartbeat(2, 4, 2, 2, kv_used=3000, kv_total=12288))
        old.heartbeat(Heartbeat(1, 1, 0, 1))  # before the KV fields
        served = ring.park(head)
        claimed = await a.claim()
        await claimed.send_head(200, [])
        parked = [ring.park(head) for _ in range(3)]
        samples = parse(generate_latest(registry).decode())
        assert value(samples, "vllm:num_requests_waiting") == 3
        assert value(samples, "vllm:num_requests_running") == 1
        assert value(samples, KV) == pytest.approx(4000 / 16384)
        info = {"block_size": "16", "num_gpu_blocks": str(16384 // 16)}
        assert value(samples, "vllm:cache_config_info", **info) == 1
        for stream in [served, *parked]:
            stream.cancel()
        claimed.fail("done")


async def test_a_tokenize_request_is_not_counted_as_a_generation(gemma_path: Path) -> None:
    """``/tokenize`` (and the other answers that generate nothing) count in a counter of
    their own; the per-request series of generations (TTFT, end to end, queue, lengths,
    successes) count the one chat request only."""
    engine = engine_config(gemma_path, max_inflight=2, ctx_size=512)
    config = ServeConfig(port=0, ring=RingConfig(max_streams=8), graceful_timeout=1)
    async with open_stack(engine, config) as stack, httpx.AsyncClient(timeout=60) as http:
        metrics = stack.url + "/metrics"
        before = await scrape(http, metrics)
        tokenized = await http.post(stack.url + TOKENIZE_PATH, json={"content": "Hello there"})
        assert tokenized.status_code == 200, tokenized.text
        chat = await http.post(
            stack.url + CHAT_PATH, json={"messages": HI, "max_tokens": 3, "ignore_eos": True}
        )
        assert chat.status_code == 200, chat.text
        await stack.wait_idle()
        after = await scrape(http, metrics)

    def delta(name: str, **labels: str) -> float:
        return moved(before, after, name, **labels)

    for name in (
        "vllm:time_to_first_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
        "vllm:request_queue_time_seconds_count",
        "vllm:request_prompt_tokens_count",
        "vllm:request_generation_tokens_count",
    ):
        assert delta(name) == 1, name
    assert delta("vllm:request_success_total", finished_reason="length") == 1
    assert delta("vllm:request_success_total", finished_reason="stop") == 0
    assert delta("llmtrio_tokenize_requests_total") == 1


async def test_a_remote_worker_serves_a_model_on_demands_series(
    qwen35_path: Path, pki: Pki
) -> None:
    """``llmtrio worker``'s composition root passes its metrics to the links of its models on
    demand too: a chat request to one moves its per-request series on the worker's port."""
    catalog = [
        CatalogModel(
            "tiny",
            engine_config(qwen35_path, model_name="tiny", threads=1, max_inflight=2, ctx_size=256),
            "models-file",
        )
    ]
    ring = Ring(max_streams=8, park_timeout=30)
    config = ServeConfig(host="127.0.0.1", port=0, graceful_timeout=1)
    async with trio.open_nursery() as nursery, httpx.AsyncClient(timeout=60) as http:
        control = await start_ingress(nursery, pki, ring)
        shutdown = trio.Event()
        binds = await nursery.start(
            partial(serve_ingress, ring, config, model_name="", shutdown=shutdown)
        )
        context = client_ssl_context(pki.worker("w1"), None, pki.ingress_ca)
        worker_metrics = await nursery.start(
            partial(
                run_worker,
                [],
                [control],
                context,
                shutdown=shutdown,
                name="w1",
                metrics_address=("127.0.0.1", 0),
                on_demand=catalog,
            )
        )
        await wait_attached(ring, 1)
        before = await scrape(http, worker_metrics)
        body = {"model": "tiny", "messages": HI, "max_tokens": 3, "ignore_eos": True}
        response = await http.post(binds[0] + CHAT_PATH, json=body)
        assert response.status_code == 200, response.text
        after = await scrape(http, worker_metrics)
        nursery.cancel_scope.cancel()
    tiny = {"model_name": "tiny"}
    for name in (
        "vllm:time_to_first_token_seconds_count",
        "vllm:request_time_per_output_token_seconds_count",
        "vllm:e2e_request_latency_seconds_count",
    ):
        assert moved(before, after, name, **tiny) == 1, name
    assert moved(before, after, "vllm:request_generation_tokens_sum", **tiny) == 3
