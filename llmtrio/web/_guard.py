"""Browser-origin protection, as Ollama does it (``OLLAMA_ORIGINS``): which web pages may use
this server, and which ``Host`` names a loopback listener answers to.

Pure: headers in, a decision out. A web page on another origin can make a browser send
requests to ``http://127.0.0.1:8080`` (a ``text/plain`` POST needs no preflight) and, through
DNS rebinding, read the replies under a name of its own. So:

- a request with an ``Origin`` header is served only when that origin is allowed: the
  server's own origin, any loopback origin (``http://localhost:3000``, ``http://127.0.0.1``,
  ``http://[::1]``), or one given with ``--allowed-origins`` (``*`` allows every origin);
- a CORS preflight (``OPTIONS`` with ``Access-Control-Request-Method``) is answered for
  allowed origins only, and allowed cross-origin responses carry
  ``Access-Control-Allow-Origin``;
- on a loopback listener, a ``Host`` that names neither a loopback address nor the bound host
  is refused (a rebound name resolving to 127.0.0.1).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

import attrs

from ..api import HOST_NOT_ALLOWED, ORIGIN_NOT_ALLOWED, ApiError

__all__ = ["OriginPolicy", "header_map"]

_CORS_METHODS = "GET, POST, OPTIONS"
_CORS_HEADERS = (
    "Authorization, Content-Type, X-Api-Key, X-Request-Id, Anthropic-Version, Anthropic-Beta"
)


def _is_loopback_name(host: str) -> bool:
    host = host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _split_host(host: str) -> str:
    """The name in a ``Host`` header, without its port (``[::1]:8080`` -> ``::1``)."""
    host = host.strip()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _normalize_origin(origin: str) -> str:
    return origin.strip().rstrip("/").lower()


def _origin_set(origins: Iterable[str]) -> frozenset[str]:
    return frozenset(_normalize_origin(o) for o in origins)


@attrs.frozen
class OriginPolicy:
    """What origins and hosts the public listener serves.

    ``allowed_origins`` are origins (``https://app.example.com``) or ``*``;
    ``loopback_listener`` turns the ``Host`` check on, with ``bound_host`` (the address or
    name the server listens on) also accepted.
    """

    allowed_origins: frozenset[str] = attrs.field(default=frozenset(), converter=_origin_set)
    loopback_listener: bool = True
    bound_host: str = "127.0.0.1"

    @property
    def allow_all(self) -> bool:
        return "*" in self.allowed_origins

    def allows_origin(self, origin: str, *, scheme: str, host: str | None) -> bool:
        """Whether a page on ``origin`` may use this server (``host`` is the request's
        ``Host`` header, which makes the server's own origin)."""
        normalized = _normalize_origin(origin)
        if self.allow_all or normalized in self.allowed_origins:
            return True
        if host is not None and normalized == f"{scheme}://{host.strip().lower()}":
            return True
        parts = urlsplit(normalized)
        return parts.scheme in ("http", "https") and _is_loopback_name(parts.hostname or "")

    def allows_host(self, host: str | None) -> bool:
        """Whether a request naming ``host`` is answered (always, off loopback)."""
        if not self.loopback_listener or host is None:
            return True
        name = _split_host(host)
        return _is_loopback_name(name) or name.lower() == _split_host(self.bound_host).lower()

    def refusal(self, method: str, scheme: str, headers: Mapping[str, str]) -> ApiError | None:
        """The 403 for a request this policy refuses, or ``None``."""
        host = headers.get("host")
        if not self.allows_host(host):
            return HOST_NOT_ALLOWED.error(
                f"This server does not answer to the host name {host!r}: on a loopback "
                "listener only loopback names and the bound address are served."
            )
        origin = headers.get("origin")
        if origin is not None and not self.allows_origin(origin, scheme=scheme, host=host):
            return ORIGIN_NOT_ALLOWED.error(
                f"Requests from the web origin {origin!r} are not allowed. Start the server "
                "with --allowed-origins to allow it."
            )
        return None

    def cors_headers(self, headers: Mapping[str, str]) -> list[tuple[str, str]]:
        """Headers for the response to an allowed request that came with an ``Origin``."""
        origin = headers.get("origin")
        if origin is None:
            return []
        return [
            ("access-control-allow-origin", origin),
            ("vary", "Origin"),
            ("access-control-expose-headers", "X-Request-Id, Retry-After"),
        ]

    def preflight_headers(self, headers: Mapping[str, str]) -> list[tuple[str, str]]:
        """Headers for the 204 answering an allowed CORS preflight."""
        requested = headers.get("access-control-request-headers")
        return [
            *self.cors_headers(headers),
            ("access-control-allow-methods", _CORS_METHODS),
            ("access-control-allow-headers", requested or _CORS_HEADERS),
            ("access-control-max-age", "600"),
        ]

    @staticmethod
    def is_preflight(method: str, headers: Mapping[str, str]) -> bool:
        return (
            method == "OPTIONS"
            and "origin" in headers
            and "access-control-request-method" in headers
        )


def header_map(raw: Iterable[tuple[bytes, bytes]]) -> dict[str, str]:
    """ASGI headers as a dict of lower-case names to values (the last of repeated names)."""
    return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in raw}
