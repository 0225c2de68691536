"""The decode loop's counters (:class:`EngineStats`), kept by both engines."""

from __future__ import annotations

import attrs

__all__ = ["EngineStats"]


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

    The prompt cache on disk (``cache_dir``): ``disk_hits`` sequences restored their prefix
    from a file (``disk_restored_tokens`` tokens in all, in ``disk_restore_s`` seconds of
    reading and restoring); ``disk_misses`` prompts were looked up there for more than memory
    held and found nothing; ``disk_writes`` files of ``disk_written_bytes`` were written (and
    ``disk_dropped`` snapshots not, the writer being too far behind); ``disk_bytes`` in
    ``disk_entries`` files are kept now; ``disk_evictions`` files were removed for the budget
    and ``disk_refused`` refused (corrupt, truncated, another model's or build's).

    Speculative decoding: ``spec_draft_tokens`` draft tokens were verified, of which
    ``spec_accepted_tokens`` were right (and emitted without a step of their own);
    ``spec_steps`` sequence-steps carried drafts; ``spec_held_steps`` steps ran without
    drafts because the draft gate held them (drafting steps had emitted fewer tokens per ms
    than plain ones, or the plain rate was being measured).

    The shared KV pool: ``kv_pool_cells`` cells in all (0 when each slot has its own);
    ``kv_cells_used`` held now by running and idle sequences; ``preemptions`` sequences were
    swapped out to make room, and ``swapped`` are out now, their state in ``swapped_bytes``
    of host memory; ``idle_evictions`` idle slots gave up their reusable cells for others.

    Images: ``image_encodes`` images were encoded by the vision projector (in the threads
    that prepare requests; a repeated image's embeddings come from its cache), in
    ``image_encode_s`` seconds in all; ``image_decode_waits_s`` is what the decode thread
    spent getting embeddings (0 unless a request reached it unencoded). Audio:
    ``audio_encodes`` 30-second windows were encoded by the audio projector (the same
    threads), in ``audio_encode_s`` seconds in all.

    LoRA adapters: ``lora_steps`` steps ran under an adapter set (not the base model);
    ``lora_switches`` steps ran under another set than the step before
    (``llama_set_adapters_lora``, after which llama.cpp reserves its graph again).
    """

    steps: int = 0
    #: Steps run on fewer compute threads than configured (they measured faster: a busy
    #: machine; the chat engine's ``ThreadChooser``).
    fewer_threads_steps: int = 0
    decode_s: float = 0.0
    image_encodes: int = 0
    image_encode_s: float = 0.0
    image_decode_waits_s: float = 0.0
    audio_encodes: int = 0
    audio_encode_s: float = 0.0
    python_s: float = 0.0
    prompt_cache_hits: int = 0
    prompt_cache_reused_tokens: int = 0
    prompt_tokens_ingested: int = 0
    prompt_cache_bytes: int = 0
    prompt_cache_entries: int = 0
    prompt_cache_snapshots: int = 0
    prompt_cache_evictions: int = 0
    disk_hits: int = 0
    disk_misses: int = 0
    disk_restored_tokens: int = 0
    disk_restore_s: float = 0.0
    disk_writes: int = 0
    disk_written_bytes: int = 0
    disk_dropped: int = 0
    disk_bytes: int = 0
    disk_entries: int = 0
    disk_evictions: int = 0
    disk_refused: int = 0
    tokens_predicted: int = 0
    busy_slots: int = 0
    running: int = 0
    kv_tokens: int = 0
    spec_draft_tokens: int = 0
    spec_accepted_tokens: int = 0
    spec_steps: int = 0
    spec_held_steps: int = 0
    kv_pool_cells: int = 0
    kv_cells_used: int = 0
    preemptions: int = 0
    swapped: int = 0
    swapped_bytes: int = 0
    idle_evictions: int = 0
    lora_steps: int = 0
    lora_switches: int = 0
