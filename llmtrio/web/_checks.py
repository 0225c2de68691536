"""The checks every request at the ingress goes through, in order: the browser origin and
``Host`` (``OriginPolicy``), the CORS preflight, the API key, and, for the ring's routes, the
drain and the rate limit. Each check either lets the request on or names its refusal.

Pure but for the clock passed in: headers, the path and the drain's state in, a decision out;
``Ingress`` (``_app``) carries the decision out.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs

from ..api import RING_PATHS, ApiError, invalid_api_key, rate_limited, shutting_down
from ._auth import OPEN_PATHS, ApiKeys
from ._drain import Drain
from ._guard import OriginPolicy
from ._ratelimit import RateLimiter, retry_after

__all__ = ["Admitted", "Checks", "Gate", "Refused"]


@attrs.frozen
class Gate:
    """What guards the API besides the origin policy.

    ``keys``: the API keys asked of every path but ``/``, ``/health`` and ``/v1/models``
    (none: no key asked). ``rate_limit``: completion requests per key (or per client address
    when no keys are set) per minute, then 429 (``None``: no limit). ``request_timeout``:
    seconds a completion request may take from its arrival to its last byte, then it is ended
    (504, or an error event once streaming; ``None``: no deadline). ``body_timeout``: seconds
    for a completion request's body to arrive, then 408."""

    keys: ApiKeys = attrs.field(factory=ApiKeys)
    rate_limit: int | None = None
    request_timeout: float | None = None
    body_timeout: float = 60.0


@attrs.frozen
class Refused:
    """Answer ``error`` and nothing else. ``read_body``: read the request's body first
    (hypercorn's HTTP/2 fails the whole connection on data for a stream already answered);
    ``close``: close the connection after it (HTTP/1.1, so a kept-alive client reconnects
    elsewhere)."""

    error: ApiError
    read_body: bool = False
    close: bool = False


@attrs.frozen
class Admitted:
    """Serve the request: through the ring (``ring``) or by the app. ``key`` is the API key
    it presented."""

    ring: bool
    key: str | None


@attrs.define
class Checks:
    """The chain, as this ingress's settings make it."""

    policy: OriginPolicy
    gate: Gate
    drain: Drain
    _limiter: RateLimiter | None = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        rate = self.gate.rate_limit
        self._limiter = None if rate is None else RateLimiter(rate)

    def origin(self, method: str, scheme: str, headers: Mapping[str, str]) -> ApiError | None:
        """The origin and ``Host`` check, first of all (before any header is answered)."""
        return self.policy.refusal(method, scheme, headers)

    def preflight(self, method: str, headers: Mapping[str, str]) -> list[tuple[str, str]] | None:
        """The headers of a CORS preflight's 204, or ``None`` when it is no preflight."""
        if OriginPolicy.is_preflight(method, headers):
            return self.policy.preflight_headers(headers)
        return None

    def response_headers(
        self, request_id: str, headers: Mapping[str, str]
    ) -> list[tuple[str, str]]:
        """What every response past the origin check carries: its request id, and the CORS
        headers of an allowed cross-origin request."""
        return [("x-request-id", request_id), *self.policy.cors_headers(headers)]

    def admit(
        self,
        method: str,
        path: str,
        headers: Mapping[str, str],
        *,
        client: str,
        http2: bool,
        now: float,
    ) -> Admitted | Refused:
        """The API key, then, for a ring route, the drain and the rate limit."""
        key = None
        if self.gate.keys and path not in OPEN_PATHS:
            key = self.gate.keys.match(headers)
            if key is None:
                return Refused(invalid_api_key())
        if not (method == "POST" and path in RING_PATHS):
            return Admitted(False, key)
        if self.drain.draining:
            return Refused(shutting_down(), read_body=True, close=not http2)
        if self._limiter is not None:
            wait = self._limiter.take(key or client, now)
            if wait is not None:
                assert self.gate.rate_limit is not None
                return Refused(rate_limited(self.gate.rate_limit, retry_after(wait)))
        return Admitted(True, key)
