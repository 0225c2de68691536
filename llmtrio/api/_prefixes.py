"""What a generation request's prompt begins with, as the ingress and the workers both can
tell it without a model: a chain of digests over the request's leading parts, so that the
ingress can send a conversation's next turn to the worker holding its prefix (the ring
matches them; see docs/ring-protocol.md, "Prefix affinity"). Pure: a body in, digests out.

The chain (each digest also covers every part before it):

- the *head*: the route's family and what every prompt of a conversation starts with: the
  tools, and the system prompt (Anthropic's ``system``, the Responses API's
  ``instructions``; chat completions carry theirs among the messages);
- then one digest per message (``messages``; the Responses API's ``input`` items), in order;
- a text completion's ``prompt``: one digest per whole ``BLOCK_BYTES`` of it (and its end).

Each part is canonical JSON (sorted keys, no spaces) without what changes from one request of
a conversation to the next while the prompt does not: Anthropic's ``cache_control`` marks
(which move to the newest message each turn) and Claude Code's per-request
``x-anthropic-billing-header`` system block. A :class:`Prefix` is a digest and the bytes of
canonical JSON it covers, so that the longest held prefix can be told. Two requests share a
digest exactly when they share every part it covers, so a worker that served one request
holds (a prefix of) the prompt of the next whose chain contains that request's last digest.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, Final

import attrs

from ._routes import CHAT_PATH, COMPLETIONS_PATH, MESSAGES_PATH, RESPONSES_PATH

__all__ = ["BLOCK_BYTES", "DIGEST_CHARS", "MAX_PREFIXES", "Prefix", "prefixes_of"]

#: A text completion's prompt is digested by blocks of this many bytes.
BLOCK_BYTES: Final = 1024
#: The most digests one request's chain has (its first parts: a prompt's head matters most).
MAX_PREFIXES: Final = 256
#: A digest's length in hex digits (64 bits: a routing hint, not a proof).
DIGEST_CHARS: Final = 16

_BILLING: Final = "x-anthropic-billing-header:"


@attrs.frozen
class Prefix:
    """One link of the chain: its ``digest`` and the canonical bytes it covers."""

    digest: str
    size: int


def prefixes_of(path: str, body: bytes) -> tuple[Prefix, ...]:
    """The chain of ``body``'s prompt, sent to ``path`` (empty for a route that generates
    nothing, or a body that is no JSON object)."""
    try:
        fields = json.loads(body)
    except (ValueError, RecursionError):
        return ()
    if not isinstance(fields, dict):
        return ()
    if path == CHAT_PATH:
        return _chain("chat", fields.get("tools"), None, _items(fields.get("messages")))
    if path == MESSAGES_PATH:
        system = _without_billing(fields.get("system"))
        return _chain("messages", fields.get("tools"), system, _items(fields.get("messages")))
    if path == RESPONSES_PATH:
        items = fields.get("input")
        parts = [items] if isinstance(items, str) else _items(items)
        return _chain("responses", fields.get("tools"), fields.get("instructions"), parts)
    if path == COMPLETIONS_PATH:
        return _blocks(fields.get("prompt"))
    return ()


def _items(value: object) -> list[Any]:
    return value[:MAX_PREFIXES] if isinstance(value, list) else []


def _without_billing(system: object) -> object:
    """Anthropic's ``system`` without Claude Code's per-request billing block."""
    if isinstance(system, list):
        return [
            block
            for block in system
            if not (
                isinstance(block, dict)
                and isinstance(block.get("text"), str)
                and block["text"].startswith(_BILLING)
            )
        ]
    if isinstance(system, str) and system.startswith(_BILLING):
        return system.partition("\n")[2]
    return system


def _canonical(value: object) -> bytes:
    return json.dumps(
        _stripped(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False
    ).encode("utf-8", "surrogatepass")


def _stripped(value: object) -> object:
    """``value`` without ``cache_control`` keys, at any depth."""
    if isinstance(value, dict):
        return {k: _stripped(v) for k, v in value.items() if k != "cache_control"}
    if isinstance(value, list):
        return [_stripped(item) for item in value]
    return value


def _chain(
    family: str, tools: object, system: object, parts: Iterable[object]
) -> tuple[Prefix, ...]:
    digest = hashlib.blake2b(digest_size=DIGEST_CHARS // 2)
    head = _canonical({"family": family, "tools": tools, "system": system})
    digest.update(head)
    size = len(head)
    chain = [Prefix(digest.copy().hexdigest(), size)]
    for part in parts:
        data = _canonical(part)
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)
        size += len(data)
        chain.append(Prefix(digest.copy().hexdigest(), size))
    return tuple(chain[:MAX_PREFIXES])


def _blocks(prompt: object) -> tuple[Prefix, ...]:
    if not isinstance(prompt, str):
        return ()
    data = prompt.encode("utf-8", "surrogatepass")
    digest = hashlib.blake2b(digest_size=DIGEST_CHARS // 2)
    digest.update(b"completions")
    chain = []
    for start in range(0, len(data), BLOCK_BYTES):
        block = data[start : start + BLOCK_BYTES]
        digest.update(block)
        chain.append(Prefix(digest.copy().hexdigest(), start + len(block)))
    return tuple(chain[:MAX_PREFIXES])
