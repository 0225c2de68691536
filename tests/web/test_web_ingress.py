"""The ingress alone (no engine, no worker): what it says when no worker takes a request, and
what /health and /v1/models show of the attached workers."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from llmtrio.api import CHAT_PATH
from llmtrio.ring import Heartbeat, Ring
from llmtrio.web._serve import _ConnectionStream

from .._helpers import open_ingress

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


# -- the connection's writes ---------------------------------------------------------------


async def test_a_response_head_goes_out_with_the_write_after_it() -> None:
    client, server = trio.testing.memory_stream_pair()
    stream = _ConnectionStream(server, timeout=5)
    head = b"HTTP/1.1 200 \r\ncontent-length: 2\r\n\r\n"
    await stream.send_all(head)
    with trio.move_on_after(0.05) as nothing:
        await client.receive_some()
    assert nothing.cancelled_caught  # held
    await stream.send_all(b"{}")
    assert await client.receive_some() == head + b"{}"  # one write
    await stream.send_all(b"")  # the end of the message: nothing held, nothing sent
    await stream.send_all(b"more")
    assert await client.receive_some() == b"more"
    # a 100 Continue goes at once (the client waits for it before its body)
    await stream.send_all(b"HTTP/1.1 100 \r\n\r\n")
    assert await client.receive_some() == b"HTTP/1.1 100 \r\n\r\n"
    # closing sends a held head first
    await stream.send_all(b"HTTP/1.1 204 \r\n\r\n")
    await stream.aclose()
    assert await client.receive_some() == b"HTTP/1.1 204 \r\n\r\n"
    assert await client.receive_some() == b""


async def test_a_whole_response_is_one_send_on_the_socket(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    sends: list[tuple[int, bytes]] = []
    send_all = trio.SocketStream.send_all

    async def counted(self: trio.SocketStream, data: bytes) -> None:
        sends.append((self.socket.getsockname()[1], bytes(data)))
        await send_all(self, data)

    monkeypatch.setattr(trio.SocketStream, "send_all", counted)
    ring = Ring(max_streams=4)
    async with open_ingress(ring, model_name="m") as server:
        port = int(str(server.client.base_url).rsplit(":", 1)[1].rstrip("/"))
        for path in ("/v1/models", "/health"):  # 200, and 503 (no worker)
            sends.clear()
            response = await server.client.get(path)
            mine = [data for local, data in sends if local == port and data]  # b'': no I/O
            assert len(mine) == 1, mine
            assert mine[0].startswith(b"HTTP/1.1 %d " % response.status_code)
            assert mine[0].endswith(response.content)
