"""The engine's frontend: :meth:`Engine.open`, :meth:`Engine.submit` and :class:`Generation`.

Three parts, with plain values and callables between them (vLLM v1's lines):

- this frontend (Trio): prepares each request with the input processor (``_inputs.py``:
  template, tokens, checks), on the event loop for a short prompt and in a worker thread
  otherwise, hands
  :class:`CoreRequest` values to the decode thread, and delivers its :class:`StepOutput`
  values to each generation (one ``run_sync_soon`` per step for all of them);
- the decode-step core (``_core.py``, no Trio): schedule → prompt reuse → one batch →
  ``llama_decode`` → sample; the decode thread here only feeds it and posts what it returns;
- per-generation output processing (``_output.py``): pieces, UTF-8, stop strings, think
  blocks and log-probabilities, on the Trio side, off the decode thread's critical path.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import attrs
import numpy as np
import numpy.typing as npt
import trio

from .._config import MAX_RECURRENT_DRAFT, EngineConfig
from .._errors import EngineClosedError, EngineFailedError, ModelLoadError
from .._lifecycle import DecodeLoop
from .._media import MEDIA_MARKER
from .._types import Capacity, GenerateRequest, TokenLogprob
from ..llama import LlamaModel, RawLogprob
from ..models import ResolvedModel
from ..tools import TOOL_CALL_CLOSE, TOOL_CALL_OPEN
from ._chat import ChatTemplate
from ._core import EngineCore
from ._disk_tier import DiskTier
from ._generation import Generation
from ._inputs import InputProcessor
from ._output import OutputProcessor
from ._step import CoreRequest, Offered, StepOutput
from ._text import THINK_CLOSE, THINK_OPEN

__all__ = ["Engine", "context_params"]

logger = logging.getLogger("llmtrio.engine")


#: A request whose messages hold at most this many characters in all (or whose prompt is at
#: most this many token ids), with no grammar, JSON schema or tools, is templated and
#: tokenized on the event loop: that costs less than the hand-off to a worker thread and back
#: (``benchmarks/prepare_inline.py``). Longer prompts, and grammars to compile, go to a
#: worker thread.
INLINE_PREPARE_CHARS = 1024


def _prepares_inline(request: GenerateRequest) -> bool:
    if request.grammar is not None or request.json_schema is not None or request.tools:
        return False
    if request.tokens is not None:
        return len(request.tokens) <= INLINE_PREPARE_CHARS
    messages = request.messages or ()
    if any(message.media for message in messages):
        return False  # llama.cpp resizes images, reads audio as it tokenizes: never here
    return sum(len(message.content) for message in messages) <= INLINE_PREPARE_CHARS


def _load_projector(model: LlamaModel, projector: Path, config: EngineConfig) -> None:
    """Load the ``projector`` (images, audio) beside ``model``.

    Error handling: :class:`ModelLoadError` when llama.cpp cannot load it (or it does not
    fit the model)."""
    model.load_projector(projector, threads=config.threads, marker=MEDIA_MARKER)


class Engine(DecodeLoop):
    """Continuous batching over ``config.max_inflight`` slots of one llama.cpp model.

    Open it with :meth:`open`; submit with :meth:`submit`.
    """

    #: What it serves: chat and text completions (an embedding model: ``EmbeddingEngine``).
    kind = "chat"

    def __init__(self, config: EngineConfig, model: LlamaModel, resolved: ResolvedModel) -> None:
        super().__init__(config, model, resolved)
        self._pieces: dict[int, bytes] = {}
        self._inputs = InputProcessor(
            config,
            model,
            ChatTemplate(
                config.chat_template or model.chat_template,
                architecture=model.architecture,
                bos_token=self._special_text(model.bos),
                eos_token=self._special_text(model.eos),
                render_builtin=model.apply_builtin_template,
            ),
            self.stats,
        )
        #: The tags the think splitter and the tool-call parser read, where one token is a
        #: whole tag: their text is kept even when the GGUF marks them control tokens (whose
        #: text is otherwise dropped), as llama.cpp's server keeps its "preserved tokens".
        self._marker_ids = self._single_tokens(
            (THINK_OPEN, THINK_CLOSE, TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
        )
        self._inbox: list[CoreRequest] = []
        #: The generations whose slot is not released yet, by key (Trio side only).
        self._generations: dict[int, Generation] = {}
        #: Requests accepted and not yet released (waiting ones included).
        self._inflight = 0
        #: The prompt cache's files (``cache_dir``), once ``_aside`` has opened them.
        self._disk: DiskTier | None = None
        #: The decode-step core while the decode thread runs (its ``held`` is read here).
        self._core: EngineCore | None = None

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
        n_batch, n_rs_seq = context_params(config)

        def load(resolved: ResolvedModel) -> LlamaModel:
            model = LlamaModel(
                resolved.path,
                slots=config.max_inflight,
                ctx_size=config.ctx_size,
                threads=config.threads,
                n_batch=n_batch,
                kv_unified=config.kv_unified,
                n_rs_seq=n_rs_seq,
                **config.load_settings,
            )
            projector = (config.mmproj or resolved.mmproj) if config.vision else None
            if projector is None:
                return model
            try:
                _load_projector(model, projector, config)
            except ModelLoadError as exc:
                if config.mmproj is not None:
                    model.close()
                    raise
                # The repo's own projector, picked unasked: the model still serves text.
                logger.warning("serving %s without images or audio: %s", resolved.name, exc)
            except BaseException:
                model.close()
                raise
            return model

        async with cls._open(config, load) as engine:
            yield engine

    def _shape(self) -> str:
        model, config = self._model, self.config
        memory = "hybrid" if model.is_hybrid else "recurrent" if model.is_recurrent else "attention"
        pool = " in one pool" if config.kv_unified else ""
        return (
            f"{memory} memory, chat template: {self._inputs.template.source}, "
            f"{config.max_inflight} slots x {config.ctx_size} tokens{pool}"
        )

    @property
    def context_length(self) -> int:
        """The most tokens one request may use, prompt and output (``EngineConfig.request_ctx``):
        what ``/v1/models`` reports."""
        return self.config.request_ctx

    @property
    def takes_images(self) -> bool:
        """Whether chat messages may carry images (a projector with a vision encoder is
        loaded)."""
        return self._model.projector is not None and self._model.projector.vision

    @property
    def takes_audio(self) -> bool:
        """Whether chat messages may carry audio (a projector with an audio encoder is
        loaded)."""
        return self._model.projector is not None and self._model.projector.audio

    def _requests_in_flight(self) -> int:
        return self._inflight

    async def _aside(self, *, task_status: trio.TaskStatus[None]) -> None:
        """The prompt cache's files (``cache_dir``): opened (the folder scanned) before the
        decode thread starts, then written, until the decode thread has stopped and what it
        handed over is written (see ``_disk_tier``).

        Error handling: :class:`ModelLoadError` when the folder cannot be made or read."""
        config = self.config
        if config.cache_dir is None or not config.prompt_cache:
            task_status.started()
            return
        try:
            disk = await trio.to_thread.run_sync(
                DiskTier.open, config, self._model, self.model_path, self.stats, self._post_soon
            )
        except OSError as exc:
            raise ModelLoadError(
                f"cannot keep the prompt cache in {config.cache_dir}: {exc.strerror or exc}"
            ) from exc
        self._disk = disk
        logger.info(
            "prompt cache on disk: %s, %d files of %d MiB (budget %d MiB)",
            disk.store.folder,
            disk.store.entries,
            disk.store.bytes_used >> 20,
            config.cache_disk_mib,
        )
        task_status.started()
        await disk.write_until_closed()

    def _after_loop(self) -> None:
        if self._disk is not None:
            self._disk.close()

    # -- public API ----------------------------------------------------------------------

    def capacity(self) -> Capacity:
        stats = self.stats
        return attrs.evolve(
            super().capacity(),
            cache_hits=stats.prompt_cache_hits,
            cached_tokens=stats.prompt_cache_reused_tokens,
            cache_bytes=stats.prompt_cache_bytes,
            kv_used=stats.kv_tokens,
            kv_total=self.config.pool_cells,
            spec_drafted=stats.spec_draft_tokens,
            spec_accepted=stats.spec_accepted_tokens,
        )

    def tokenize(self, text: str, *, add_special: bool = False) -> list[int]:
        return self._model.tokenize(text, add_special=add_special)

    async def count_prompt_tokens(self, request: GenerateRequest) -> int:
        """The number of tokens ``request``'s prompt has, templated and tokenized exactly as
        :meth:`submit` would (its ``usage.prompt_tokens``), without generating.

        Error handling: :class:`PromptTooLongError` when it cannot fit a slot (the count is in
        it), :class:`InvalidRequestError` for a request :meth:`submit` would refuse."""
        if self._closed:
            raise self._failure or EngineClosedError("the engine is closed")
        if _prepares_inline(request):
            return len(self._inputs.prompt(request).tokens)
        prepared = await trio.to_thread.run_sync(
            self._inputs.prompt, request, abandon_on_cancel=True
        )
        return len(prepared.tokens)

    @asynccontextmanager
    async def submit(self, request: GenerateRequest) -> AsyncIterator[Generation]:
        """Start a generation and yield it; it never waits for decoding or admission.

        Error handling: :class:`PromptTooLongError` or :class:`InvalidRequestError` when the
        request cannot run, :class:`EngineClosedError` when the engine is closed; all raised
        before anything is queued.
        """
        if self._closed:
            raise self._failure or EngineClosedError("the engine is closed")
        self._inputs.check_size(request)
        if _prepares_inline(request):
            prepared = self._inputs.prepare(request)
        else:
            # Rendering and tokenizing a long prompt, encoding media or compiling a grammar
            # takes a while: never on the event loop. A cancel abandons the thread, which
            # stops before its next media chunk.
            known = self._on_disk if request.cache_prompt else None
            cancelled = threading.Event()
            try:
                prepared = await trio.to_thread.run_sync(
                    self._inputs.prepare, request, cancelled, known, abandon_on_cancel=True
                )
            finally:
                cancelled.set()
        prompt = prepared.tokens
        prompt_array = np.asarray(prompt, dtype=np.int32)
        offered = await self._look_on_disk(prompt_array, request)
        key = self._next_key
        self._next_key += 1
        scope = trio.CancelScope()
        output = OutputProcessor(
            stops=request.stop,
            opens_think=prepared.opens_think,
            piece=self._piece,
            token_logprob=self._token_logprob,
        )
        generation = Generation(
            prompt_tokens=len(prompt),
            audio_tokens=prepared.audio_tokens,
            output=output,
            scope=scope,
            end=lambda: self._end(key),
        )
        budget = self.config.request_ctx - len(prompt) + 1
        core_request = CoreRequest(
            key,
            prompt_array,
            request,
            max_tokens=min(request.max_tokens or budget, budget),
            hints=prepared.hints,
            grammar=prepared.grammar,
            media=prepared.media,
            opens_think=prepared.opens_think,
            offered=offered,
        )
        with self._cond:
            if self._closed:  # checked under the lock the decode loop closes under
                raise self._failure or EngineClosedError("the engine is closed")
            self._inbox.append(core_request)
            self._cond.notify()
        self._generations[key] = generation
        self._inflight += 1
        self._capacity_changed()
        with scope:
            try:
                yield generation
            finally:
                if not generation.finished:
                    self._end(key)

    # -- Trio-side helpers -------------------------------------------------------------

    def _on_disk(self, prompt: list[int]) -> int:
        """How many of ``prompt``'s tokens a file on disk serves (no I/O; 0 without files)."""
        disk = self._disk
        if disk is None:
            return 0
        found = disk.store.best(np.asarray(prompt, dtype=np.int32), len(prompt) - 1, room=disk.room)
        return found.keep if found is not None else 0

    async def _look_on_disk(
        self, prompt: npt.NDArray[np.int32], request: GenerateRequest
    ) -> Offered | None:
        """A snapshot of ``prompt``'s prefix read from disk, when the files serve more of it
        than memory does (as the decode thread last published); ``None`` otherwise."""
        disk, core = self._disk, self._core
        if disk is None or not request.cache_prompt:
            return None
        limit = len(prompt) - 1  # at least one token is ingested, for its logits
        memory = disk.memory_serves(core.held if core is not None else (), prompt, limit)
        return await disk.lookup(prompt, limit, memory)

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
            piece = model.special_piece(token) if token in self._marker_ids else model.piece(token)
            self._pieces[token] = piece
        return piece

    def _end(self, key: int) -> None:
        """Ask the decode thread to end ``key`` at the next token boundary (idempotent)."""
        if key in self._generations:
            with self._cond:
                self._cancels.add(key)
                self._cond.notify()

    def _deliver(self, outputs: list[StepOutput]) -> None:
        for output in outputs:
            generation = self._generations.get(output.key)
            if generation is None:
                continue
            if output.released:
                del self._generations[output.key]
                self._inflight -= 1
                self._capacity_changed()
            generation.apply(output)

    # -- the decode thread -------------------------------------------------------------

    def _loop(self) -> None:
        """Feed the core what the Trio side sent (new requests, cancellations) and post
        what each step returns, until the engine closes."""
        core = self._core = EngineCore(self._model, self.config, self.stats, disk=self._disk)
        failure: BaseException | None = None
        try:
            while True:
                with self._cond:
                    if not core.busy:
                        self._decoding = 0
                    while not (self._closing or self._inbox or self._cancels or core.busy):
                        self._cond.wait()
                    if self._closing:
                        break
                    new, self._inbox = self._inbox, []
                    cancels, self._cancels = self._cancels, set()
                for request in new:
                    core.add(request)
                for key in cancels:
                    core.cancel(key)
                # Freed slots are known now, not after the next decode.
                self._post(core.release_cancelled())
                outputs = core.step()
                self._decoding = core.decoding
                self._post(outputs)
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
            if failure is None:
                core.flush()  # what memory holds, to disk (a model unloaded, a server drained)
            closed = core.close(error)
            closed += [StepOutput(r.key, [], error=error, released=True) for r in waiting]
            self._decoding = 0
            self._post(closed)

    def _post(self, outputs: list[StepOutput]) -> None:
        if outputs:
            self._post_soon(self._deliver, outputs)


def context_params(config: EngineConfig) -> tuple[int, int]:
    """The context's ``n_batch`` (also its ``n_ubatch``) and ``n_rs_seq`` for ``config``: a
    step holds the prefill chunk and every sequence's token and drafts, and a recurrent
    state keeps a snapshot for each draft token it may have to roll back (at most
    ``MAX_RECURRENT_DRAFT``; llama.cpp clamps it to 0 on attention-only models). With
    speculation off, room for one token a sequence and no snapshots
    (``benchmarks/spec_context.py`` measures what the difference costs a plain step)."""
    drafts = config.spec_draft_max if config.spec is not None else 0
    n_batch = max(config.prefill_chunk + config.max_inflight * (1 + drafts), 64)
    return n_batch, min(drafts, MAX_RECURRENT_DRAFT)
