"""Graceful drain with real processes and real signals: ``llmtrio serve`` (with its local
worker, and ``--no-local-worker`` in front of a ``llmtrio worker``) and ``llmtrio worker``, on
loopback with the gemma test model."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from llmtrio.api import CHAT_PATH

from .._helpers import wait_until
from .._procs import Ingress, Ring

pytestmark = pytest.mark.slow


@pytest.fixture
def ring(tmp_path: Path, gemma_path: Path) -> Iterator[Ring]:
    with Ring.opened(tmp_path, gemma_path) as ring:
        yield ring


def long_chat(max_tokens: int) -> object:
    return {
        "messages": [{"role": "user", "content": "Once upon a time"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
    }


def wait_draining(ingress: Ingress) -> httpx.Response:
    def draining() -> httpx.Response | None:
        health = httpx.get(ingress.url + "/health", timeout=10)
        return health if health.json()["status"] == "draining" else None

    return wait_until(draining, lambda: f"draining: {ingress.proc.text()[-2000:]}", within=20)


def events(lines: list[str]) -> list[dict[str, object]]:
    return [json.loads(line[6:]) for line in lines if line.startswith("data: {")]


def test_sigterm_finishes_the_running_stream_refuses_new_requests_and_exits_0(
    ring: Ring,
) -> None:
    ingress = ring.serve("serve", "--graceful-timeout=120")
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", ingress.url + CHAT_PATH, json=long_chat(200)) as response,
    ):
        lines = response.iter_lines()
        for line in lines:
            if '"content"' in line:
                break
        ingress.proc.popen.send_signal(signal.SIGTERM)
        health = wait_draining(ingress)
        assert health.status_code == 503
        refused = client.post(ingress.url + CHAT_PATH, json=long_chat(4))
        assert refused.status_code == 503
        assert refused.json()["error"]["code"] == "shutting_down"
        assert int(refused.headers["retry-after"]) >= 1
        rest = list(lines)
    assert [line for line in rest if line][-1] == "data: [DONE]"
    finals = [e for e in events(rest) if e.get("choices")]
    assert finals[-1]["choices"][0]["finish_reason"] == "length"  # type: ignore[index]
    assert not any("error" in e for e in events(rest))
    assert ingress.proc.popen.wait(timeout=60) == 0
    ingress.proc.wait_for(r"draining: 1 requests in flight")


def test_a_second_signal_stops_at_once(ring: Ring) -> None:
    ingress = ring.serve("serve", "--graceful-timeout=120")
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", ingress.url + CHAT_PATH, json=long_chat(1500)) as response,
    ):
        lines = response.iter_lines()
        for line in lines:
            if '"content"' in line:
                break
        ingress.proc.popen.send_signal(signal.SIGINT)
        wait_draining(ingress)
        ingress.proc.popen.send_signal(signal.SIGTERM)
        assert ingress.proc.popen.wait(timeout=60) == 0
        with pytest.raises(httpx.RemoteProtocolError):
            list(lines)  # the connection is gone before the response ended
    ingress.proc.wait_for(r"second signal: stopping now")


def test_an_ingress_cuts_what_outlives_its_graceful_timeout_and_detaches_its_workers(
    ring: Ring,
) -> None:
    ingress = ring.ingress("ingress")  # --graceful-timeout=1
    worker = ring.worker("worker-a", [ingress])
    ingress.wait_workers({"worker-a"})
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", ingress.url + CHAT_PATH, json=long_chat(1500)) as response,
    ):
        lines = response.iter_lines()
        for line in lines:
            if '"content"' in line:
                break
        ingress.proc.popen.send_signal(signal.SIGTERM)
        rest = list(lines)
    error = events(rest)[-1]["error"]
    assert error["code"] == "shutting_down"  # type: ignore[index]
    assert "data: [DONE]" not in rest
    assert ingress.proc.popen.wait(timeout=60) == 0
    ingress.proc.wait_for(r"1 requests still running after 1s: cutting them")
    # The worker was told why, stays up and frees its slot; it will reattach by itself.
    worker.wait_for(r"the ingress sent us away: the ingress is shutting down", 10)
    assert worker.popen.poll() is None
    worker.popen.send_signal(signal.SIGTERM)
    assert worker.popen.wait(timeout=60) == 0


def test_a_worker_cuts_what_outlives_its_graceful_timeout_and_exits_0(ring: Ring) -> None:
    ingress = ring.ingress("ingress")
    worker = ring.worker("worker-a", [ingress], None, "--graceful-timeout=1")
    ingress.wait_workers({"worker-a"})
    with (
        httpx.Client(timeout=120) as client,
        client.stream("POST", ingress.url + CHAT_PATH, json=long_chat(1500)) as response,
    ):
        lines = response.iter_lines()
        for line in lines:
            if '"content"' in line:
                break
        worker.popen.send_signal(signal.SIGTERM)
        rest = list(lines)
    assert worker.popen.wait(timeout=60) == 0
    worker.wait_for(r"streams still running after 1s: cancelling")
    error = events(rest)[-1]["error"]
    assert error["code"] == "worker_failed"  # type: ignore[index]
    # The ingress lives on, with nothing held.
    assert ingress.proc.popen.poll() is None
    health = ingress.health()
    assert health["ring"] == {"parked": 0, "serving": 0, "max_streams": 64, "workers": 0}
