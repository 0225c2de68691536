"""What one request costs in Trio's terms, counted in process through the whole stack (HTTP
ingress, ring, local worker, engine): the tasks llmtrio's own code spawns for it and the cancel
scopes llmtrio's own code enters for it, so that a later change cannot quietly add them back.

A non-streamed request spawns two tasks of llmtrio's: the ingress's disconnect watcher (it
reads the connection while the response is awaited) and the worker's task for the claimed
stream. Its cancel scopes: the ingress request's one (its nursery's: the client leaving, the
drain's cut and the request deadline all cancel it), the body timeout, one shield for the last
body, the claimed stream's own (the ring cancels it when the client goes away), and one per
socket write (the send timeout; the response head goes out with the body, in one write); a
chat request's generation adds the engine's one. Before issue 32 they were four tasks (a
drain watcher and a cancel watcher besides) and ten scopes for a chat request, nine for an
embeddings one.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import attrs
import httpx
import pytest
import trio
import trio.testing

from llmtrio.api import CHAT_PATH, EMBEDDINGS_PATH
from llmtrio.engine import EngineConfig, open_engine
from llmtrio.ring import Ring, RingConfig
from llmtrio.worker import serve_link

from .._helpers import engine_config, open_ingress

#: The local worker's heartbeat waits for the engine's next capacity change (or half a second)
#: in a scope of its own: it runs beside the requests, not for one.
_HEARTBEAT = "llmtrio.worker._link:serve_link.<locals>.beat"


def _llmtrio_caller(frame: FrameType | None) -> str | None:
    """The first frame outside trio (and contextlib) that led here, named ``module:function``,
    if it is llmtrio's; ``None`` for anyone else's (hypercorn's, httpx's, the test's)."""
    while frame is not None:
        module = frame.f_globals.get("__name__", "")
        if module == "trio" or module.startswith(("trio.", "contextlib")):
            frame = frame.f_back
            continue
        if module.startswith("llmtrio"):
            return f"{module}:{frame.f_code.co_qualname}"
        return None
    return None


@attrs.define(eq=False)
class Counts(trio.abc.Instrument):
    """The tasks spawned from llmtrio's code (by the spawned coroutine's module) and the
    cancel scopes llmtrio's code entered (by ``CancelScope.__enter__``'s first caller outside
    trio: a nursery's scope is entered by trio's ``open_nursery`` for its caller), while
    ``counting``."""

    counting: bool = False
    tasks: list[str] = attrs.field(factory=list)
    scopes: list[str] = attrs.field(factory=list)

    def task_spawned(self, task: trio.lowlevel.Task) -> None:
        if not self.counting:
            return
        frame = getattr(task.coro, "cr_frame", None)
        module = frame.f_globals.get("__name__", "") if frame is not None else ""
        if module.startswith("llmtrio"):
            self.tasks.append(f"{module}:{task.coro.cr_code.co_qualname}")

    def scope_entered(self) -> None:
        if self.counting:
            caller = _llmtrio_caller(sys._getframe(2))
            if caller is not None and caller != _HEARTBEAT:
                self.scopes.append(caller)

    @contextmanager
    def request(self) -> Iterator[None]:
        self.tasks.clear()
        self.scopes.clear()
        self.counting = True
        try:
            yield
        finally:
            self.counting = False


@pytest.fixture
async def counts(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Counts]:
    counts = Counts()
    enter = trio.CancelScope.__enter__

    def counted_enter(scope: trio.CancelScope) -> trio.CancelScope:
        counts.scope_entered()
        return enter(scope)

    monkeypatch.setattr(trio.CancelScope, "__enter__", counted_enter)
    trio.lowlevel.add_instrument(counts)
    try:
        yield counts
    finally:
        trio.lowlevel.remove_instrument(counts)


@asynccontextmanager
async def serving(config: EngineConfig) -> AsyncIterator[httpx.AsyncClient]:
    """``llmtrio serve``'s stack for one model (as ``llmtrio.cli.serve`` puts it together:
    the default ring settings, one local worker), with a client on it."""
    async with open_engine(config) as engine:
        ring = Ring.from_config(RingConfig())
        async with trio.open_nursery() as nursery:

            async def worker(*, task_status: trio.TaskStatus[None]) -> None:
                async with ring.attach(
                    "local",
                    engine.capacity().max_inflight,
                    models=[engine.model_name],
                    kinds=[engine.kind],
                ) as link:
                    await serve_link(engine, link, task_status=task_status)

            await nursery.start(worker)
            async with open_ingress(ring) as ingress:
                yield ingress.client
            nursery.cancel_scope.cancel()


async def _counted(counts: Counts, client: httpx.AsyncClient, path: str, body: Any) -> None:
    """One request, after a first one to warm up, counted from its start until every task is
    blocked again (the worker's task ends right after its last message)."""
    response = await client.post(path, json=body)
    assert response.status_code == 200, response.text
    await trio.testing.wait_all_tasks_blocked()
    with counts.request():
        response = await client.post(path, json=body)
        assert response.status_code == 200, response.text
        await trio.testing.wait_all_tasks_blocked()


async def test_a_chat_request_costs_two_tasks_and_six_scopes(
    counts: Counts, qwen35_path: Path
) -> None:
    async with serving(engine_config(qwen35_path, max_inflight=1)) as client:
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        await _counted(counts, client, CHAT_PATH, body)
    assert sorted(counts.tasks) == [
        "llmtrio.web._relay:RingRequest._serve.<locals>.cancel_on_disconnect",
        "llmtrio.worker._link:serve_link.<locals>.handle",
    ], counts.tasks
    # and the engine's: a generation's admission wait
    assert sorted(counts.scopes) == sorted(
        [*_SCOPES, "llmtrio.engine.generate._engine:Engine.submit"]
    ), counts.scopes


async def test_an_embeddings_request_costs_two_tasks_and_five_scopes(
    counts: Counts, minilm_path: Path
) -> None:
    async with serving(engine_config(minilm_path, max_inflight=1)) as client:
        body = {"input": "The cat sat on the mat.", "model": minilm_path.stem}
        await _counted(counts, client, EMBEDDINGS_PATH, body)
    assert sorted(counts.tasks) == [
        "llmtrio.web._relay:RingRequest._serve.<locals>.cancel_on_disconnect",
        "llmtrio.worker._link:serve_link.<locals>.handle",
    ], counts.tasks
    assert sorted(counts.scopes) == _SCOPES, counts.scopes


_SCOPES = sorted(
    [
        "llmtrio.web._relay:RingRequest.serve",  # the request's scope (its nursery's)
        "llmtrio.web._relay:RingRequest._serve",  # the body timeout
        "llmtrio.web._access:Exchange.shielded",  # one shield for the last body
        "llmtrio.worker._pipeline:serve_request",  # the claimed stream's scope
        "llmtrio.web._serve:_ConnectionStream.send_all",  # the one socket write's send timeout
    ]
)
