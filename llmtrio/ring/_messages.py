"""The ring's messages: frozen values that travel between a worker and an ingress's ring.

A worker sends ``Attach`` (first), ``Heartbeat``, ``Claim``, ``Withdraw``, ``Release``,
``ResponseHead``, ``ResponseData``, ``ResponseEnd``, ``ResponseError`` and ``Detach``; the
ring sends ``Assign``, ``Withdrawn``, ``Credit``, ``Cancel`` and ``Detach``. Every operation of
``RingCore`` has a message, so a worker across a network can do all an in-process one can.
``PROTOCOL_VERSION`` is what ``Attach`` carries; an ingress refuses any other.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeAlias

import attrs

__all__ = [
    "CHAT_MODEL",
    "EMBEDDING_MODEL",
    "KINDS",
    "MAX_HELD_PREFIXES",
    "MAX_PREFIX_CHARS",
    "PROTOCOL_VERSION",
    "RERANK_MODEL",
    "Assign",
    "Attach",
    "Cancel",
    "Claim",
    "Credit",
    "Detach",
    "Headers",
    "Heartbeat",
    "Message",
    "Outcome",
    "Release",
    "RequestHead",
    "ResponseData",
    "ResponseEnd",
    "ResponseError",
    "ResponseHead",
    "ResponseMessage",
    "Withdraw",
    "Withdrawn",
]

PROTOCOL_VERSION: Final = 1
"""The wire protocol's version; an ingress refuses an ``Attach`` carrying another."""

CHAT_MODEL: Final = "chat"
"""A model's kind: chat and text completions."""
EMBEDDING_MODEL: Final = "embedding"
"""A model's kind: embeddings."""
RERANK_MODEL: Final = "rerank"
"""A model's kind: reranking (a cross-encoder's scores of query-document pairs)."""
KINDS: Final = (CHAT_MODEL, EMBEDDING_MODEL, RERANK_MODEL)


Headers: TypeAlias = tuple[tuple[str, str], ...]


def _to_ints(value: Iterable[int]) -> tuple[int, ...]:
    return tuple(value)


def _to_strings(value: Iterable[str]) -> tuple[str, ...]:
    items = tuple(value)
    if isinstance(value, str) or not all(isinstance(item, str) for item in items):
        raise TypeError(f"expected strings, not {value!r}")
    return items


def _to_headers(value: Iterable[tuple[str, str]] | Mapping[str, str]) -> Headers:
    """Normalise headers to a tuple of ``(name, value)`` string pairs, order kept."""
    items: Iterable[Any] = value.items() if isinstance(value, Mapping) else value
    headers: list[tuple[str, str]] = []
    for item in items:
        if isinstance(item, str | bytes) or len(item) != 2:
            raise TypeError(f"a header must be a (name, value) pair, not {item!r}")
        name, text = item
        if not isinstance(name, str) or not isinstance(text, str):
            raise TypeError(f"header names and values must be str, not {item!r}")
        headers.append((name, text))
    return tuple(headers)


def _to_bytes(value: bytes | bytearray | memoryview) -> bytes:
    if not isinstance(value, bytes | bytearray | memoryview):
        raise TypeError(f"expected bytes, not {type(value).__name__}")
    return bytes(value)


def _int_at_least(minimum: int) -> Any:
    def check(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
        if not isinstance(value, int) or isinstance(value, bool):
            raise TypeError(f"{attribute.name} must be an int, not {value!r}")
        if value < minimum:
            raise ValueError(f"{attribute.name} must be at least {minimum}, not {value}")

    return check


def _str(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not isinstance(value, str):
        raise TypeError(f"{attribute.name} must be a str, not {value!r}")


def _nonempty_str(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    _str(instance, attribute, value)
    if not value:
        raise ValueError(f"{attribute.name} must not be empty")


def _optional(check: Any) -> Any:
    def optional(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
        if value is not None:
            check(instance, attribute, value)

    return optional


def _status(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    _int_at_least(100)(instance, attribute, value)
    if value > 599:
        raise ValueError(f"status must be between 100 and 599, not {value}")


def _bytes_repr(value: bytes) -> str:
    return f"<{len(value)} bytes>"


_stream_id: Final = _int_at_least(1)


@attrs.frozen
class RequestHead:
    """The head of an uploaded request: what the client asked for, without the body."""

    method: str = attrs.field(validator=_nonempty_str)
    path: str = attrs.field(validator=_str)
    headers: Headers = attrs.field(default=(), converter=_to_headers)


@attrs.frozen
class Attach:
    """Worker → ring, first message: who the worker is, how many streams it may hold, the
    models it serves and the protocol version it speaks.

    Over the network, ``worker_id`` is only the worker's suggestion: the control listener
    names the worker after its certificate.
    """

    worker_id: str = attrs.field(validator=_nonempty_str)
    max_inflight: int = attrs.field(validator=_int_at_least(1))
    models: tuple[str, ...] = attrs.field(default=(), converter=_to_strings, kw_only=True)
    version: int = attrs.field(default=PROTOCOL_VERSION, kw_only=True, validator=_int_at_least(0))
    kinds: tuple[str, ...] = attrs.field(default=(), converter=_to_strings, kw_only=True)
    """Each model's kind (``"chat"``, ``"embedding"`` or ``"rerank"``: :data:`KINDS`; a
    newer worker's kind that this version does not know is kept as it is), in the order of
    ``models``; empty (optional on the wire, as from a worker of the previous version) means
    all chat."""
    vision: tuple[str, ...] = attrs.field(default=(), converter=_to_strings, kw_only=True)
    """The ``models`` that take images (optional on the wire: none)."""
    audio: tuple[str, ...] = attrs.field(default=(), converter=_to_strings, kw_only=True)
    """The ``models`` that take audio (optional on the wire: none)."""
    contexts: tuple[int, ...] = attrs.field(default=(), converter=_to_ints, kw_only=True)
    """Each model's context length in tokens (the most one request may use), in the order of
    ``models``; 0 or empty (optional on the wire, as from a worker of the previous version):
    not stated."""

    @contexts.validator
    def _check_contexts(
        self, attribute: attrs.Attribute[tuple[int, ...]], value: tuple[int, ...]
    ) -> None:
        if value and len(value) != len(self.models):
            raise ValueError(f"contexts must give one length per model, not {value!r}")
        if any(not isinstance(n, int) or isinstance(n, bool) or n < 0 for n in value):
            raise ValueError(f"a context length is an integer of 0 or more, not {value!r}")

    def context(self, model: str) -> int:
        """The context length of ``model`` (one of ``models``): 0 when not stated."""
        if self.contexts and model in self.models:
            return self.contexts[self.models.index(model)]
        return 0

    @kinds.validator
    def _check_kinds(
        self, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]
    ) -> None:
        if value and len(value) != len(self.models):
            raise ValueError(f"kinds must name one kind per model, not {value!r}")
        for kind in value:
            # A kind this version does not know (a newer worker's) is kept as it is: the
            # model is listed with it, and only the routes that take any kind reach it.
            if not kind:
                raise ValueError(f"a model's kind is a name (one of {KINDS}), not {kind!r}")

    def kind(self, model: str) -> str:
        """The kind of ``model`` (one of ``models``): ``"chat"`` unless ``kinds`` says else."""
        if self.kinds and model in self.models:
            return self.kinds[self.models.index(model)]
        return CHAT_MODEL


#: The most prefix digests a heartbeat states, and the longest one.
MAX_HELD_PREFIXES: Final = 256
MAX_PREFIX_CHARS: Final = 64


def _check_prefixes(
    instance: object, attribute: attrs.Attribute[tuple[str, ...]], value: tuple[str, ...]
) -> None:
    if len(value) > MAX_HELD_PREFIXES:
        raise ValueError(f"{attribute.name}: at most {MAX_HELD_PREFIXES}, not {len(value)}")
    for digest in value:
        if not 0 < len(digest) <= MAX_PREFIX_CHARS:
            raise ValueError(f"{attribute.name}: a digest of 1 to {MAX_PREFIX_CHARS} characters")


#: A heartbeat's ``model_state`` values ("": not reported).
MODEL_STATES = ("", "loaded", "loading", "unloaded")


@attrs.frozen
class Heartbeat:
    """Worker → ring: the engine's capacity now (stored for stats; assignment uses claims)."""

    inflight: int = attrs.field(validator=_int_at_least(0))
    max_inflight: int = attrs.field(validator=_int_at_least(0))
    available_slots: int = attrs.field(validator=_int_at_least(0))
    decoding: int = attrs.field(default=0, validator=_int_at_least(0))
    """Sequences in the engine's current batch (for health pages; optional on the wire)."""
    cache_hits: int = attrs.field(default=0, kw_only=True, validator=_int_at_least(0))
    """Prompt reuse, for health pages (optional on the wire): sequences that started with
    part of their prompt in memory, the tokens reused in all, and the host memory its
    snapshots hold now."""
    cached_tokens: int = attrs.field(default=0, kw_only=True, validator=_int_at_least(0))
    cache_bytes: int = attrs.field(default=0, kw_only=True, validator=_int_at_least(0))
    kv_used: int = attrs.field(default=0, kw_only=True, validator=_int_at_least(0))
    """KV-cache cells (tokens) the running sequences hold, and the engine's cells in all
    (slots times context), for the ingress's ``vllm:kv_cache_usage_perc`` (optional on the
    wire: a ``kv_total`` of 0 means not reported, as from a worker older than these fields)."""
    kv_total: int = attrs.field(default=0, kw_only=True, validator=_int_at_least(0))
    spec_drafted: int = attrs.field(default=0, kw_only=True, validator=_int_at_least(0))
    """Speculative decoding, for health pages (optional on the wire): draft tokens verified,
    and those that were right."""
    spec_accepted: int = attrs.field(default=0, kw_only=True, validator=_int_at_least(0))
    model_state: str = attrs.field(
        default="", kw_only=True, validator=attrs.validators.in_(MODEL_STATES)
    )
    """Whether the worker's model is ``loaded``, ``loading`` or ``unloaded`` (a model it
    loads on demand; optional on the wire: ``""``, not reported, is a loaded model, as from a
    worker of the previous version)."""
    model_bytes: int = attrs.field(default=0, kw_only=True, validator=_int_at_least(0))
    """The loaded model's estimated memory (0: not stated; optional on the wire)."""
    unload_in_s: int = attrs.field(default=0, kw_only=True, validator=_int_at_least(-1))
    """Seconds until the idle loaded model unloads: -1 never (pinned), 0 not stated (busy,
    or not loaded on demand; optional on the wire)."""
    free_bytes: int = attrs.field(default=0, kw_only=True, validator=_int_at_least(-1))
    """The worker's memory budget still free for a load without evicting: -1 no bound, 0 not
    stated or none free (optional on the wire). Of the links whose model is ``unloaded``, the
    ring has the one stating the most load it (see ``RingCore``)."""
    prefixes: tuple[str, ...] = attrs.field(
        default=(), kw_only=True, converter=_to_strings, validator=_check_prefixes
    )
    """The prompt prefixes the worker holds, as digests (at most ``MAX_HELD_PREFIXES``, each
    at most ``MAX_PREFIX_CHARS`` characters; optional on the wire: none). The ring reads them
    only to match the digests a stream was parked with (see ``RingCore``: prefix affinity);
    what they are digests of is the ingress's and the worker's business."""


@attrs.frozen
class Claim:
    """Worker → ring: "I have ``count`` more free slots; assign me up to that many streams"
    (for ``model`` only, when it names one: a stream parked under that routing key).

    ``model`` is optional on the wire: a claim without one (a worker of the previous version)
    is for any model the worker listed in its ``Attach``."""

    count: int = attrs.field(default=1, validator=_int_at_least(1))
    model: str | None = attrs.field(default=None, kw_only=True, validator=_optional(_nonempty_str))


@attrs.frozen
class Assign:
    """Ring → worker: a request lane (its head and body) the worker now holds."""

    stream_id: int = attrs.field(validator=_stream_id)
    head: RequestHead = attrs.field(validator=attrs.validators.instance_of(RequestHead))
    body: bytes = attrs.field(default=b"", converter=_to_bytes, repr=_bytes_repr)
    credits: int = attrs.field(default=0, kw_only=True, validator=_int_at_least(0))
    """Over the network: how many ``ResponseData`` the worker may send on this stream before
    it waits for a ``Credit`` (0 in process, where the ring's own buffer back-pressures)."""


@attrs.frozen
class Withdraw:
    """Worker → ring: take back up to ``count`` of my claims that no stream has filled yet:
    those for ``model`` when it names one, else any (claims without a model first)."""

    count: int = attrs.field(default=1, validator=_int_at_least(1))
    model: str | None = attrs.field(default=None, kw_only=True, validator=_optional(_nonempty_str))


@attrs.frozen
class Withdrawn:
    """Ring → worker, the answer to ``Withdraw``: how many claims were still unfilled (the
    rest were filled, and their ``Assign`` came before this)."""

    count: int = attrs.field(validator=_int_at_least(0))


@attrs.frozen
class Release:
    """Worker → ring: give back an assigned stream without responding (it is parked again
    at the front); on a cancelled stream, acknowledges the ``Cancel``."""

    stream_id: int = attrs.field(validator=_stream_id)


@attrs.frozen
class Credit:
    """Ring → worker: the stream's client took ``count`` more chunks; send that many more."""

    stream_id: int = attrs.field(validator=_stream_id)
    count: int = attrs.field(default=1, validator=_int_at_least(1))


@attrs.frozen
class ResponseHead:
    """Worker → ring → client: the response's status and headers; comes before any data."""

    stream_id: int = attrs.field(validator=_stream_id)
    status: int = attrs.field(validator=_status)
    headers: Headers = attrs.field(default=(), converter=_to_headers)


@attrs.frozen
class ResponseData:
    """Worker → ring → client: a chunk of the response body."""

    stream_id: int = attrs.field(validator=_stream_id)
    data: bytes = attrs.field(converter=_to_bytes)


@attrs.frozen
class Outcome:
    """What a response ended with, as its worker states it, for the ingress's access log
    and metrics. The ring carries it and never reads it."""

    finish_reason: str | None = attrs.field(default=None, validator=_optional(_str))
    prompt_tokens: int | None = attrs.field(default=None, validator=_optional(_int_at_least(0)))
    cached_tokens: int | None = attrs.field(default=None, validator=_optional(_int_at_least(0)))
    completion_tokens: int | None = attrs.field(default=None, validator=_optional(_int_at_least(0)))
    error_code: str | None = attrs.field(default=None, validator=_optional(_str))


def _outcome(instance: object, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None and not isinstance(value, Outcome):
        raise TypeError(f"outcome must be an Outcome or None, not {value!r}")


@attrs.frozen
class ResponseEnd:
    """Worker → ring → client: the response is complete. Also acknowledges a ``Cancel``.

    ``outcome`` is what the worker states the response ended with (optional on the wire)."""

    stream_id: int = attrs.field(validator=_stream_id)
    outcome: Outcome | None = attrs.field(default=None, kw_only=True, validator=_outcome)


@attrs.frozen
class ResponseError:
    """Worker → ring → client: the worker could not finish; also acknowledges a ``Cancel``.

    ``outcome`` is what the worker states the response ended with (optional on the wire)."""

    stream_id: int = attrs.field(validator=_stream_id)
    message: str = attrs.field(validator=_str)
    outcome: Outcome | None = attrs.field(default=None, kw_only=True, validator=_outcome)


@attrs.frozen
class Cancel:
    """Ring → worker: the client went away; stop, then acknowledge with End or Error."""

    stream_id: int = attrs.field(validator=_stream_id)


@attrs.frozen
class Detach:
    """Either way, last message: the worker leaves (or is sent away) for ``reason``."""

    reason: str = attrs.field(default="", validator=_str)


Message: TypeAlias = (
    Attach
    | Heartbeat
    | Claim
    | Withdraw
    | Withdrawn
    | Release
    | Assign
    | Credit
    | ResponseHead
    | ResponseData
    | ResponseEnd
    | ResponseError
    | Cancel
    | Detach
)
ResponseMessage: TypeAlias = ResponseHead | ResponseData | ResponseEnd | ResponseError
