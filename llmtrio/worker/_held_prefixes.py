"""What prompt prefixes a link's model holds, as its heartbeat states them to the ring (prefix
affinity: the ingress prefers, among the workers that may take a request, the one holding the
longest prefix of its prompt).

A worker knows the prefixes it holds by the requests it serves: as each one starts, the first
and the last digest of the request's chain (``llmtrio.api.prefixes_of``) are noted: its head
(the tools and system prompt a new conversation shares) and all of it (what the conversation's
next turn starts with), and the link beats at once, so that the ring hears them before the
response's end (and so before the client can send its next turn). The most recent ``size`` are
stated. It is a hint, not an inventory: a prefix may have left the prompt cache since (evicted
from memory with no ``--cache-dir`` to keep it), and then the worker computes it, as any other
would.
"""

from __future__ import annotations

from collections import OrderedDict

import attrs

from ..api import prefixes_of

__all__ = ["HELD_PREFIXES", "PrefixLog"]

#: How many digests a link states (two a request: 32 conversations).
HELD_PREFIXES = 64


@attrs.define
class PrefixLog:
    """The most recent ``size`` prefix digests of the requests a link served."""

    size: int = HELD_PREFIXES
    _digests: OrderedDict[str, None] = attrs.field(init=False, factory=OrderedDict)

    def serving(self, path: str, body: bytes) -> bool:
        """A request to ``path`` with ``body`` starts: its prefixes are held from now on.
        Returns whether that changed what is stated (the order of the others aside)."""
        chain = prefixes_of(path, body)
        new = False
        for prefix in (chain[0], chain[-1]) if chain else ():
            new = new or prefix.digest not in self._digests
            self._digests[prefix.digest] = None
            self._digests.move_to_end(prefix.digest)
        while len(self._digests) > self.size:
            self._digests.popitem(last=False)
        return new

    def held(self) -> tuple[str, ...]:
        """The digests, most recent first."""
        return tuple(reversed(self._digests))
