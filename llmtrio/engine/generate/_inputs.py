"""The engine's input processor (vLLM v1's name): a :class:`GenerateRequest` checked and
turned into what the decode core takes, before anything is queued.

- :meth:`InputProcessor.check_size` refuses, on the event loop and without tokenizing, a
  prompt that cannot fit a slot whatever its tokens;
- :meth:`InputProcessor.prepare` (in a worker thread: rendering, tokenizing and compiling a
  grammar take a while) renders the chat template, tokenizes, finds where a recurrent state
  is worth a snapshot (the hints), encodes the images, and checks token ids, ``logit_bias``
  and the grammar, so that a bad request fails with its own error and never on the decode
  thread.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

import attrs
import numpy as np

from .._config import EngineConfig
from .._errors import InvalidRequestError, PromptTooLongError
from .._media import MEDIA_MARKER, Image
from .._stats import EngineStats
from .._types import GenerateRequest
from ..grammar import Grammar
from ..llama import ImageChunk, LlamaModel
from ._chat import ChatTemplate
from ._drafting import cut_anywhere
from ._prompt_cache import common_prefix
from ._request_grammar import request_grammar

__all__ = ["InputProcessor", "Prepared", "image_placeholders"]


def image_placeholders(digest: str, count: int) -> list[int]:
    """The ids that stand for an image's ``count`` embeddings in a prompt's token list:
    negative (never a vocabulary id) and drawn from the image's content hash, so the prompt
    cache finds a repeated image as a common prefix (and so never encodes it again) and
    tells different images apart at their first position."""
    raw = bytes.fromhex(digest) if digest else bytes(32)
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
    #: The prompt's images, by the offset of their first placeholder in ``tokens``.
    images: tuple[tuple[int, ImageChunk], ...] = ()


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
        self, request: GenerateRequest, known: Callable[[list[int]], int] | None = None
    ) -> Prepared:
        """The request's prompt, checked, and its grammar (from ``grammar``, ``json_schema``
        or its tools), compiled and parsed once. ``known(tokens)`` says how many of the
        prompt's tokens the prompt cache holds (in memory or on disk): an image among them is
        not encoded (the decode thread encodes it should the cache not serve it after all).

        Error handling: :class:`PromptTooLongError`, :class:`InvalidRequestError` (a token
        id or a ``logit_bias`` outside the vocabulary, a schema the grammar cannot enforce),
        :class:`GrammarError` (a grammar llama.cpp cannot parse)."""
        prepared = self.prompt(request)
        if prepared.images:
            self._encode(prepared, after=known(prepared.tokens) if known is not None else 0)
        self._check_logit_bias(request)
        grammar = request_grammar(
            request, xml_calls=self.template.xml_tool_calls, opens_think=prepared.opens_think
        )
        if grammar is not None:
            self._model.grammars.check(grammar.text)
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
            images = [image for message in request.messages for image in message.images]
            if images:
                self._check_images(len(images))
            rendered = self.template.render(
                request.messages, think=request.think, tools=request.tools
            )
            hinted = self._config.prompt_cache and not cut_anywhere(self._model)
            last = request.messages[-1].content
            hints: tuple[int, ...] = ()
            if images:
                tokens, spans = self._tokenize_with_images(rendered.text, images)
                if hinted:
                    hints = self._image_hints(rendered.text, last, images, tokens)
                prepared = Prepared(tokens, rendered.opens_think, hints, images=spans)
            else:
                tokens = self.tokenize_prompt(rendered.text)
                if hinted:
                    hints = self._hints(rendered.text, last, tokens)
                prepared = Prepared(tokens, rendered.opens_think, hints)
        if len(prepared.tokens) >= self._config.request_ctx:
            raise PromptTooLongError(len(prepared.tokens), self._config.request_ctx)
        return prepared

    def _encode(self, prepared: Prepared, after: int = 0) -> None:
        """Encode the prompt's images here, in the preparing thread, not on the decode
        thread: an encode takes seconds on a CPU, and every stream would wait for it there
        (``benchmarks/vision_bench.py``). An image encoded lately is found in the projector's
        cache instead.

        Error handling: :class:`InvalidRequestError` when the projector fails on an image."""
        vision, stats = self._model.vision, self._stats
        for start, chunk in prepared.images:
            assert vision is not None
            if start + chunk.n_tokens <= after:  # in the prompt cache: not decoded again
                continue
            encodes, started = vision.encodes, time.perf_counter()
            chunk.embd = vision.encode(chunk, self._model.n_embd)
            if vision.encodes > encodes:  # counters: racy across threads, as all of them
                stats.image_encodes += 1
                stats.image_encode_s += time.perf_counter() - started
            if chunk.embd is None:
                raise InvalidRequestError(
                    "the vision projector could not encode an image", param="messages"
                )

    def _check_images(self, count: int) -> None:
        if self._model.vision is None:
            raise InvalidRequestError(
                "this model takes no images (it was started without a vision projector: --mmproj)",
                param="messages",
            )
        if count > self._config.max_images:
            raise InvalidRequestError(
                f"the request has {count} images, more than the {self._config.max_images} "
                "this server takes (--max-images)",
                param="messages",
            )

    def _tokenize_with_images(
        self, text: str, images: list[Image]
    ) -> tuple[list[int], tuple[tuple[int, ImageChunk], ...]]:
        """The templated prompt split at its media markers (llama.cpp's ``mtmd_tokenize``,
        which adds the model's begin/end-of-image tokens): text tokens, and for each image
        ``n_tokens`` placeholder ids (see :func:`image_placeholders`) and its chunk."""
        model = self._model
        assert model.vision is not None
        tokens: list[int] = []
        spans: list[tuple[int, ImageChunk]] = []
        for run in model.vision.tokenize(text, images, add_special=model.add_bos):
            if isinstance(run, list):
                if not tokens and model.add_bos and run[:2] == [model.bos, model.bos]:
                    run = run[1:]
                tokens += run
                continue
            if run.n_tokens > model.n_batch:
                raise InvalidRequestError(
                    f"an image takes {run.n_tokens} tokens, more than the {model.n_batch} "
                    "one decode of this engine holds (raise --prefill-chunk)",
                    param="messages",
                )
            spans.append((len(tokens), run))
            tokens += image_placeholders(run.digest, run.n_tokens)
        return tokens, tuple(spans)

    def _image_hints(
        self, text: str, last: str, images: list[Image], prompt: list[int]
    ) -> tuple[int, ...]:
        """:meth:`_hints` for a prompt with images: each prefix tokenized with the images
        its markers stand for (never a point inside an image: the placeholders of an image
        agree whole or not at all)."""
        start = text.rfind(last) if last else -1
        if start <= 0:
            return ()
        tokens = np.asarray(prompt, dtype=np.int32)
        hints = set()
        for end in (start, start + len(last)):
            prefix = text[:end]
            before, _ = self._tokenize_with_images(prefix, images[: prefix.count(MEDIA_MARKER)])
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
