"""What the decode-step core keeps per request (:class:`Job`) and per step (:class:`Part`);
engine-internal, shared by the core and the shared pool."""

from __future__ import annotations

import ctypes
import random
from collections.abc import Sequence
from typing import Protocol

import attrs
import numpy as np
import numpy.typing as npt

from .._types import GenerateRequest
from ..grammar import Grammar
from ..llama import LlamaModel, MediaChunk, Penalties, SlotSampler
from ..spec_decode import Acceptance
from ._step import CoreRequest, StepOutput
from ._think_budget import ThinkBudget

__all__ = ["Drafter", "Job", "Part", "slot_sampler"]


class Drafter(Protocol):
    """Where a sequence's drafts come from (:class:`NgramDrafter`; tests bring others)."""

    def extend(self, tokens: Sequence[int]) -> None: ...

    def propose(self, limit: int) -> tuple[list[int], int]: ...


@attrs.define(eq=False)
class Job:
    """One request inside the core."""

    request: CoreRequest
    seq: int = -1
    pos: int = 0
    last_token: int = -1
    generated: int = 0
    sampler: SlotSampler | None = None
    admitted_at: float = 0.0
    first_token_at: float = 0.0
    cancelled: bool = False
    #: Order of first admission (the youngest running sequence is preempted first).
    order: int = -1
    #: Prompt tokens found in memory at admission (not ingested).
    cached: int = 0
    #: Prompt lengths after which the state is snapshotted (the prompt cache's decision).
    snapshot_at: tuple[int, ...] = ()
    #: Generated tokens decoded into the sequence's memory, after the prompt.
    fed: list[int] = attrs.field(factory=list)
    drafter: Drafter | None = None
    #: Its drafter cuts each draft where the grammar refuses a token itself (the core's,
    #: for a sequence held to a grammar from its first token): the budget need not again.
    drafts_fit: bool = False
    acceptance: Acceptance = attrs.field(factory=Acceptance)
    drafted: int = 0
    accepted: int = 0
    #: The first tokens of a draft the budget did not verify, checked against the tokens
    #: the sequence emits next (``DraftBudget``'s shadow drafts).
    shadow: list[int] = attrs.field(factory=list)
    #: What its sampler takes a position, in ms (a moving average, measured verifying).
    sample_ms: float = 0.0
    #: Out of the batch to make room in the pool, until admitted again; its memory in
    #: host memory meanwhile (``swapped``; none when it held no cells).
    preempted: bool = False
    swapped: ctypes.Array[ctypes.c_uint8] | None = None
    #: Its reasoning budget (none without one, or on a model without think markers).
    think: ThinkBudget | None = None

    @property
    def key(self) -> int:
        return self.request.key

    @property
    def prompt(self) -> npt.NDArray[np.int32]:
        return self.request.prompt

    def position(self, index: int) -> int:
        """The sequence position of prompt (or generated) token ``index``: the index,
        but on M-RoPE models an image takes fewer positions than tokens, so every token
        after one sits that much earlier (never called for an index inside an image)."""
        shift = 0
        for start, chunk in self.request.media:
            if start + chunk.n_tokens <= index:
                shift += chunk.n_pos - chunk.n_tokens
        return index + shift

    def media_at(self, start: int | None) -> tuple[int, MediaChunk] | None:
        """The media chunk a prompt chunk from ``start`` ingests, with the offset it begins
        at (the scheduler never mixes a media chunk with text in one prompt chunk)."""
        if start is None:
            return None
        for begin, chunk in self.request.media:
            if begin <= start < begin + chunk.n_tokens:
                return begin, chunk
        return None

    def output(self, tokens: list[int], **fields: object) -> StepOutput:
        return StepOutput(
            self.key,
            tokens,
            cached=self.cached,
            admitted_at=self.admitted_at,
            first_token_at=self.first_token_at,
            drafted=self.drafted,
            accepted=self.accepted,
            **fields,  # type: ignore[arg-type]
        )


@attrs.define(eq=False)
class Part:
    """One job's tokens in this step: a decode token and its drafts (``start is None``) or
    a prompt chunk."""

    job: Job
    start: int | None
    count: int
    index: int
    outputs: bool = True
    draft: list[int] = attrs.field(factory=list)
    #: The n-gram length the draft was found with.
    match: int = 0

    @property
    def tokens(self) -> int:
        return 1 + len(self.draft) if self.start is None else self.count


def slot_sampler(
    model: LlamaModel, request: GenerateRequest, grammar: Grammar | None
) -> SlotSampler:
    """The sampler of one request: its sampling settings, biases (end of generation
    banned with ``ignore_eos``), grammar, penalties and log-probabilities."""
    sampling = request.sampling
    bias = dict(request.logit_bias)
    if request.ignore_eos:
        bias.update(dict.fromkeys(model.eog, float("-inf")))
    penalties = (
        Penalties(
            presence=sampling.presence_penalty,
            frequency=sampling.frequency_penalty,
            repeat=sampling.repeat_penalty,
            repeat_last_n=sampling.repeat_last_n,
        )
        if sampling.penalized
        else None
    )
    return SlotSampler(
        model,
        temperature=sampling.temperature,
        top_k=sampling.top_k,
        top_p=sampling.top_p,
        min_p=sampling.min_p,
        seed=(sampling.seed if sampling.seed is not None else random.getrandbits(32)) & 0xFFFFFFFF,
        bias=bias,
        grammar=grammar,
        penalties=penalties,
        logprobs=request.logprobs,
    )
