"""OpenAI's legacy text completions (``POST /v1/completions``): request and response. Pure.

A raw prompt (a string or token ids), no chat template. ``echo``, ``suffix``, ``best_of > 1``
and ``n > 1`` are refused with a 400 that says so.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import attrs

from ..api import (
    OPENAI_ERRORS,
    SSE_DONE,
    ApiError,
    Body,
    RequestLimits,
    dumps,
    invalid_request,
    invalid_type,
    invalid_value,
    missing,
    read,
)
from ..engine import Done, GenerateRequest, InvalidRequestError, Sampling, Token, TokenLogprob
from ._encoding import Envelope, ResponseMeta, from_engine_error, timings_json, usage_json
from ._features import parse_response_format
from ._requests import (
    json_body,
    parse_logit_bias,
    parse_max_tokens,
    parse_sampling,
    parse_stop,
    parse_stream,
    reject_refused,
)

__all__ = ["CompletionRequest", "TextBody", "TextStream", "parse_completion_request"]

_NO_LIMITS = RequestLimits()

#: OpenAI's default ``max_tokens`` for completions.
DEFAULT_MAX_TOKENS = 16


@attrs.frozen
class CompletionRequest:
    """A parsed ``POST /v1/completions``: ``prompt`` is text (tokenized with the model's
    BOS) or token ids; :meth:`generate` builds the engine request."""

    model: str | None
    prompt: str | tuple[int, ...]
    options: dict[str, Any]
    stream: bool = False
    include_usage: bool = False
    logprobs: int | None = None

    def generate(self, tokenize: Callable[[str], list[int]]) -> GenerateRequest:
        """The engine request; ``tokenize`` turns a text prompt into ids (BOS included).

        Error handling: :class:`ApiError` (400) for an empty prompt."""
        tokens = tokenize(self.prompt) if isinstance(self.prompt, str) else list(self.prompt)
        if not tokens:
            raise invalid_value("prompt", "it must not be empty.")
        try:
            return GenerateRequest(tokens=tokens, logprobs=self.logprobs, **self.options)
        except InvalidRequestError as exc:
            raise from_engine_error(exc) from None


def _parse_prompt(value: object) -> str | tuple[int, ...]:
    if value is None:
        raise missing("prompt")
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return tuple(value)
        if len(value) == 1 and isinstance(value[0], str | list):
            return _parse_prompt(value[0])
        if len(value) > 1 and all(isinstance(v, str | list) for v in value):
            raise invalid_request(
                "Invalid 'prompt': this server completes one prompt per request.",
                param="prompt",
                code="unsupported_parameter",
            )
    raise invalid_type(
        "prompt", "a string, an array of token ids, or one of those in an array", value
    )


def parse_completion_request(body: bytes, limits: RequestLimits = _NO_LIMITS) -> CompletionRequest:
    """Parse and validate a completions request body.

    Accepted: the completions fields of the field table (``llmtrio.api.FIELDS``):
    ``model``, ``prompt``, ``max_tokens`` (16 when absent, as OpenAI's), the sampling fields
    and penalties, ``seed``, ``stop``, ``stream``, ``stream_options.include_usage``,
    ``logprobs`` (0 to 20 alternatives), ``logit_bias``, ``ignore_eos``, ``cache_prompt``,
    ``response_format`` (llama.cpp's extensions); ``n`` and ``best_of`` of 1, ``echo``
    false. Error handling: :class:`ApiError` 400, naming the field (``max_tokens`` and
    ``stop`` over ``limits`` too).
    """
    data = json_body(body)
    reject_refused(data, Body.COMPLETIONS, limits)
    for name in ("n", "best_of"):
        read(data, Body.COMPLETIONS, name, limits)
    model = read(data, Body.COMPLETIONS, "model", limits)
    prompt = _parse_prompt(data.get("prompt"))
    if isinstance(prompt, str) and not prompt:
        raise invalid_value("prompt", "it must not be empty.")
    max_tokens = parse_max_tokens(data, Body.COMPLETIONS, limits)
    if max_tokens is None:
        max_tokens = min(DEFAULT_MAX_TOKENS, limits.max_tokens or DEFAULT_MAX_TOKENS)
    sampling = parse_sampling(data, Body.COMPLETIONS, limits)
    logprobs = read(data, Body.COMPLETIONS, "logprobs", limits)
    stream, include_usage = parse_stream(data, Body.COMPLETIONS, limits)
    try:
        options = {
            "max_tokens": max_tokens,
            "sampling": Sampling(**sampling),
            "stop": parse_stop(data.get("stop"), limits),
            "ignore_eos": read(data, Body.COMPLETIONS, "ignore_eos", limits) or False,
            "cache_prompt": read(data, Body.COMPLETIONS, "cache_prompt", limits) is not False,
            "logit_bias": parse_logit_bias(data.get("logit_bias")),
            **parse_response_format(data, Body.COMPLETIONS, limits),
        }
    except InvalidRequestError as exc:
        raise from_engine_error(exc) from None
    return CompletionRequest(model, prompt, options, stream, include_usage, logprobs)


def _logprobs_json(entries: Sequence[TokenLogprob], offset: int) -> dict[str, Any]:
    """The legacy completions ``logprobs`` object; ``offset`` is the text length before the
    first token."""
    offsets = []
    for entry in entries:
        offsets.append(offset)
        offset += len(entry.token)
    return {
        "tokens": [e.token for e in entries],
        "token_logprobs": [e.logprob for e in entries],
        "top_logprobs": [{text: lp for text, _, lp in e.top} for e in entries],
        "text_offset": offsets,
    }


def _choice(text: str, logprobs: Any, finish_reason: str | None) -> dict[str, Any]:
    return {"text": text, "index": 0, "logprobs": logprobs, "finish_reason": finish_reason}


class TextStream:
    """The server-sent events of a streamed text completion: a chunk per piece, then the
    last choice chunk (with llama.cpp's ``timings``), the usage chunk when asked for, and
    ``[DONE]``."""

    streaming = True

    def __init__(self, request: CompletionRequest, meta: ResponseMeta) -> None:
        self._envelope = Envelope(meta, "text_completion", request.include_usage)
        self._include_usage = request.include_usage
        self._logprobs = request.logprobs is not None
        self._offset = 0

    def start(self) -> bytes:
        return b""

    def event(self, token: Token) -> bytes:
        logprobs = _logprobs_json(token.logprobs, self._offset) if self._logprobs else None
        self._offset += len(token.text)
        return self._envelope.chunk(dumps(_choice(token.text, logprobs, None)))

    def finish(self, done: Done) -> bytes:
        last = dumps(_choice("", None, done.stop.finish_reason))
        out = self._envelope.chunk(last, timings=timings_json(done))
        if self._include_usage:
            out += self._envelope.usage(done)
        return out + SSE_DONE

    def finish_reason(self, done: Done) -> str:
        return done.stop.finish_reason

    def failure(self, error: ApiError) -> bytes:
        return OPENAI_ERRORS.event(error)


class TextBody:
    """The ``text_completion`` body of a request that did not stream."""

    streaming = False

    def __init__(self, request: CompletionRequest, meta: ResponseMeta) -> None:
        self._meta = meta
        self._logprobs = request.logprobs is not None
        self._text: list[str] = []
        self._entries: list[TokenLogprob] = []

    def start(self) -> bytes:
        return b""

    def event(self, token: Token) -> bytes:
        self._text.append(token.text)
        self._entries += token.logprobs
        return b""

    def finish(self, done: Done) -> bytes:
        logprobs = _logprobs_json(self._entries, 0) if self._logprobs else None
        return dumps(
            {
                "id": self._meta.id,
                "object": "text_completion",
                "created": self._meta.created,
                "model": self._meta.model,
                "choices": [_choice("".join(self._text), logprobs, done.stop.finish_reason)],
                "usage": usage_json(done),
                "timings": timings_json(done),
            }
        )

    def finish_reason(self, done: Done) -> str:
        return done.stop.finish_reason

    def failure(self, error: ApiError) -> bytes:
        return OPENAI_ERRORS.event(error)
