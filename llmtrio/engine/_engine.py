"""The engine: one model, many generations, one ``llama_decode`` per step.

Shape of a step (on the decode thread, a ``trio.to_thread.run_sync`` worker):

    inbox (new jobs) → cancel flags checked → Scheduler.schedule() → fill Batch
    → llama_decode → sample → post token ids to Trio (one ``run_sync_soon`` per step for all
    generations)

Prompts are rendered and tokenized in a worker thread of their own, off the event loop.

Everything text-shaped (pieces, UTF-8, stop strings, think blocks) happens per generation on
the Trio side, off the decode thread's critical path.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import attrs
import numpy as np
import numpy.typing as npt
import trio

from ._chat import ChatTemplate
from ._errors import (
    DecodeError,
    EngineClosedError,
    EngineFailedError,
    InvalidRequestError,
    PromptTooLongError,
)
from ._llama import Batch, LlamaModel, SlotSampler
from ._model_source import ResolvedModel, resolve_model
from ._sampling import Penalties, RawLogprob
from ._scheduler import Scheduler
from ._text import THINK_CLOSE, THINK_OPEN, StopMatcher, ThinkSplitter, Utf8Assembler
from ._types import (
    Capacity,
    Done,
    EngineConfig,
    Event,
    Failed,
    GenerateRequest,
    StopReason,
    Timings,
    Token,
    TokenLogprob,
)

__all__ = ["Engine", "EngineStats", "Generation"]

logger = logging.getLogger("llmtrio.engine")


@attrs.define
class EngineStats:
    """Counters of the decode loop, for benchmarks and metrics: ``decode_s`` is time inside
    ``llama_decode``, ``python_s`` the rest of each step (batch filling, sampling, hand-off).

    Plain numbers, written by the decode thread once per step and read (racily, which is
    fine for counters) at scrape time; nothing here costs the loop more than an addition.
    """

    steps: int = 0
    decode_s: float = 0.0
    python_s: float = 0.0
    #: Prompt tokens decoded (prefill), as llama.cpp's ``prompt_tokens_total``.
    prompt_tokens_ingested: int = 0
    #: Tokens sampled and handed out, as llama.cpp's ``tokens_predicted_total``.
    tokens_predicted: int = 0
    #: Sequences in each step's batch, summed (busy slots per decode = this / ``steps``).
    busy_slots: int = 0
    #: Requests holding a slot (admitted) after the last step; the rest of ``inflight`` waits.
    running: int = 0
    #: Context cells the running requests use after the last step (their positions, summed).
    kv_tokens: int = 0


@attrs.define(eq=False)
class _Job:
    """One request as the decode thread sees it."""

    key: int
    prompt: npt.NDArray[np.int32]
    request: GenerateRequest
    max_tokens: int
    generation: Generation
    seq: int = -1
    pos: int = 0
    last_token: int = -1
    generated: int = 0
    sampler: SlotSampler | None = None
    admitted_at: float = 0.0
    first_token_at: float = 0.0
    #: Set from the Trio side; the decode loop frees the slot at the next token boundary.
    cancelled: bool = False


@attrs.frozen
class _Update:
    """What one step did to one job, handed to the Trio side."""

    job: _Job
    tokens: list[int]
    stop: StopReason | None = None
    error: Exception | None = None
    released: bool = False
    logprobs: list[RawLogprob] | None = None


class Generation:
    """A running generation: iterate it for :class:`Token` events, ending with one
    :class:`Done` or :class:`Failed`.

    Resource handling: the generation runs inside its own cancel scope, opened by
    :meth:`Engine.submit`. :meth:`cancel`, leaving the ``async with``, or cancelling the task
    that iterates all end it the same way: the scope is cancelled, and the decode thread frees
    the slot at the next token boundary (or the next prefill chunk).
    """

    def __init__(
        self, engine: Engine, prompt_tokens: int, opens_think: bool, stops: tuple[str, ...]
    ) -> None:
        self._engine = engine
        self._job: _Job | None = None
        self._scope = trio.CancelScope()
        self._send, self._receive = trio.open_memory_channel[Event](float("inf"))
        self.prompt_tokens = prompt_tokens
        self._completion_tokens = 0
        self._utf8 = Utf8Assembler()
        self._stop = StopMatcher(stops)
        self._think = ThinkSplitter(reasoning=opens_think)
        self._logprobs: list[TokenLogprob] = []
        self._submitted_at = time.perf_counter()
        self._released = False
        #: Set once a Done or Failed event was produced; no event follows it.
        self.finished = False
        self.result: Done | Failed | None = None
        #: Set with ``finished``: the slot is free or being freed; what is left is buffered.
        self.ended = trio.Event()

    def __aiter__(self) -> Generation:
        return self

    async def __anext__(self) -> Event:
        if self.finished and self._receive.statistics().current_buffer_used == 0:
            raise StopAsyncIteration
        return await self._receive.receive()

    def cancel(self) -> None:
        """End the generation; safe to call from any Trio task, any number of times."""
        self._scope.cancel()
        self._engine._cancel(self)

    def drain(self) -> list[Event]:
        """The events produced and not read yet, without waiting."""
        events: list[Event] = []
        while True:
            try:
                events.append(self._receive.receive_nowait())
            except (trio.WouldBlock, trio.EndOfChannel):
                return events

    # -- Trio side of the hand-off ---------------------------------------------------

    def _apply(self, update: _Update) -> None:
        if self.finished:
            return
        job = update.job
        if update.logprobs:
            self._logprobs += [self._engine._token_logprob(raw) for raw in update.logprobs]
        for token in update.tokens:
            self._completion_tokens += 1
            text = self._utf8.feed(self._engine._piece(token))
            if self._emit(text):
                self._finish(StopReason.STOP_STRING, job)
                self._engine._cancel(self)
                return
        if update.error is not None:
            self._fail(update.error)
        elif update.stop is not None:
            stop = update.stop
            if self._emit(self._utf8.flush()):
                stop = StopReason.STOP_STRING  # the last, flushed character completed one
            else:
                self._emit_segments(self._think.feed(self._stop.flush()))
                self._emit_segments(self._think.flush())
            self._finish(stop, job)

    def _emit(self, text: str) -> bool:
        """Pass text through the stop matcher and think splitter; true when a stop matched."""
        if not text:
            return False
        safe, stopped = self._stop.feed(text)
        self._emit_segments(self._think.feed(safe))
        if stopped:
            self._emit_segments(self._think.flush())
        return stopped

    def _emit_segments(self, segments: list[tuple[str, bool]]) -> None:
        for text, reasoning in segments:
            if self._logprobs:
                logprobs, self._logprobs = tuple(self._logprobs), []
                self._send.send_nowait(Token(text, reasoning, logprobs))
            else:
                self._send.send_nowait(Token(text, reasoning))

    def _fail(self, error: Exception) -> None:
        """End with ``Failed(error)`` (unless already ended) and free the slot."""
        if not self.finished:
            self.finished = True
            self.result = Failed(error)
            self._send.send_nowait(self.result)
            self.ended.set()
        self._engine._cancel(self)

    def _finish(self, stop: StopReason, job: _Job) -> None:
        now = time.perf_counter()
        admitted = job.admitted_at or now
        first = job.first_token_at or now
        self.finished = True
        self.result = Done(
            stop=stop,
            prompt_tokens=self.prompt_tokens,
            completion_tokens=self._completion_tokens,
            timings=Timings(
                queue_s=max(0.0, admitted - self._submitted_at),
                prefill_s=max(0.0, first - admitted),
                decode_s=max(0.0, now - first),
            ),
        )
        self._send.send_nowait(self.result)
        self.ended.set()


class Engine:
    """Continuous batching over ``config.max_inflight`` slots of one llama.cpp model.

    Open it with :meth:`open`; submit with :meth:`submit`.
    """

    def __init__(self, config: EngineConfig, model: LlamaModel, resolved: ResolvedModel) -> None:
        self.config = config
        self.model_name = resolved.name
        self.model_path = resolved.path
        self._model = model
        self._template = ChatTemplate(
            model.chat_template,
            architecture=model.architecture,
            bos_token=self._special_text(model.bos),
            eos_token=self._special_text(model.eos),
            render_builtin=model.apply_builtin_template,
        )
        self._think_ids = self._single_tokens((THINK_OPEN, THINK_CLOSE))
        self._pieces: dict[int, bytes] = {}
        self._max_piece_bytes = max(1, model.max_piece_bytes)
        self._trio_token = trio.lowlevel.current_trio_token()
        self._cond = threading.Condition()
        self._inbox: list[_Job] = []
        self._closing = False
        self._closed = False
        self._failure: EngineFailedError | None = None
        self._stopped = trio.Event()
        self._next_key = 0
        self._inflight = 0
        self._decoding = 0
        self._capacity_lot = trio.lowlevel.ParkingLot()
        self.stats = EngineStats()
        # Test seam: llama.cpp itself rejects out-of-vocabulary ids when this is off.
        self._check_token_ids = True

    # -- lifecycle ---------------------------------------------------------------------

    @classmethod
    @asynccontextmanager
    async def open(cls, config: EngineConfig) -> AsyncIterator[Engine]:
        """Resolve and load the model (in a thread), start the decode loop, and yield the
        engine once the model is resident.

        Error handling: :class:`ModelLoadError` when the model cannot be found or loaded.
        Resource handling: on exit, generations still running end with
        ``Failed(EngineClosedError)``, the decode thread stops and the model is freed.
        """
        resolved = await trio.to_thread.run_sync(resolve_model, config)
        n_batch = max(config.prefill_chunk + config.max_inflight, 64)
        model = await trio.to_thread.run_sync(
            lambda: LlamaModel(
                resolved.path,
                slots=config.max_inflight,
                ctx_size=config.ctx_size,
                threads=config.threads,
                n_batch=n_batch,
            )
        )
        try:
            engine = cls(config, model, resolved)
            logger.info(
                "loaded %s (%s, %s memory, chat template: %s), %d slots x %d tokens",
                resolved.name,
                model.architecture,
                "hybrid" if model.is_hybrid else "recurrent" if model.is_recurrent else "attention",
                engine._template.source,
                config.max_inflight,
                config.ctx_size,
            )
            # The caller's exception (or cancellation) is held while the nursery closes and
            # raised after it, so it leaves this block as it was raised, not in a group.
            error: BaseException | None = None
            async with trio.open_nursery() as nursery:
                await nursery.start(engine._run_loop)
                try:
                    yield engine
                except BaseException as exc:
                    error = exc
                finally:
                    engine._close()  # the loop stops within one decode step
            if error is not None:
                raise error
        finally:
            model.close()

    async def _run_loop(self, *, task_status: trio.TaskStatus[None]) -> None:
        """Run the decode loop in a ``trio.to_thread.run_sync`` worker until it stops; a
        loop that dies is recorded (``failure``), not raised: every generation it held has
        already ended with ``Failed``, and the engine's owner decides what to do."""
        task_status.started()
        try:
            await trio.to_thread.run_sync(self._loop, thread_name="llmtrio decode loop")
        except Exception as exc:
            logger.error("the decode loop failed", exc_info=exc)
            self._failure = EngineFailedError(f"the decode loop failed: {exc!r}")
        finally:
            self._closed = True
            self._stopped.set()

    def _close(self) -> None:
        self._closed = True
        with self._cond:
            self._closing = True
            self._cond.notify()

    # -- public API ----------------------------------------------------------------------

    @property
    def failure(self) -> EngineFailedError | None:
        """Why the decode loop died, once it has; ``None`` while it runs (or closed
        normally)."""
        return self._failure

    async def wait_failed(self) -> EngineFailedError:
        """Return the failure once the decode loop has died; waits forever on an engine
        that runs or closes normally."""
        await self._stopped.wait()
        if self._failure is None:
            await trio.sleep_forever()
        assert self._failure is not None
        return self._failure

    def capacity(self) -> Capacity:
        inflight = self._inflight
        return Capacity(
            inflight=inflight,
            decoding=self._decoding,
            max_inflight=self.config.max_inflight,
            available_slots=max(0, self.config.max_inflight - inflight),
        )

    async def wait_idle(self) -> None:
        """Return once no request is in flight (waiting ones included)."""
        while self._inflight:
            await self._capacity_lot.park()

    async def capacity_changed(self) -> None:
        """Return at the next change of :meth:`capacity`'s ``inflight`` (a request accepted
        or its slot freed)."""
        await self._capacity_lot.park()

    async def wait_for_slot(self) -> None:
        """Return once fewer than ``max_inflight`` requests are in flight."""
        while self._inflight >= self.config.max_inflight:
            await self._capacity_lot.park()

    def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        return self._model.tokenize(text, add_special=add_special)

    @property
    def n_vocab(self) -> int:
        return self._model.n_vocab

    @asynccontextmanager
    async def submit(self, request: GenerateRequest) -> AsyncIterator[Generation]:
        """Start a generation and yield it; it never waits for decoding or admission.

        Error handling: :class:`PromptTooLongError` or :class:`InvalidRequestError` when the
        request cannot run, :class:`EngineClosedError` when the engine is closed; all raised
        before anything is queued.
        """
        if self._closed:
            raise self._failure or EngineClosedError("the engine is closed")
        self._check_size(request)
        # Rendering and tokenizing a long prompt, or compiling a grammar, takes a while: never
        # on the event loop.
        prompt, opens_think = await trio.to_thread.run_sync(
            self._prepare, request, abandon_on_cancel=True
        )
        generation = Generation(self, len(prompt), opens_think, request.stop)
        budget = self.config.ctx_size - len(prompt) + 1
        job = _Job(
            key=self._next_key,
            prompt=np.asarray(prompt, dtype=np.int32),
            request=request,
            max_tokens=min(request.max_tokens or budget, budget),
            generation=generation,
        )
        self._next_key += 1
        generation._job = job
        with self._cond:
            if self._closed:  # checked under the lock the decode loop closes under
                raise self._failure or EngineClosedError("the engine is closed")
            self._inbox.append(job)
            self._cond.notify()
        self._inflight += 1
        self._capacity_lot.unpark_all()
        with generation._scope:
            try:
                yield generation
            finally:
                if not generation.finished:
                    self._cancel(generation)

    # -- Trio-side helpers -------------------------------------------------------------

    def _check_size(self, request: GenerateRequest) -> None:
        """Refuse, without tokenizing, a prompt whose size alone cannot fit a slot: no token
        covers more than ``_max_piece_bytes`` bytes of text, so that bounds its count."""
        if request.messages is not None:
            size = sum(len(m.content.encode("utf-8", "replace")) for m in request.messages)
            at_least = -(-size // self._max_piece_bytes)
        else:
            assert request.tokens is not None
            at_least = len(request.tokens)
        if at_least >= self.config.ctx_size:
            raise PromptTooLongError(at_least, self.config.ctx_size, at_least=True)

    def _prompt(self, request: GenerateRequest) -> tuple[list[int], bool]:
        model = self._model
        if request.tokens is not None:
            prompt = list(request.tokens)
            if self._check_token_ids:
                bad = [t for t in prompt if not 0 <= t < model.n_vocab]
                if bad:
                    raise InvalidRequestError(
                        f"token id {bad[0]} is outside the vocabulary (0..{model.n_vocab - 1})",
                        param="tokens",
                    )
            opens_think = False
        else:
            assert request.messages is not None
            rendered = self._template.render(
                request.messages, think=request.think, tools=request.tools
            )
            prompt = model.tokenize(rendered.text, add_special=model.add_bos)
            if model.add_bos and len(prompt) > 1 and prompt[0] == prompt[1] == model.bos:
                prompt = prompt[1:]
            opens_think = rendered.opens_think
        if len(prompt) >= self.config.ctx_size:
            raise PromptTooLongError(len(prompt), self.config.ctx_size)
        for token, _ in request.logit_bias:
            if not 0 <= token < model.n_vocab:
                raise InvalidRequestError(
                    f"logit_bias names token {token}, outside the vocabulary "
                    f"(0..{model.n_vocab - 1})",
                    param="logit_bias",
                )
        return prompt, opens_think

    def _prepare(self, request: GenerateRequest) -> tuple[list[int], bool]:
        """The prompt's tokens and whether it opens a think block; the grammar checked."""
        prompt = self._prompt(request)
        self._check_grammar(request)
        return prompt

    def _check_grammar(self, request: GenerateRequest) -> None:
        """Raise :class:`GrammarError` now, not on the decode thread, for a bad grammar."""
        if request.grammar is not None:
            SlotSampler(
                self._model,
                temperature=0.0,
                top_k=0,
                top_p=1.0,
                min_p=0.0,
                seed=0,
                bias={},
                grammar=request.grammar,
            ).close()

    def _token_logprob(self, raw: RawLogprob) -> TokenLogprob:
        def text(token: int) -> tuple[str, bytes]:
            piece = self._piece(token)
            return piece.decode("utf-8", "replace"), piece

        token, piece = text(raw.token)
        top = tuple((*text(t), logprob) for t, logprob in raw.top)
        return TokenLogprob(token, piece, raw.logprob, top)

    def _special_text(self, token: int) -> str:
        return self._model.special_piece(token).decode("utf-8", "replace") if token >= 0 else ""

    def _single_tokens(self, texts: tuple[str, ...]) -> frozenset[int]:
        ids = set()
        for text in texts:
            tokens = self._model.tokenize(text, add_special=False)
            if len(tokens) == 1:
                ids.add(tokens[0])
        return frozenset(ids)

    def _piece(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            model = self._model
            piece = model.special_piece(token) if token in self._think_ids else model.piece(token)
            self._pieces[token] = piece
        return piece

    def _cancel(self, generation: Generation) -> None:
        job = generation._job
        if job is None or generation._released or job.cancelled:
            return
        job.cancelled = True  # read by the decode loop at the next token boundary
        with self._cond:
            self._cond.notify()

    def _slot_released(self) -> None:
        self._inflight -= 1
        self._capacity_lot.unpark_all()

    def _deliver(self, updates: list[_Update]) -> None:
        for update in updates:
            generation = update.job.generation
            if update.released and not generation._released:
                generation._released = True
                self._slot_released()
            try:
                generation._apply(update)
            except Exception as exc:  # a fault in one generation ends that one only
                logger.exception("delivering to a generation failed")
                generation._fail(exc)

    # -- the decode thread -------------------------------------------------------------

    def _loop(self) -> None:
        config = self.config
        model = self._model
        scheduler = Scheduler(config.max_inflight, config.prefill_chunk, config.target_step_ms)
        batch = Batch(model.n_batch)
        jobs: dict[int, _Job] = {}
        # Lowest free sequence id first, and batches in ascending id order: llama.cpp splits a
        # batch of non-unified sequences into one micro-batch per run of consecutive,
        # increasing ids, and each micro-batch reads all the weights again.
        free_seqs = list(range(config.max_inflight))
        stats = self.stats

        def release(job: _Job) -> None:
            scheduler.remove(job.key)
            jobs.pop(job.key, None)
            if job.seq >= 0:
                model.forget(job.seq)
                heapq.heappush(free_seqs, job.seq)
                job.seq = -1
            if job.sampler is not None:
                job.sampler.close()
                job.sampler = None

        failure: BaseException | None = None
        try:
            while True:
                with self._cond:
                    if not jobs:
                        self._decoding = 0
                        stats.running = stats.kv_tokens = 0
                    while not (self._closing or self._inbox or jobs):
                        self._cond.wait()
                    if self._closing:
                        break
                    new, self._inbox = self._inbox, []
                started = time.perf_counter()
                updates: list[_Update] = []
                for job in new:
                    jobs[job.key] = job
                    scheduler.add(job.key, len(job.prompt))
                for job in [job for job in jobs.values() if job.cancelled]:
                    release(job)
                    updates.append(_Update(job, [], stop=StopReason.CANCELLED, released=True))
                if updates:
                    # Freed slots are known now, not after the next decode.
                    self._post(updates)
                    updates = []
                plan = scheduler.schedule()
                for key in plan.admitted:
                    job = jobs[key]
                    job.seq = heapq.heappop(free_seqs)
                    job.admitted_at = started
                    job.sampler = self._sampler(job)
                if plan.empty:
                    self._decoding = 0
                    self._post(updates)
                    continue

                parts = [_Part(jobs[key], None, 0, 0) for key in plan.decode]
                parts += [_Part(jobs[p.key], p.start, p.count, 0) for p in plan.prefill]
                parts.sort(key=lambda part: part.job.seq)
                self._decoding = len(parts)
                decode_s, sampled, failed = self._decode(batch, parts)
                for job, error in failed:
                    release(job)
                    updates.append(_Update(job, [], error=error, released=True))
                now = time.perf_counter()
                for job, token in sampled:
                    updates.append(self._advance(job, token, now, release))
                # Counted before the hand-off, so whoever sees a request end sees its tokens.
                stats.steps += 1
                stats.busy_slots += len(parts)
                stats.prompt_tokens_ingested += sum(p.count for p in parts if p.start is not None)
                stats.tokens_predicted += sum(len(u.tokens) for u in updates)
                stats.running = sum(1 for job in jobs.values() if job.seq >= 0)
                stats.kv_tokens = sum(job.pos for job in jobs.values() if job.seq >= 0)
                self._post(updates)

                step_s = time.perf_counter() - started
                stats.decode_s += decode_s
                stats.python_s += step_s - decode_s
                scheduler.measured(step_s * 1000, decode_only=not plan.prefill)
        except BaseException as exc:
            failure = exc
            raise
        finally:
            # Stopping (or a fault): whatever is in flight fails, nothing hangs.
            with self._cond:
                self._closed = True
                waiting, self._inbox = self._inbox, []
            error = (
                EngineClosedError("the engine closed")
                if failure is None
                else EngineFailedError(f"the decode loop failed: {failure!r}")
            )
            closed = [
                _Update(job, [], error=error, released=True)
                for job in list(jobs.values()) + waiting
            ]
            for job in list(jobs.values()):
                release(job)
            self._decoding = 0
            self._post(closed)

    def _sampler(self, job: _Job) -> SlotSampler:
        request = job.request
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
            grammar=request.grammar,
            penalties=penalties,
            logprobs=request.logprobs,
        )

    def _decode(
        self, batch: Batch, parts: list[_Part]
    ) -> tuple[float, list[tuple[_Job, int]], list[tuple[_Job, Exception]]]:
        """Decode ``parts`` in one batch and sample each part that ends with an output.

        When llama_decode fails for a batch of several sequences, each sequence's part of
        this step is rolled back and retried alone, so only the sequences that fail alone are
        failed. A sequence whose memory cannot be rolled back (recurrent state) is failed.
        """
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
            spent, ok, bad = self._decode(batch, [part])
            decode_s += spent
            sampled += ok
            failed += bad
        return decode_s, sampled, failed

    def _advance(
        self, job: _Job, token: int, now: float, release: Callable[[_Job], None]
    ) -> _Update:
        if not job.first_token_at:
            job.first_token_at = now
        stop: StopReason | None = None
        tokens: list[int] = []
        logprobs = None
        if token < 0 or (token in self._model.eog and not job.request.ignore_eos):
            # An end-of-generation token, or a grammar that allows nothing more.
            stop = StopReason.END_OF_GENERATION
        else:
            tokens.append(token)
            if job.request.logprobs is not None and job.sampler is not None:
                raw = job.sampler.last_logprob
                logprobs = [raw] if raw is not None else None
            job.generated += 1
            job.last_token = token
            if job.generated >= job.max_tokens:
                stop = (
                    StopReason.MAX_TOKENS
                    if job.request.max_tokens is not None
                    and job.generated >= job.request.max_tokens
                    else StopReason.CONTEXT_END
                )
            elif job.pos >= self.config.ctx_size:
                stop = StopReason.CONTEXT_END
        if stop is not None:
            release(job)
        return _Update(job, tokens, stop=stop, released=stop is not None, logprobs=logprobs)

    def _post(self, updates: list[_Update]) -> None:
        if updates:
            with contextlib.suppress(trio.RunFinishedError):
                self._trio_token.run_sync_soon(self._deliver, updates)


@attrs.define(eq=False)
class _Part:
    """One job's tokens in this step: a decode token (``start is None``) or a prompt chunk."""

    job: _Job
    start: int | None
    count: int
    index: int
    outputs: bool = True


def _decode_error(rc: int) -> str:
    reasons = {
        1: "no room left in the context memory for this sequence",
        2: "the decode was aborted",
        -1: "llama.cpp rejected the batch as invalid",
    }
    return f"llama_decode failed ({rc}): {reasons.get(rc, 'fatal error in the compute graph')}"
