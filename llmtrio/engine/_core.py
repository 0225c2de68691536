"""The decode-step core: schedule → carry out prompt reuse → fill one batch → ``llama_decode``
→ sample → hand token ids out (vLLM v1's ``EngineCore``). No Trio and no threads: whoever owns
it calls :meth:`EngineCore.step` from one thread (the engine's decode thread; a test's own).

Requests come in and results go out as plain values (:class:`CoreRequest`,
:class:`StepOutput`); the policies it carries out are pure objects of their own: the
:class:`Scheduler` (who runs, how many prompt tokens each) and the :class:`PromptCache`
(which slot, what of the prompt is already in memory, what to snapshot).
"""

from __future__ import annotations

import ctypes
import random
import time

import attrs
import numpy as np
import numpy.typing as npt

from ._errors import DecodeError
from ._grammar import Grammar
from ._llama import Batch, LlamaModel, SlotSampler
from ._prompt_cache import PromptCache
from ._sampling import Penalties, RawLogprob
from ._scheduler import Scheduler, Start
from ._types import EngineConfig, GenerateRequest, StopReason

__all__ = ["CoreRequest", "EngineCore", "EngineStats", "StepOutput"]


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
    """What one step did to one request: tokens sampled, and its end (``stop`` or
    ``error``; ``released`` once its slot is free). ``cached`` prompt tokens were found in
    memory; the times are ``time.perf_counter()`` values (0 until they happen)."""

    key: int
    tokens: list[int]
    stop: StopReason | None = None
    error: Exception | None = None
    released: bool = False
    logprobs: list[RawLogprob] | None = None
    cached: int = 0
    admitted_at: float = 0.0
    first_token_at: float = 0.0


@attrs.define(eq=False)
class _Job:
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
    #: Prompt tokens found in memory at admission (not ingested).
    cached: int = 0
    #: Prompt lengths after which the state is snapshotted (the prompt cache's decision).
    snapshot_at: tuple[int, ...] = ()
    #: Generated tokens decoded into the sequence's memory, after the prompt.
    fed: list[int] = attrs.field(factory=list)

    @property
    def key(self) -> int:
        return self.request.key

    @property
    def prompt(self) -> npt.NDArray[np.int32]:
        return self.request.prompt

    def output(self, tokens: list[int], **fields: object) -> StepOutput:
        return StepOutput(
            self.key,
            tokens,
            cached=self.cached,
            admitted_at=self.admitted_at,
            first_token_at=self.first_token_at,
            **fields,  # type: ignore[arg-type]
        )


@attrs.define(eq=False)
class _Part:
    """One job's tokens in this step: a decode token (``start is None``) or a prompt chunk."""

    job: _Job
    start: int | None
    count: int
    index: int
    outputs: bool = True


class EngineCore:
    """Continuous batching over ``config.max_inflight`` sequences of one model.

    :meth:`add` and :meth:`cancel` take effect at the next :meth:`step`, which runs one
    ``llama_decode`` for every running sequence. :meth:`close` fails what is left.

    Resource handling: a sequence's sampler is freed with its slot; its memory stays for
    the prompt cache (cleared after a failed decode, or when reuse is off).
    """

    def __init__(self, model: LlamaModel, config: EngineConfig, stats: EngineStats) -> None:
        self._model = model
        self._config = config
        self._stats = stats
        self._scheduler = Scheduler(
            config.max_inflight, config.prefill_chunk, config.target_step_ms
        )
        self._batch = Batch(model.n_batch)
        self._jobs: dict[int, _Job] = {}
        # The prompt cache picks each sequence's id: the slot holding most of its prompt,
        # else the lowest free one. Batches go in ascending id order: llama.cpp splits a
        # batch of non-unified sequences into one micro-batch per run of consecutive,
        # increasing ids, and each micro-batch reads all the weights again.
        self._cache = PromptCache(
            config.max_inflight,
            cut_anywhere=cut_anywhere(model),
            budget_bytes=config.cache_ram_mib * 2**20,
            enabled=config.prompt_cache,
        )
        self._snapshots: dict[int, ctypes.Array[ctypes.c_uint8]] = {}
        #: Sequences in the last step's batch.
        self.decoding = 0

    @property
    def busy(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self._jobs)

    def add(self, request: CoreRequest) -> None:
        self._jobs[request.key] = _Job(request)
        self._scheduler.add(request.key, len(request.prompt))

    def cancel(self, key: int) -> None:
        """End ``key`` at the next step (a no-op once it has ended)."""
        job = self._jobs.get(key)
        if job is not None:
            job.cancelled = True

    def release_cancelled(self) -> list[StepOutput]:
        """Free the cancelled requests' slots now (before the next decode)."""
        outputs = []
        for job in [job for job in self._jobs.values() if job.cancelled]:
            self._release(job)
            outputs.append(job.output([], stop=StopReason.CANCELLED, released=True))
        self._count_running()
        return outputs

    def step(self) -> list[StepOutput]:
        """Admit, ingest and decode one step; what happened to each request."""
        started = time.perf_counter()
        plan = self._scheduler.schedule(self._start)
        for key in plan.admitted:
            job = self._jobs[key]
            job.admitted_at = started
            job.sampler = self._sampler(job.request.request, job.request.grammar)
        if plan.empty:
            self.decoding = 0
            self._count_running()
            return []
        parts = [_Part(self._jobs[key], None, 0, 0) for key in plan.decode]
        parts += [_Part(self._jobs[p.key], p.start, p.count, 0) for p in plan.prefill]
        parts.sort(key=lambda part: part.job.seq)
        self.decoding = len(parts)
        decode_s, sampled, failed = self._decode(parts)
        outputs: list[StepOutput] = []
        for job, error in failed:
            self._release(job, clear=True)
            outputs.append(job.output([], error=error, released=True))
        for part in parts:
            job = part.job
            if part.start is not None and job.seq >= 0:
                self._stats.prompt_tokens_ingested += part.count
                if job.pos in job.snapshot_at:
                    self._snapshot(job.seq, job.prompt[: job.pos])
        now = time.perf_counter()
        for job, token in sampled:
            outputs.append(self._advance(job, token, now))
        stats = self._stats
        # Counted before the hand-off, so whoever sees a request end sees its tokens.
        stats.busy_slots += len(parts)
        stats.tokens_predicted += sum(len(output.tokens) for output in outputs)
        self._count_running()
        step_s = time.perf_counter() - started
        stats.steps += 1
        stats.decode_s += decode_s
        stats.python_s += step_s - decode_s
        self._scheduler.measured(step_s * 1000, decode_only=not plan.prefill)
        return outputs

    def close(self, error: Exception) -> list[StepOutput]:
        """Fail every request left with ``error`` and free its slot."""
        outputs = []
        for job in list(self._jobs.values()):
            self._release(job, clear=True)
            outputs.append(job.output([], error=error, released=True))
        self.decoding = 0
        self._count_running()
        return outputs

    # -- prompt reuse --------------------------------------------------------------------

    def _start(self, key: int) -> Start:
        """Carry out the prompt cache's decision for a sequence admitted now."""
        job = self._jobs[key]
        model, cache = self._model, self._cache
        plan = cache.assign(
            job.prompt, hints=job.request.hints, reuse=job.request.request.cache_prompt
        )
        seq = job.seq = plan.seq
        keep = plan.keep
        if plan.save is not None:
            self._snapshot(seq, plan.save)
        if plan.restore is not None and not model.restore_state(seq, self._snapshots[plan.restore]):
            cache.restore_failed(seq)
            keep = 0
        if keep == 0 or not model.forget(seq, keep):
            model.forget(seq)
            keep = 0
        job.pos = job.cached = keep
        job.snapshot_at = plan.snapshot_at
        self._count_cache()
        return Start(keep, plan.snapshot_at)

    def _snapshot(self, seq: int, tokens: npt.NDArray[np.int32]) -> None:
        data = self._model.save_state(seq)
        if data is None:
            return
        entry, evicted = self._cache.stored(tokens, len(data))
        for old in evicted:
            del self._snapshots[old]
        if entry is not None:
            self._snapshots[entry] = data
        self._count_cache()

    def _count_running(self) -> None:
        running = [job for job in self._jobs.values() if job.seq >= 0]
        self._stats.running = len(running)
        self._stats.kv_tokens = sum(job.pos for job in running)

    def _count_cache(self) -> None:
        stats, cache = self._stats, self._cache
        stats.prompt_cache_hits = cache.hits
        stats.prompt_cache_reused_tokens = cache.reused_tokens
        stats.prompt_cache_bytes = cache.bytes_used
        stats.prompt_cache_entries = cache.entries
        stats.prompt_cache_snapshots = cache.snapshots
        stats.prompt_cache_evictions = cache.evictions

    def _release(self, job: _Job, *, clear: bool = False) -> None:
        """Free ``job``'s slot; its memory stays for the prompt cache unless ``clear`` (a
        failed decode may have left it inconsistent)."""
        self._scheduler.remove(job.key)
        self._jobs.pop(job.key, None)
        if job.seq >= 0:
            if clear or not self._config.prompt_cache:
                self._model.forget(job.seq)
                self._cache.released(job.seq, ())
            else:
                held = job.prompt[: min(job.pos, len(job.prompt))]
                if job.fed:
                    held = np.concatenate([held, np.asarray(job.fed, dtype=np.int32)])
                self._cache.released(job.seq, held)
            job.seq = -1
        if job.sampler is not None:
            job.sampler.close()
            job.sampler = None

    # -- one step ------------------------------------------------------------------------

    def _sampler(self, request: GenerateRequest, grammar: Grammar | None) -> SlotSampler:
        sampling = request.sampling
        bias = dict(request.logit_bias)
        if request.ignore_eos:
            bias.update(dict.fromkeys(self._model.eog, float("-inf")))
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
            self._model,
            temperature=sampling.temperature,
            top_k=sampling.top_k,
            top_p=sampling.top_p,
            min_p=sampling.min_p,
            seed=(sampling.seed if sampling.seed is not None else random.getrandbits(32))
            & 0xFFFFFFFF,
            bias=bias,
            grammar=grammar,
            penalties=penalties,
            logprobs=request.logprobs,
        )

    def _decode(
        self, parts: list[_Part]
    ) -> tuple[float, list[tuple[_Job, int]], list[tuple[_Job, Exception]]]:
        """Decode ``parts`` in one batch and sample each part that ends with an output.

        When llama_decode fails for a batch of several sequences, each sequence's part of
        this step is rolled back and retried alone, so only the sequences that fail alone are
        failed. A sequence whose memory cannot be rolled back (recurrent state) is failed.
        """
        batch = self._batch
        batch.clear()
        for part in parts:
            job = part.job
            if part.start is None:
                part.index = batch.add_one(job.last_token, job.pos, job.seq)
            else:
                last = part.start + part.count == len(job.prompt)
                chunk = job.prompt[part.start : part.start + part.count]
                part.index = batch.add(chunk, part.start, job.seq, output_last=last)
                part.outputs = last
        t0 = time.perf_counter()
        rc = self._model.decode(batch)
        decode_s = time.perf_counter() - t0
        if rc == 0:
            sampled = []
            for part in parts:
                if part.start is None:
                    part.job.pos += 1
                    part.job.fed.append(part.job.last_token)
                else:
                    part.job.pos = part.start + part.count
                if part.outputs and part.job.sampler is not None:
                    sampled.append((part.job, part.job.sampler.sample(part.index)))
            return decode_s, sampled, []
        failed: list[tuple[_Job, Exception]] = []
        retry: list[_Part] = []
        for part in parts:
            start = part.job.pos if part.start is None else part.start
            if len(parts) > 1 and self._model.forget(part.job.seq, start):
                retry.append(part)
            else:
                failed.append((part.job, DecodeError(_decode_error(rc))))
        sampled = []
        for part in retry:
            spent, ok, bad = self._decode([part])
            decode_s += spent
            sampled += ok
            failed += bad
        return decode_s, sampled, failed

    def _advance(self, job: _Job, token: int, now: float) -> StepOutput:
        if not job.first_token_at:
            job.first_token_at = now
        request = job.request.request
        stop: StopReason | None = None
        tokens: list[int] = []
        logprobs = None
        if token < 0 or (token in self._model.eog and not request.ignore_eos):
            # An end-of-generation token, or a grammar that allows nothing more.
            stop = StopReason.END_OF_GENERATION
        else:
            tokens.append(token)
            if request.logprobs is not None and job.sampler is not None:
                raw = job.sampler.last_logprob
                logprobs = [raw] if raw is not None else None
            job.generated += 1
            job.last_token = token
            if job.generated >= job.request.max_tokens:
                stop = (
                    StopReason.MAX_TOKENS
                    if request.max_tokens is not None and job.generated >= request.max_tokens
                    else StopReason.CONTEXT_END
                )
            elif job.pos >= self._config.ctx_size:
                stop = StopReason.CONTEXT_END
        if stop is not None:
            self._release(job)
        return job.output(tokens, stop=stop, released=stop is not None, logprobs=logprobs)


def cut_anywhere(model: LlamaModel) -> bool:
    """Whether a sequence's memory can be cut back to any position: attention only, with a
    full-size sliding-window cache."""
    recurrent = model.is_recurrent or model.is_hybrid
    return not recurrent and (model.n_swa == 0 or model.swa_full)


def _decode_error(rc: int) -> str:
    reasons = {
        1: "no room left in the context memory for this sequence",
        2: "the decode was aborted",
        -1: "llama.cpp rejected the batch as invalid",
    }
    return f"llama_decode failed ({rc}): {reasons.get(rc, 'fatal error in the compute graph')}"
