"""llama.cpp server's ``POST /tokenize`` and ``POST /detokenize``: requests, the work on any
model's tokenizer (a chat or an embedding model's), and the JSON bodies.

``/tokenize``: ``content`` (a text, or texts and token ids, kept as they are, as llama.cpp's
mixed prompts), ``add_special`` (default false: the model's BOS where it adds one, to the
first text only), ``parse_special`` (default true: ``<|im_end|>`` is that token) and
``with_pieces`` answer ``{"tokens": [ids]}`` or ``{"tokens": [{"id", "piece"}]}``, a piece
being the token's text, special tokens rendered, or its bytes (an array of numbers) where
they are not UTF-8 on their own (a token holding part of a character), as llama.cpp does.
``/detokenize``: ``tokens`` answer ``{"content": text}``, the pieces joined (a character left
unfinished becomes U+FFFD). A token id outside the vocabulary is a 400 naming it.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any, ClassVar

import attrs

from ..api import (
    DETOKENIZE_PATH,
    TOKENIZE_PATH,
    ApiError,
    Body,
    RequestLimits,
    checked_text,
    dumps,
    invalid_type,
    invalid_value,
    missing,
    read,
)
from ._encoding import Answer, ResponseMeta, WholeBody
from ._requests import json_body
from ._shapes import Encoder, Finished, ModelEngine, run_tokenizer

__all__ = [
    "DETOKENIZE_ENDPOINT",
    "TOKENIZE_ENDPOINT",
    "DetokenizeRequest",
    "Detokenized",
    "TokenizeRequest",
    "Tokenized",
    "parse_detokenize_request",
    "parse_tokenize_request",
]

_NO_LIMITS = RequestLimits()


@attrs.frozen
class TokenizeRequest:
    """A parsed ``POST /tokenize``: ``content`` holds texts and token ids, in order."""

    model: str | None
    content: tuple[str | int, ...]
    add_special: bool = False
    parse_special: bool = True
    with_pieces: bool = False


@attrs.frozen
class DetokenizeRequest:
    """A parsed ``POST /detokenize``."""

    model: str | None
    tokens: tuple[int, ...]


def parse_tokenize_request(body: bytes, limits: RequestLimits = _NO_LIMITS) -> TokenizeRequest:
    """Parse and validate a ``/tokenize`` body. Error handling: :class:`ApiError` 400
    naming the field (``content[2]`` for a part that is neither a text nor a token id)."""
    data = json_body(body)
    content = data.get("content")  # the field table's shape; its branches are read here
    if content is None:
        raise missing("content")
    if isinstance(content, str):
        parts: tuple[str | int, ...] = (checked_text(content, "content"),)
    elif isinstance(content, list):
        parts = tuple(_content_part(item, f"content[{i}]") for i, item in enumerate(content))
    else:
        raise invalid_type("content", "a string or an array of strings and token ids", content)
    flags = {
        name: read(data, Body.TOKENIZE, name, limits)
        for name in ("add_special", "parse_special", "with_pieces")
    }
    return TokenizeRequest(
        read(data, Body.TOKENIZE, "model", limits),
        parts,
        add_special=flags["add_special"] is True,
        parse_special=flags["parse_special"] is not False,
        with_pieces=flags["with_pieces"] is True,
    )


def _content_part(item: object, param: str) -> str | int:
    if isinstance(item, str):
        return checked_text(item, param)
    if isinstance(item, int) and not isinstance(item, bool):
        if item < 0:
            raise invalid_value(param, f"token ids are at least 0, but got {item}.")
        return item
    raise invalid_type(param, "a string or a token id", item)


def parse_detokenize_request(body: bytes, limits: RequestLimits = _NO_LIMITS) -> DetokenizeRequest:
    """Parse and validate a ``/detokenize`` body. Error handling: :class:`ApiError` 400
    naming the field."""
    data = json_body(body)
    tokens = read(data, Body.DETOKENIZE, "tokens", limits)
    return DetokenizeRequest(read(data, Body.DETOKENIZE, "model", limits), tuple(tokens))


@attrs.frozen(kw_only=True)
class Tokenized(Answer):
    """The answer of a ``/tokenize``: the token ids and, when asked for, their pieces
    (nothing generated or ingested)."""

    kind: ClassVar[str] = "tokenize"
    tokens: tuple[int, ...]
    pieces: tuple[bytes, ...] | None = None


@attrs.frozen(kw_only=True)
class Detokenized(Answer):
    """The answer of a ``/detokenize``: the tokens' text."""

    kind: ClassVar[str] = "detokenize"
    content: str


def _vocabulary_error(param: str, token: int, n_vocab: int) -> ApiError:
    return invalid_value(param, f"token id {token} is outside the vocabulary (0..{n_vocab - 1}).")


def _tokenize(engine: ModelEngine, request: TokenizeRequest) -> tuple[list[int], list[bytes]]:
    """The token ids of ``request.content`` (llama.cpp's ``tokenize_mixed``) and, when asked
    for, their pieces."""
    n_vocab = engine.n_vocab
    tokens: list[int] = []
    for i, part in enumerate(request.content):
        if isinstance(part, str):
            tokens += engine.tokenize_text(
                part,
                add_special=request.add_special and i == 0,
                parse_special=request.parse_special,
            )
        elif part >= n_vocab:
            raise _vocabulary_error(f"content[{i}]", part, n_vocab)
        else:
            tokens.append(part)
    pieces = [engine.token_bytes(token) for token in tokens] if request.with_pieces else []
    return tokens, pieces


def _detokenize(engine: ModelEngine, tokens: Sequence[int]) -> str:
    n_vocab = engine.n_vocab
    for i, token in enumerate(tokens):
        if token >= n_vocab:
            raise _vocabulary_error(f"tokens[{i}]", token, n_vocab)
    return b"".join(engine.token_bytes(token) for token in tokens).decode("utf-8", "replace")


@attrs.frozen
class _Tokenize:
    """``POST /tokenize``: any model's tokenizer."""

    route: str = TOKENIZE_PATH
    model_kind: str | None = None
    id_prefix: str = "tok"

    def parse(self, body: bytes, limits: RequestLimits) -> TokenizeRequest:
        return parse_tokenize_request(body, limits)

    @asynccontextmanager
    async def run(self, engine: ModelEngine, request: TokenizeRequest) -> AsyncIterator[Finished]:
        size = sum(len(part) if isinstance(part, str) else 1 for part in request.content)
        tokens, pieces = await run_tokenizer(size, _tokenize, engine, request)
        piece_tuple = tuple(pieces) if request.with_pieces else None
        yield Finished(Tokenized(tokens=tuple(tokens), pieces=piece_tuple))

    def encoder(self, request: TokenizeRequest, meta: ResponseMeta) -> Encoder[Any]:
        return _TokenizeBody()


@attrs.frozen
class _Detokenize:
    """``POST /detokenize``: any model's tokenizer."""

    route: str = DETOKENIZE_PATH
    model_kind: str | None = None
    id_prefix: str = "detok"

    def parse(self, body: bytes, limits: RequestLimits) -> DetokenizeRequest:
        return parse_detokenize_request(body, limits)

    @asynccontextmanager
    async def run(self, engine: ModelEngine, request: DetokenizeRequest) -> AsyncIterator[Finished]:
        content = await run_tokenizer(len(request.tokens), _detokenize, engine, request.tokens)
        yield Finished(Detokenized(content=content))

    def encoder(self, request: DetokenizeRequest, meta: ResponseMeta) -> Encoder[Any]:
        return _DetokenizeBody()


def _piece(piece: bytes) -> str | list[int]:
    """A piece as llama.cpp's ``with_pieces`` writes it: its text, or its bytes."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return list(piece)


class _TokenizeBody(WholeBody):
    def finish(self, answer: Tokenized) -> bytes:
        if answer.pieces is None:
            return b'{"tokens":' + json.dumps(answer.tokens, separators=(",", ":")).encode() + b"}"
        entries = [
            {"id": t, "piece": _piece(p)} for t, p in zip(answer.tokens, answer.pieces, strict=True)
        ]
        return dumps({"tokens": entries})


class _DetokenizeBody(WholeBody):
    def finish(self, answer: Detokenized) -> bytes:
        return dumps({"content": answer.content})


TOKENIZE_ENDPOINT = _Tokenize()
DETOKENIZE_ENDPOINT = _Detokenize()
