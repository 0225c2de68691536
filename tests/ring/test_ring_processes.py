"""A real ring: ``llmtrio serve --no-local-worker`` ingresses and ``llmtrio worker`` processes on
loopback, with real TLS (trustme: one CA for the ingresses, another for the workers) and the
gemma test model. Kept few: each worker process loads the model."""

from __future__ import annotations

import concurrent.futures
import json
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import trio
import trustme

from llmtrio.api import CHAT_PATH
from llmtrio.ring import (
    PROTOCOL_VERSION,
    Attach,
    ControlRefusedError,
    Detach,
    FrameDecoder,
    client_ssl_context,
    encode,
)
from llmtrio.ring._tls import open_control_websocket

from .._helpers import wait_until
from .._procs import Ring

pytestmark = pytest.mark.slow


@pytest.fixture
def ring(tmp_path: Path, gemma_path: Path) -> Iterator[Ring]:
    with Ring.opened(tmp_path, gemma_path) as ring:
        yield ring


def chat(max_tokens: int, *, stream: bool = False, prompt: str = "Once upon a time") -> object:
    return {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": stream,
    }


def test_two_ingresses_two_workers_then_kills_and_a_disconnect(ring: Ring) -> None:
    ingresses = [ring.ingress("ingress-a"), ring.ingress("ingress-b")]
    workers = {name: ring.worker(name, ingresses) for name in ("worker-a", "worker-b")}
    for ingress in ingresses:
        ingress.wait_workers({"worker-a", "worker-b"})
        models = httpx.get(ingress.url + "/v1/models", timeout=10).json()
        assert len(models["data"]) == 1  # what the workers serve: one model

    # Requests to both ingresses, served by both workers.
    served: set[str] = set()
    with httpx.Client(timeout=120) as client:

        def ask(url: str) -> None:
            response = client.post(url + CHAT_PATH, json=chat(8))
            assert response.status_code == 200, response.text
            assert response.json()["choices"][0]["message"]["content"]
            served.add(response.headers["x-llmtrio-worker"].split("#")[0])

        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            list(pool.map(ask, [ingress.url for ingress in ingresses for _ in range(6)]))
    assert served == {"worker-a", "worker-b"}

    # A client that disconnects mid-stream: the remote engine's inflight comes back to 0.
    with (
        httpx.Client(timeout=60) as client,
        client.stream(
            "POST", ingresses[0].url + CHAT_PATH, json=chat(400, stream=True)
        ) as response,
    ):
        for line in response.iter_lines():
            if '"content"' in line:
                break
    wait_until(
        lambda: not any(w["held"] or _inflight(w) for w in ingresses[0].workers()),
        lambda: f"no worker busy: {ingresses[0].workers()}",
        within=20,
    )

    # A worker SIGKILLed mid-stream: a clean error event, and the stream ends.
    with (
        httpx.Client(timeout=60) as client,
        client.stream(
            "POST", ingresses[1].url + CHAT_PATH, json=chat(400, stream=True)
        ) as response,
    ):
        holder = response.headers["x-llmtrio-worker"].split("#")[0]
        lines = response.iter_lines()
        for line in lines:
            if '"content"' in line:
                break
        workers[holder].popen.send_signal(signal.SIGKILL)
        rest = list(lines)
    events = [json.loads(line[6:]) for line in rest if line.startswith("data: {")]
    assert "error" in events[-1], rest[-5:]
    # The ingress logs why; its client is told the worker failed, no internals.
    assert events[-1]["error"]["code"] == "worker_failed"
    for ingress in ingresses:
        ingress.wait_workers({"worker-a", "worker-b"} - {holder})
    # The survivor still serves both ingresses.
    for ingress in ingresses:
        response = httpx.post(ingress.url + CHAT_PATH, json=chat(4), timeout=60)
        assert response.status_code == 200


def _inflight(worker: dict[str, object]) -> int:
    capacity = worker["capacity"]
    return int(capacity["inflight"]) if isinstance(capacity, dict) else 0


@pytest.mark.parametrize("stream", [False, True], ids=["json", "sse"])
def test_a_worker_killed_before_its_first_token_is_replaced_invisibly(
    ring: Ring, stream: bool
) -> None:
    ingress = ring.ingress("ingress")
    workers = {name: ring.worker(name, [ingress]) for name in ("worker-a", "worker-b")}
    ingress.wait_workers({"worker-a", "worker-b"})
    prompt = "the quick brown fox jumps over the lazy dog " * 150  # a long prefill
    with (
        httpx.Client(timeout=120) as client,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        body = chat(4, prompt=prompt, stream=stream)
        future = pool.submit(client.post, ingress.url + CHAT_PATH, json=body)
        holder = wait_until(
            lambda: next((str(w["id"]) for w in ingress.workers() if w["held"]), None),
            "a worker holding the request",
            within=30,
            every=0.02,
        )
        killed = holder.split("#")[0]
        workers[killed].popen.send_signal(signal.SIGKILL)
        response = future.result()
    assert response.status_code == 200, response.text
    assert response.headers["x-llmtrio-worker"].split("#")[0] != killed
    if stream:
        assert '"error"' not in response.text
        assert response.text.rstrip().endswith("data: [DONE]")
    else:
        assert response.json()["choices"][0]["message"]["content"]


def test_refusals_are_quick_and_named_at_both_ends(ring: Ring) -> None:
    ingress = ring.ingress("ingress")
    port = int(ingress.control.rsplit(":", 1)[1])
    # A worker process with a certificate from another CA.
    stranger = ring.worker("stranger", [ingress], ring.certificate("stranger", trustme.CA()))
    stranger.wait_for(r"refused the connection: .*refusing this worker's certificate", 60)
    ingress.proc.wait_for(r"refused a worker from .*CERTIFICATE_VERIFY_FAILED", 10)
    assert ingress.workers() == []

    async def raw_clients() -> None:
        async with trio.open_nursery() as nursery:
            # No certificate at all.
            context = client_ssl_context(None, None, ring.tmp / "ingress-ca.pem")
            with trio.fail_after(10), pytest.raises(ControlRefusedError, match="refusing"):
                await open_control_websocket(nursery, "127.0.0.1", port, context, limit_s=30)
            # A good certificate and an incompatible protocol version.
            good = client_ssl_context(ring.certificate("old"), None, ring.tmp / "ingress-ca.pem")
            ws = await open_control_websocket(nursery, "127.0.0.1", port, good, limit_s=10)
            await ws.send_message(encode(Attach("old", 1, version=PROTOCOL_VERSION + 1)))
            decoder = FrameDecoder()
            with trio.fail_after(10):
                decoder.receive_data(bytes(await ws.get_message()))
            reply = decoder.next_message()
            assert isinstance(reply, Detach)
            assert "incompatible protocol version" in reply.reason
            nursery.cancel_scope.cancel()

    trio.run(raw_clients)
    ingress.proc.wait_for(r"PEER_DID_NOT_RETURN_A_CERTIFICATE", 10)
    ingress.proc.wait_for(r"refused worker old .*incompatible protocol version", 10)


def test_a_worker_sigtermed_finishes_its_stream_detaches_and_exits_0(ring: Ring) -> None:
    ingress = ring.ingress("ingress")
    worker = ring.worker("worker-a", [ingress])
    ingress.wait_workers({"worker-a"})
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", ingress.url + CHAT_PATH, json=chat(48, stream=True)) as response,
    ):
        lines = response.iter_lines()
        for line in lines:
            if '"content"' in line:
                break
        worker.popen.send_signal(signal.SIGTERM)
        rest = list(lines)
    assert rest[-1] == "data: [DONE]" or rest[-2:] == ["data: [DONE]", ""], rest[-3:]
    assert not any('"error"' in line for line in rest)
    assert worker.popen.wait(timeout=60) == 0
    assert ingress.workers() == []
    ingress.proc.wait_for(r"worker worker-a#\d+ detached: the worker left", 10)


def test_workers_reattach_to_a_restarted_ingress_by_themselves(ring: Ring) -> None:
    ingress = ring.ingress("ingress")
    port = ingress.control.rsplit(":", 1)[1]
    ring.worker("worker-a", [ingress])
    ingress.wait_workers({"worker-a"})
    ingress.proc.popen.send_signal(signal.SIGKILL)
    ingress.proc.popen.wait(timeout=30)
    again = ring.ingress("ingress-again", f"--control-port={port}")
    assert again.control == ingress.control
    again.wait_workers({"worker-a"})
    response = httpx.post(again.url + CHAT_PATH, json=chat(4), timeout=60)
    assert response.status_code == 200, response.text


def test_keys_limits_and_metrics_flags_reach_the_ingress_and_the_worker(ring: Ring) -> None:
    ingress = ring.ingress("ingress", "--api-key=k1", "--rate-limit=100")
    worker = ring.worker("w", [ingress], None, "--metrics-port=0", "--max-tokens-limit=8")
    metrics = worker.wait_for(r"metrics on (http://\S+)").group(1)
    ingress.wait_workers({"w"})
    key = {"Authorization": "Bearer k1"}
    url = ingress.url + CHAT_PATH
    assert httpx.post(url, json=chat(4), timeout=60).status_code == 401
    assert httpx.get(ingress.url + "/metrics", timeout=10).status_code == 401
    over = httpx.post(url, json=chat(9), headers=key, timeout=60)
    assert over.status_code == 400 and over.json()["error"]["param"] == "max_tokens"
    done = httpx.post(url, json=chat(8), headers=key, timeout=60)
    assert done.status_code == 200, done.text
    scraped = httpx.get(metrics, timeout=10).text
    predicted = re.search(
        r"^llamacpp:tokens_predicted_total\{model_name=\"[^\"]+\"\} (\S+)$", scraped, re.M
    )
    assert predicted is not None
    assert float(predicted.group(1)) == done.json()["usage"]["completion_tokens"]
    ingress_metrics = httpx.get(ingress.url + "/metrics", headers=key, timeout=10).text
    assert "llmtrio_workers_attached 1.0" in ingress_metrics
    assert re.search(r"request_id=\S+ worker=w#\d+ .* status=200 ", ingress.proc.text())
