"""The ingress alone (no engine, no worker): what it says when no worker takes a request, and
what /health and /v1/models show of the attached workers."""

from __future__ import annotations

import pytest
import trio

from llmtrio._routes import CHAT_PATH
from llmtrio.ring import Heartbeat, Ring

from ._helpers import open_ingress

BODY = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


async def test_no_worker_within_the_park_timeout_is_a_503_with_retry_after() -> None:
    ring = Ring(max_streams=4, park_timeout=0.2, retry_after=3)
    async with open_ingress(ring, model_name="") as server:
        response = await server.client.post(CHAT_PATH, json=BODY)
    assert response.status_code == 503
    assert response.headers["Retry-After"] == "3"
    error = response.json()["error"]
    assert error["code"] == "no_worker"
    assert "0.2s" in error["message"]
    assert ring.stats().tracked == 0


@pytest.mark.parametrize("model_name", ["", "served-name"])
async def test_health_and_models_list_the_attached_workers(model_name: str) -> None:
    ring = Ring(max_streams=4)
    async with (
        open_ingress(ring, model_name=model_name) as server,
        ring.attach("w1#1", 2, models=["m1"]) as one,
        ring.attach("w2#2", 4, models=["m1"]),
    ):
        one.heartbeat(Heartbeat(inflight=1, max_inflight=2, available_slots=1))
        await trio.sleep(0.01)
        health = (await server.client.get("/health")).json()
        models = (await server.client.get("/v1/models")).json()
    assert [w["id"] for w in health["workers"]] == ["w1#1", "w2#2"]
    first = health["workers"][0]
    assert first["capacity"]["inflight"] == 1
    assert 0 <= first["last_heartbeat_s_ago"] < 5
    assert health["workers"][1]["capacity"] is None  # no heartbeat yet
    assert [m["id"] for m in models["data"]] == ["m1"]
