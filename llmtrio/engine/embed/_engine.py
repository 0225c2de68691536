"""The embedding engine: :meth:`EmbeddingEngine.open` and :meth:`EmbeddingEngine.embed`.

An embedding model (BERT and kin, or a decoder fine-tuned for embeddings) gets its own
llama.cpp context with ``embeddings=True`` and the pooling its GGUF names (mean, CLS, last).
The shape follows the chat engine's:

- the Trio side checks and tokenizes a caller's inputs (in a worker thread), queues them for
  the decode thread and waits for their vectors; a caller that is cancelled asks for its
  queued inputs to be dropped;
- the decode thread (one ``trio.to_thread`` worker) moves queued inputs into the pure packer
  (``_pack.py``), decodes one batch at a time, many sequences per ``llama_decode``
  (up to ``EMBEDDING_DECODE_TOKENS`` tokens),
  inputs of any number of callers side by side, on the thread count that measured faster
  (``ThreadChooser``: the configured threads or 1), and posts each input's pooled vector back;
- the vectors are L2-normalized, as OpenAI's are.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Self

import attrs
import numpy as np
import numpy.typing as npt
import trio

from .._config import EngineConfig
from .._cores import ThreadChooser
from .._errors import DecodeError, EngineClosedError, InvalidRequestError, ModelLoadError
from .._lifecycle import DecodeLoop
from ..llama import Batch, LlamaModel
from ..models import POOLING_NAMES, ResolvedModel
from ._pack import EmbedPacker, Packed

__all__ = [
    "EMBEDDING_BATCH_TOKENS",
    "EMBEDDING_DECODE_TOKENS",
    "EMBEDDING_SEQUENCES",
    "EmbeddingEngine",
    "Embeddings",
]

logger = logging.getLogger("llmtrio.engine")

#: The most sequences (inputs) one decode carries, and the least number of requests an
#: embedding engine takes at once (its ``capacity().max_inflight``).
EMBEDDING_SEQUENCES = 64
#: The most tokens one decode can carry (at least one whole input of the model's window).
EMBEDDING_BATCH_TOKENS = 2048
#: The tokens one decode aims at: queued inputs are packed while they fit this many (an input
#: longer than this goes alone). llama.cpp attends over every token of a BERT batch, masking
#: the other sequences off, so the cost per token grows with the batch; see ``EmbedPacker``.
EMBEDDING_DECODE_TOKENS = 256


@attrs.frozen
class Embeddings:
    """What :meth:`EmbeddingEngine.embed` returns: one L2-normalized ``float32`` vector per
    input (``vectors[i]`` for input ``i``) and each input's length in tokens."""

    vectors: npt.NDArray[np.float32] = attrs.field(eq=False)
    token_counts: tuple[int, ...]

    @property
    def prompt_tokens(self) -> int:
        return sum(self.token_counts)


class _Call:
    """One caller's inputs while they are decoded (Trio side only)."""

    def __init__(self, n: int, dim: int) -> None:
        self.vectors = np.zeros((n, dim), dtype=np.float32)
        self.left = n
        self.error: Exception | None = None
        self.done = trio.Event()


class EmbeddingEngine(DecodeLoop):
    """Batched embeddings of one llama.cpp embedding model. Open it with :meth:`open`;
    embed with :meth:`embed`.

    ``ctx_size`` is the longest input in tokens: the configured ``ctx_size``, at most the
    window the model was trained on. ``pooling`` names the GGUF's pooling.
    """

    kind = "embedding"
    #: An embedding model takes no images or audio.
    takes_images = False
    takes_audio = False
    _loop_name = "embedding loop"
    #: The fewest tokens a decode carries: a decode of fewer inputs' tokens gets a filler
    #: sequence (0: none; see ``RerankEngine``).
    _min_decode_tokens = 0

    def __init__(self, config: EngineConfig, model: LlamaModel, resolved: ResolvedModel) -> None:
        pooling = self._pooling(model, resolved.name)
        if config.lora:
            raise ModelLoadError(
                f"{resolved.name} is an embedding model: LoRA adapters are served on "
                "generating models only"
            )
        super().__init__(config, model, resolved)
        self.pooling = pooling
        self.ctx_size = model.ctx_size
        #: The floats of one input's output: its vector's (or a cross-encoder's scores).
        self.dimensions = model.pooled_size
        self._inbox: list[tuple[int, list[npt.NDArray[np.int32]]]] = []
        self._calls: dict[int, _Call] = {}
        self._threads = ThreadChooser(config.threads)
        self._threads_now = config.threads
        #: How many decodes ran on each thread count (see ``ThreadChooser``).
        self.decodes_by_threads: dict[int, int] = {}

    @staticmethod
    def _pooling(model: LlamaModel, name: str) -> str:
        """The name of the model's pooling, which this engine serves.

        Error handling: :class:`ModelLoadError` for a pooling it does not serve."""
        pooling = POOLING_NAMES.get(model.pooling)
        if pooling is None:
            raise ModelLoadError(
                f"{name} is not an embedding model: its GGUF names no mean, CLS or last "
                f"pooling (llama.cpp pooling type {model.pooling})"
            )
        return pooling

    @classmethod
    @asynccontextmanager
    async def open(cls, config: EngineConfig) -> AsyncIterator[Self]:
        """Resolve and load the model (in a thread) with an embedding context, start the
        decode loop, and yield the engine once the model is resident.

        Error handling: :class:`ModelLoadError` when the model cannot be found or loaded, or
        names no sentence pooling (a generating model: open it with ``Engine``).
        Resource handling: on exit, callers still waiting get :class:`EngineClosedError`,
        the decode thread stops and the model is freed.
        """
        async with cls._open(
            config,
            lambda resolved: LlamaModel(
                resolved.path,
                slots=EMBEDDING_SEQUENCES,
                ctx_size=config.ctx_size,
                threads=config.threads,
                n_batch=max(EMBEDDING_BATCH_TOKENS, config.ctx_size),
                embeddings=True,
                **config.load_settings,
            ),
        ) as engine:
            yield engine

    def _shape(self) -> str:
        return (
            f"embeddings: {self.dimensions} dimensions, {self.pooling} pooling, "
            f"{self.ctx_size} tokens per input"
        )

    def _requests_in_flight(self) -> int:
        return len(self._calls)

    def _after_loop(self) -> None:
        for call in self._calls.values():
            call.error = call.error or self._failure or EngineClosedError("the engine closed")
            call.done.set()

    # -- public API ----------------------------------------------------------------------

    @property
    def context_length(self) -> int:
        """The longest input in tokens (``ctx_size``): what ``/v1/models`` reports."""
        return self.ctx_size

    @property
    def max_inflight(self) -> int:
        """How many requests it takes at once (the ring's claims): at least the sequences
        one decode carries, so concurrent requests fill a batch."""
        return max(self.config.max_inflight, EMBEDDING_SEQUENCES)

    def tokenize(self, text: str) -> list[int]:
        """``text``'s tokens as the model embeds it (with its special tokens: BERT's
        ``[CLS] ... [SEP]``)."""
        return self._model.tokenize(text, add_special=True, parse_special=False)

    async def embed(self, inputs: Sequence[str]) -> Embeddings:
        """The embeddings of ``inputs`` (texts), tokenized in a worker thread.

        Error handling and resource handling: as :meth:`embed_tokens`.
        """
        if self._closed:  # the model may be freed: not even its tokenizer is there
            raise self._failure or EngineClosedError("the engine is closed")
        texts = list(inputs)
        tokens = await trio.to_thread.run_sync(
            lambda: [self.tokenize(text) for text in texts]
        )  # not abandoned on cancel: the model must outlive the thread that reads it
        return await self.embed_tokens(tokens)

    async def embed_tokens(self, inputs: Sequence[Sequence[int]]) -> Embeddings:
        """The embeddings of ``inputs`` (token ids each), decoded in batches with any other
        caller's inputs.

        Error handling: :class:`InvalidRequestError` (``param`` ``input[i]``) for an empty
        input, a token id outside the vocabulary or an input longer than ``ctx_size``, raised
        before anything is queued; :class:`DecodeError` when llama.cpp fails on one of these
        inputs (the other callers' inputs are decoded again without it);
        :class:`EngineClosedError` when the engine is closed or closes meanwhile.
        Resource handling: cancelling the caller drops its inputs that are still queued at
        the next batch boundary; a batch being decoded finishes, and its vectors for this
        caller are discarded.
        """
        vectors, counts = await self._pool(inputs, "input")
        return Embeddings(vectors, counts)

    async def _pool(
        self, inputs: Sequence[Sequence[int]], param: str
    ) -> tuple[npt.NDArray[np.float32], tuple[int, ...]]:
        """Each input's pooled output (row ``i`` for input ``i``, as :meth:`_finish` leaves
        it) and its length in tokens; ``param`` names the inputs in errors. See
        :meth:`embed_tokens`."""
        if self._closed:
            raise self._failure or EngineClosedError("the engine is closed")
        arrays = [self._checked(param, i, tokens) for i, tokens in enumerate(inputs)]
        if not arrays:
            raise InvalidRequestError(f"no {param}s to decode", param=param)
        key = self._next_key
        self._next_key += 1
        call = _Call(len(arrays), self.dimensions)
        with self._cond:
            if self._closed:
                raise self._failure or EngineClosedError("the engine is closed")
            self._inbox.append((key, arrays))
            self._cond.notify()
        self._calls[key] = call
        self._capacity_changed()
        try:
            await call.done.wait()
        finally:
            if self._calls.pop(key, None) is not None:
                self._capacity_changed()
            if not call.done.is_set():
                with self._cond:
                    self._cancels.add(key)
                    self._cond.notify()
        if call.error is not None:
            raise call.error
        return call.vectors, tuple(len(a) for a in arrays)

    def _checked(self, what: str, index: int, tokens: Sequence[int]) -> npt.NDArray[np.int32]:
        param = f"{what}[{index}]"
        if len(tokens) == 0:
            raise InvalidRequestError(f"{what} {index} is empty", param=param)
        if len(tokens) > self.ctx_size:
            raise InvalidRequestError(
                f"{what} {index} is {len(tokens)} tokens, more than the {self.ctx_size} this "
                f"model takes at once (its context); shorten it",
                param=param,
            )
        array = np.asarray(tokens, dtype=np.int64)
        bad = (array < 0) | (array >= self.n_vocab)
        if bad.any():
            token = int(array[int(np.argmax(bad))])
            raise InvalidRequestError(
                f"{what} {index} holds token id {token}, outside the vocabulary "
                f"(0 to {self.n_vocab - 1})",
                param=param,
            )
        return array.astype(np.int32)

    # -- Trio side: results --------------------------------------------------------------

    def _deliver(self, results: list[tuple[Packed, npt.NDArray[np.float32] | Exception]]) -> None:
        for item, result in results:
            call = self._calls.get(item.key)
            if call is None or call.done.is_set():
                continue  # cancelled, or already failed
            if isinstance(result, Exception):
                call.error = result
                call.done.set()
                continue
            call.vectors[item.index] = result
            call.left -= 1
            if call.left == 0:
                call.done.set()

    # -- the decode thread ---------------------------------------------------------------

    def _loop(self) -> None:
        model = self._model
        packer = EmbedPacker(
            max_tokens=model.n_batch, max_seqs=model.slots, budget=EMBEDDING_DECODE_TOKENS
        )
        batch = Batch(model.n_batch)
        try:
            while True:
                with self._cond:
                    while not (self._closing or self._inbox or self._cancels or packer.pending):
                        self._decoding = 0
                        self._cond.wait()
                    if self._closing:
                        return
                    new, self._inbox = self._inbox, []
                    cancels, self._cancels = self._cancels, set()
                for key, arrays in new:
                    packer.add(key, arrays)
                for key in cancels:
                    packer.cancel(key)
                items = packer.next_batch()
                if items:
                    self._decoding = len(items)
                    self._post(self._decode(batch, items))
        finally:
            self._decoding = 0

    def _decode(
        self, batch: Batch, items: list[Packed]
    ) -> list[tuple[Packed, npt.NDArray[np.float32] | Exception]]:
        """Each item's normalized vector; when the decode fails, each item is decoded on its
        own, so only the input llama.cpp cannot take fails."""
        model = self._model
        model.clear_memory()
        batch.clear()
        for seq, item in enumerate(items):
            start = batch.n
            batch.add(item.tokens, 0, seq, output_last=True)
            batch.logits[start : batch.n] = 1  # pooling reads every token's output
        inputs = batch.n
        if inputs < self._min_decode_tokens and len(items) < model.slots:
            # a filler sequence, its output unread: see ``_min_decode_tokens``
            filler = np.full(self._min_decode_tokens - inputs, items[0].tokens[0], np.int32)
            batch.add(filler, 0, len(items), output_last=True, output_all=True)
        threads = self._threads.choose(batch.n)
        if threads != self._threads_now:
            model.set_threads(threads)
            self._threads_now = threads
        started = time.perf_counter()
        status = model.decode(batch)
        self._threads.observe(threads, batch.n, time.perf_counter() - started)
        self.decodes_by_threads[threads] = self.decodes_by_threads.get(threads, 0) + 1
        self.stats.steps += 1
        self.stats.busy_slots += len(items)
        if status != 0:
            if len(items) > 1:
                return [result for item in items for result in self._decode(batch, [item])]
            error = DecodeError(f"llama_decode failed (status {status}) on this input")
            return [(items[0], error)]
        self.stats.prompt_tokens_ingested += inputs
        results: list[tuple[Packed, npt.NDArray[np.float32] | Exception]] = []
        for seq, item in enumerate(items):
            vector = model.pooled(seq)
            if vector is None:
                results.append((item, DecodeError("llama.cpp returned no embedding")))
                continue
            results.append((item, self._finish(vector)))
        return results

    @staticmethod
    def _finish(pooled: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        """One input's pooled output as the caller gets it: L2-normalized, as OpenAI's
        vectors are."""
        norm = float(np.linalg.norm(pooled))
        return pooled / norm if norm > 0 else pooled

    def _post(self, results: list[tuple[Packed, npt.NDArray[np.float32] | Exception]]) -> None:
        self._post_soon(self._deliver, results)
