"""Per-slot sampling extras over a logits vector: penalties and log-probabilities.

Pure numpy, no llama.cpp: each runs only for the slots whose request asks for it, so a plain
greedy slot stays an argmax.
"""

from __future__ import annotations

from collections import Counter, deque

import attrs
import numpy as np
import numpy.typing as npt

__all__ = ["Penalties", "RawLogprob", "logprob_of"]

_FLOAT32_MAX = float(np.finfo(np.float32).max)


class Penalties:
    """OpenAI's presence and frequency penalties over every token generated so far, and
    llama.cpp's repeat penalty over the last ``repeat_last_n`` of them.

    The repeat penalty divides a positive logit (multiplies a negative one), as llama.cpp's
    ``llama_sampler_init_penalties`` does; presence and frequency subtract
    ``presence + frequency * count`` (OpenAI's formula).
    """

    def __init__(
        self, *, presence: float, frequency: float, repeat: float, repeat_last_n: int
    ) -> None:
        self._presence = presence
        self._frequency = frequency
        self._repeat = repeat
        self._counts: Counter[int] = Counter()
        self._window: deque[int] = deque(maxlen=repeat_last_n if repeat != 1.0 else 0)

    def apply(self, logits: npt.NDArray[np.float32]) -> None:
        """Penalize ``logits`` in place."""
        if self._window:
            ids = np.fromiter(set(self._window), dtype=np.int64)
            values = logits[ids].astype(np.float64)
            with np.errstate(over="ignore"):  # inf, clipped below
                scaled = np.where(values > 0, values / self._repeat, values * self._repeat)
            # A tiny penalty (1e-300 is valid) would overflow float32 logits to +-inf, which
            # turns every later softmax into NaN: the most a float32 holds is the most it gets.
            logits[ids] = np.clip(scaled, -_FLOAT32_MAX, _FLOAT32_MAX)
        if self._counts and (self._presence or self._frequency):
            ids = np.fromiter(self._counts.keys(), dtype=np.int64, count=len(self._counts))
            counts = np.fromiter(self._counts.values(), dtype=np.float32, count=len(ids))
            logits[ids] -= self._presence + self._frequency * counts

    def accept(self, token: int) -> None:
        self._counts[token] += 1
        if self._window.maxlen:
            self._window.append(token)


@attrs.frozen
class RawLogprob:
    """A token's log-probability and its top alternatives, as token ids (the decode thread's
    side; the Trio side turns ids into text)."""

    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


def logprob_of(logits: npt.NDArray[np.float32], token: int, top: int) -> RawLogprob:
    """The log-softmax of ``logits`` at ``token``, and the ``top`` most likely tokens with
    theirs (most likely first; ties by token id)."""
    peak = float(logits.max())
    log_z = peak + float(np.log(np.sum(np.exp(logits - peak), dtype=np.float64)))
    best: tuple[tuple[int, float], ...] = ()
    if top > 0:
        n = min(top, len(logits))
        ids = np.argpartition(-logits, n - 1)[:n]
        ids = ids[np.lexsort((ids, -logits[ids]))]
        best = tuple((int(i), float(logits[i]) - log_z) for i in ids)
    return RawLogprob(token, float(logits[token]) - log_z, best)
