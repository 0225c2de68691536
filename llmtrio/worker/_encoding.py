"""What every response the worker writes is built from: ids, the chunk envelope of an event
stream, usage, timings and log-probabilities in OpenAI's shapes, the OpenAI error for an
engine error; and the ends of the work that is not a generation (:class:`Answer`), with the
base of their one-body encoders (:class:`WholeBody`). Pure: no I/O, no clock; randomness only
in the ids.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Sequence
from typing import Any, ClassVar

import attrs

from ..api import (
    OPENAI_ERRORS,
    ApiError,
    ErrorFamily,
    dumps,
    invalid_request,
    json_string,
    model_unavailable,
    server_error,
)
from ..engine import (
    Done,
    EngineClosedError,
    EngineError,
    EngineFailedError,
    GrammarBugError,
    PromptTooLongError,
    RequestError,
    TokenLogprob,
)

__all__ = [
    "Answer",
    "Counted",
    "Envelope",
    "ResponseMeta",
    "WholeBody",
    "chat_logprobs_json",
    "finish_reason",
    "from_engine_error",
    "new_id",
    "timings_json",
    "usage_json",
]


def new_id(prefix: str) -> str:
    """A fresh response id: ``chatcmpl-...`` for chat, ``cmpl-...`` for text completions."""
    return f"{prefix}-{secrets.token_hex(12)}"


@attrs.frozen
class ResponseMeta:
    """What every chunk and body of one response repeats: its id, creation time (Unix
    seconds) and the model's name; ``prompt_tokens``, the prompt's length when it is known
    as the work starts (a generation's; ``None`` otherwise)."""

    id: str
    created: int
    model: str
    prompt_tokens: int | None = None


@attrs.frozen
class Envelope:
    """The server-sent events of one streamed completion, all built on one envelope:
    ``data: {"id", "object", "created", "model", "choices": [...] [, "usage": null]}``.

    The bytes around the choices are encoded once; a chunk costs the choice's own encoding.
    With ``include_usage`` every chunk carries ``"usage": null`` and :meth:`usage` sends the
    counts in a last chunk with no choices, as OpenAI's streams do.
    """

    meta: ResponseMeta
    object: str
    include_usage: bool = False
    _open: bytes = attrs.field(init=False, repr=False)
    _close: bytes = attrs.field(init=False, repr=False)

    @_open.default
    def _make_open(self) -> bytes:
        return (
            b'data: {"id":'
            + json_string(self.meta.id)
            + b',"object":'
            + json_string(self.object)
            + b',"created":'
            + str(int(self.meta.created)).encode()
            + b',"model":'
            + json_string(self.meta.model)
            + b',"choices":['
        )

    @_close.default
    def _make_close(self) -> bytes:
        return b"]" + (b',"usage":null' if self.include_usage else b"")

    def prefix(self, choice_open: bytes) -> bytes:
        """The bytes of a chunk up to where ``choice_open`` leaves off: a caller that adds
        only a string and the rest of its choice keeps it, for :meth:`with_prefix`."""
        return self._open + choice_open

    def with_prefix(self, prefix: bytes, rest: bytes) -> bytes:
        """A chunk made of a :meth:`prefix` and the rest of its one choice."""
        return prefix + rest + self._close + b"}\n\n"

    def chunk(self, choice: bytes, **extra: Any) -> bytes:
        """A chunk with one choice (its JSON bytes) and ``extra`` top-level fields."""
        tail = b"".join(b',"' + key.encode() + b'":' + dumps(value) for key, value in extra.items())
        return self._open + choice + self._close + tail + b"}\n\n"

    def usage(self, done: Done) -> bytes:
        """The usage chunk: ``"choices": []`` and the token counts."""
        return self._open + b'],"usage":' + dumps(usage_json(done)) + b"}\n\n"


@attrs.frozen(kw_only=True)
class Answer:
    """The end of an endpoint's work that is not a generation: its own type among the events
    of the worker's pipeline, beside the engine's ``Done`` (never one): a tokenizer route's
    answer, the vectors of an embeddings request, a prompt's token count. Each kind's type
    says its ``kind``, which the worker's metrics count in a counter of its own; none is
    observed as a generation (no time to first token, no output tokens).

    ``prompt_tokens``: the prompt tokens it counted or embedded (the count the response's
    outcome states on the ring); ``inputs``: how many inputs it answered (an embeddings
    request's texts or token arrays; one otherwise)."""

    kind: ClassVar[str]
    prompt_tokens: int = 0

    @property
    def inputs(self) -> int:
        return 1


@attrs.frozen(kw_only=True)
class Counted(Answer):
    """A prompt counted, nothing generated (``/v1/messages/count_tokens``,
    ``/v1/responses/input_tokens``): templated and tokenized as its generation would be."""

    kind: ClassVar[str] = "count_tokens"


class WholeBody:
    """The part every encoder of an :class:`Answer` shares (the worker's ``Encoder`` shape,
    one JSON body, never streamed): nothing before or per event, the body whole from
    ``finish`` (each one's own), the ``finish_reason`` ``stop``, and a failure worded in
    ``errors``' family (an error response, since nothing went out before it)."""

    streaming = False
    errors = OPENAI_ERRORS

    def start(self) -> bytes:
        return b""

    def event(self, token: Any) -> bytes:
        return b""

    def finish_reason(self, answer: Answer) -> str:
        return "stop"

    def failure(self, error: ApiError) -> bytes:
        return self.errors.event(error)


def finish_reason(done: Done, calls: int) -> str:
    """OpenAI's ``finish_reason`` of a generation's end, on every route (the ring's outcome
    states it, so the ingress counts one vocabulary): ``tool_calls`` for a reply with
    ``calls``, unless it ran out of tokens (then ``length``, as OpenAI's: the last call's
    arguments are cut short)."""
    reason = done.stop.finish_reason
    return "tool_calls" if calls and reason != "length" else reason


def usage_json(done: Done) -> dict[str, Any]:
    """OpenAI's usage: ``prompt_tokens`` counts the reused ones too, and
    ``prompt_tokens_details.cached_tokens`` says how many of them were reused
    (``audio_tokens``, how many are audio embeddings, where there are any)."""
    details: dict[str, int] = {"cached_tokens": done.cached_tokens}
    if done.audio_tokens:
        details["audio_tokens"] = done.audio_tokens
    return {
        "prompt_tokens": done.prompt_tokens,
        "completion_tokens": done.completion_tokens,
        "total_tokens": done.prompt_tokens + done.completion_tokens,
        "prompt_tokens_details": details,
    }


def timings_json(done: Done) -> dict[str, float | int | None]:
    """llama.cpp server's ``timings`` fields, plus the time spent waiting for a slot.

    ``prompt_ms`` runs until the first token was sampled, so the decode rate counts the
    tokens after the first over ``predicted_ms``. As in llama.cpp's server, ``cache_n``
    prompt tokens were reused from memory and ``prompt_n`` were ingested, and ``draft_n``
    draft tokens were verified (speculative decoding), ``draft_n_accepted`` of them right
    (sent only where there were drafts, as llama.cpp's server does).
    """
    t = done.timings
    decoded_after_first = max(done.completion_tokens - 1, 0)
    ingested = done.prompt_tokens - done.cached_tokens
    timings: dict[str, float | int | None] = {
        "queue_ms": _ms(t.queue_s),
        "cache_n": done.cached_tokens,
        "prompt_n": ingested,
        "prompt_ms": _ms(t.prefill_s),
        "prompt_per_second": _rate(ingested, t.prefill_s),
        "predicted_n": done.completion_tokens,
        "predicted_ms": _ms(t.decode_s),
        "predicted_per_second": _rate(decoded_after_first, t.decode_s),
    }
    if done.draft_tokens:
        timings["draft_n"] = done.draft_tokens
        timings["draft_n_accepted"] = done.accepted_tokens
    return timings


def _ms(seconds: float) -> float | None:
    return round(seconds * 1000.0, 3) if math.isfinite(seconds) else None


def _rate(count: int, seconds: float) -> float | None:
    if count <= 0 or not (seconds > 0.0 and math.isfinite(seconds)):
        return None
    return round(count / seconds, 2)


def token_logprob_json(entry: TokenLogprob) -> dict[str, Any]:
    """One token of OpenAI's chat ``logprobs.content``."""
    return {
        "token": entry.token,
        "logprob": entry.logprob,
        "bytes": list(entry.piece),
        "top_logprobs": [
            {"token": text, "logprob": logprob, "bytes": list(piece)}
            for text, piece, logprob in entry.top
        ],
    }


def chat_logprobs_json(entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    """OpenAI's chat ``logprobs``: ``{"content": [...], "refusal": null}``."""
    return {"content": [token_logprob_json(e) for e in entries], "refusal": None}


def from_engine_error(exc: EngineError, family: ErrorFamily = OPENAI_ERRORS) -> ApiError:
    """The error for an exception the engine raised or reported, on a route of ``family``
    (``llmtrio.api.error_family``).

    A :class:`PromptTooLongError` becomes a 400 ``context_length_exceeded`` on ``messages``,
    worded as ``family``'s clients match it (:func:`_prompt_too_long`); any other
    :class:`RequestError` a 400 naming its ``param``; :class:`EngineClosedError` a 503;
    anything else a 500 (a :class:`GrammarBugError` too: a grammar the server wrote wrongly
    is its own fault, never the request's).
    """
    if isinstance(exc, PromptTooLongError):
        return _prompt_too_long(exc, family)
    if isinstance(exc, RequestError):
        return invalid_request(str(exc), param=exc.param, code="invalid_value")
    if isinstance(exc, GrammarBugError):
        return server_error(f"The server could not constrain this reply: {exc}.")
    if isinstance(exc, EngineFailedError):
        return model_unavailable("The model failed and cannot serve requests.")
    if isinstance(exc, EngineClosedError):
        return model_unavailable("The model is shutting down.")
    return server_error(f"The model failed while generating: {exc}")


def _prompt_too_long(exc: PromptTooLongError, family: ErrorFamily) -> ApiError:
    """A prompt over the context, in the one wording of each route family: OpenAI's (clients
    match "maximum context length"), Anthropic's (Claude Code compacts its conversation when
    it reads "prompt is too long"). The Responses API's routes name ``input`` instead
    (``_responses_request.naming_input``)."""
    if family.anthropic:
        message = (
            f"prompt is too long: {exc.prompt_tokens} tokens > {exc.ctx_size - 1} maximum "
            f"(this model's context is {exc.ctx_size} tokens, and at least one is left to "
            f"generate)."
        )
    else:
        message = (
            f"This model's maximum context length is {exc.ctx_size} tokens. However, your "
            f"messages resulted in {exc.prompt_tokens} tokens (at least one token must be left "
            f"to generate). Please reduce the length of the messages."
        )
    return invalid_request(message, param="messages", code="context_length_exceeded")
