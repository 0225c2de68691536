"""Prefix affinity end to end: two workers (one engine each, the same model), attached over
the network ring (mutual TLS, their heartbeats framed), behind one ingress; conversations of
two turns, some at once. A conversation's second turn lands on the
worker that served its first (``x-llmtrio-worker``), where its prefix is in memory: the test
counts how often, and what that saves (the second turns' cached prompt tokens)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from pathlib import Path

import httpx
import pytest
import trio

from llmtrio.api import CHAT_PATH
from llmtrio.engine import Engine
from llmtrio.ring import Ring, client_ssl_context, connect_ring
from llmtrio.worker import serve_link

from .._helpers import engine_config, open_ingress
from .test_ring_remote import Pki, pki, start_ingress, wait_attached

__all__ = ["pki"]

pytestmark = pytest.mark.slow

SYSTEM = " ".join(f"Rule {i}: be brief about topic {i}." for i in range(10))


@asynccontextmanager
async def two_workers(model: Path, pki: Pki) -> AsyncIterator[httpx.AsyncClient]:
    ring = Ring(max_streams=64)
    async with AsyncExitStack() as stack:
        nursery = await stack.enter_async_context(trio.open_nursery())
        url = await start_ingress(nursery, pki, ring)
        for name in ("w1", "w2"):
            config = engine_config(model, model_name="m", threads=1, max_inflight=2, ctx_size=1024)
            engine = await stack.enter_async_context(Engine.open(config))
            context = client_ssl_context(pki.worker(name), None, pki.ingress_ca)
            link = await stack.enter_async_context(
                connect_ring([url], context, worker_id=name, max_inflight=2, models=["m"])
            )
            await nursery.start(partial(serve_link, engine, link))
        await wait_attached(ring, 2)
        ingress = await stack.enter_async_context(open_ingress(ring))
        try:
            yield ingress.client
        finally:
            nursery.cancel_scope.cancel()


async def test_a_conversations_next_turn_lands_where_its_prefix_is(
    qwen35_path: Path, pki: Pki
) -> None:
    """One conversation at a time, then three at once. One at a time, every second turn lands
    on its first turn's worker. At once, a second turn lands elsewhere when its worker has no
    claim out as it arrives (a link claims one stream at a time: between an assignment and its
    next claim, or with both slots busy), and the test says how often; the prompt's shared
    head (the system prompt) is on both workers then, and the rest is computed."""
    async with two_workers(qwen35_path, pki) as client:
        alone = [await _converse(client, i) for i in range(6)]
        together: list[tuple[list[str], int]] = []

        async def one(i: int) -> None:
            together.append(await _converse(client, i))

        for start in range(100, 112, 3):
            async with trio.open_nursery() as nursery:
                for i in range(start, start + 3):
                    nursery.start_soon(one, i)
    rates = []
    for name, runs in (("one at a time", alone), ("three at once", together)):
        same = sum(first == second for (first, second), _ in runs)
        rates.append(same / len(runs))
        print(
            f"{name}: second turns on the first turn's worker {same} of {len(runs)}; their "
            f"cached prompt tokens {sorted(cached for _, cached in runs)}"
        )
    workers = {worker for runs in (alone, together) for pair, _ in runs for worker in pair}
    assert workers == {"w1", "w2"}  # both served: affinity is no pinning
    assert rates[0] == 1.0
    assert rates[1] >= 0.5  # no worse than chance, whatever the races
    assert all(cached > 0 for _, cached in alone + together)


async def _converse(client: httpx.AsyncClient, i: int) -> tuple[list[str], int]:
    """Two turns of conversation ``i``: the worker of each, and the second's cached tokens."""
    messages = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": f"Conversation {i}: name a colour."},
    ]
    body = {"model": "m", "messages": messages, "max_tokens": 3, "temperature": 0}
    first = await client.post(CHAT_PATH, json=body)
    assert first.status_code == 200, first.text
    answer = first.json()["choices"][0]["message"]["content"]
    messages += [
        {"role": "assistant", "content": answer},
        {"role": "user", "content": "And another one?"},
    ]
    second = await client.post(CHAT_PATH, json={**body, "messages": messages})
    assert second.status_code == 200, second.text
    landed = [r.headers["x-llmtrio-worker"].split("#")[0] for r in (first, second)]
    return landed, second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
