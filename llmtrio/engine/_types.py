"""Values that cross the engine's public face: requests, events, capacity, config."""

from __future__ import annotations

import enum
import os
from collections.abc import Sequence
from pathlib import Path

import attrs

from ._errors import InvalidRequestError

__all__ = [
    "Capacity",
    "ChatMessage",
    "Done",
    "EngineConfig",
    "Event",
    "Failed",
    "GenerateRequest",
    "Sampling",
    "StopReason",
    "Timings",
    "Token",
]

DEFAULT_REPO = "unsloth/Qwen3.5-0.8B-GGUF"
DEFAULT_QUANT = "Q4_K_M"


@attrs.frozen
class EngineConfig:
    """How to load the model and how to schedule it.

    ``model`` is a local GGUF path; when ``None`` the model is resolved from the Hugging Face
    cache (``hf_repo`` and ``hf_file`` or ``quant``). ``ctx_size`` is per slot: the context
    allocated is ``ctx_size * max_inflight`` tokens. ``target_step_ms`` pauses admission while
    the measured decode step is slower than it (0: admission is bounded by ``max_inflight``
    only). ``prefill_chunk`` is the prompt-token budget of one step, shared by all prompts
    being ingested.
    """

    model: Path | None = attrs.field(default=None, converter=attrs.converters.optional(Path))
    hf_repo: str = DEFAULT_REPO
    hf_file: str | None = None
    quant: str = DEFAULT_QUANT
    max_inflight: int = 8
    ctx_size: int = 4096
    target_step_ms: float = 0.0
    prefill_chunk: int = 256
    threads: int = attrs.field(factory=lambda: os.cpu_count() or 1)
    allow_fallback: bool = True
    model_name: str | None = None

    def __attrs_post_init__(self) -> None:
        if self.max_inflight < 1:
            raise ValueError("max_inflight must be at least 1")
        if self.ctx_size < 16:
            raise ValueError("ctx_size must be at least 16")
        if self.target_step_ms < 0:
            raise ValueError("target_step_ms must be 0 or more")
        if self.prefill_chunk < 1:
            raise ValueError("prefill_chunk must be at least 1")
        if self.threads < 1:
            raise ValueError("threads must be at least 1")


@attrs.frozen
class ChatMessage:
    role: str
    content: str

    def __attrs_post_init__(self) -> None:
        if self.role not in ("system", "user", "assistant", "developer", "tool"):
            raise InvalidRequestError(f"unknown message role {self.role!r}", param="messages")


@attrs.frozen
class Sampling:
    """Sampling parameters; ``temperature == 0`` is greedy (the other fields are then unused)."""

    temperature: float = 0.8
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    seed: int | None = None

    def __attrs_post_init__(self) -> None:
        if not 0.0 <= self.temperature <= 100.0:
            raise InvalidRequestError("temperature must be between 0 and 100", param="temperature")
        if not 0.0 < self.top_p <= 1.0:
            raise InvalidRequestError("top_p must be in (0, 1]", param="top_p")
        if self.top_k < 0:
            raise InvalidRequestError("top_k must be 0 (off) or more", param="top_k")
        if not 0.0 <= self.min_p <= 1.0:
            raise InvalidRequestError("min_p must be in [0, 1]", param="min_p")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0


GREEDY = Sampling(temperature=0.0)


def _tuple_of_messages(value: Sequence[ChatMessage] | None) -> tuple[ChatMessage, ...] | None:
    return None if value is None else tuple(value)


def _tuple_of_ints(value: Sequence[int] | None) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(v) for v in value)


def _tuple_of_strings(value: Sequence[str]) -> tuple[str, ...]:
    return (value,) if isinstance(value, str) else tuple(value)


def _tuple_of_biases(value: Sequence[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    return tuple((int(token), float(bias)) for token, bias in value)


@attrs.frozen
class GenerateRequest:
    """One generation: chat ``messages`` (templated with the model's chat template) or raw
    prompt ``tokens``, exactly one of the two.

    ``max_tokens=None`` generates until end of generation or the end of the slot's context.
    ``stop`` strings end generation and are never emitted. ``think`` is passed to the chat
    template as ``enable_thinking`` (``None``: the template's default). ``ignore_eos`` keeps
    generating through end-of-generation tokens (for benchmarks). ``logit_bias`` maps token
    ids to a bias added to their logits (``-inf`` bans a token).
    """

    messages: tuple[ChatMessage, ...] | None = attrs.field(
        default=None, converter=_tuple_of_messages
    )
    tokens: tuple[int, ...] | None = attrs.field(default=None, converter=_tuple_of_ints)
    max_tokens: int | None = None
    sampling: Sampling = GREEDY
    stop: tuple[str, ...] = attrs.field(default=(), converter=_tuple_of_strings)
    think: bool | None = None
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = attrs.field(default=(), converter=_tuple_of_biases)

    def __attrs_post_init__(self) -> None:
        if (self.messages is None) == (self.tokens is None):
            raise InvalidRequestError("give exactly one of messages or tokens", param="messages")
        if self.messages is not None and not self.messages:
            raise InvalidRequestError("messages must not be empty", param="messages")
        if self.tokens is not None and not self.tokens:
            raise InvalidRequestError("tokens must not be empty", param="tokens")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidRequestError("max_tokens must be at least 1", param="max_tokens")
        if any(not s for s in self.stop):
            raise InvalidRequestError("stop strings must not be empty", param="stop")

    @classmethod
    def user(cls, prompt: str, *, system: str | None = None, **kwargs: object) -> GenerateRequest:
        """A one-turn chat: an optional system message, then ``prompt`` as the user's."""
        messages = [ChatMessage("system", system)] if system else []
        messages.append(ChatMessage("user", prompt))
        return cls(messages=messages, **kwargs)  # type: ignore[arg-type]


class StopReason(enum.Enum):
    END_OF_GENERATION = "end_of_generation"
    MAX_TOKENS = "max_tokens"
    CONTEXT_END = "context_end"
    STOP_STRING = "stop_string"
    CANCELLED = "cancelled"

    @property
    def finish_reason(self) -> str:
        """OpenAI's ``finish_reason`` for this stop."""
        if self in (StopReason.MAX_TOKENS, StopReason.CONTEXT_END):
            return "length"
        return "stop"


@attrs.frozen
class Timings:
    """Seconds spent waiting for a slot, ingesting the prompt (until the first token was
    sampled) and decoding the rest."""

    queue_s: float
    prefill_s: float
    decode_s: float


@attrs.frozen
class Token:
    """A piece of generated text; ``reasoning`` when it lies inside a think block."""

    text: str
    reasoning: bool = False


@attrs.frozen
class Done:
    stop: StopReason
    prompt_tokens: int
    completion_tokens: int
    timings: Timings


@attrs.frozen
class Failed:
    error: Exception


Event = Token | Done | Failed


@attrs.frozen
class Capacity:
    """Slot occupancy, in the fields of the ring's worker heartbeat.

    ``inflight`` counts accepted requests still running, those waiting for admission
    included; ``decoding`` those in the current batch.
    """

    inflight: int
    decoding: int
    max_inflight: int
    available_slots: int
