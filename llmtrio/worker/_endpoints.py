"""The endpoints the worker serves, each one small value on the :class:`Endpoint` shape."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import attrs
import trio

from .._fields import RequestLimits
from .._routes import CHAT_PATH, COMPLETIONS_PATH
from ..engine import Engine, Generation
from ._chat_request import ChatCompletionRequest, parse_chat_request
from ._chat_response import ChatBody, ChatStream
from ._completions import CompletionRequest, TextBody, TextStream, parse_completion_request
from ._endpoint import Encoder, Endpoint
from ._responses import ResponseMeta

__all__ = ["CHAT", "COMPLETIONS", "ENDPOINTS"]


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
        async with engine.submit(request.generate) as generation:
            yield generation

    def encoder(self, request: ChatCompletionRequest, meta: ResponseMeta) -> Encoder:
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
        # Tokenizing a long prompt takes a while: never on the event loop.
        generate = await trio.to_thread.run_sync(
            request.generate, lambda text: engine.tokenize(text, add_special=True)
        )
        async with engine.submit(generate) as generation:
            yield generation

    def encoder(self, request: CompletionRequest, meta: ResponseMeta) -> Encoder:
        return TextStream(request, meta) if request.stream else TextBody(request, meta)


CHAT: Endpoint[ChatCompletionRequest] = _Chat()
COMPLETIONS: Endpoint[CompletionRequest] = _Completions()
#: Every endpoint the worker serves, by route.
ENDPOINTS: dict[str, Endpoint[object]] = {e.route: e for e in (CHAT, COMPLETIONS)}  # type: ignore[misc]
