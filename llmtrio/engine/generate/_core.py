"""The decode-step core: schedule → carry out prompt reuse → draft → fill one batch →
``llama_decode`` → sample and verify → hand token ids out (vLLM v1's ``EngineCore``). No Trio
and no threads: whoever owns it calls :meth:`EngineCore.step` from one thread (the engine's
decode thread; a test's own).

Requests come in and results go out as plain values (:class:`CoreRequest`,
:class:`StepOutput`); the policies it carries out are pure objects of their own: the
:class:`Scheduler` (who runs, how many prompt tokens each), the :class:`PromptCache`
(which slot, what of the prompt is already in memory, what to snapshot), and speculative
decoding's drafter and draft budget (the ``spec`` package, carried out by ``_drafting.py``).

Speculative decoding: a decoding sequence's step carries its last token and up to
``spec_draft_max`` draft tokens, every one with logits. Its sampler then samples the
logits at each position in turn, exactly as it would without drafts (penalties, grammar,
temperature and its random state advance token by token), and stops at the first sample
that differs from the draft: every token emitted is the one the sequence would have
sampled at its position, and the drafts after the first wrong one are cut from memory.

The core's parts: the prompt cache's decisions carried out (``_core_reuse``), one batch
decoded, sampled and verified (``_core_execute``); the rest is here.

A reasoning budget (``_think_budget.py``): once a sequence has spent its budget inside its think
block, the position after takes ``</think>`` whatever the logits say (its sampler takes it as
if picked), and a draft that would cross the budget is cut at the marker.

LoRA adapters: llama.cpp applies them per context, so one step runs the sequences of one
adapter set (``_adapter_turns``: whose turn it is; the scheduler plans that set's sequences
only, the others wait in their slots with everything they hold). The prompt cache files
memory by adapter set, so a prefix is reused only under the set it was computed under.

The shared pool (``kv_unified``): when a step needs more cells than are free, idle slots
give their reusable cells up first (snapshotted within the prompt cache's budget), then the
drafts go, then the youngest running sequence is swapped out (its state copied to host
memory, its sampler kept) until the pool has room for it again.
"""

from __future__ import annotations

import ctypes
import time
from collections import Counter
from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from .._config import EngineConfig
from .._cores import ThreadChooser
from .._stats import EngineStats
from .._types import StopReason
from ..llama import Batch, LlamaModel, RawLogprob
from ..spec_decode import (
    Acceptance,
    DraftGate,
    NgramDrafter,
    NgramPool,
    PooledDrafter,
    Shape,
    plan_drafts,
)
from ._adapter_turns import AdapterTurns
from ._core_execute import Execution
from ._core_reuse import PromptReuse
from ._disk_tier import DiskTier
from ._drafting import DraftBudget, cut_anywhere, judge_shadow
from ._jobs import Drafter, Job, Part, slot_sampler
from ._lora import BASE, LoraSet
from ._pool import SharedPool
from ._prompt_cache import PromptCache
from ._scheduler import Scheduler
from ._step import CoreRequest, StepOutput
from ._think_budget import ThinkBudget, think_markers

__all__ = ["Drafter", "EngineCore"]


class EngineCore(PromptReuse, Execution):
    """Continuous batching over ``config.max_inflight`` sequences of one model.

    :meth:`add` and :meth:`cancel` take effect at the next :meth:`step`, which runs one
    ``llama_decode`` for every running sequence. :meth:`close` fails what is left.

    ``drafter(tokens)`` makes a sequence's drafter from its prompt (prompt lookup by
    default); it is used when ``config.spec`` is on and the memory can take drafts back.
    ``plan`` decides how many of the drafts offered a step verifies: by default
    :func:`plan_drafts` from measured step costs, carried out while steps with drafts emit
    more tokens per ms than steps without (:class:`DraftGate`); a plan of the caller's own
    (tests force drafts with one) is carried out as chosen.

    ``disk``: the prompt cache's disk tier (``cache_dir``): snapshots host memory does not
    keep are handed to it, a request may come with a snapshot it read (``offered``), and
    :meth:`flush` hands it what memory holds as the engine closes.

    Resource handling: a sequence's sampler is freed with its slot; its memory stays for
    the prompt cache (cleared after a failed decode, or when reuse is off). A preempted
    sequence's swapped-out state is held until it resumes or ends.
    """

    def __init__(
        self,
        model: LlamaModel,
        config: EngineConfig,
        stats: EngineStats,
        *,
        drafter: Callable[[list[int]], Drafter] | None = None,
        plan: Callable[..., list[int]] | None = None,
        disk: DiskTier | None = None,
    ) -> None:
        self._model = model
        self._disk = disk
        self._config = config
        self._stats = stats
        self._scheduler = Scheduler(
            config.max_inflight,
            config.prefill_chunk,
            config.target_step_ms,
            prefill_share=config.prefill_share,
        )
        self._batch = Batch(model.n_batch)
        self._jobs: dict[int, Job] = {}
        # The prompt cache picks each sequence's id: the slot holding most of its prompt,
        # else the lowest free one. Batches go in ascending id order: llama.cpp splits a
        # batch of non-unified sequences into one micro-batch per run of consecutive,
        # increasing ids, and each micro-batch reads all the weights again.
        self._cache = PromptCache(
            config.max_inflight,
            cut_anywhere=cut_anywhere(model),
            budget_bytes=config.cache_ram_mib * 2**20,
            enabled=config.prompt_cache,
            spills=disk is not None,
        )
        #: The snapshots in host memory: the tokens each follows, and the state.
        self._snapshots: dict[int, tuple[npt.NDArray[np.int32], ctypes.Array[ctypes.c_uint8], str]]
        self._snapshots = {}
        #: What the slots and snapshots of the base model hold (the prompt cache's ``held``),
        #: as of the last change: published for the frontend's disk lookups (a tuple, replaced
        #: whole; memory under adapters serves no base request).
        self.held: tuple[npt.NDArray[np.int32], ...] = ()
        self._pool = (
            SharedPool(
                config.pool_cells,
                model=model,
                cache=self._cache,
                scheduler=self._scheduler,
                stats=stats,
                jobs=self._jobs,
                snapshot=self._snapshot,
            )
            if model.kv_unified
            else None
        )
        self._request_ctx = config.request_ctx
        self._drafts = DraftBudget(
            model,
            config,
            self._batch.capacity,
            plan or plan_drafts,
            DraftGate() if plan is None else None,
        )
        #: What every sequence wrote, for the others to draft from (with the default
        #: drafter only: tests that bring their own drafter get exactly its drafts).
        self._ngrams = (
            NgramPool(config.spec_pool)
            if config.spec_pool and self._drafts.draft_max and drafter is None
            else None
        )
        self._make_drafter = drafter
        #: ``<think>`` and ``</think>`` as single tokens (a reasoning budget needs them).
        self._markers = think_markers(lambda text: model.tokenize(text, add_special=False))
        self._admissions = 0
        #: Whose turn it is among the LoRA adapter sets; the jobs of each set (by key);
        #: the set this step runs under.
        self._turns = AdapterTurns()
        self._sets: Counter[str] = Counter()
        self._serve: LoraSet = BASE
        #: Each step's compute threads: the configured ones, or 1 where that measures faster
        #: (a machine with fewer free cores than threads: issue 48).
        self._threads = ThreadChooser(config.threads)
        self._choose_threads = config.choose_threads
        self._threads_now = config.threads
        #: Time spent sampling decoding sequences' positions in this step.
        self._sample_s = 0.0
        #: Sequences in the last step's batch.
        self.decoding = 0

    def _drafter(self, job: Job, tokens: list[int]) -> Drafter:
        """A sequence's drafter: prompt lookup, and the core's pool priced by the
        sequence's acceptance (or the tests' own drafter)."""
        if self._make_drafter is not None:
            return self._make_drafter(tokens)
        grammar, sampler = job.request.grammar, job.sampler
        # Held to a grammar from the first token: drafts are chosen among the n-gram's
        # occurrences by what the grammar takes (a JSON key the schema wants next).
        held = grammar is not None and grammar.trigger is None
        fits = sampler.allowed if held and sampler is not None else None
        job.drafts_fit = fits is not None
        own = NgramDrafter(tokens, fits=fits)
        if self._ngrams is None:
            return own
        return PooledDrafter(own, self._ngrams, tokens, job.acceptance.rate, fits=fits)

    @property
    def busy(self) -> bool:
        """Whether any request is waiting or running."""
        return bool(self._jobs)

    @property
    def request_ctx(self) -> int:
        """The most positions one request may use."""
        return self._request_ctx

    def add(self, request: CoreRequest) -> None:
        self._jobs[request.key] = Job(
            request,
            acceptance=Acceptance(shared=self._drafts.shared(request)),
            think=self._think_budget(request),
        )
        self._sets[request.lora.key] += 1
        self._scheduler.add(request.key, len(request.prompt))

    def _think_budget(self, request: CoreRequest) -> ThinkBudget | None:
        """The request's reasoning budget: none when it asks for none, when the model has no
        single-token think markers, or under a grammar held from the first token (which
        decides every token, the marker too)."""
        budget, markers = request.request.reasoning_budget, self._markers
        grammar = request.grammar
        if budget is None or markers is None or (grammar is not None and grammar.trigger is None):
            return None
        unfinished = self._model.unfinished_utf8
        return ThinkBudget(
            budget, markers, thinking=request.opens_think, unfinished=unfinished.__contains__
        )

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
        """Admit, ingest, draft and decode one step; what happened to each request."""
        started = time.perf_counter()
        self._sample_s = 0.0
        pool = self._pool
        serves = self._serving()
        plan = self._scheduler.schedule(self._start, pool.fits if pool else None, serves)
        for key in plan.admitted:
            job = self._jobs[key]
            if job.sampler is None:
                job.admitted_at = started
                job.sampler = slot_sampler(self._model, job.request.request, job.request.grammar)
        if plan.empty:
            self.decoding = 0
            self._count_running()
            return []
        parts = [Part(self._jobs[key], None, 0, 0) for key in plan.decode]
        prefill = [Part(self._jobs[p.key], p.start, p.count, 0) for p in plan.prefill]
        if self._drafts.draft_max:
            self._drafts.draft(parts, prefill, started)
        parts += prefill
        if pool:
            parts = pool.make_room(parts)
        parts.sort(key=lambda part: part.job.seq)
        self.decoding = len(parts)
        outputs: list[StepOutput] = []
        if not parts:
            self._count_running()
            return outputs
        if self._model.loras.use(self._serve.adapters):
            self._stats.lora_switches += 1
        if self._serve.adapters:
            self._stats.lora_steps += 1
        drafting = self._drafts.draft_max > 0
        sizes = (
            self._drafts.micro_batches([(part.job.seq, part.tokens) for part in parts])
            if drafting
            else []
        )
        decode_s, sampled, failed = self._decode(parts)
        for job, error in failed:
            self._release(job, clear=True)
            outputs.append(job.output([], error=error, released=True))
        for part in parts:
            job = part.job
            if part.start is not None and job.seq >= 0:
                self._stats.prompt_tokens_ingested += part.count
                if job.pos in job.snapshot_at:
                    self._snapshot(job.seq, job.prompt[: job.pos], job.request.lora.key)
        now = time.perf_counter()
        for job, tokens, logprobs in sampled:
            outputs.append(self._advance(job, tokens, logprobs, now))
        stats = self._stats
        # Counted before the hand-off, so whoever sees a request end sees its tokens.
        stats.busy_slots += len(parts)
        stats.tokens_predicted += sum(len(output.tokens) for output in outputs)
        self._count_running()
        step_s = time.perf_counter() - started
        stats.steps += 1
        stats.decode_s += decode_s
        stats.python_s += step_s - decode_s
        prompt_tokens = sum(part.count for part in parts if part.start is not None)
        decode_only = not any(part.start is not None for part in parts)
        self._scheduler.measured(
            step_s * 1000, decode_only=decode_only, prompt_tokens=prompt_tokens
        )
        gate = self._drafts.gate
        if drafting and gate is not None:
            stats.spec_held_steps = gate.held  # steps with a prompt chunk are held too
            if decode_only and not failed:
                gate.measured(
                    len(parts),
                    sum(len(output.tokens) for output in outputs),
                    step_s * 1000,
                    opened=self._drafts.opened,
                    at=started,
                )
        if drafting and not failed:
            # Without the decoding sequences' sampling: the budget adds each one's own.
            self._drafts.costs.measured(
                (step_s - self._sample_s) * 1000,
                outputs=sum(part.tokens for part in parts if part.start is None),
                prefill=sum(part.tokens for part in parts if part.start is not None),
                shape=Shape.of(sizes),
                at=started,
            )
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

    # -- adapter sets --------------------------------------------------------------------

    def _serving(self) -> Callable[[int], bool] | None:
        """Choose the adapter set this step runs under (``_serve``); the scheduler's filter
        of its sequences, or ``None`` when every request in the core is of that one set."""
        jobs = self._jobs
        if len(self._sets) <= 1:
            job = next(iter(jobs.values()), None)
            self._serve = job.request.lora if job is not None else self._serve
            return None
        sets: dict[str, LoraSet] = {}
        ready: Counter[str] = Counter()
        for job in jobs.values():
            lora = job.request.lora
            sets[lora.key] = lora
            if job.seq >= 0:
                ready[lora.key] += 1
        first = self._scheduler.first_waiting
        key = self._turns.choose(ready, jobs[first].request.lora.key if first is not None else None)
        if key is None:  # not expected: the core holds jobs, so one is ready or waiting
            return None
        self._serve = sets[key]
        return lambda k: jobs[k].request.lora.key == key

    def _count_running(self) -> None:
        running = [job for job in self._jobs.values() if job.seq >= 0]
        stats = self._stats
        stats.running = len(running)
        stats.kv_tokens = sum(job.pos for job in running)
        if self._pool:
            stats.kv_cells_used = stats.kv_tokens + self._cache.idle_cells()

    def _release(self, job: Job, *, clear: bool = False) -> None:
        """Free ``job``'s slot; its memory stays for the prompt cache unless ``clear`` (a
        failed decode may have left it inconsistent)."""
        self._scheduler.remove(job.key)
        if self._jobs.pop(job.key, None) is not None:
            key = job.request.lora.key
            self._sets[key] -= 1
            if not self._sets[key]:
                del self._sets[key]
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
            self.held = self._cache.held()
        if job.preempted and self._pool:
            self._pool.unswap(job)
        if job.sampler is not None:
            job.sampler.close()
            job.sampler = None

    def _advance(
        self, job: Job, sampled: list[int], logprobs: list[RawLogprob] | None, now: float
    ) -> StepOutput:
        if not job.first_token_at:
            job.first_token_at = now
        request = job.request.request
        stop: StopReason | None = None
        tokens: list[int] = []
        ends = self._ends(job)
        for token in sampled:
            if ends(token):
                # An end-of-generation token, or a grammar that allows nothing more.
                stop = StopReason.END_OF_GENERATION
                break
            tokens.append(token)
            job.generated += 1
            job.last_token = token
            if job.generated >= job.request.max_tokens:
                stop = (
                    StopReason.MAX_TOKENS
                    if request.max_tokens is not None and job.generated >= request.max_tokens
                    else StopReason.CONTEXT_END
                )
                break
        if stop is None and job.pos >= self._request_ctx:
            stop = StopReason.CONTEXT_END
        if job.shadow:
            judge_shadow(job, tokens)
        if job.drafter is not None:
            job.drafter.extend(tokens)
        elif self._drafts.draft_max and stop is None:
            # Made at the first token: the index of the prompt is built once, off the
            # admission step, and only for sequences that decode.
            history = job.prompt.tolist()
            if job.request.media:  # no media placeholder is ever a draft
                history = [token for token in history if token >= 0]
            history += tokens
            job.drafter = self._drafter(job, history)
        if logprobs is not None:
            logprobs = logprobs[: len(tokens)] or None
        if stop is not None:
            self._release(job)
        return job.output(tokens, stop=stop, released=stop is not None, logprobs=logprobs)
