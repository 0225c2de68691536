"""OpenAI's legacy text completions (``POST /v1/completions``), translated. Pure.

A raw prompt (a string or token ids), no chat template. ``echo``, ``suffix``, ``best_of > 1``
and ``n > 1`` are refused with a 400 that says so.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from .._openai_errors import OpenAIError, dumps, invalid_request
from ..engine import (
    MAX_TOP_LOGPROBS,
    Done,
    GenerateRequest,
    InvalidRequestError,
    Sampling,
    Token,
    TokenLogprob,
)
from ._features import parse_response_format
from ._openai import (
    _INT32_MAX,
    RequestLimits,
    _invalid_type,
    _opt_bool,
    _opt_int,
    _opt_str,
    _parse_logit_bias,
    _parse_stop,
    _reject_constant,
    _timings,
    _usage,
    from_engine_error,
    parse_sampling,
    parse_stream,
)

__all__ = [
    "CompletionRequest",
    "CompletionStream",
    "completion_text_body",
    "parse_completion_request",
]

#: OpenAI's default ``max_tokens`` for completions.
DEFAULT_MAX_TOKENS = 16
_DEFAULT_LIMITS = RequestLimits()


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

        Error handling: :class:`OpenAIError` (400) for an empty prompt."""
        tokens = tokenize(self.prompt) if isinstance(self.prompt, str) else list(self.prompt)
        if not tokens:
            raise invalid_request(
                "Invalid 'prompt': it must not be empty.", param="prompt", code="invalid_value"
            )
        try:
            return GenerateRequest(tokens=tokens, logprobs=self.logprobs, **self.options)
        except InvalidRequestError as exc:
            raise from_engine_error(exc) from None


def _refuse(param: str, message: str) -> OpenAIError:
    return invalid_request(message, param=param, code="unsupported_parameter")


def _parse_prompt(value: object) -> str | tuple[int, ...]:
    if value is None:
        raise invalid_request(
            "Missing required parameter: 'prompt'.",
            param="prompt",
            code="missing_required_parameter",
        )
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value:
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return tuple(value)
        if len(value) == 1 and isinstance(value[0], str | list):
            return _parse_prompt(value[0])
        if len(value) > 1 and all(isinstance(v, str | list) for v in value):
            raise _refuse(
                "prompt", "Invalid 'prompt': this server completes one prompt per request."
            )
    raise _invalid_type(
        "prompt", "a string, an array of token ids, or one of those in an array", value
    )


def parse_completion_request(
    body: bytes, limits: RequestLimits = _DEFAULT_LIMITS
) -> CompletionRequest:
    """Parse and validate a completions request body.

    Accepted: ``model``, ``prompt``, ``max_tokens`` (16 when absent, as OpenAI's),
    ``temperature``, ``top_p``, ``top_k``, ``min_p``, ``seed``, ``stop``, ``stream``,
    ``stream_options.include_usage``, ``logprobs`` (0 to 20 alternatives), penalties,
    ``logit_bias``, ``ignore_eos``, ``cache_prompt``, ``response_format`` (llama.cpp's
    extensions); ``n`` and
    ``best_of`` of 1, ``echo`` false. Error handling: :class:`OpenAIError` 400, naming the
    field (``max_tokens`` and ``stop`` over ``limits`` too).
    """
    try:
        data = json.loads(body.decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise invalid_request(
            f"We could not parse the JSON body of your request: {str(exc)[:200]}."
        ) from None
    if not isinstance(data, dict):
        raise _invalid_type("body", "a JSON object", data)

    for key, message in (
        ("echo", "echoing the prompt back is not supported"),
        ("suffix", "a suffix (fill-in-the-middle) is not supported"),
    ):
        value = data.get(key)
        if value is not None and value is not False:
            raise _refuse(key, f"Unsupported parameter: '{key}': {message}.")
    for key in ("n", "best_of"):
        count = _opt_int(data, key, 1, None)
        if count is not None and count != 1:
            raise _refuse(
                key,
                f"Unsupported parameter: '{key}': this server generates one completion per "
                f"request, so {key} must be 1, but got {count}.",
            )

    model = _opt_str(data, "model")
    prompt = _parse_prompt(data.get("prompt"))
    if isinstance(prompt, str) and not prompt:
        raise invalid_request(
            "Invalid 'prompt': it must not be empty.", param="prompt", code="invalid_value"
        )
    max_tokens = _opt_int(data, "max_tokens", 1, _INT32_MAX)
    limits.check_max_tokens(max_tokens, "max_tokens")
    if max_tokens is None:
        max_tokens = min(DEFAULT_MAX_TOKENS, limits.max_tokens or DEFAULT_MAX_TOKENS)

    sampling = parse_sampling(data)
    logprobs = _opt_int(data, "logprobs", 0, MAX_TOP_LOGPROBS)

    stream, include_usage = parse_stream(data)
    try:
        options = {
            "max_tokens": max_tokens,
            "sampling": Sampling(**sampling),
            "stop": _parse_stop(data.get("stop"), limits),
            "ignore_eos": _opt_bool(data, "ignore_eos", "ignore_eos") or False,
            "cache_prompt": _opt_bool(data, "cache_prompt", "cache_prompt") is not False,
            "logit_bias": _parse_logit_bias(data.get("logit_bias")),
            "grammar": parse_response_format(data.get("response_format")),
        }
    except InvalidRequestError as exc:
        raise from_engine_error(exc) from None
    return CompletionRequest(model, prompt, options, stream, include_usage, logprobs)


def new_text_completion_id() -> str:
    return "cmpl-" + secrets.token_hex(12)


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


def completion_text_body(
    text: str,
    logprobs: Sequence[TokenLogprob] | None,
    done: Done,
    *,
    model: str,
    id: str,
    created: int,
) -> bytes:
    """The ``text_completion`` body of a request that did not stream."""
    return dumps(
        {
            "id": id,
            "object": "text_completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "text": text,
                    "index": 0,
                    "logprobs": None if logprobs is None else _logprobs_json(logprobs, 0),
                    "finish_reason": done.stop.finish_reason,
                }
            ],
            "usage": _usage(done),
            "timings": _timings(done),
        }
    )


@attrs.define
class CompletionStream:
    """The server-sent events of a streamed text completion: :meth:`token` per piece, then
    :meth:`finish` (the last choice chunk, the usage chunk when asked for, ``[DONE]``)."""

    id: str
    created: int
    model: str
    include_usage: bool = False
    logprobs: bool = False
    _offset: int = 0

    def _chunk(self, choices: list[dict[str, Any]], **extra: Any) -> bytes:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if self.include_usage:
            body["usage"] = None
        body.update(extra)
        return b"data: " + dumps(body) + b"\n\n"

    def token(self, token: Token) -> bytes:
        logprobs = _logprobs_json(token.logprobs, self._offset) if self.logprobs else None
        self._offset += len(token.text)
        return self._chunk(
            [{"text": token.text, "index": 0, "logprobs": logprobs, "finish_reason": None}]
        )

    def finish(self, done: Done) -> bytes:
        out = self._chunk(
            [
                {
                    "text": "",
                    "index": 0,
                    "logprobs": None,
                    "finish_reason": done.stop.finish_reason,
                }
            ],
            timings=_timings(done),
        )
        if self.include_usage:
            out += self._chunk([], usage=_usage(done))
        return out + b"data: [DONE]\n\n"
