"""Requests per client per minute: a token bucket per key, with the clock passed in.

Pure: no I/O, no clock of its own; the ingress passes ``trio.current_time()``, tests a
number.
"""

from __future__ import annotations

import math

import attrs

__all__ = ["RateLimiter", "retry_after"]


@attrs.define
class _Bucket:
    tokens: float
    at: float


@attrs.define
class RateLimiter:
    """``per_minute`` requests per key per minute, in bursts of up to ``per_minute``: each
    key's bucket holds ``per_minute`` tokens and refills at ``per_minute / 60`` a second.

    Resource handling: keys whose bucket has refilled are forgotten once more than
    ``max_keys`` are tracked, so a stream of new client addresses cannot grow it without
    bound (a forgotten key starts full, which is what it had).
    """

    per_minute: int
    max_keys: int = 10_000
    _buckets: dict[str, _Bucket] = attrs.field(factory=dict, init=False)

    def __attrs_post_init__(self) -> None:
        if self.per_minute < 1:
            raise ValueError(f"per_minute must be at least 1, not {self.per_minute}")

    def take(self, key: str, now: float) -> float | None:
        """Spend one of ``key``'s tokens at time ``now``: ``None`` when there was one, else
        the seconds until there is (for ``Retry-After``)."""
        rate = self.per_minute / 60.0
        bucket = self._buckets.get(key)
        if bucket is None:
            if len(self._buckets) >= self.max_keys:
                self._forget_full(now)
            bucket = self._buckets[key] = _Bucket(float(self.per_minute), now)
        else:
            elapsed = max(0.0, now - bucket.at)
            bucket.tokens = min(float(self.per_minute), bucket.tokens + elapsed * rate)
            bucket.at = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return None
        return (1.0 - bucket.tokens) / rate

    def _forget_full(self, now: float) -> None:
        rate = self.per_minute / 60.0
        full = [
            key
            for key, bucket in self._buckets.items()
            if bucket.tokens + (now - bucket.at) * rate >= self.per_minute
        ]
        for key in full:
            del self._buckets[key]
        if len(self._buckets) >= self.max_keys:  # all busy: forget the longest idle
            oldest = min(self._buckets, key=lambda k: self._buckets[k].at)
            del self._buckets[oldest]


def retry_after(seconds: float) -> int:
    """Whole seconds for ``Retry-After``, at least 1."""
    return max(1, math.ceil(seconds))
