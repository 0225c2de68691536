"""Helpers shared by the tests: engine configurations and runs, waiting on state, reading
ring streams, an ingress on a free port."""

from __future__ import annotations

import inspect
import math
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar, cast

import attrs
import httpx
import trio
from prometheus_client import CollectorRegistry

from llmtrio.api import CHAT_PATH
from llmtrio.engine import Done, Engine, EngineConfig, GenerateRequest, Token, TokenLogprob
from llmtrio.ring import RequestHead, ResponseHead, Ring, RingStream
from llmtrio.web import ServeConfig, serve_ingress

__all__ = [
    "HEAD",
    "NEAR_TIE_NATS",
    "SSE",
    "Ingress",
    "assert_greedy_agrees",
    "collect",
    "collect_logprobs",
    "engine_config",
    "eventually",
    "open_ingress",
    "read_all",
    "run",
    "run_together",
    "wait_until",
]

T = TypeVar("T")

#: What a wait awaits, for its failure message: a text, or a callable that describes the state
#: when the wait fails (a log's tail, a /health).
Describe = str | Callable[[], object]


#: A chat completion request's head, as the ingress parks it on the ring.
HEAD = RequestHead("POST", CHAT_PATH, [("content-type", "application/json")])
#: A streamed response's headers.
SSE = [("content-type", "text/event-stream")]


def engine_config(model: Path, **changes: Any) -> EngineConfig:
    """An engine on a test model: 4 slots of 512 tokens on 2 threads (this machine's share),
    without speculative decoding, unless ``changes`` (any of :class:`EngineConfig`'s fields)
    say otherwise.

    Without drafts because tests compare runs token for token and logprob for logprob: drafts,
    whose number follows measured step times, change batch shapes, and with them the last bits
    of the logits (a near tie can flip, more on some CPUs than others). The tests of
    speculation ask for it (``spec="ngram"``); the served processes run the default. For the
    same reason prompts first (``prefill_share=inf``): a finite share sizes the chunks beside
    decoding by measured step times (``tests/engine/test_smooth_streams.py`` asks for one), and
    every step on the 2 threads (``choose_threads=False``): the bits follow the thread count,
    which a measured choice would make follow the machine's load."""
    base = EngineConfig(
        model=model,
        max_inflight=4,
        ctx_size=512,
        threads=2,
        spec=None,
        prefill_share=math.inf,
        choose_threads=False,
    )
    return attrs.evolve(base, **changes)


def _awaited(check: Callable[..., object], what: Describe | None) -> str:
    """What a wait waits for, for its failure: ``what`` (a callable: the state at the time),
    else the source line of ``check`` (a lambda reads as its condition)."""
    if callable(what):
        return str(what())
    if what is not None:
        return what
    try:
        return inspect.getsource(check).strip()
    except (OSError, TypeError):
        return repr(check)


def _failure(
    check: Callable[..., object], what: Describe | None, within: float, last: object
) -> str:
    seen = "" if isinstance(last, bool) or last is None else f" (last: {last!r})"
    return f"not within {within}s: {_awaited(check, what)}{seen}"


async def eventually(
    check: Callable[[], Awaitable[T]] | Callable[[], T],
    what: Describe | None = None,
    *,
    within: float = 10,
) -> T:
    """Poll ``check`` (a function, or an async one) until it gives a true value, and return
    that value: for state that another task, thread or process changes without an event to
    wait on (where a ``trio.Event`` or a channel exists, wait on that instead). Fails the test
    with an ``AssertionError`` saying what was awaited (``what``, else ``check``'s source) after
    ``within`` seconds: a bound on a hang, not a measure of speed."""
    last: object = None
    try:
        with trio.fail_after(within):
            while True:
                pending = check()
                last = await pending if inspect.isawaitable(pending) else pending
                if last:
                    return cast(T, last)
                await trio.sleep(0.01)
    except trio.TooSlowError:
        raise AssertionError(_failure(check, what, within, last)) from None


def wait_until(
    check: Callable[[], T], what: Describe | None = None, *, within: float = 60, every: float = 0.05
) -> T:
    """:func:`eventually` for code outside Trio (processes, threads): poll ``check`` every
    ``every`` seconds until it gives a true value, and return that value; an ``AssertionError``
    saying what was awaited after ``within`` seconds. ``check`` may raise to give up early
    (a process that exited)."""
    end = time.monotonic() + within
    while not (last := check()):
        if time.monotonic() >= end:
            raise AssertionError(_failure(check, what, within, last))
        time.sleep(every)
    return last


async def read_all(stream: RingStream) -> tuple[ResponseHead, bytes]:
    """A ring stream's response: its head and its whole body."""
    head = await stream.response_head()
    return head, b"".join([chunk async for chunk in stream.body()])


@attrs.frozen
class Ingress:
    """An ingress on a free loopback port, from :func:`open_ingress`."""

    url: str
    #: A client with ``url`` as its base.
    client: httpx.AsyncClient
    #: Set it to begin the ingress's graceful drain.
    shutdown: trio.Event
    #: Set once ``serve_ingress`` returned.
    stopped: trio.Event


@asynccontextmanager
async def open_ingress(
    ring: Ring,
    config: ServeConfig | None = None,
    *,
    model_name: str = "m",
    registry: CollectorRegistry | None = None,
    verify: ssl.SSLContext | bool = True,
    http2: bool = False,
) -> AsyncIterator[Ingress]:
    """``serve_ingress`` in front of ``ring`` (``config``: a free loopback port, a 1 s graceful
    timeout) with a client on it. Leaving the block begins the drain and waits (10 s at most)
    for the server to stop; a test may set ``shutdown`` itself before."""
    if config is None:
        config = ServeConfig(host="127.0.0.1", port=0, graceful_timeout=1)
    shutdown, stopped = trio.Event(), trio.Event()
    async with trio.open_nursery() as nursery:

        async def serve(*, task_status: trio.TaskStatus[list[str]]) -> None:
            await serve_ingress(
                ring,
                config,
                model_name=model_name,
                shutdown=shutdown,
                registry=registry,
                task_status=task_status,
            )
            stopped.set()

        binds = await nursery.start(serve)
        async with httpx.AsyncClient(
            base_url=binds[0], timeout=30, verify=verify, http2=http2
        ) as client:
            yield Ingress(binds[0], client, shutdown, stopped)
        shutdown.set()
        with trio.fail_after(10):
            await stopped.wait()


#: How far apart, in nats, two choices may be for batch shape alone to swap them. llama.cpp's
#: logits depend on the shape of the batch that computed them (one batch or chunks, a cached
#: prefix plus one token, other sequences beside it): measured on an AVX2 machine, the gap
#: between the top two logprobs of gemma-3-270m moved by a median 0.13 nats and at most 0.81
#: between 5-token batches and 1-token steps (issue 15).
NEAR_TIE_NATS = 1.0


async def collect(engine: Engine, request: GenerateRequest) -> tuple[str, Done]:
    """Run ``request`` to its end; its text and its ``Done`` (a ``Failed`` fails the test)."""
    text, done, _ = await run(engine, request)
    return text, done


async def collect_logprobs(
    engine: Engine, request: GenerateRequest
) -> tuple[list[TokenLogprob], Done]:
    """Run ``request`` (which asks for logprobs) to its end; each token's logprobs and its
    ``Done``."""
    assert request.logprobs, "ask for logprobs (with alternatives) to compare tokens"
    _, done, logprobs = await run(engine, request)
    assert len(logprobs) == done.completion_tokens
    return logprobs, done


async def events_of(engine: Engine, request: GenerateRequest) -> tuple[list[Token], Done]:
    """Run ``request`` to its end: its ``Token`` events and its ``Done`` (a ``Failed`` fails
    the test)."""
    tokens: list[Token] = []
    async with engine.submit(request) as generation:
        async for event in generation:
            if isinstance(event, Token):
                tokens.append(event)
            elif isinstance(event, Done):
                return tokens, event
            else:
                raise AssertionError(f"generation failed: {event}")
    raise AssertionError("no Done event")


async def run(engine: Engine, request: GenerateRequest) -> tuple[str, Done, list[TokenLogprob]]:
    """Run ``request`` to its end: its text, its ``Done`` and its tokens' logprobs (a
    ``Failed`` fails the test)."""
    tokens, done = await events_of(engine, request)
    logprobs = [logprob for token in tokens for logprob in token.logprobs]
    return "".join(token.text for token in tokens), done, logprobs


async def run_together(
    engine: Engine, requests: list[GenerateRequest]
) -> list[tuple[list[TokenLogprob], Done]]:
    """Run ``requests`` at once, all admitted in one step (the decode thread is held at its
    step boundary while they are submitted): each one's logprobs and ``Done``."""
    logprobs: list[list[TokenLogprob]] = [[] for _ in requests]
    async with AsyncExitStack() as stack:
        with engine._cond:
            generations = [await stack.enter_async_context(engine.submit(r)) for r in requests]

        async def drain(i: int) -> None:
            async for event in generations[i]:
                if isinstance(event, Token):
                    logprobs[i] += event.logprobs

        async with trio.open_nursery() as nursery:
            for i in range(len(requests)):
                nursery.start_soon(drain, i)
    results = []
    for entries, generation in zip(logprobs, generations, strict=True):
        assert isinstance(generation.result, Done)
        results.append((entries, generation.result))
    return results


def assert_greedy_agrees(
    reference: Sequence[TokenLogprob],
    other: Sequence[TokenLogprob],
    *,
    within: float = NEAR_TIE_NATS,
) -> int | None:
    """Assert that two greedy runs of one request, computed from differently shaped batches,
    agree as far as batch shape lets them: token for token until they first differ, and
    there only at a near tie (each run's choice is among the other run's alternatives,
    within ``within`` nats of that run's own choice). After a divergence the two continue
    from different texts, so nothing further is compared. Returns where they diverged.

    This is what holds on any CPU; where two runs are ingested alike, compare them exactly.
    """
    for i, (a, b) in enumerate(zip(reference, other, strict=False)):
        if a.piece == b.piece:
            continue
        for mine, theirs, name in ((a, b, "reference"), (b, a, "other")):
            alternatives = {piece: logprob for _, piece, logprob in mine.top}
            assert theirs.piece in alternatives, (
                f"token {i}: {theirs.token!r} is not among the {name} run's alternatives "
                f"{[text for text, _, _ in mine.top]} (chose {mine.token!r})"
            )
            gap = mine.logprob - alternatives[theirs.piece]
            assert gap <= within, (
                f"token {i}: the runs chose {a.token!r} and {b.token!r}, {gap:.3f} nats apart "
                f"in the {name} run: more than batch shape moves logits"
            )
        return i
    assert len(reference) == len(other)
    return None
