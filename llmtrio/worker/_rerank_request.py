"""Reranking requests in the three shapes clients send, each parsed into one
:class:`RerankRequest`: pairs of a query and a document. Pure.

- Jina's and llama.cpp's (``POST /v1/rerank``, ``/rerank``): ``query``, ``documents`` (texts
  or ``{"text": ...}`` objects), ``top_n``, ``return_documents`` (default true), and
  ``truncation`` (cut a document whose pair is over the model's context; default false: a
  400 naming the document).
- Cohere's v2 (``POST /v2/rerank``): ``query``, ``documents``, ``top_n`` and
  ``max_tokens_per_doc`` (default 4096); as Cohere's API does, a document is cut to fit
  rather than refused.
- vLLM's scores (``POST /v1/score``): ``text_1`` (a text, or one a pair) and ``text_2`` (a
  text or texts): one to one, one to many, or many to as many; and ``truncation``.

Empty ``documents`` (or ``text_2``), more than ``max_rerank_documents`` of them, and a field of
the wrong type are each a 400 naming the field (a document by its index: ``documents[3]``).
"""

from __future__ import annotations

from typing import Any

import attrs

from ..api import (
    DOCUMENT,
    DOCUMENT_TEXT,
    Body,
    RequestLimits,
    check,
    invalid_request,
    invalid_type,
    invalid_value,
    missing,
    read,
)
from ._requests import json_body

__all__ = [
    "COHERE_MAX_TOKENS_PER_DOC",
    "RerankRequest",
    "parse_cohere_rerank_request",
    "parse_rerank_request",
    "parse_score_request",
]

_NO_LIMITS = RequestLimits()
#: Cohere's default ``max_tokens_per_doc``.
COHERE_MAX_TOKENS_PER_DOC = 4096


@attrs.frozen
class RerankRequest:
    """Pairs to score: each document with the query (``queries`` holds one query for all,
    or one a document, in order). ``top_n`` keeps the best that many results (``None``:
    all); ``return_documents`` puts each document's text in its result; ``truncate`` cuts a
    document's end so that its pair fits the model's context (else such a pair is refused),
    ``max_document_tokens`` cuts every document to that many tokens first.
    ``query_param`` and ``document_param`` are how errors name the two (``query`` and
    ``documents``, or ``text_1`` and ``text_2``)."""

    model: str | None
    queries: tuple[str, ...]
    documents: tuple[str, ...]
    top_n: int | None = None
    return_documents: bool = True
    truncate: bool = False
    max_document_tokens: int | None = None
    query_param: str = "query"
    document_param: str = "documents"

    def query(self, index: int) -> str:
        """The query of document ``index``'s pair."""
        return self.queries[0] if len(self.queries) == 1 else self.queries[index]

    def query_name(self, index: int) -> str:
        """How errors name the query of document ``index``'s pair."""
        return self.query_param if len(self.queries) == 1 else f"{self.query_param}[{index}]"


def parse_rerank_request(body: bytes, limits: RequestLimits = _NO_LIMITS) -> RerankRequest:
    """Parse and validate a Jina (and llama.cpp) shaped body (``/v1/rerank``, ``/rerank``).

    Error handling: :class:`ApiError` 400 naming the field, or the document."""
    data = json_body(body)
    return_documents = read(data, Body.RERANK, "return_documents", limits)
    return RerankRequest(
        read(data, Body.RERANK, "model", limits),
        (read(data, Body.RERANK, "query", limits),),
        _documents(data, limits),
        top_n=read(data, Body.RERANK, "top_n", limits),
        return_documents=return_documents is not False,
        truncate=read(data, Body.RERANK, "truncation", limits) is True,
    )


def parse_cohere_rerank_request(body: bytes, limits: RequestLimits = _NO_LIMITS) -> RerankRequest:
    """Parse and validate a Cohere v2 body (``/v2/rerank``): documents are cut to
    ``max_tokens_per_doc`` and to fit the context, as Cohere's API does.

    Error handling: :class:`ApiError` 400 naming the field, or the document."""
    data = json_body(body)
    most = read(data, Body.RERANK_V2, "max_tokens_per_doc", limits)
    return RerankRequest(
        read(data, Body.RERANK_V2, "model", limits),
        (read(data, Body.RERANK_V2, "query", limits),),
        _documents(data, limits),
        top_n=read(data, Body.RERANK_V2, "top_n", limits),
        return_documents=False,
        truncate=True,
        max_document_tokens=COHERE_MAX_TOKENS_PER_DOC if most is None else most,
    )


def parse_score_request(body: bytes, limits: RequestLimits = _NO_LIMITS) -> RerankRequest:
    """Parse and validate a vLLM score body (``/v1/score``): ``text_1`` one text (or one in
    a list) with each of ``text_2``, or as many as ``text_2``, pair by pair.

    Error handling: :class:`ApiError` 400 naming the field, or the text."""
    data = json_body(body)
    firsts = _texts(data.get("text_1"), "text_1", None)
    seconds = _texts(data.get("text_2"), "text_2", limits.max_rerank_documents)
    if len(firsts) > 1 and len(firsts) != len(seconds):
        raise invalid_value(
            "text_2",
            f"{len(seconds)} texts, but 'text_1' has {len(firsts)}: give one 'text_1' for "
            f"every 'text_2', or one for all of them.",
        )
    return RerankRequest(
        read(data, Body.SCORE, "model", limits),
        firsts,
        seconds,
        return_documents=False,
        truncate=read(data, Body.SCORE, "truncation", limits) is True,
        query_param="text_1",
        document_param="text_2",
    )


def _documents(data: dict[str, Any], limits: RequestLimits) -> tuple[str, ...]:
    value = data.get("documents")
    if value is None:
        raise missing("documents")
    if not isinstance(value, list):
        raise invalid_type("documents", "an array of texts or of objects with a text", value)
    _count(value, "documents", limits.max_rerank_documents)
    texts = []
    for i, item in enumerate(value):
        param = f"documents[{i}]"
        if isinstance(item, dict):
            texts.append(check(DOCUMENT, item, limits, param)["text"])
        elif isinstance(item, str):
            texts.append(check(DOCUMENT_TEXT, item, limits, param))
        else:
            raise invalid_type(param, "a text, or an object with its text", item)
    return tuple(texts)


def _texts(value: object, param: str, most: int | None) -> tuple[str, ...]:
    if value is None:
        raise missing(param)
    if isinstance(value, str):
        return (check(DOCUMENT_TEXT, value, _NO_LIMITS, param),)
    if not isinstance(value, list):
        raise invalid_type(param, "a text or an array of texts", value)
    _count(value, param, most)
    return tuple(_text(item, f"{param}[{i}]") for i, item in enumerate(value))


def _text(item: object, param: str) -> str:
    if not isinstance(item, str):
        raise invalid_type(param, "a text", item)
    text: str = check(DOCUMENT_TEXT, item, _NO_LIMITS, param)
    return text


def _count(value: list[Any], param: str, most: int | None) -> None:
    if not value:
        raise invalid_value(param, "empty array. Expected at least one text.", "empty_array")
    if most is not None and len(value) > most:
        raise invalid_request(
            f"Invalid '{param}': {len(value)} documents, more than this server takes in one "
            f"request ({most}).",
            param=param,
            code="array_above_max_length",
        )
