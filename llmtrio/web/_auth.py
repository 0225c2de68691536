"""API keys on the public listener, as llama.cpp's server checks them.

A request carries its key as ``Authorization: Bearer <key>`` or ``X-Api-Key: <key>``; it is
compared with every configured key in constant time (``hmac.compare_digest``), so the time
taken says nothing about how much of a key was right. Pure: no I/O.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..api import PROBE_PATHS, ROUTES

__all__ = ["OPEN_PATHS", "ApiKeys", "read_key_file"]

#: What anyone may fetch with keys set: the chat page, the probes and the API's open routes
#: (health and the model list).
OPEN_PATHS = frozenset({"/", *PROBE_PATHS, *(route.path for route in ROUTES if route.open)})


def read_key_file(path: Path) -> list[str]:
    """The keys in ``path``, one per line; blank lines and ``#`` comments are skipped.

    Error handling: ``OSError`` when it cannot be read."""
    keys = []
    for line in path.read_text(encoding="utf-8").splitlines():
        key = line.strip()
        if key and not key.startswith("#"):
            keys.append(key)
    return keys


class ApiKeys:
    """The keys a listener accepts; none means no key is asked for."""

    def __init__(self, keys: Iterable[str] = ()) -> None:
        self._keys = tuple(dict.fromkeys(k.encode() for k in keys if k))

    def __bool__(self) -> bool:
        return bool(self._keys)

    def match(self, headers: Mapping[str, str]) -> str | None:
        """A short, stable name for the key ``headers`` carry (for rate limits and logs; not
        the key), or ``None`` when it carries none of the keys. Every key is compared, in
        constant time each."""
        given = _presented(headers).encode()
        found = None
        for key in self._keys:
            if hmac.compare_digest(given, key):
                found = key
        if found is None:
            return None
        return "key-" + hashlib.sha256(found).hexdigest()[:12]


def _presented(headers: Mapping[str, str]) -> str:
    authorization = headers.get("authorization", "")
    scheme, _, credentials = authorization.partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return headers.get("x-api-key", "").strip()
