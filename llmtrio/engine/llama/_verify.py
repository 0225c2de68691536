"""Verifying a sequence's drafts: its sampler samples each position in turn, exactly as it
would without drafts, and stops at the first sample that differs from the draft."""

from __future__ import annotations

from collections.abc import Callable, Sequence

__all__ = ["verify"]


def verify(
    sample: Callable[[int], int], first: int, draft: Sequence[int], ends: Callable[[int], bool]
) -> list[int]:
    """Sample the positions ``first, first + 1, ...`` in turn (the last token's, then each
    draft token's) and stop after the first sample that differs from the draft, or ends the
    generation: the tokens to emit. All but the last equal the draft."""
    out: list[int] = []
    for j in range(len(draft) + 1):
        token = sample(first + j)
        out.append(token)
        if j == len(draft) or token != draft[j] or ends(token):
            break
    return out
