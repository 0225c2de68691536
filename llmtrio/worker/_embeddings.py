"""OpenAI's embeddings (``POST /v1/embeddings``): request and response. Pure.

``input`` is a text, an array of texts, an array of token ids or an array of arrays of token
ids; each text or token array is one input and gets one vector. ``encoding_format`` is
``float`` (arrays of numbers) or ``base64`` (each vector's little-endian float32 bytes);
``dimensions`` is refused (no GGUF field says a model was trained for truncated vectors).
An empty input, more inputs than the server's ``max_embedding_inputs`` or an input longer
than the model's context is a 400 naming the input's index (``input[3]``).
"""

from __future__ import annotations

import base64
from typing import ClassVar

import attrs
import numpy as np
import numpy.typing as npt

from ..api import (
    ApiError,
    Body,
    RequestLimits,
    checked_text,
    describe,
    dumps,
    invalid_request,
    invalid_type,
    invalid_value,
    missing,
    read,
)
from ._encoding import Answer, WholeBody
from ._requests import json_body, reject_refused

__all__ = [
    "Embedded",
    "EmbeddingsBody",
    "EmbeddingsRequest",
    "float_array",
    "parse_embeddings_request",
    "too_long",
]

_NO_LIMITS = RequestLimits()


@attrs.frozen
class EmbeddingsRequest:
    """A parsed ``POST /v1/embeddings``: ``inputs`` are texts or token-id tuples, never
    empty, at most the server's ``max_embedding_inputs``."""

    model: str | None
    inputs: tuple[str, ...] | tuple[tuple[int, ...], ...]
    encoding_format: str = "float"


@attrs.frozen(kw_only=True)
class Embedded(Answer):
    """The answer of an embeddings request: the vectors, row ``i`` for input ``i``, and the
    ``prompt_tokens`` the inputs took (ingested, counted as a generation's prompt is)."""

    kind: ClassVar[str] = "embeddings"
    vectors: npt.NDArray[np.float32] = attrs.field(eq=False)

    @property
    def inputs(self) -> int:
        return len(self.vectors)


def parse_embeddings_request(body: bytes, limits: RequestLimits = _NO_LIMITS) -> EmbeddingsRequest:
    """Parse and validate an embeddings request body.

    Error handling: :class:`ApiError` 400 naming the field, or the input (``input[i]``)
    that is empty, of the wrong type or beyond ``limits.max_embedding_inputs``.
    """
    data = json_body(body)
    reject_refused(data, Body.EMBEDDINGS, limits)
    model = read(data, Body.EMBEDDINGS, "model", limits)
    read(data, Body.EMBEDDINGS, "user", limits)
    encoding = data.get("encoding_format")
    if encoding is None:
        encoding = "float"
    elif encoding not in ("float", "base64"):
        raise invalid_value(
            "encoding_format", f"expected 'float' or 'base64', but got {describe(encoding)}."
        )
    return EmbeddingsRequest(model, _parse_inputs(data.get("input"), limits), encoding)


def _parse_inputs(
    value: object, limits: RequestLimits
) -> tuple[str, ...] | tuple[tuple[int, ...], ...]:
    if value is None:
        raise missing("input")
    if isinstance(value, str):
        return (_text(value, "input"),)
    if not isinstance(value, list):
        raise invalid_type("input", "a string or an array", value)
    if not value:
        raise invalid_value("input", "it must not be an empty array.")
    if all(_is_token(item) for item in value):
        return (tuple(value),)  # one input of token ids
    if len(value) > limits.max_embedding_inputs:
        raise invalid_request(
            f"Invalid 'input': {len(value)} inputs, more than this server takes in one request "
            f"({limits.max_embedding_inputs}); 'input[{limits.max_embedding_inputs}]' is the "
            f"first one over.",
            param=f"input[{limits.max_embedding_inputs}]",
            code="array_above_max_length",
        )
    if isinstance(value[0], str):
        return tuple(_text(item, f"input[{i}]") for i, item in enumerate(value))
    return tuple(_tokens(item, f"input[{i}]") for i, item in enumerate(value))


def _is_token(item: object) -> bool:
    return isinstance(item, int) and not isinstance(item, bool)


def _text(value: object, param: str) -> str:
    if not isinstance(value, str):
        raise invalid_type(param, "a string, as the first input is", value)
    if not value:
        raise invalid_value(param, "an input must not be empty.")
    return checked_text(value, param)


def _tokens(value: object, param: str) -> tuple[int, ...]:
    if not isinstance(value, list):
        raise invalid_type(param, "an array of token ids, as the first input is", value)
    if not value:
        raise invalid_value(param, "an input must not be empty.")
    for token in value:
        if not _is_token(token):
            raise invalid_type(param, "an array of token ids (integers)", token)
        if token < 0:
            raise invalid_value(param, f"token ids are at least 0, but got {token}.")
    return tuple(value)


def too_long(index: int, tokens: int, ctx_size: int) -> ApiError:
    """400 ``context_length_exceeded`` for input ``index`` (OpenAI's wording, which clients
    match: "maximum context length")."""
    return invalid_request(
        f"This model's maximum context length is {ctx_size} tokens, however input {index} "
        f"resulted in {tokens} tokens. Please reduce the length of input[{index}].",
        param=f"input[{index}]",
        code="context_length_exceeded",
    )


def float_array(vector: npt.NDArray[np.float32]) -> str:
    """``vector`` as a JSON array, each number with 9 significant digits: enough to read
    back the same ``float32`` (its ``max_digits10``; llama.cpp's server writes as many), and
    one C-level format for the whole vector, where ``json.dumps`` of its values as Python
    floats writes 17 digits each through ``float.__repr__`` (0.18 against 0.67 ms for 384
    numbers, 5.2 against 8.4 KB)."""
    if not np.isfinite(vector).all():
        raise ValueError("an embedding holds a NaN or an infinity")
    return "[" + ",".join(["%.9g"] * len(vector)) % tuple(vector.tolist()) + "]"


@attrs.define
class EmbeddingsBody(WholeBody):
    """The JSON body: ``{"object": "list", "data": [...], "model", "usage"}``."""

    request: EmbeddingsRequest
    model: str

    def finish(self, answer: Embedded) -> bytes:
        if self.request.encoding_format == "base64":
            vectors = [
                '"' + base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") + '"'
                for row in answer.vectors
            ]
        else:
            vectors = [float_array(row) for row in answer.vectors]
        data = ",".join(
            f'{{"object":"embedding","index":{i},"embedding":{vector}}}'
            for i, vector in enumerate(vectors)
        )
        usage = {"prompt_tokens": answer.prompt_tokens, "total_tokens": answer.prompt_tokens}
        tail = dumps({"model": self.model, "usage": usage})
        return b'{"object":"list","data":[' + data.encode() + b"]," + tail[1:]
