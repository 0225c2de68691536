"""Unloading a model on demand while its requests race in, over the in-process link and the
remote (TLS) one: before the engine is freed, the model's link has withdrawn its claims on
the ring and handed back a stream assigned in the race, so no request reaches a model that
is gone and none claimed before the unload loads it again; every request is answered. And a
loaded model whose decode loop dies unloads, answers 503 in OpenAI's shape, and loads again.

The tiny qwen35 model serves under three names (``a``, ``b``, ``c``); the unload of ``a`` is
held at its engine's close (``Gate``) so that the ring can be looked at right then."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial

import attrs
import pytest
import trio
import trio.testing

from llmtrio.engine import EngineConfig
from llmtrio.engine.generate._core import EngineCore
from llmtrio.ring import (
    Ring,
    RingStats,
    RingStream,
    StreamState,
    WorkerStats,
    client_ssl_context,
    connect_ring,
)
from llmtrio.worker import (
    LOAD_WAITERS,
    HostConfig,
    HostedModel,
    ModelHost,
    OnDemand,
    _host,
    serve_link,
)

from .._helpers import HEAD, engine_config, eventually, read_all
from ..ring.test_ring_remote import Pki, pki, start_ingress, wait_attached
from .test_models_on_demand import QWEN35, chat

__all__ = ["pki"]

pytestmark = pytest.mark.slow

LINKS = ["local", "remote"]


def model(name: str) -> HostedModel:
    config = engine_config(QWEN35, model_name=name, threads=1, max_inflight=2, ctx_size=256)
    return HostedModel.of(name, config)


@attrs.define
class Gate:
    """Holds ``model``'s engine open once its unload has begun, until ``opened``, and keeps
    what the ring looked like at that moment (its links had withdrawn by then)."""

    ring: Ring
    model: str
    opened: trio.Event = attrs.field(factory=trio.Event)
    closing: list[RingStats] = attrs.field(factory=list)
    reached: trio.Event = attrs.field(factory=trio.Event)

    @asynccontextmanager
    async def open_engine(self, config: EngineConfig) -> AsyncIterator[object]:
        async with _real_open_engine(config) as engine:
            yield engine
            if config.model_name == self.model:
                self.closing.append(self.ring.stats())
                self.reached.set()
                await self.opened.wait()


_real_open_engine = _host.open_engine


def link_of(stats: RingStats, name: str) -> WorkerStats:
    (found,) = [worker for worker in stats.workers if worker.models == (name,)]
    return found


def park(ring: Ring, name: str) -> RingStream:
    return ring.park(HEAD, json.dumps(chat(name)).encode(), key=name)


async def answer(stream: RingStream) -> int:
    head, body = await read_all(stream)
    assert head.status == 200, body
    return head.status


@asynccontextmanager
async def hosting(
    kind: str, ring: Ring, host: ModelHost, names: Sequence[str], pki: Pki
) -> AsyncIterator[None]:
    """``host``'s models served on ``ring``, each on its own link: in this process, or over
    TLS through a control listener."""
    async with AsyncExitStack() as stack:
        nursery = await stack.enter_async_context(trio.open_nursery())
        await nursery.start(host.run)
        links = []
        if kind == "remote":
            url = await start_ingress(nursery, pki, ring)
            context = client_ssl_context(pki.worker("w"), None, pki.ingress_ca)
            for name in names:
                connecting = connect_ring(
                    [url], context, worker_id=f"w/{name}", max_inflight=LOAD_WAITERS, models=[name]
                )
                links.append(await stack.enter_async_context(connecting))
        # Entered last, left first: the links' streams end before the links close.
        serving = await stack.enter_async_context(trio.open_nursery())
        for index, name in enumerate(names):
            if links:
                await serving.start(partial(serve_link, OnDemand(host, name), links[index]))
            else:
                await serving.start(local_link, ring, host, name)
        await wait_attached(ring, len(names))
        await eventually(lambda: all(w.capacity for w in ring.stats().workers))
        yield
        serving.cancel_scope.cancel()
        nursery.cancel_scope.cancel()


async def local_link(
    ring: Ring, host: ModelHost, name: str, *, task_status: trio.TaskStatus[None]
) -> None:
    async with ring.attach(f"local-{name}", LOAD_WAITERS, models=[name]) as link:
        await serve_link(OnDemand(host, name), link, task_status=task_status)


@pytest.mark.parametrize("kind", LINKS)
async def test_an_evicted_model_withdraws_its_claims_before_it_goes(
    kind: str, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A budget of two: ``a`` and ``b`` loaded, a request for ``c`` evicts ``a`` (the least
    recently used); requests for ``a`` that come while it unloads stay parked (its link
    claims nothing), and all are answered once it is gone (by a load of ``a`` that a claim
    made after the unload asked for)."""
    ring = Ring(max_streams=64)
    gate = Gate(ring, "a")
    monkeypatch.setattr(_host, "open_engine", gate.open_engine)
    host = ModelHost.of([model(n) for n in "abc"], HostConfig(max_loaded_models=2))
    async with hosting(kind, ring, host, "abc", pki):
        for name in "ab":
            await answer(park(ring, name))
        evicting = park(ring, "c")
        await gate.reached.wait()
        (at_close,) = gate.closing
        # When a's engine began to close, its link held nothing and claimed nothing.
        assert link_of(at_close, "a").waiting_claims == 0
        assert link_of(at_close, "a").held == ()
        assert host.state("a") == "unloading"
        # The ring hears a unloaded at once, and the requests for it wait parked.
        assert ring.models()["a"].state == "unloaded"
        racing = [park(ring, "a") for _ in range(4)]
        await trio.testing.wait_all_tasks_blocked()
        assert [s.state for s in racing] == [StreamState.PARKED] * 4
        assert link_of(ring.stats(), "a").waiting_claims == 0
        gate.opened.set()
        assert [await answer(s) for s in [evicting, *racing]] == [200] * 5
    # (in the order they ended: c's load and a's second may end either way round)
    assert sorted(host.loads) == [("a", "ok"), ("a", "ok"), ("b", "ok"), ("c", "ok")]
    assert host.unloads[:2] == ["a", "b"]  # then b made room for a again


@pytest.mark.parametrize("kind", LINKS)
async def test_a_stream_assigned_as_the_unload_begins_is_handed_back(
    kind: str, pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream the ring assigns to ``a``'s claim in the very moment its unload begins (the
    claim not yet withdrawn) is given back before the engine goes, parked again, and served
    by the next load."""
    ring = Ring(max_streams=64)
    gate = Gate(ring, "a")
    monkeypatch.setattr(_host, "open_engine", gate.open_engine)
    host = ModelHost.of([model("a")], HostConfig())
    async with hosting(kind, ring, host, "a", pki):
        await answer(park(ring, "a"))
        await eventually(lambda: link_of(ring.stats(), "a").waiting_claims == 1)
        assert host.unload("a")
        raced = park(ring, "a")  # before the link has run: its claim is still there
        assert raced.state is StreamState.ASSIGNED
        await gate.reached.wait()
        (at_close,) = gate.closing
        assert link_of(at_close, "a").waiting_claims == 0
        # Handed back (over the network its Release may land just after the engine began
        # to close): parked again while the model is gone, nobody claiming it.
        await eventually(lambda: raced.state is StreamState.PARKED)
        assert link_of(ring.stats(), "a").held == ()
        gate.opened.set()
        assert await answer(raced) == 200
    assert host.loads == [("a", "ok"), ("a", "ok")]
    assert host.unloads == ["a"]


async def test_a_model_whose_decode_loop_dies_unloads_and_loads_again(
    pki: Pki, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fault in the decode loop of a loaded model (injected): the request on it is
    answered 503 in OpenAI's shape, the model unloads (``/v1/models`` says so), a request
    within the back-off is refused 503 ``model_load_failed`` with ``Retry-After``, and a
    later one loads it again."""
    ring = Ring(max_streams=64)
    host = ModelHost.of([model("a")], HostConfig())
    async with hosting("local", ring, host, "a", pki):
        await answer(park(ring, "a"))

        def fail(self: EngineCore) -> None:
            raise RuntimeError("an injected fault")

        with monkeypatch.context() as patch:
            patch.setattr(EngineCore, "step", fail)
            head, body = await read_all(park(ring, "a"))
        assert head.status == 503
        error = json.loads(body)["error"]
        assert error["type"] and "failed" in error["message"]
        await eventually(lambda: host.state("a") is None)
        assert ring.models()["a"].state == "unloaded"
        head, body = await read_all(park(ring, "a"))
        assert head.status == 503
        assert json.loads(body)["error"]["code"] == "model_load_failed"
        assert "decode loop failed" in json.loads(body)["error"]["message"]
        assert dict(head.headers)["Retry-After"] == "1"

        async def served() -> bool:
            head, _ = await read_all(park(ring, "a"))
            return head.status == 200

        await eventually(served)
        assert ring.models()["a"].state == "loaded"
    assert host.loads == [("a", "ok"), ("a", "ok")]
    assert host.unloads == ["a"]
