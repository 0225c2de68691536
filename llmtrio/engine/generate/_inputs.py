"""The engine's input processor (vLLM v1's name): a :class:`GenerateRequest` checked and
turned into what the decode core takes, before anything is queued.

- :meth:`InputProcessor.check_size` refuses, on the event loop and without tokenizing, a
  prompt that cannot fit a slot whatever its tokens;
- :meth:`InputProcessor.prepare` (in a worker thread: rendering, tokenizing and compiling a
  grammar take a while) renders the chat template, tokenizes, finds where a recurrent state
  is worth a snapshot (the hints), encodes the media (images, audio: one encode per chunk, a
  request cancelled meanwhile stopping between two), and checks token ids, ``logit_bias``
  and the grammar, so that a bad request fails with its own error and never on the decode
  thread.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections.abc import Callable, Sequence

import attrs
import numpy as np

from .._config import EngineConfig
from .._errors import GrammarBugError, GrammarError, InvalidRequestError, PromptTooLongError
from .._media import MEDIA_MARKER
from .._stats import EngineStats
from .._types import GenerateRequest, Media
from ..grammar import Grammar
from ..llama import LlamaModel, MediaChunk
from ._chat import ChatTemplate
from ._drafting import cut_anywhere
from ._prompt_cache import common_prefix
from ._request_grammar import request_grammar

__all__ = ["InputProcessor", "Prepared", "RequestAbandoned", "media_placeholders"]


logger = logging.getLogger("llmtrio.engine")


def _log_grammar_bug(request: GenerateRequest, grammar: str, error: Exception) -> None:
    """A grammar the engine wrote that llama.cpp refused, logged with what it came from."""
    if request.json_schema is not None:
        source: object = {"json_schema": request.json_schema}
    else:
        source = {"tools": [attrs.asdict(tool) for tool in request.tools]}
    logger.error(
        "llama.cpp cannot parse the grammar written for %s (%s):\n%s",
        json.dumps(source, ensure_ascii=False),
        error,
        grammar,
    )


class RequestAbandoned(Exception):
    """The request was cancelled while it was prepared (raised in the preparing thread,
    whose result nobody waits for any more)."""


def media_placeholders(digest: str, count: int, index: int = 0) -> list[int]:
    """The ids that stand for a media chunk's ``count`` embeddings in a prompt's token list:
    negative (never a vocabulary id) and drawn from its file's content hash and its place
    among that file's chunks (``index``: an audio file's 30-second windows), so the prompt
    cache finds a repeated image or audio file as a common prefix (and so never encodes it
    again) and tells different media, and different windows of one file, apart at their
    first position."""
    if not digest:
        raw = bytes(32)
    elif index == 0:
        raw = bytes.fromhex(digest)
    else:
        raw = hashlib.sha256(f"{digest}:{index}".encode()).digest()
    words = [int.from_bytes(raw[i : i + 4], "little") >> 1 for i in range(0, 32, 4)]
    return [-1 - words[i % len(words)] for i in range(count)]


@attrs.frozen
class Prepared:
    """A request's prompt as the decode core takes it: its ``tokens``, whether the rendered
    prompt ``opens_think`` (the reply starts inside a think block), and the prompt lengths
    where a recurrent state is worth a snapshot (``hints``), and its ``grammar``, compiled and
    parsed (both cached), so a slot on the decode thread only copies it."""

    tokens: list[int]
    opens_think: bool = False
    hints: tuple[int, ...] = ()
    grammar: Grammar | None = None
    #: The prompt's media chunks, by the offset of their first placeholder in ``tokens``.
    media: tuple[tuple[int, MediaChunk], ...] = ()

    @property
    def audio_tokens(self) -> int:
        """How many of ``tokens`` are audio embeddings."""
        return sum(chunk.n_tokens for _, chunk in self.media if chunk.audio)


class InputProcessor:
    """Checks and prepares requests for one model (see the module's doc)."""

    def __init__(
        self,
        config: EngineConfig,
        model: LlamaModel,
        template: ChatTemplate,
        stats: EngineStats | None = None,
    ) -> None:
        self.template = template
        self._stats = stats if stats is not None else EngineStats()
        self._config = config
        self._model = model
        self._max_piece_bytes = max(1, model.max_piece_bytes)
        # Test seam: llama.cpp itself rejects out-of-vocabulary ids when this is off.
        self.check_token_ids = True

    def check_size(self, request: GenerateRequest) -> None:
        """Refuse, without tokenizing, a prompt whose size alone cannot fit a slot: no token
        covers more than the model's longest piece, so that bounds its count.

        Error handling: :class:`PromptTooLongError` (``at_least``)."""
        if request.messages is not None:
            size = sum(len(m.content.encode("utf-8", "replace")) for m in request.messages)
            at_least = -(-size // self._max_piece_bytes)
        else:
            assert request.tokens is not None
            at_least = len(request.tokens)
        if at_least >= self._config.request_ctx:
            raise PromptTooLongError(at_least, self._config.request_ctx, at_least=True)

    def prepare(
        self,
        request: GenerateRequest,
        cancelled: threading.Event | None = None,
        known: Callable[[list[int]], int] | None = None,
    ) -> Prepared:
        """The request's prompt, checked, its media encoded, and its grammar (from
        ``grammar``, ``json_schema`` or its tools), compiled and parsed once. ``cancelled``
        set (the request was cancelled while this runs in a thread) stops it before the next
        media chunk's encode. ``known(tokens)`` says how many of the prompt's tokens the
        prompt cache holds (in memory or on disk): a media chunk among them is not encoded
        (the decode thread encodes it should the cache not serve it after all).

        Error handling: :class:`PromptTooLongError`, :class:`InvalidRequestError` (a token
        id or a ``logit_bias`` outside the vocabulary, a strict schema the grammar cannot
        enforce, media the projector cannot take), :class:`GrammarError` (the request's own
        grammar does not parse), :class:`GrammarBugError` (one the engine wrote does not:
        logged with its schema), :class:`RequestAbandoned` once ``cancelled`` is set."""
        prepared = self.prompt(request)
        if prepared.media:
            after = known(prepared.tokens) if known is not None else 0
            self._encode(prepared, cancelled, after=after)
        self._check_logit_bias(request)
        grammar = request_grammar(
            request, xml_calls=self.template.xml_tool_calls, opens_think=prepared.opens_think
        )
        if grammar is not None:
            try:
                self._model.grammars.check(grammar.text)
            except GrammarError as exc:
                if request.grammar is not None:
                    raise  # the request's own: its fault
                _log_grammar_bug(request, grammar.text, exc)
                raise GrammarBugError(
                    "the grammar written for this request's schema does not parse; this is "
                    "the server's bug, and it is logged with the schema"
                ) from None
        return attrs.evolve(prepared, grammar=grammar)

    def tokenize_prompt(self, text: str) -> list[int]:
        """``text`` tokenized as a prompt: with the model's BOS, never two of them (a
        template that writes its own BOS)."""
        model = self._model
        prompt = model.tokenize(text, add_special=model.add_bos)
        if model.add_bos and len(prompt) > 1 and prompt[0] == prompt[1] == model.bos:
            prompt = prompt[1:]
        return prompt

    def prompt(self, request: GenerateRequest) -> Prepared:
        """The request's prompt tokens (templated, checked against the slot's context),
        without its grammar.

        Error handling: :class:`PromptTooLongError`, :class:`InvalidRequestError` (a token id
        outside the vocabulary)."""
        if request.tokens is not None:
            self._check_token_ids(request.tokens)
            prepared = Prepared(list(request.tokens))
        else:
            assert request.messages is not None
            media = [item for message in request.messages for item in message.media]
            if media:
                self._check_media(request)
            rendered = self.template.render(
                request.messages, think=request.think, tools=request.tools
            )
            hinted = self._config.prompt_cache and not cut_anywhere(self._model)
            last = request.messages[-1].content
            hints: tuple[int, ...] = ()
            if media:
                tokens, spans = self._tokenize_with_media(rendered.text, media)
                if hinted:
                    hints = self._media_hints(rendered.text, last, media, tokens)
                prepared = Prepared(tokens, rendered.opens_think, hints, media=spans)
            else:
                tokens = self.tokenize_prompt(rendered.text)
                if hinted:
                    hints = self._hints(rendered.text, last, tokens)
                prepared = Prepared(tokens, rendered.opens_think, hints)
        if len(prepared.tokens) >= self._config.request_ctx:
            raise PromptTooLongError(len(prepared.tokens), self._config.request_ctx)
        return prepared

    def _encode(
        self, prepared: Prepared, cancelled: threading.Event | None = None, after: int = 0
    ) -> None:
        """Encode the prompt's media chunks here, in the preparing thread, not on the decode
        thread: an encode takes seconds on a CPU, and every stream would wait for it there
        (``benchmarks/vision_bench.py``). One encode per chunk (an audio file's 30-second
        window), ``cancelled`` checked before each; a chunk encoded lately is found in the
        projector's cache instead.

        Error handling: :class:`InvalidRequestError` when the projector fails on a chunk,
        :class:`RequestAbandoned` once ``cancelled`` is set."""
        projector, stats = self._model.projector, self._stats
        for start, chunk in prepared.media:
            assert projector is not None
            if start + chunk.n_tokens <= after:  # in the prompt cache: not decoded again
                continue
            if cancelled is not None and cancelled.is_set():
                raise RequestAbandoned
            encodes, started = projector.encodes, time.perf_counter()
            chunk.embd = projector.encode(chunk, self._model.n_embd)
            if projector.encodes > encodes:  # counters: racy across threads, as all of them
                spent = time.perf_counter() - started
                if chunk.audio:
                    stats.audio_encodes += 1
                    stats.audio_encode_s += spent
                else:
                    stats.image_encodes += 1
                    stats.image_encode_s += spent
            if chunk.embd is None:
                kind = "an audio window" if chunk.audio else "an image"
                raise InvalidRequestError(
                    f"the projector could not encode {kind}", param="messages"
                )

    def _check_media(self, request: GenerateRequest) -> None:
        projector = self._model.projector
        assert request.messages is not None
        images = sum(len(message.images) for message in request.messages)
        audio = sum(len(message.audio) for message in request.messages)
        if images and (projector is None or not projector.vision):
            raise InvalidRequestError(
                "this model takes no images (it was started without a vision projector: --mmproj)",
                param="messages",
            )
        if audio and (projector is None or not projector.audio):
            raise InvalidRequestError(
                "this model takes no audio (it was started without an audio projector: --mmproj)",
                param="messages",
            )
        if images > self._config.max_images:
            raise InvalidRequestError(
                f"the request has {images} images, more than the {self._config.max_images} "
                "this server takes (--max-images)",
                param="messages",
            )

    def _tokenize_with_media(
        self, text: str, media: Sequence[Media]
    ) -> tuple[list[int], tuple[tuple[int, MediaChunk], ...]]:
        """The templated prompt split at its media markers (llama.cpp's ``mtmd_tokenize``,
        which adds the model's begin/end-of-image and -audio tokens): text tokens, and for
        each media chunk ``n_tokens`` placeholder ids (see :func:`media_placeholders`) and
        the chunk."""
        model = self._model
        assert model.projector is not None
        tokens: list[int] = []
        spans: list[tuple[int, MediaChunk]] = []
        for run in model.projector.tokenize(text, media, add_special=model.add_bos):
            if isinstance(run, list):
                if not tokens and model.add_bos and run[:2] == [model.bos, model.bos]:
                    run = run[1:]
                tokens += run
                continue
            if run.non_causal and run.n_tokens > model.n_batch:
                # decoded whole, with causal attention off: one decode must hold it
                raise InvalidRequestError(
                    f"an image takes {run.n_tokens} tokens, more than the {model.n_batch} "
                    "one decode of this engine holds (raise --prefill-chunk)",
                    param="messages",
                )
            spans.append((len(tokens), run))
            tokens += media_placeholders(run.digest, run.n_tokens, run.index)
        return tokens, tuple(spans)

    def _media_hints(
        self, text: str, last: str, media: Sequence[Media], prompt: list[int]
    ) -> tuple[int, ...]:
        """:meth:`_hints` for a prompt with media: each prefix tokenized with the media
        its markers stand for (never a point inside a chunk: the placeholders of a chunk
        agree whole or not at all)."""
        start = text.rfind(last) if last else -1
        if start <= 0:
            return ()
        tokens = np.asarray(prompt, dtype=np.int32)
        hints = set()
        for end in (start, start + len(last)):
            prefix = text[:end]
            before, _ = self._tokenize_with_media(prefix, media[: prefix.count(MEDIA_MARKER)])
            hints.add(common_prefix(np.asarray(before, dtype=np.int32), tokens))
        return tuple(sorted(h for h in hints if 0 < h < len(prompt)))

    def _hints(self, text: str, last: str, prompt: list[int]) -> tuple[int, ...]:
        """The prompt lengths where the last message's text starts (what precedes it, a
        system prompt above all, is shared by other requests) and ends (the next turn of
        the conversation repeats all of it): where a recurrent state is worth a snapshot."""
        start = text.rfind(last) if last else -1
        if start <= 0:
            return ()
        tokens = np.asarray(prompt, dtype=np.int32)
        hints = set()
        for end in (start, start + len(last)):
            prefix = np.asarray(self.tokenize_prompt(text[:end]), dtype=np.int32)
            # Where tokenizing the prefix alone agrees with the whole prompt: at most the
            # boundary, never past it.
            hints.add(common_prefix(prefix, tokens))
        return tuple(sorted(h for h in hints if 0 < h < len(prompt)))

    def _check_token_ids(self, tokens: Sequence[int]) -> None:
        n_vocab = self._model.n_vocab
        bad = [t for t in tokens if not 0 <= t < n_vocab] if self.check_token_ids else []
        if bad:
            raise InvalidRequestError(
                f"token id {bad[0]} is outside the vocabulary (0..{n_vocab - 1})",
                param="tokens",
            )

    def _check_logit_bias(self, request: GenerateRequest) -> None:
        n_vocab = self._model.n_vocab
        for token, _ in request.logit_bias:
            if not 0 <= token < n_vocab:
                raise InvalidRequestError(
                    f"logit_bias names token {token}, outside the vocabulary (0..{n_vocab - 1})",
                    param="logit_bias",
                )
