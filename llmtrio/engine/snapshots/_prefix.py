"""What memory holding some tokens can do for a prompt: the one rule the prompt cache (in
host memory) and the snapshot store (on disk) both follow. Pure: token ids in, counts out.

- Attention only (``cut_anywhere``): cells can be cut at any position, so memory holding
  ``held`` serves the prompt's first ``common_prefix(held, prompt)`` tokens.
- Recurrent or hybrid memory: the recurrent state exists only at the end of what was
  ingested, so memory holding ``held`` serves a prompt that ``held`` prefixes whole, or
  nothing.

Image placeholders are negative ids (drawn from the image's content hash): a prefix holding an
image is worth keeping and restoring whatever its length, since its tokens are few but each
image costs an encode and a decode of its own.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = ["Tokens", "as_tokens", "common_prefix", "covers", "reusable", "worth"]

Tokens = npt.NDArray[np.int32]


def as_tokens(value: Sequence[int] | Tokens) -> Tokens:
    return np.asarray(value, dtype=np.int32)


def common_prefix(a: Tokens, b: Tokens) -> int:
    """The number of leading tokens ``a`` and ``b`` share."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def reusable(held: Tokens, tokens: Tokens, limit: int, *, cut_anywhere: bool) -> int:
    """How many tokens of ``tokens`` (at most ``limit``) memory holding ``held`` serves."""
    if not len(held):
        return 0
    common = common_prefix(held, tokens)
    if cut_anywhere:
        return min(common, limit)
    return len(held) if common == len(held) and len(held) <= limit else 0


def covers(held: Tokens, tokens: Tokens, *, cut_anywhere: bool) -> bool:
    """Whether memory holding ``held`` serves every prefix memory holding ``tokens`` could
    serve (so that keeping ``tokens`` as well is no use)."""
    if cut_anywhere:
        return len(held) >= len(tokens) and common_prefix(held, tokens) == len(tokens)
    return len(held) == len(tokens) and common_prefix(held, tokens) == len(tokens)


def worth(tokens: Tokens, n: int, least: int) -> bool:
    """Whether the first ``n`` of ``tokens`` are worth a snapshot (or a restore): at least
    ``least`` tokens, or an image among them."""
    return n >= least or bool(n and tokens[:n].min() < 0)
