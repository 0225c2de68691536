"""Helpers shared by the engine tests."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AsyncExitStack

import trio

from llmtrio.engine import Done, Engine, GenerateRequest, Token, TokenLogprob

__all__ = [
    "NEAR_TIE_NATS",
    "assert_greedy_agrees",
    "collect",
    "collect_logprobs",
    "run",
    "run_together",
]

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


async def run(engine: Engine, request: GenerateRequest) -> tuple[str, Done, list[TokenLogprob]]:
    """Run ``request`` to its end: its text, its ``Done`` and its tokens' logprobs (a
    ``Failed`` fails the test)."""
    text: list[str] = []
    logprobs: list[TokenLogprob] = []
    async with engine.submit(request) as generation:
        async for event in generation:
            if isinstance(event, Token):
                text.append(event.text)
                logprobs += event.logprobs
            elif isinstance(event, Done):
                return "".join(text), event, logprobs
            else:
                raise AssertionError(f"generation failed: {event}")
    raise AssertionError("no Done event")


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
