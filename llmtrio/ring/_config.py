"""The settings an ingress gives its ring: ``RingConfig``."""

from __future__ import annotations

import attrs

__all__ = ["RingConfig"]


@attrs.frozen
class RingConfig:
    """How many requests an ingress's ring holds and how long one may wait for a worker.

    ``max_streams`` bounds the open streams (parked or being served); a request beyond it
    is refused at once (the ingress answers 503 with ``Retry-After``). ``park_timeout`` is
    how many seconds a request may stay parked, claimed by no worker, before it is cancelled
    (503); ``None`` lets it wait as long as its client does. ``Ring.from_config`` builds a
    ring with these settings.

    Error handling: ``ValueError`` naming the field for a value out of range.
    """

    max_streams: int = 64
    park_timeout: float | None = 30.0

    def __attrs_post_init__(self) -> None:
        if self.max_streams < 1:
            raise ValueError(f"max_streams must be at least 1, not {self.max_streams}")
        if self.park_timeout is not None and not self.park_timeout > 0:
            raise ValueError(f"park_timeout must be more than 0, not {self.park_timeout}")
