"""The values that cross the decode thread's boundary: what the core takes
(:class:`CoreRequest`, with a snapshot read from disk for it: :class:`Offered`), what one
step did to a request (:class:`StepOutput`)."""

from __future__ import annotations

import ctypes

import attrs
import numpy as np
import numpy.typing as npt

from .._types import GenerateRequest, StopReason
from ..grammar import Grammar
from ..llama import MediaChunk, RawLogprob
from ..snapshots import Tokens

__all__ = ["Buffer", "CoreRequest", "Offered", "StepOutput"]

#: A sequence's state in host memory, as llama.cpp writes and reads it.
Buffer = ctypes.Array[ctypes.c_uint8]


@attrs.define(eq=False)
class Offered:
    """A snapshot read from disk for one request: the tokens its state follows, the state
    until the decode thread takes it (:meth:`take`), and the seconds the read took."""

    tokens: Tokens
    data: Buffer | None
    seconds: float

    def take(self) -> Buffer | None:
        """The state, once (the request does not hold it after its start)."""
        data, self.data = self.data, None
        return data


@attrs.frozen(eq=False)
class CoreRequest:
    """One request as the core takes it: the prompt's token ids, how many tokens it may
    generate, and the prompt lengths worth a snapshot on recurrent memory (``hints``)."""

    key: int
    prompt: npt.NDArray[np.int32]
    request: GenerateRequest
    max_tokens: int
    hints: tuple[int, ...] = ()
    #: The grammar the engine compiled for it (parsed and cached: a slot copies it).
    grammar: Grammar | None = None
    #: Its media chunks, by the prompt offset of their placeholder ids (decoded alone:
    #: whole, or a causal one in prompt chunks of its own).
    media: tuple[tuple[int, MediaChunk], ...] = ()
    #: Its prompt leaves a think block open: the first tokens are reasoning.
    opens_think: bool = False
    #: A snapshot of a prefix of its prompt read from disk, restored where it serves more
    #: than memory does (taken at the start: not held while the request runs).
    offered: Offered | None = None


@attrs.frozen(eq=False)
class StepOutput:
    """What one step did to one request: tokens sampled (several when drafts were
    accepted), and its end (``stop`` or ``error``; ``released`` once its slot is free).
    ``cached`` prompt tokens were found in memory; ``drafted`` draft tokens were verified for
    it so far and ``accepted`` of them were right; the times are ``time.perf_counter()``
    values (0 until they happen)."""

    key: int
    tokens: list[int]
    stop: StopReason | None = None
    error: Exception | None = None
    released: bool = False
    logprobs: list[RawLogprob] | None = None
    cached: int = 0
    admitted_at: float = 0.0
    first_token_at: float = 0.0
    drafted: int = 0
    accepted: int = 0
