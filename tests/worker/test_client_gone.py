"""A client that goes away while its stream is being answered: the worker ends that stream's
generation quietly, frees its slot and serves on (the client leaving is not a fault)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import trio

from llmtrio.web import ServeConfig

from .._helpers import HEAD, engine_config, read_all
from .._stack import open_stack

STEPS = 400


def chat(max_tokens: int, *, stream: bool) -> bytes:
    return json.dumps(
        {
            "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": stream,
        }
    ).encode()


async def test_a_client_leaving_mid_stream_ends_its_generation_and_the_worker_serves_on(
    gemma_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Seen in the ring simulation: the client left while the response's nursery had other
    tasks; the send raised StreamCancelledError as the stream was cancelled, so the
    two came out as one group that no ``except StreamCancelledError`` matched, and it took the
    worker's whole ``serve_link`` (every stream it held) down. Here the real worker serves
    streamed chats on the real engine, and clients leave after 1, 2 and 5 chunks (while the
    worker is sending)."""
    config = ServeConfig(host="127.0.0.1", port=0, graceful_timeout=1)
    async with open_stack(engine_config(gemma_path, max_inflight=2), config) as stack:
        predicted = stack.engine.stats.tokens_predicted
        for read in (1, 2, 5):
            stream = stack.ring.park(HEAD, chat(STEPS, stream=True))
            assert (await stream.response_head()).status == 200
            chunks = 0
            async for _ in stream.body():
                chunks += 1
                if chunks == read:
                    break
            stream.cancel()  # the client goes away
            with trio.fail_after(30):  # a freed slot is freed within seconds
                await stack.wait_idle()
        # Each generation ended when its client left: the three together sampled fewer tokens
        # than one of them would have run to.
        assert stack.engine.stats.tokens_predicted - predicted < STEPS
        # The worker is still attached and serves the next request whole.
        assert stack.failure is None and not stack.detached.is_set()
        assert len(stack.ring.stats().workers) == 1
        head, body = await read_all(stack.ring.park(HEAD, chat(8, stream=False)))
        assert head.status == 200, body
        answer = json.loads(body)
        assert answer["choices"][0]["finish_reason"] == "length"
        assert answer["usage"]["completion_tokens"] == 8
    assert not [r for r in caplog.records if r.levelname == "ERROR"], caplog.text
