"""Helpers shared by the engine tests."""

from __future__ import annotations

from llmtrio.engine import Done, Engine, GenerateRequest, Token

__all__ = ["collect"]


async def collect(engine: Engine, request: GenerateRequest) -> tuple[str, Done]:
    """Run ``request`` to its end; its text and its ``Done`` (a ``Failed`` fails the test)."""
    text = []
    async with engine.submit(request) as generation:
        async for event in generation:
            if isinstance(event, Token):
                text.append(event.text)
            elif isinstance(event, Done):
                return "".join(text), event
            else:
                raise AssertionError(f"generation failed: {event}")
    raise AssertionError("no Done event")
