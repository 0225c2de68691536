"""The routes the workers serve, named once: the ingress (``llmtrio.web``) forwards ``POST``
on these paths through the ring and answers everything else itself; the worker dispatches on
the path it is given and trusts the ingress's routing (it checks no methods, answers no
404/405)."""

from __future__ import annotations

__all__ = ["CHAT_PATH", "COMPLETIONS_PATH", "EMBEDDINGS_PATH", "RING_PATHS"]

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
EMBEDDINGS_PATH = "/v1/embeddings"
#: Served by the workers through the ring, ``POST`` only.
RING_PATHS = frozenset({CHAT_PATH, COMPLETIONS_PATH, EMBEDDINGS_PATH})
