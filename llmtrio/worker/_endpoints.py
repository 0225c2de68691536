"""The endpoints the worker serves, each one small value on the :class:`Endpoint` shape.

Those that take images fetch a request's ``http(s)`` image URLs in their ``run``, before the
work is submitted (``_images.fetch_remote_images``): inside the stream's cancel scope, so a
client that goes away cancels its fetches."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import attrs

from ..api import (
    CHAT_PATH,
    COMPLETIONS_PATH,
    COUNT_TOKENS_PATH,
    EMBEDDINGS_PATH,
    MESSAGES_PATH,
    RESPONSES_INPUT_TOKENS_PATH,
    RESPONSES_PATH,
    TRANSCRIPTIONS_PATH,
    TRANSLATIONS_PATH,
    Body,
    RequestLimits,
)
from ..engine import EmbeddingEngine, Engine, Generation, RequestError
from ._chat_request import ChatCompletionRequest, parse_chat_request
from ._chat_response import ChatBody, ChatStream
from ._completions import CompletionRequest, TextBody, TextStream, parse_completion_request
from ._embeddings import (
    Embedded,
    EmbeddingsBody,
    EmbeddingsRequest,
    parse_embeddings_request,
    too_long,
)
from ._encoding import Counted, ResponseMeta, from_engine_error
from ._images import fetch_remote_images
from ._messages_request import MessagesRequest, parse_messages_request
from ._messages_response import MessageBody, MessageStream, TokenCount
from ._rerank import (
    RERANK_ALIAS_ENDPOINT,
    RERANK_ENDPOINT,
    RERANK_V2_ENDPOINT,
    SCORE_ENDPOINT,
)
from ._responses_output import InputTokensBody, ResponsesBody, ResponsesStream
from ._responses_request import ResponsesRequest, naming_input, parse_responses_request
from ._shapes import Encoder, Endpoint, Finished, run_tokenizer
from ._tokenize import DETOKENIZE_ENDPOINT, TOKENIZE_ENDPOINT
from ._transcriptions import (
    TranscriptBody,
    TranscriptionRequest,
    TranscriptStream,
    parse_transcription_request,
)

__all__ = [
    "CHAT_ENDPOINT",
    "COMPLETIONS_ENDPOINT",
    "COUNT_MESSAGE_TOKENS_ENDPOINT",
    "EMBEDDINGS_ENDPOINT",
    "ENDPOINTS",
    "MESSAGES_ENDPOINT",
    "RESPONSES_ENDPOINT",
    "RESPONSES_INPUT_TOKENS_ENDPOINT",
    "TRANSCRIPTIONS_ENDPOINT",
    "TRANSLATIONS_ENDPOINT",
]


@attrs.frozen
class _Chat:
    """``POST /v1/chat/completions``."""

    route: str = CHAT_PATH
    model_kind: str = "chat"
    id_prefix: str = "chatcmpl"

    def parse(self, body: bytes, limits: RequestLimits) -> ChatCompletionRequest:
        return parse_chat_request(body, limits)

    @asynccontextmanager
    async def run(
        self, engine: Engine, request: ChatCompletionRequest
    ) -> AsyncIterator[Generation]:
        generate = await fetch_remote_images(request.generate, engine)
        async with engine.submit(generate) as generation:
            yield generation

    def encoder(self, request: ChatCompletionRequest, meta: ResponseMeta) -> Encoder[Any]:
        return ChatStream(request, meta) if request.stream else ChatBody(request, meta)


@attrs.frozen
class _Completions:
    """``POST /v1/completions``: a raw prompt, tokenized with the model's BOS."""

    route: str = COMPLETIONS_PATH
    model_kind: str = "chat"
    id_prefix: str = "cmpl"

    def parse(self, body: bytes, limits: RequestLimits) -> CompletionRequest:
        return parse_completion_request(body, limits)

    @asynccontextmanager
    async def run(self, engine: Engine, request: CompletionRequest) -> AsyncIterator[Generation]:
        def tokenize(text: str) -> list[int]:
            return engine.tokenize(text, add_special=True)

        generate = await run_tokenizer(len(request.prompt), request.generate, tokenize)
        async with engine.submit(generate) as generation:
            yield generation

    def encoder(self, request: CompletionRequest, meta: ResponseMeta) -> Encoder[Any]:
        return TextStream(request, meta) if request.stream else TextBody(request, meta)


@attrs.frozen
class _Embeddings:
    """``POST /v1/embeddings``: texts (tokenized with the model's special tokens) or token
    ids, one vector each, decoded in batches with other requests' inputs."""

    route: str = EMBEDDINGS_PATH
    model_kind: str = "embedding"
    id_prefix: str = "embd"

    def parse(self, body: bytes, limits: RequestLimits) -> EmbeddingsRequest:
        return parse_embeddings_request(body, limits)

    @asynccontextmanager
    async def run(
        self, engine: EmbeddingEngine, request: EmbeddingsRequest
    ) -> AsyncIterator[Finished]:
        tokens: list[list[int]]
        if request.inputs and isinstance(request.inputs[0], str):
            texts = [str(item) for item in request.inputs]
            tokens = await run_tokenizer(
                sum(map(len, texts)), lambda: [engine.tokenize(text) for text in texts]
            )
        else:
            tokens = [list(item) for item in request.inputs if not isinstance(item, str)]
        for index, ids in enumerate(tokens):
            if len(ids) > engine.ctx_size:
                raise too_long(index, len(ids), engine.ctx_size)
        result = await engine.embed_tokens(tokens)
        yield Finished(Embedded(vectors=result.vectors, prompt_tokens=result.prompt_tokens))

    def encoder(self, request: EmbeddingsRequest, meta: ResponseMeta) -> Encoder[Any]:
        return EmbeddingsBody(request, meta.model)


@attrs.frozen
class _Responses:
    """``POST /v1/responses``: OpenAI's Responses API, stateless; the same generation as
    chat's for the same conversation."""

    route: str = RESPONSES_PATH
    model_kind: str = "chat"
    id_prefix: str = "resp"

    def parse(self, body: bytes, limits: RequestLimits) -> ResponsesRequest:
        return parse_responses_request(body, limits)

    @asynccontextmanager
    async def run(self, engine: Engine, request: ResponsesRequest) -> AsyncIterator[Generation]:
        generate = await fetch_remote_images(request.generate, engine)
        with _naming_input():
            async with engine.submit(generate) as generation:
                yield generation

    def encoder(self, request: ResponsesRequest, meta: ResponseMeta) -> Encoder[Any]:
        return ResponsesStream(request, meta) if request.stream else ResponsesBody(request, meta)


@attrs.frozen
class _ResponsesInputTokens:
    """``POST /v1/responses/input_tokens``: a Responses body's input tokens, templated and
    tokenized exactly as its generation would be (its ``usage.input_tokens``)."""

    route: str = RESPONSES_INPUT_TOKENS_PATH
    model_kind: str = "chat"
    id_prefix: str = "resp"

    def parse(self, body: bytes, limits: RequestLimits) -> ResponsesRequest:
        return parse_responses_request(body, limits)

    @asynccontextmanager
    async def run(self, engine: Engine, request: ResponsesRequest) -> AsyncIterator[Finished]:
        generate = await fetch_remote_images(request.generate, engine)
        with _naming_input():
            count = await engine.count_prompt_tokens(generate)
        yield Finished(Counted(prompt_tokens=count))

    def encoder(self, request: ResponsesRequest, meta: ResponseMeta) -> Encoder[Any]:
        return InputTokensBody()


@contextmanager
def _naming_input() -> Iterator[None]:
    """A prompt too long for the context (or the engine's other refusals of the messages:
    too many images, an image to a model without a projector), told as the Responses API
    names it (``input``)."""
    try:
        yield
    except RequestError as exc:  # a PromptTooLongError is one, on "messages"
        if exc.param != "messages":
            raise
        raise naming_input(from_engine_error(exc)) from None


@attrs.frozen
class _Messages:
    """``POST /v1/messages``: Anthropic's Messages API, on the chat path of the engine."""

    route: str = MESSAGES_PATH
    model_kind: str = "chat"
    id_prefix: str = "msg"

    def parse(self, body: bytes, limits: RequestLimits) -> MessagesRequest:
        return parse_messages_request(body, limits)

    @asynccontextmanager
    async def run(self, engine: Engine, request: MessagesRequest) -> AsyncIterator[Generation]:
        generate = await fetch_remote_images(request.generate, engine)
        async with engine.submit(generate) as generation:
            yield generation

    def encoder(self, request: MessagesRequest, meta: ResponseMeta) -> Encoder[Any]:
        return MessageStream(request, meta) if request.stream else MessageBody(request, meta)


@attrs.frozen
class _CountTokens:
    """``POST /v1/messages/count_tokens``: a Messages API body's prompt, templated and
    tokenized as a generation's is, counted without generating."""

    route: str = COUNT_TOKENS_PATH
    model_kind: str = "chat"
    id_prefix: str = "count"

    def parse(self, body: bytes, limits: RequestLimits) -> MessagesRequest:
        return parse_messages_request(body, limits, endpoint=Body.COUNT_TOKENS)

    @asynccontextmanager
    async def run(self, engine: Engine, request: MessagesRequest) -> AsyncIterator[Finished]:
        generate = await fetch_remote_images(request.generate, engine)
        count = await engine.count_prompt_tokens(generate)
        yield Finished(Counted(prompt_tokens=count))

    def encoder(self, request: MessagesRequest, meta: ResponseMeta) -> Encoder[Any]:
        return TokenCount()


@attrs.frozen
class _Transcriptions:
    """``POST /v1/audio/transcriptions`` (``body`` ``TRANSCRIPTIONS``) or
    ``/v1/audio/translations`` (``TRANSLATIONS``): a form with an audio file, a generation on
    it, the transcript in the asked format."""

    route: str = TRANSCRIPTIONS_PATH
    body: Body = Body.TRANSCRIPTIONS
    model_kind: str = "chat"
    id_prefix: str = "transcript"

    def parse(self, body: bytes, limits: RequestLimits) -> TranscriptionRequest:
        return parse_transcription_request(body, limits, self.body)

    @asynccontextmanager
    async def run(self, engine: Engine, request: TranscriptionRequest) -> AsyncIterator[Generation]:
        async with engine.submit(request.generate) as generation:
            yield generation

    def encoder(self, request: TranscriptionRequest, meta: ResponseMeta) -> Encoder[Any]:
        if request.stream:
            return TranscriptStream(request, meta)
        return TranscriptBody(request, meta)


CHAT_ENDPOINT: Endpoint[ChatCompletionRequest] = _Chat()
COMPLETIONS_ENDPOINT: Endpoint[CompletionRequest] = _Completions()
EMBEDDINGS_ENDPOINT: Endpoint[EmbeddingsRequest] = _Embeddings()
RESPONSES_ENDPOINT: Endpoint[ResponsesRequest] = _Responses()
RESPONSES_INPUT_TOKENS_ENDPOINT: Endpoint[ResponsesRequest] = _ResponsesInputTokens()
MESSAGES_ENDPOINT: Endpoint[MessagesRequest] = _Messages()
COUNT_MESSAGE_TOKENS_ENDPOINT: Endpoint[MessagesRequest] = _CountTokens()
TRANSCRIPTIONS_ENDPOINT: Endpoint[TranscriptionRequest] = _Transcriptions()
TRANSLATIONS_ENDPOINT: Endpoint[TranscriptionRequest] = _Transcriptions(
    TRANSLATIONS_PATH, Body.TRANSLATIONS
)
#: Every endpoint the worker serves, by route.
ENDPOINTS: dict[str, Endpoint[object]] = {
    e.route: e  # type: ignore[misc]
    for e in (
        CHAT_ENDPOINT,
        COMPLETIONS_ENDPOINT,
        EMBEDDINGS_ENDPOINT,
        RESPONSES_ENDPOINT,
        RESPONSES_INPUT_TOKENS_ENDPOINT,
        MESSAGES_ENDPOINT,
        COUNT_MESSAGE_TOKENS_ENDPOINT,
        TRANSCRIPTIONS_ENDPOINT,
        TRANSLATIONS_ENDPOINT,
    )
}
#: llama.cpp server's tokenizer routes, on any model.
ENDPOINTS |= {e.route: e for e in (TOKENIZE_ENDPOINT, DETOKENIZE_ENDPOINT)}  # type: ignore[misc]
#: Reranking, on a reranking model (``_rerank.py``).
_RERANKING = (RERANK_ENDPOINT, RERANK_ALIAS_ENDPOINT, RERANK_V2_ENDPOINT, SCORE_ENDPOINT)
ENDPOINTS |= {e.route: e for e in _RERANKING}  # type: ignore[misc]
