"""What the media benchmarks measure beside the media: a counting stream's gaps between tokens
(``audio_bench.py``, ``vision_bench.py``)."""

from __future__ import annotations

import time

from llmtrio.engine import ChatMessage, Engine, GenerateRequest, Token


async def count_and_time(engine: Engine, i: int, tokens: int, gaps: list[float]) -> None:
    """Stream ``tokens`` tokens of counting from ``i``, adding each gap between two tokens
    (seconds) to ``gaps``."""
    request = GenerateRequest(
        messages=[ChatMessage("user", f"Count from {i} onwards.")],
        max_tokens=tokens,
        ignore_eos=True,
    )
    last = 0.0
    async with engine.submit(request) as generation:
        async for event in generation:
            if isinstance(event, Token):
                now = time.perf_counter()
                if last:
                    gaps.append(now - last)
                last = now
