"""No request can crash, wedge or leak the server: hostile numbers, faults inside one stream,
clients that stop reading, disconnects at any moment, huge prompts, dead engines.

Each test runs the real stack (gemma test model, ring, worker, hypercorn) in its own Trio run
and asserts on structure (steps, tokens, counts, states), never on wall-clock bounds; the
only time limits are loose guards against hanging forever.
"""

from __future__ import annotations

import itertools
import json
import random
import socket
import struct
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import pytest
import trio

from llmtrio.api import CHAT_PATH
from llmtrio.cli import serve
from llmtrio.engine import (
    ChatMessage,
    Done,
    Engine,
    EngineFailedError,
    Failed,
    GenerateRequest,
    Token,
)
from llmtrio.engine.generate._chat import ChatTemplate
from llmtrio.web import ServeConfig

from .._helpers import engine_config
from .._stack import Stack, open_stack

HI = [{"role": "user", "content": "Count from one to ten."}]


def serve_config(**kwargs: Any) -> ServeConfig:
    return ServeConfig(host="127.0.0.1", port=0, graceful_timeout=1, **kwargs)


async def chat(http: httpx.AsyncClient, stack: Stack, **fields: Any) -> httpx.Response:
    fields.setdefault("messages", HI)
    return await http.post(stack.url + CHAT_PATH, json=fields)


def sse_events(data: bytes) -> list[Any]:
    events = []
    for block in data.split(b"\n\n"):
        if block.startswith(b"data: ") and block != b"data: [DONE]":
            events.append(json.loads(block[6:]))
    return events


# ----------------------------------------------------------------------------------------------
# A request's fault is that request's


async def test_a_400_digit_temperature_is_a_400_and_the_server_goes_on(gemma_path: Path) -> None:
    async with open_stack(engine_config(gemma_path), serve_config()) as stack:
        async with httpx.AsyncClient(timeout=60) as http:
            for field in ("temperature", "top_p", "min_p"):
                body = (
                    b'{"messages":[{"role":"user","content":"hi"}],"' + field.encode() + b'":'
                    + b"1" * 400 + b"}"
                )  # fmt: skip
                response = await http.post(
                    stack.url + CHAT_PATH,
                    content=body,
                    headers={"content-type": "application/json"},
                )
                assert response.status_code == 400, response.text
                error = response.json()["error"]
                assert error["param"] == field
                assert error["type"] == "invalid_request_error"
            response = await chat(http, stack, max_tokens=3)
            assert response.status_code == 200
            assert response.json()["choices"][0]["message"]["content"]
        await stack.wait_idle()


RAISING_TEMPLATE = (
    "{% for m in messages %}{% if m.content == 'boom' %}{{ 1 + m.content }}{% endif %}"
    "<start_of_turn>{{ m.role }}\n{{ m.content }}<end_of_turn>\n{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


async def test_a_chat_template_that_raises_fails_that_request_only(gemma_path: Path) -> None:
    async with open_stack(engine_config(gemma_path), serve_config()) as stack:
        engine = stack.engine
        engine._inputs.template = ChatTemplate(
            RAISING_TEMPLATE,
            architecture="gemma3",
            bos_token="<bos>",
            eos_token="<eos>",
            render_builtin=None,
        )
        async with httpx.AsyncClient(timeout=60) as http, trio.open_nursery() as nursery:
            ok: list[httpx.Response] = []

            async def good() -> None:
                ok.append(await chat(http, stack, max_tokens=24, ignore_eos=True))

            nursery.start_soon(good)  # a stream running while another request faults
            boom = [{"role": "user", "content": "boom"}]
            for stream in (False, True):
                response = await chat(http, stack, messages=boom, stream=stream, max_tokens=3)
                assert response.status_code == 500, response.text
                error = response.json()["error"]
                assert error["type"] == "server_error"
                assert "TypeError" not in error["message"] and "Traceback" not in error["message"]
                assert response.headers["x-request-id"]
        assert ok[0].status_code == 200
        assert ok[0].json()["usage"]["completion_tokens"] == 24
        async with httpx.AsyncClient(timeout=60) as http:
            assert (await chat(http, stack, max_tokens=2)).status_code == 200
            assert (await http.get(stack.url + "/health")).json()["status"] == "ok"
        await stack.wait_idle()


async def test_a_delivery_fault_fails_that_generation_only(gemma_path: Path) -> None:
    async with Engine.open(engine_config(gemma_path, max_inflight=2)) as engine:
        request = GenerateRequest(messages=[ChatMessage("user", "Count.")], max_tokens=12)
        async with engine.submit(request) as broken, engine.submit(request) as fine:

            def explode(update: object) -> None:
                raise UnicodeError("a bug in one generation")

            broken._apply = explode  # type: ignore[method-assign]
            broken_events = [event async for event in broken]
            fine_events = [event async for event in fine]
        assert isinstance(broken_events[-1], Failed)
        assert isinstance(broken_events[-1].error, UnicodeError)
        assert isinstance(fine_events[-1], Done)
        assert fine_events[-1].completion_tokens == 12
        with trio.fail_after(30):
            await engine.wait_idle()


# ----------------------------------------------------------------------------------------------
# Slow and vanished clients


async def raw_request(
    url: str, body: dict[str, Any], *, rcvbuf: int | None = None
) -> trio.SocketStream:
    """A client on a bare socket (optionally with a tiny receive buffer) that has sent a
    chat request and read nothing yet."""
    parts = urlsplit(url)
    sock = trio.socket.socket()
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    await sock.connect((parts.hostname, parts.port))
    stream = trio.SocketStream(sock)
    payload = json.dumps(body).encode()
    await stream.send_all(
        f"POST {CHAT_PATH} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\n"
        f"Connection: close\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
        + payload
    )
    return stream


async def read_to_end(stream: trio.SocketStream) -> bytes:
    """Everything until the server closes (or resets) the connection."""
    data = bytearray()
    try:
        while chunk := await stream.receive_some(65536):
            data += chunk
    except trio.BrokenResourceError:  # reset by the server
        pass
    return bytes(data)


def complete(data: bytes) -> bool:
    """Whether ``data`` holds a whole HTTP/1.1 response (by content-length or chunking)."""
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        return False
    for line in head.lower().split(b"\r\n"):
        if line.startswith(b"content-length:"):
            return len(body) >= int(line.split(b":")[1])
    return body.endswith(b"0\r\n\r\n")


async def read_response(stream: trio.SocketStream, start: bytes = b"") -> bytes:
    """One whole response (the server may keep the connection open after it), the first
    bytes of which were ``start``."""
    data = bytearray(start)
    while not complete(bytes(data)):
        chunk = await stream.receive_some(65536)
        if not chunk:
            break
        data += chunk
    return bytes(data)


async def test_clients_that_stop_reading_hold_no_slot_once_their_generation_ends(
    gemma_path: Path,
) -> None:
    """2 x max_inflight clients that read nothing (and a send timeout too long to rescue
    anyone): their generations run to the end and free their slots, what they produced
    waits at the ingress, and max_inflight new requests then decode together.

    Without speculative decoding: the new requests get slots as the stalled generations end,
    and only without drafts (whose number per sequence follows measured step times) do those
    end in the same step."""
    slots = 2
    config = serve_config(send_timeout=600, send_buffer=4096)
    engine = engine_config(gemma_path, max_inflight=slots, spec=None)
    async with open_stack(engine, config) as stack:
        long = {"messages": HI, "max_tokens": 150, "ignore_eos": True, "stream": True}
        with trio.fail_after(180):
            stalled = [await raw_request(stack.url, long, rcvbuf=4096) for _ in range(2 * slots)]
            try:
                spans: list[tuple[int, int]] = []
                async with httpx.AsyncClient(timeout=None) as http:

                    async def fresh() -> None:
                        body = {
                            "messages": HI,
                            "max_tokens": 16,
                            "ignore_eos": True,
                            "stream": True,
                        }
                        first = None
                        async with http.stream(
                            "POST", stack.url + CHAT_PATH, json=body
                        ) as response:
                            assert response.status_code == 200
                            async for line in response.aiter_lines():
                                if first is None and '"content":"' in line and '"role"' not in line:
                                    first = stack.engine.stats.steps
                        assert first is not None
                        spans.append((first, stack.engine.stats.steps))

                    async with trio.open_nursery() as nursery:
                        for _ in range(slots):
                            nursery.start_soon(fresh)
                # Decoded together: each one's first token came before the other's last.
                (a_first, a_last), (b_first, b_last) = spans
                assert a_first < b_last and b_first < a_last, spans
                # The stalled clients still hold their connections, and nothing else.
                stats = stack.ring.stats()
                assert (stats.parked, stats.assigned, stats.responding) == (0, 0, 0)
                assert stack.engine.capacity().inflight == 0
            finally:  # also on failure: a stalled client is otherwise waited out (600 s)
                for stream in stalled:
                    await stream.aclose()
            await stack.wait_idle()


async def test_a_client_that_takes_nothing_is_dropped_after_the_send_timeout(
    gemma_path: Path,
) -> None:
    """A streaming client that stops reading is disconnected once it has taken nothing for
    --send-timeout seconds, and its generation is cancelled long before its end."""
    config = serve_config(send_timeout=1.0, send_buffer=4096)
    async with open_stack(
        engine_config(gemma_path, max_inflight=1, ctx_size=2048), config
    ) as stack:
        body = {"messages": HI, "max_tokens": 1500, "ignore_eos": True, "stream": True}
        with trio.fail_after(120):
            stalled = await raw_request(stack.url, body, rcvbuf=4096)
            await stack.engine.capacity_changed()  # admitted
            await stack.engine.wait_idle()  # cancelled, not finished
            data = await read_to_end(stalled)  # ends: the server hung up on it
        assert data.startswith(b"HTTP/1.1 200")
        assert b"data: [DONE]" not in data
        assert stack.engine.stats.steps < 1000
        await stack.wait_idle()


DISCONNECT_POINTS = (
    "before_sending",
    "mid_headers",
    "after_request",
    "after_head",
    "mid_body",
    "mid_body_reset",
    "read_all",
)


async def test_disconnects_at_random_moments_leave_nothing_behind(gemma_path: Path) -> None:
    """Hundreds of clients hanging up at random points (before the request, mid-headers, right
    after the body, after the response head, mid-stream, with a reset): at the end nothing is
    parked, nothing is being served and the engine has nothing in flight."""
    rng = random.Random(7)
    counts = dict.fromkeys(DISCONNECT_POINTS, 0)
    async with open_stack(engine_config(gemma_path), serve_config()) as stack:
        parts = urlsplit(stack.url)
        limit = trio.Semaphore(8)

        async def client(point: str, stream_mode: bool, max_tokens: int, cut: int) -> None:
            async with limit:
                sock = trio.socket.socket()
                await sock.connect((parts.hostname, parts.port))
                stream = trio.SocketStream(sock)
                try:
                    if point == "before_sending":
                        return
                    body = json.dumps(
                        {"messages": HI, "max_tokens": max_tokens, "stream": stream_mode}
                    ).encode()
                    request = (
                        f"POST {CHAT_PATH} HTTP/1.1\r\nHost: {parts.netloc}\r\n"
                        f"Content-Type: application/json\r\nConnection: close\r\n"
                        f"Content-Length: {len(body)}\r\n\r\n"
                    ).encode() + body
                    if point == "mid_headers":
                        await stream.send_all(request[: cut % 40 + 1])
                        return
                    await stream.send_all(request)
                    if point == "after_request":
                        return
                    data = bytearray()
                    while b"\r\n\r\n" not in data:
                        chunk = await stream.receive_some(65536)
                        if not chunk:
                            return
                        data += chunk
                    if point == "after_head":
                        return
                    if point in ("mid_body", "mid_body_reset"):
                        while len(data) < cut and not complete(bytes(data)):
                            chunk = await stream.receive_some(65536)
                            if not chunk:
                                return
                            data += chunk
                        if point == "mid_body_reset":
                            sock.setsockopt(
                                socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
                            )
                        return
                    assert complete(await read_response(stream, bytes(data)))
                finally:
                    await stream.aclose()

        with trio.fail_after(240):
            async with trio.open_nursery() as nursery:
                for _ in range(210):
                    point = rng.choice(DISCONNECT_POINTS)
                    counts[point] += 1
                    nursery.start_soon(
                        client, point, rng.random() < 0.7, rng.randint(1, 12), rng.randint(0, 3000)
                    )
                    await trio.sleep(rng.random() * 0.02)
            await stack.wait_idle()
        stats = stack.ring.stats()
        assert (stats.parked, stats.assigned, stats.responding) == (0, 0, 0)
        assert stack.engine.capacity().inflight == 0
        async with httpx.AsyncClient(timeout=60) as http:
            assert (await chat(http, stack, max_tokens=2)).status_code == 200
    assert sum(counts.values()) == 210 and all(counts.values()), counts


# ----------------------------------------------------------------------------------------------
# Prompt preparation is off the event loop


@pytest.mark.parametrize(
    "size", [1 << 20, 600_000], ids=["1MiB refused unread", "600kB tokenized in a thread"]
)
async def test_a_huge_prompt_never_stalls_running_streams(gemma_path: Path, size: int) -> None:
    """While a huge prompt arrives and is refused, a running stream still gets a token every
    step or two (counted in engine steps between the events its client receives)."""
    # One decode thread, so the prompt's tokenizing (on main, on the event loop) does not
    # also slow the decode steps down by taking their second core: steps go on, and a stalled
    # event loop shows as a gap in the steps at which the stream's events arrive.
    config = engine_config(gemma_path, max_inflight=2, ctx_size=16384, threads=1)
    async with open_stack(config, serve_config(max_body_bytes=4 << 20)) as stack:
        words = " ".join(f"w{i % 1000}" for i in range(size // 5))[:size]
        async with httpx.AsyncClient(timeout=None) as http:
            steps_at_event: list[int] = []
            huge_sent = trio.Event()
            huge_done = trio.Event()

            async def runner() -> None:
                body = {"messages": HI, "max_tokens": 3000, "ignore_eos": True, "stream": True}
                async with http.stream("POST", stack.url + CHAT_PATH, json=body) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: {"):
                            steps_at_event.append(stack.engine.stats.steps)
                            if len(steps_at_event) == 5:
                                huge_sent.set()
                            if huge_done.is_set() and len(steps_at_event) > 40:
                                return

            async with trio.open_nursery() as nursery:
                nursery.start_soon(runner)
                await huge_sent.wait()
                mark = len(steps_at_event)
                response = await chat(
                    http, stack, messages=[{"role": "user", "content": words}], max_tokens=4
                )
                refused_at = len(steps_at_event)
                huge_done.set()
            assert response.status_code == 400
            assert response.json()["error"]["code"] == "context_length_exceeded"
        window = steps_at_event[mark - 1 :]
        gaps = [b - a for a, b in itertools.pairwise(window)]
        assert refused_at >= mark
        assert max(gaps) <= 2, (gaps, mark, refused_at)
        await stack.wait_idle()


# ----------------------------------------------------------------------------------------------
# Browser origins and host names


async def test_cross_origin_pages_and_foreign_hosts_are_refused(gemma_path: Path) -> None:
    config = serve_config(allowed_origins=["https://app.example.com"])
    async with open_stack(engine_config(gemma_path), config) as stack:
        port = urlsplit(stack.url).port
        body = json.dumps({"messages": HI, "max_tokens": 2})
        async with httpx.AsyncClient(timeout=60) as http:

            async def post(**headers: str) -> httpx.Response:
                return await http.post(stack.url + CHAT_PATH, content=body, headers=headers)

            evil = await post(**{"content-type": "text/plain", "origin": "https://evil.example"})
            assert evil.status_code == 403
            assert evil.json()["error"]["code"] == "origin_not_allowed"
            rebound = await post(**{"host": f"attacker.example:{port}"})
            assert rebound.status_code == 403
            assert rebound.json()["error"]["code"] == "host_not_allowed"
            page = await http.get(stack.url + "/health", headers={"host": "attacker.example"})
            assert page.status_code == 403
            preflight = {"access-control-request-method": "POST"}
            refused = await http.options(
                stack.url + CHAT_PATH, headers={**preflight, "origin": "https://evil.example"}
            )
            assert refused.status_code == 403
            for origin in (
                f"http://127.0.0.1:{port}",  # the server's own
                "http://localhost:3000",  # loopback
                "https://app.example.com",  # --allowed-origins
            ):
                allowed = await http.options(
                    stack.url + CHAT_PATH, headers={**preflight, "origin": origin}
                )
                assert allowed.status_code == 204
                assert allowed.headers["access-control-allow-origin"] == origin
                served = await post(**{"content-type": "application/json", "origin": origin})
                assert served.status_code == 200
                assert served.headers["access-control-allow-origin"] == origin
            assert (await post(**{"host": f"localhost:{port}"})).status_code == 200
        await stack.wait_idle()


# ----------------------------------------------------------------------------------------------
# One body limit


async def test_max_body_bytes_above_one_mebibyte_is_honoured(gemma_path: Path) -> None:
    """The ingress alone limits the body: 2 MiB allowed means a 1.5 MiB body is read (and
    then refused for its length in tokens, not its size), and a 3 MiB one is a 413."""
    config = serve_config(max_body_bytes=2 << 20)
    async with (
        open_stack(engine_config(gemma_path), config) as stack,
        httpx.AsyncClient(timeout=60) as http,
    ):
        medium = [{"role": "user", "content": "a " * (3 << 18)}]
        response = await chat(http, stack, messages=medium, max_tokens=2)
        assert response.status_code == 400
        assert response.json()["error"]["code"] == "context_length_exceeded"
        large = [{"role": "user", "content": "a " * (3 << 19)}]
        response = await chat(http, stack, messages=large, max_tokens=2)
        assert response.status_code == 413
        assert str(2 << 20) in response.json()["error"]["message"]


# ----------------------------------------------------------------------------------------------
# A dead engine


async def test_a_dead_engine_makes_health_503_with_the_reason(
    gemma_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with open_stack(engine_config(gemma_path), serve_config()) as stack:

        def decode(batch: object) -> int:
            raise RuntimeError("llama.cpp exploded")

        monkeypatch.setattr(stack.engine._model, "decode", decode)
        async with httpx.AsyncClient(timeout=60) as http:
            response = await chat(http, stack, max_tokens=4)
            assert response.status_code in (500, 502, 503)
            assert "exploded" not in response.text
            with trio.fail_after(30):
                await stack.detached.wait()
            health = await http.get(stack.url + "/health")
            assert health.status_code == 503
            assert "the decode loop failed" in health.json()["reason"]
            assert health.json()["status"] == "no_workers"
        assert isinstance(stack.failure, EngineFailedError)


async def test_serve_raises_when_its_engine_dies(
    gemma_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from llmtrio.engine.llama import LlamaModel

    def decode(self: LlamaModel, batch: object) -> int:
        raise RuntimeError("llama.cpp exploded")

    monkeypatch.setattr(LlamaModel, "decode", decode)
    shutdown = trio.Event()
    with pytest.raises(EngineFailedError, match="decode loop failed"), trio.fail_after(60):
        async with trio.open_nursery() as nursery:

            async def run(*, task_status: trio.TaskStatus[list[str]]) -> None:
                try:
                    await serve(
                        engine_config(gemma_path),
                        serve_config(),
                        shutdown=shutdown,
                        task_status=task_status,
                    )
                except EngineFailedError as exc:
                    failures.append(exc)

            failures: list[EngineFailedError] = []
            binds = await nursery.start(run)
            async with httpx.AsyncClient(timeout=60) as http:
                response = await http.post(
                    binds[0] + CHAT_PATH, json={"messages": HI, "max_tokens": 2}
                )
                assert response.status_code >= 500
        raise failures[0]


# ----------------------------------------------------------------------------------------------
# Reasoning is the template's, not the user's


@pytest.mark.parametrize("model", ["gemma", "qwen35"])
async def test_a_user_writing_think_tags_does_not_open_reasoning(
    gemma_path: Path, qwen35_path: Path, model: str
) -> None:
    """Whether generation starts inside a think block comes from the template's generation
    prompt only: a message mentioning <think> (or ending with one) is text."""
    path = gemma_path if model == "gemma" else qwen35_path
    async with Engine.open(engine_config(path, max_inflight=1)) as engine:
        for text in ("What is the <think> tag for?", "Explain this: <think>"):
            for think in (None, False):
                request = GenerateRequest.user(text, think=think, max_tokens=1)
                assert not engine._inputs.prepare(request).opens_think, (text, think)


# ----------------------------------------------------------------------------------------------
# The engine's shape


async def test_the_decode_loop_runs_in_a_trio_worker_thread(gemma_path: Path) -> None:
    import threading

    async with Engine.open(engine_config(gemma_path, max_inflight=1)) as engine:
        async with engine.submit(GenerateRequest.user("Hi.", max_tokens=2)) as generation:
            events = [event async for event in generation]
        names = [thread.name for thread in threading.enumerate()]
        assert "llmtrio decode loop" in names
    assert isinstance(events[-1], Done)
    assert all(isinstance(event, Token) for event in events[:-1])
