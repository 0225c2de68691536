"""Several models in one ``llmtrio serve`` process (gemma and the qwen35 test model), each
with its own engine and local worker claiming for its own model: requests route by ``model``,
``/v1/models`` and ``/health`` list both, and one model's full slots never hold up the other."""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from llmtrio.api import CHAT_PATH, COMPLETIONS_PATH, EMBEDDINGS_PATH
from llmtrio.cli import serve
from llmtrio.web import ServeConfig

from .._helpers import engine_config, eventually, wait_until
from .._procs import Ring

pytestmark = pytest.mark.slow


@pytest.fixture
async def two_models(gemma_path: Path, qwen35_path: Path) -> AsyncIterator[str]:
    configs = [
        engine_config(gemma_path, model_name="gemma", max_inflight=1, threads=1),
        engine_config(qwen35_path, max_inflight=2, threads=1),  # served under its stem
    ]
    shutdown = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(partial(serve, configs, ServeConfig(port=0), shutdown=shutdown))
        yield binds[0]
        shutdown.set()


def wait_models(client: httpx.Client, workers: dict[str, int]) -> list[dict[str, object]]:
    """``/v1/models`` once it lists ``workers`` (model -> workers serving it)."""

    def listed() -> list[dict[str, object]] | None:
        models: list[dict[str, object]] = client.get("/v1/models").json()["data"]
        return models if {str(m["id"]): m["workers"] for m in models} == workers else None

    return wait_until(listed, lambda: f"{workers} in {client.get('/v1/models').json()}", within=120)


def chat(model: str | None, *, max_tokens: int = 4, stream: bool = False) -> dict[str, object]:
    body: dict[str, object] = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": max_tokens,
        "stream": stream,
    }
    if model is not None:
        body["model"] = model
    return body


async def test_requests_route_by_model_and_answer_with_its_name(
    two_models: str, qwen35_path: Path
) -> None:
    qwen = qwen35_path.stem
    async with httpx.AsyncClient(base_url=two_models, timeout=120) as client:
        listed = (await client.get("/v1/models")).json()["data"]
        assert [(m["id"], m["kind"], m["workers"]) for m in listed] == [
            ("gemma", "chat", 1),
            (qwen, "chat", 1),
        ]
        health = (await client.get("/health")).json()
        assert sorted(tuple(w["models"]) for w in health["workers"]) == [("gemma",), (qwen,)]
        assert health["models"] == {
            "gemma": {"kind": "chat", "workers": 1},
            qwen: {"kind": "chat", "workers": 1},
        }
        generated = {}
        for model in ("gemma", qwen):
            answer = await client.post(CHAT_PATH, json=chat(model))
            assert answer.status_code == 200, answer.text
            assert answer.json()["model"] == model
            text = await client.post(COMPLETIONS_PATH, json={"model": model, "prompt": "a"})
            assert text.status_code == 200 and text.json()["model"] == model
            generated[model] = sum(r.json()["usage"]["completion_tokens"] for r in (answer, text))
        # /metrics: each engine's figures, labelled with its model (vLLM's model_name)
        samples = [
            sample
            for family in text_string_to_metric_families((await client.get("/metrics")).text)
            for sample in family.samples
        ]
        for model in ("gemma", qwen):
            mine = [s for s in samples if s.labels.get("model_name") == model]
            by_name = {s.name: s.value for s in mine if set(s.labels) == {"model_name"}}
            assert by_name["llamacpp:tokens_predicted_total"] == generated[model]
            assert by_name["llamacpp:n_decode_total"] > 0
            assert by_name["vllm:e2e_request_latency_seconds_count"] == 2
            successes = [s.value for s in mine if s.name == "vllm:request_success_total"]
            assert sum(successes) == 2

        unknown = await client.post(CHAT_PATH, json=chat("gpt-4o"))
        assert unknown.status_code == 404
        assert unknown.json()["error"]["code"] == "model_not_found"
        for omitted in (None, ""):
            missing = await client.post(CHAT_PATH, json=chat(omitted))
            assert missing.status_code == 400
            assert missing.json()["error"]["code"] == "missing_required_parameter"
            assert "gemma" in missing.json()["error"]["message"]
        wrong = await client.post(EMBEDDINGS_PATH, json={"model": "gemma", "input": "x"})
        assert wrong.status_code == 400 and wrong.json()["error"]["param"] == "model"


async def test_one_models_full_slots_never_hold_up_the_other(
    two_models: str, qwen35_path: Path
) -> None:
    """gemma has one slot: while a long gemma generation holds it and another gemma request
    waits parked, a qwen35 request is answered whole."""
    async with (
        httpx.AsyncClient(base_url=two_models, timeout=120) as client,
        client.stream("POST", CHAT_PATH, json=chat("gemma", max_tokens=200, stream=True)) as long,
    ):
        assert long.status_code == 200

        async def parked() -> int:
            return int((await client.get("/health")).json()["ring"]["parked"])

        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(client.post, CHAT_PATH, json=chat("gemma")))
            await eventually(parked, "a gemma request parked", within=60)
            other = await client.post(CHAT_PATH, json=chat(qwen35_path.stem))
            assert other.status_code == 200, other.text
            assert other.json()["model"] == qwen35_path.stem
            # gemma's second request is still parked behind its one busy slot
            assert (await client.get("/health")).json()["ring"]["parked"] == 1
            nursery.cancel_scope.cancel()


def test_two_workers_serving_different_models_over_the_ring(
    tmp_path: Path, gemma_path: Path, qwen35_path: Path
) -> None:
    """Real processes: an ingress, a worker serving gemma, and one worker process serving
    gemma and qwen35 (two engines, ``--model`` twice). Requests for qwen35 go to that one
    only; gemma's go to both; an unknown model is a 404 at once."""
    qwen = qwen35_path.stem
    with Ring.opened(tmp_path, gemma_path) as ring:
        ingress = ring.ingress("ingress")
        ring.worker("w-gemma", [ingress])
        ring.worker("w-both", [ingress], None, f"--model={qwen35_path}")
        with httpx.Client(base_url=ingress.url, timeout=120) as client:
            listed = wait_models(client, {gemma_path.stem: 2, qwen: 1})
            assert {m["id"]: m["kind"] for m in listed} == {gemma_path.stem: "chat", qwen: "chat"}
            served = set()
            for _ in range(4):
                answer = client.post(CHAT_PATH, json=chat(qwen))
                assert answer.status_code == 200, answer.text
                assert answer.json()["model"] == qwen
                served.add(answer.headers["x-llmtrio-worker"].split("#")[0])
            assert served == {"w-both"}
            answer = client.post(CHAT_PATH, json=chat(gemma_path.stem))
            assert answer.status_code == 200 and answer.json()["model"] == gemma_path.stem
            assert client.post(CHAT_PATH, json=chat("nope")).status_code == 404
            assert client.post(CHAT_PATH, json=chat(None)).status_code == 400  # two models
