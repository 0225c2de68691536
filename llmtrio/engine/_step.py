"""The values that cross the decode thread's boundary: what the core takes
(:class:`CoreRequest`), what one step did to a request (:class:`StepOutput`), and the
counters it keeps (:class:`EngineStats`)."""

from __future__ import annotations

import attrs
import numpy as np
import numpy.typing as npt

from ._grammar import Grammar
from ._sampling import RawLogprob
from ._types import GenerateRequest, StopReason

__all__ = ["CoreRequest", "EngineStats", "StepOutput"]


@attrs.define
class EngineStats:
    """Counters of the decode loop, for benchmarks and metrics: ``decode_s`` is time inside
    ``llama_decode``, ``python_s`` the rest of each step (batch filling, sampling, hand-off).

    Plain numbers, written by the decode thread once per step and read (racily, which is
    fine for counters) at scrape time; nothing here costs the loop more than an addition.
    ``tokens_predicted`` tokens were sampled and handed out; ``busy_slots`` sums the
    sequences in each step's batch (busy slots per decode = it / ``steps``); ``running``
    requests hold a slot after the last step, using ``kv_tokens`` context cells in all.

    Prompt reuse: ``prompt_cache_hits`` sequences started with part of their prompt already
    in memory, ``prompt_cache_reused_tokens`` tokens in all were not ingested again;
    ``prompt_tokens_ingested`` were. ``prompt_cache_bytes`` of host memory hold
    ``prompt_cache_entries`` snapshots now; ``prompt_cache_snapshots`` were taken and
    ``prompt_cache_evictions`` evicted (least recently used first) since the start.

    Speculative decoding: ``spec_draft_tokens`` draft tokens were verified, of which
    ``spec_accepted_tokens`` were right (and emitted without a step of their own);
    ``spec_steps`` sequence-steps carried drafts.

    The shared KV pool: ``kv_pool_cells`` cells in all (0 when each slot has its own);
    ``kv_cells_used`` held now by running and idle sequences; ``preemptions`` sequences were
    swapped out to make room, and ``swapped`` are out now, their state in ``swapped_bytes``
    of host memory; ``idle_evictions`` idle slots gave up their reusable cells for others.
    """

    steps: int = 0
    decode_s: float = 0.0
    python_s: float = 0.0
    prompt_cache_hits: int = 0
    prompt_cache_reused_tokens: int = 0
    prompt_tokens_ingested: int = 0
    prompt_cache_bytes: int = 0
    prompt_cache_entries: int = 0
    prompt_cache_snapshots: int = 0
    prompt_cache_evictions: int = 0
    tokens_predicted: int = 0
    busy_slots: int = 0
    running: int = 0
    kv_tokens: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_steps: int = 0
    kv_pool_cells: int = 0
    kv_cells_used: int = 0
    preemptions: int = 0
    swapped: int = 0
    swapped_bytes: int = 0
    idle_evictions: int = 0


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
